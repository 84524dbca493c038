"""Smoke test of ``scripts/bench_engine.py fumble`` (:mod:`fafo.bench.tools.fumble_attention`): CSV layout and the
block-sparsity structure (no timings)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import csv  # noqa: E402
import importlib.util  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import fafo.bench.tools.fumble_attention as fumble  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_engine.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_engine_fumble", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def test_main_writes_csv_and_plot(bench, tmp_path):
    out = tmp_path / "sub" / "fumble.csv"
    contexts = [256, 512]
    threads = torch.get_num_threads()
    rows = bench.main(["fumble", "--contexts", *map(str, contexts),
                       "--heads", "2", "--kv-heads", "1", "--head-dim", "8",
                       "--streams", "2", "--k", "2", "--budget", "200", "--repeats", "1", "--warmup", "1",
                       "--scatter", "streaming", "random", "--no-compile", "--device", "cpu", "--threads", "1",
                       "--out", str(out), "--plot"])
    assert torch.get_num_threads() == threads  # restored
    assert out.is_file() and out.with_suffix(".png").is_file()
    with open(out, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == fumble.FUMBLE_COLUMNS
        table = list(reader)
    assert len(table) == len(rows) == len(contexts) * 3  # fixed + 2 scattered layouts per context
    assert {r["layout"] for r in table} == {"fixed", "scattered"}
    assert sorted(int(r["context"]) for r in table if r["layout"] == "fixed") == contexts
    assert {r["scatter"] for r in table if r["layout"] == "scattered"} == {"streaming", "random"}
    for r in table:
        assert float(r["median_ms"]) >= 0 and int(r["active_kv_blocks"]) <= int(r["total_kv_tiles"])
        assert r["q_rows"] == "4" and r["compiled"] == "0" and r["threads"] == "1"
        if r["layout"] == "scattered":  # the equivalence check ran and passed
            assert float(r["check_max_abs_diff"]) < 1e-3
    largest = [r for r in table if int(r["context"]) == max(contexts)]
    fixed = next(int(r["active_kv_blocks"]) for r in largest if r["layout"] == "fixed")
    for r in largest:
        if r["layout"] == "scattered":
            assert fixed < int(r["active_kv_blocks"]), r


def test_fixed_region_blocks_stay_flat():
    """Paper sizes (240 fumble rows, F=760): the fixed mask's active blocks do not grow with the context."""
    from torch.nn.attention.flex_attention import create_block_mask

    Q, F = 240, 760
    gen = torch.Generator().manual_seed(0)
    counts = {}
    for ctx in (1024, 8192):
        fixed = create_block_mask(fumble.fixed_region_mask(torch.tensor([F])), None, None, Q, ctx, device="cpu")
        counts["fixed", ctx] = fumble.block_counts(fixed)[0]
        for scatter in fumble.SCATTERS:
            selected = torch.zeros(ctx, dtype=torch.bool)
            selected[fumble.scattered_slots(scatter, ctx, F, 4, gen)] = True
            assert int(selected.sum()) == F
            bm = create_block_mask(fumble.selected_mask(selected), None, None, Q, ctx, device="cpu")
            counts[scatter, ctx] = fumble.block_counts(bm)[0]
    assert counts["fixed", 1024] == counts["fixed", 8192] == 2 * 6  # 2 query blocks x ceil(760 / 128)
    assert counts["streaming", 8192] > counts["fixed", 8192]
    assert counts["random", 8192] > 4 * counts["fixed", 8192]


def test_mismatch_raises():
    """The equivalence check fails loudly when the fixed region does not hold the selected entries."""
    from torch.nn.attention.flex_attention import create_block_mask

    torch.manual_seed(0)
    ctx, F, Q = 256, 40, 4
    q, k, v = torch.randn(1, 2, Q, 8), torch.randn(1, 1, ctx, 8), torch.randn(1, 1, ctx, 8)
    idx = torch.arange(ctx - F, ctx)
    selected = torch.zeros(ctx, dtype=torch.bool)
    selected[idx] = True
    bm_fixed = create_block_mask(fumble.fixed_region_mask(torch.tensor([F])), None, None, Q, ctx, device="cpu")
    bm_scat = create_block_mask(fumble.selected_mask(selected), None, None, Q, ctx, device="cpu")
    flex = fumble.flex_layouts(compiled=False)
    assert fumble.check_equivalence(flex, q, k, v, idx, bm_fixed, bm_scat, F) < 1e-4
    wrong = torch.arange(F)  # the fixed run copies slots [0, F) instead of the selected ones
    with pytest.raises(RuntimeError, match="disagree"):
        fumble.check_equivalence(flex, q, k, v, wrong, bm_fixed, bm_scat, F)
