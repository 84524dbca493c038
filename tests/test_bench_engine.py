"""``scripts/bench_engine.py`` on CPU in CI-size settings (roofline, curve, decode modes write their CSVs; no
timing checks), and the library it stands on: the in-memory random model and its transformers twin, the roofline's
byte count, the cost curve and the device CSV (:mod:`fafo.bench.tools.cost_curve`)."""

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_engine.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_engine", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_engine_writes_a_row_per_context_and_step(tmp_path, checkpoint, bench):
    out = tmp_path / "engine.csv"
    bench.main(["roofline", "--model", str(checkpoint("llama_gqa")), "--contexts", "64", "128", "--steps", "1", "9",
                "--repeats", "2", "--warmup", "1", "--out", str(out), "--plot"])
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0]) == bench.COLUMNS
    assert [(r["context"], r["step_tokens"]) for r in rows] == [("64", "1"), ("64", "9"), ("128", "1"), ("128", "9")]
    assert all(float(r["median_ms"]) > 0 and int(r["bytes_read"]) > 0 and float(r["copy_fraction"]) > 0
               for r in rows)
    assert int(rows[2]["bytes_read"]) > int(rows[0]["bytes_read"])  # more context, more KV to read
    assert {r["attention"] for r in rows} == {"sdpa"}  # --compile auto: eager on CPU, as the runner
    assert out.with_suffix(".png").exists()


def test_bench_engine_times_compiled_steps_warm(tmp_path, checkpoint, bench, fresh_dynamo):
    """Compiled steps: one graph per step size, compiled in warm-up; the contexts reuse it (no compile timed)."""
    from fafo.engine.compiled import compile_stats

    out = tmp_path / "engine.csv"
    bench.main(["--model", str(checkpoint("llama_gqa")), "--contexts", "64", "128", "--steps", "1", "5",
                "--repeats", "1", "--warmup", "1", "--compile", "default", "--compile-backend", "aot_eager",
                "--compile-attention", "flex", "--out", str(out)])
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 4 and {r["attention"] for r in rows} == {"flex+compile:default"}
    assert all(float(r["median_ms"]) > 0 for r in rows)
    assert compile_stats()["graphs"] == 2


def test_random_model_is_built_on_the_device_and_shared_with_transformers():
    """No checkpoint on disk: the weights are drawn in place, and transformers' twin holds the same tensors and
    computes the same logits."""
    from fafo.bench.tools.random_model import llama_config, random_engine, transformers_twin
    from fafo.engine.attention import causal_plan

    engine = random_engine(llama_config("embedded", num_hidden_layers=2), "cpu", "float32")
    hf = transformers_twin(engine)
    assert hf.model.embed_tokens.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()
    assert float(engine.model.model.norm.weight.min()) == 1.0
    ids = torch.randint(3, 1000, (1, 12), generator=torch.Generator().manual_seed(0))
    ours = engine.forward(engine.cache(64), ids[0].tolist(), list(range(12)), list(range(12)), causal_plan(0))
    with torch.no_grad():
        theirs = hf(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_bytes_per_forward_reads_one_embedding_row():
    from fafo.bench.tools.engine_timing import bytes_per_forward, kv_bytes_per_token
    from fafo.bench.tools.random_model import llama_config, random_engine

    engine = random_engine(llama_config("embedded", num_hidden_layers=1), "cpu", "float16")
    a = engine.model.args
    table = a.vocab_size * a.dim * 2
    assert bytes_per_forward(engine, 0) == engine.weights_nbytes - table + a.dim * 2
    assert kv_bytes_per_token(engine) == 2 * a.n_kv_heads * a.head_dim * 2
    assert bytes_per_forward(engine, 100) - bytes_per_forward(engine, 0) == 100 * kv_bytes_per_token(engine)


@pytest.mark.parametrize("name,slug", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
                                       ("NVIDIA L40S", "l40s"), ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090")])
def test_gpu_slug(name, slug):
    from fafo.bench.tools.engine_timing import gpu_slug

    assert gpu_slug(name) == slug


def test_cost_curve_interpolates_and_gives_break_even_tau(tmp_path):
    from fafo.bench.tools.cost_curve import CostCurve
    from fafo.errors import ConfigError

    path = tmp_path / "curve.csv"
    rows = ["context,step_tokens,median_ms,device"]
    for context, base in ((1000, 10.0), (3000, 20.0)):  # latency = base + step/10 ms
        rows += [f"{context},{step},{base + step / 10},cpu" for step in (1, 11, 101)]
    path.write_text("\n".join(rows) + "\n")
    curve = CostCurve.load(path)
    assert curve.latency(1, 1000) == pytest.approx(10.1)
    assert curve.latency(51, 1000) == pytest.approx(15.1)  # between grid steps
    assert curve.latency(51, 2000) == pytest.approx(20.1)  # and between contexts
    assert curve.break_even_tau((101,), 1000) == pytest.approx(20.1 / 10.1)
    assert curve.break_even_tau((11, 11), 1000) == pytest.approx(2 * 11.1 / 10.1)  # two forwards per step
    assert curve.predicted_speedup(4.0, (101,), 1000) == pytest.approx(4.0 * 10.1 / 20.1)
    assert curve.methods == {}
    with pytest.raises(ConfigError, match="bench.cost_curve"):
        CostCurve.load(tmp_path / "missing.csv")


def test_device_csv_holds_the_curve_and_the_methods(tmp_path):
    from fafo.bench.tools.cost_curve import DEVICE_COLUMNS, CostCurve, write_device_csv
    from fafo.errors import ConfigError

    curve = [{"context": c, "step_tokens": s, "median_ms": 5.0 + s / 100 + c / 1000} for c in (512, 4096)
             for s in (1, 64, 481)]
    methods = [{"method": "vanilla", "forward_tokens": "1", "step_ms": 5.5, "host_ms": 0.25, "wall_ms": 5.75,
                "tau": 1.0, "steps": 63, "forwards_per_step": 1.0, "prompt_tokens": 512},
               {"method": "fafo_2forward", "forward_tokens": "241+241", "step_ms": 11.0, "host_ms": 1.5,
                "wall_ms": 12.5, "tau": 1.2, "steps": 50, "forwards_per_step": 2.0, "prompt_tokens": 512}]
    path = write_device_csv(tmp_path / "h100.csv", curve, methods, {"device_name": "NVIDIA H100", "dtype": "float16"})
    rows = list(csv.DictReader(open(path)))
    assert list(rows[0]) == DEVICE_COLUMNS and [r["row"] for r in rows] == ["curve"] * 6 + ["method"] * 2
    loaded = CostCurve.load(path)
    assert loaded.device == "NVIDIA H100" and sorted(loaded.table) == [512, 4096]
    assert loaded.latency(64, 512) == pytest.approx(5.0 + 0.64 + 0.512)
    assert loaded.methods["fafo_2forward"] == {"step_ms": 11.0, "host_ms": 1.5, "wall_ms": 12.5, "tau": 1.2,
                                               "steps": 50.0, "forwards_per_step": 2.0, "prompt_tokens": 512.0,
                                               "forward_tokens": "241+241"}
    bad = path.read_text().replace("5.5,0.25", "5.5,fast")
    (tmp_path / "bad.csv").write_text(bad)
    with pytest.raises(ConfigError, match="method 'vanilla'"):
        CostCurve.load(tmp_path / "bad.csv")


def test_bench_engine_curve_prints_break_even_tau(tmp_path, checkpoint, capsys, bench):
    from fafo.bench.tools.cost_curve import CostCurve

    out = tmp_path / "curve.csv"
    bench.main(["--model", str(checkpoint("llama_gqa")), "--contexts", "32", "64", "--steps", "1", "8", "64",
                "--repeats", "2", "--warmup", "1", "--out", str(out), "--curve"])
    rows = list(csv.DictReader(open(out)))
    assert {int(r["step_tokens"]) for r in rows} == {1, 8, 64} and all(int(r["threads"]) >= 1 for r in rows)
    printed = capsys.readouterr().out
    assert "break-even tau" in printed
    fafo = next(line for line in printed.splitlines() if line.startswith("fafo (n=m=40, k=6)"))
    curve = CostCurve.load(out)  # what is printed is the curve's (timings themselves are not asserted)
    assert fafo.split()[3] == "481" and fafo.split()[-1] == f"{curve.break_even_tau((481,), 64):.2f}"
    two = next(line for line in printed.splitlines() if line.startswith("fafo-2forward"))
    assert two.split()[3] == "241+241"


@pytest.mark.parametrize("mode", ["vs-hf", "fafo-step"])
def test_bench_engine_decode_modes_write_their_rows(tmp_path, mode, monkeypatch, bench):
    monkeypatch.setenv("FAFO_CACHE", str(tmp_path / "cache"))
    small = '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, ' \
            '"intermediate_size": 128, "vocab_size": 512}'
    out = tmp_path / "decode.csv"
    bench.main([mode, "--threads", "1", "--rounds", "1", "--prompts", "32", "--new-tokens", "6", "--context", "40",
                "--spec", small, "--out", str(out)])
    assert not (tmp_path / "cache").exists()  # the random model was built in memory, not written to disk
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0]) == bench.DECODE_COLUMNS and {r["bench"] for r in rows} == {mode}
    assert all(float(r["median_ms"]) > 0 and r["threads"] == "1" for r in rows)
    if mode == "vs-hf":  # ours vs transformers on the same weights, the same greedy tokens
        assert [r["variant"] for r in rows] == ["ours", "hf-dynamic", "hf-static"]
        assert all(r["note"] == "tokens equal to HF: True" for r in rows)
    else:  # fused vs two forwards, on both attention paths, with attention's share of the step
        assert [r["variant"] for r in rows] == ["dense fused", "dense 2forward", "sdpa fused", "sdpa 2forward"]
        assert all(0 < float(r["attention_share"]) < 1 for r in rows)


def test_bench_engine_refuses_cuda_graphs_on_cpu(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--compile", "reduce-overhead"])


@pytest.mark.parametrize("tokens, rows", [
    (7, 1), ([1, 2, 3], 3), ([[1, 2], [3, 4]], 2), (torch.zeros(2, 5, dtype=torch.long), 5),
    (np.arange(6), 6), (np.zeros((2, 4), dtype="int64"), 4),
])
def test_forward_rows_are_counted_for_every_input_form_a_method_passes(tokens, rows):
    from fafo.bench.tools.engine_timing import n_rows

    assert n_rows(tokens) == rows


def test_cost_curve_per_batch_size_prices_each_batch_and_old_files_are_batch_one(tmp_path):
    """A ``batch`` column: each batch size its own grid (break-even tau and projected speedup per batch on file);
    a batch not on file is refused naming the fix; a CSV without the column (older files) is all batch 1."""
    from fafo.bench.tools.cost_curve import CostCurve
    from fafo.bench.tools.projection import curve_fields
    from fafo.errors import ConfigError

    lines = ["batch,context,step_tokens,median_ms"]
    for batch, slope in ((1, 0.01), (8, 0.1)):  # 8 rows: a 101-token step costs 11x a 1-token one
        lines += [f"{batch},1000,{s},{10 + slope * (s - 1)}" for s in (1, 101)]
    (tmp_path / "curve.csv").write_text("\n".join(lines) + "\n")
    curve = CostCurve.load(tmp_path / "curve.csv")
    assert sorted(curve.batches) == [1, 8] and curve.table == curve.batches[1]
    assert curve.break_even_tau((101,), 1000) == pytest.approx(11 / 10)
    assert curve.break_even_tau((101,), 1000, 8) == pytest.approx(20 / 10)
    assert curve.projected_by_batch(3.0, (101,), 1000) == pytest.approx({1: 3.0 / 1.1, 8: 3.0 / 2.0})
    with pytest.raises(ConfigError, match="--curve --batch 4"):
        curve.latency(1, 1000, 4)
    rows = [{"status": "ok", "sample_id": "a", "turn": "0", "prompt_tokens": "996", "new_tokens": "9",
             "forwards": "2", "batch_size": "8"}]
    fields = curve_fields((101,), curve, rows, {})
    assert fields["break_even_tau"] == pytest.approx(curve.break_even_tau((101,), 1000, 8))  # the run's own batch
    assert fields["projected_speedup_by_batch"] == pytest.approx({"1": 4.0 / 1.1, "8": 4.0 / 2.0})  # tau 8/2
    (tmp_path / "only8.csv").write_text("batch,context,step_tokens,median_ms\n8,1000,1,10\n")
    with pytest.raises(ConfigError, match="batch 1 among them"):
        CostCurve.load(tmp_path / "only8.csv")


def test_bench_engine_curve_at_several_batch_sizes(tmp_path, checkpoint, capsys, bench):
    from fafo.bench.tools.cost_curve import CostCurve

    out = tmp_path / "curve.csv"
    bench.main(["--model", str(checkpoint("llama_gqa")), "--contexts", "32", "--steps", "1", "8", "--repeats", "1",
                "--warmup", "1", "--out", str(out), "--curve", "--batch", "3"])
    rows = list(csv.DictReader(open(out)))
    assert sorted((int(r["batch"]), int(r["step_tokens"])) for r in rows) == [(1, 1), (1, 8), (3, 1), (3, 8)]
    assert all(float(r["tokens_per_s"]) * float(r["median_ms"]) / 1e3 == pytest.approx(
        int(r["batch"]) * int(r["step_tokens"])) for r in rows)
    printed = capsys.readouterr().out
    assert "batch 1 (rows per forward)" in printed and "batch 3 (rows per forward)" in printed
    assert sorted(CostCurve.load(out).batches) == [1, 3]
