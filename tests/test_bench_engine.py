"""Smoke tests of ``scripts/bench_engine.py``'s roofline (default), curve and decode modes on CPU in CI-size settings:
they write their CSVs (no timing checks)."""

import csv
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_engine.py"


def test_bench_engine_writes_a_row_per_context_and_step(tmp_path, checkpoint):
    spec = importlib.util.spec_from_file_location("bench_engine", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "engine.csv"
    module.main(["roofline", "--model", str(checkpoint("llama_gqa")), "--contexts", "64", "128", "--steps", "1", "9",
                 "--repeats", "2", "--warmup", "1", "--out", str(out), "--plot"])
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0]) == module.COLUMNS
    assert [(r["context"], r["step_tokens"]) for r in rows] == [("64", "1"), ("64", "9"), ("128", "1"), ("128", "9")]
    assert all(float(r["median_ms"]) > 0 and int(r["bytes_read"]) > 0 for r in rows)
    assert int(rows[2]["bytes_read"]) > int(rows[0]["bytes_read"])  # more context, more KV to read
    assert out.with_suffix(".png").exists()


def test_bench_engine_times_compiled_steps(tmp_path, checkpoint):
    import torch._dynamo

    spec = importlib.util.spec_from_file_location("bench_engine", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "engine.csv"
    torch._dynamo.reset()
    try:
        module.main(["--model", str(checkpoint("llama_gqa")), "--contexts", "64", "128", "--steps", "1", "5",
                     "--repeats", "1", "--warmup", "1", "--compile", "default", "--compile-backend", "aot_eager",
                     "--out", str(out)])
    finally:
        torch._dynamo.reset()
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 4 and {r["attention"] for r in rows} == {"sdpa+compile:default"}
    assert all(float(r["median_ms"]) > 0 for r in rows)


def test_cost_curve_interpolates_and_gives_break_even_tau(tmp_path):
    from fafo.bench.cost_curve import CostCurve
    from fafo.errors import ConfigError
    import pytest

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
    with pytest.raises(ConfigError, match="bench.cost_curve"):
        CostCurve.load(tmp_path / "missing.csv")


def test_bench_engine_curve_prints_break_even_tau(tmp_path, checkpoint, capsys):
    spec = importlib.util.spec_from_file_location("bench_engine", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "curve.csv"
    module.main(["--model", str(checkpoint("llama_gqa")), "--contexts", "32", "64", "--steps", "1", "8", "64",
                 "--repeats", "2", "--warmup", "1", "--out", str(out), "--curve"])
    rows = list(csv.DictReader(open(out)))
    assert {int(r["step_tokens"]) for r in rows} == {1, 8, 64} and all(int(r["threads"]) >= 1 for r in rows)
    printed = capsys.readouterr().out
    assert "break-even tau" in printed
    fafo = next(line for line in printed.splitlines() if line.startswith("fafo (n=m=40, k=6)"))
    assert fafo.split()[3] == "481" and float(fafo.split()[-1]) > 1.0  # a 481-token forward costs more than one
    two = next(line for line in printed.splitlines() if line.startswith("fafo-2forward"))
    assert two.split()[3] == "241+241"


@pytest.mark.parametrize("mode", ["vs-hf", "fafo-step"])
def test_bench_engine_decode_modes_write_their_rows(tmp_path, mode, monkeypatch):
    monkeypatch.setenv("FAFO_CACHE", str(tmp_path))  # where the random model is built
    spec = importlib.util.spec_from_file_location("bench_engine", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    small = '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, ' \
            '"intermediate_size": 128, "vocab_size": 512}'
    out = tmp_path / "decode.csv"
    module.main([mode, "--threads", "1", "--rounds", "1", "--prompts", "32", "--new-tokens", "6", "--context", "40",
                 "--spec", small, "--out", str(out)])
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0]) == module.DECODE_COLUMNS and {r["bench"] for r in rows} == {mode}
    assert all(float(r["median_ms"]) > 0 and r["threads"] == "1" for r in rows)
    if mode == "vs-hf":  # ours vs transformers, the same greedy tokens
        assert [r["variant"] for r in rows] == ["ours", "hf-dynamic", "hf-static"]
        assert all(r["note"] == "tokens equal to HF: True" for r in rows)
    else:  # fused vs two forwards, on both attention paths, with attention's share of the step
        assert [r["variant"] for r in rows] == ["dense fused", "dense 2forward", "sdpa fused", "sdpa 2forward"]
        assert all(0 < float(r["attention_share"]) < 1 for r in rows)
