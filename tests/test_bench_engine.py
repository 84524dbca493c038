"""Smoke test of scripts/bench_engine.py: it runs on CPU in CI-size settings and writes its CSV (no timing checks)."""

import csv
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_engine.py"


def test_bench_engine_writes_a_row_per_context_and_step(tmp_path, checkpoint):
    spec = importlib.util.spec_from_file_location("bench_engine", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "engine.csv"
    module.main(["--model", str(checkpoint("llama_gqa")), "--contexts", "64", "128", "--steps", "1", "9",
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
