"""bench.batch_size > 1 through the runner and the reports: rows per request token-identical to a batch-1 run, the
time accounting (each request's share sums to the batch's wall time), batch_steps.jsonl, the metrics under load,
the refusals before a model loads, and experiment=batch_sweep with scripts/plot.py --batch through the real CLI."""

import json
import math
from types import SimpleNamespace

import pytest

from fafo.batch import BatchStep, RequestTimes
from fafo.bench.batch_metrics import batch_summary, read_steps
from fafo.bench.batch_run import BATCH_COLUMNS, shares
from fafo.bench.records import SAMPLE_COLUMNS
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.bench.tools.batch_curve import break_even
from fafo.engine.engine import Engine
from fafo.errors import ConfigError
from tests.helpers import import_script, make_cfg, read_rows, run_cli

SETTINGS = ("method=token_recycling", "bench.max_new_tokens=12", "bench.max_samples=6", "bench.bootstrap=50")


def _tokens(run_dir) -> dict:
    return {(o["sample_id"], o["turn"]): o["tokens"]
            for o in map(json.loads, (run_dir / "outputs.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_a_batched_run_matches_batch_one_per_request_and_accounts_for_the_batch_time(tmp_path, batching):
    one, batched = tmp_path / "one", tmp_path / "batched"
    Runner().run(resolve(make_cfg(tmp_path, *SETTINGS), one), report=False)
    summary = Runner().run(resolve(make_cfg(tmp_path, *SETTINGS, "bench.batch_size=3", f"bench.batching={batching}"),
                                   batched), report=False)
    rows = read_rows(batched)
    assert list(rows[0]) == SAMPLE_COLUMNS[:-1] + BATCH_COLUMNS + ["crc"]
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}  # 6 samples, two of them two-turn
    assert all(r["exact_match"] == "True" and r["batch_size"] == "3" and r["batching"] == batching for r in rows)
    assert _tokens(batched) == _tokens(one)  # lossless per request, second turns built from the batch's answers
    steps = read_steps(batched)
    assert [(p["decoder"], p["turn"]) for p in steps] == [("reference", 0), ("method", 0), ("reference", 1),
                                                          ("method", 1)]
    method = [p for p in steps if p["decoder"] == "method"]
    for p in method:
        assert all(1 <= len(s["rows"]) <= 3 for s in p["steps"]) and max(len(s["rows"]) for s in p["steps"]) == \
            min(3, len(p["requests"]))
        ends = [s["end_s"] for s in p["steps"]]
        assert ends == sorted(ends) and ends[-1] <= p["wall_s"]
        mine = [r for r in rows if int(r["turn"]) == p["turn"]]
        # every request's share of the steps it was in, plus its own prefill: the batch's time, all of it
        assert sum(float(r["total_s"]) for r in mine) == pytest.approx(p["wall_s"], rel=0.05)
        assert p["tokens"] == sum(int(r["new_tokens"]) for r in mine)
        counted = {sid: 0 for sid in p["requests"]}
        for s in p["steps"]:
            for sid, n in zip(s["rows"], s["new_tokens"]):
                counted[sid] += n
        assert all(counted[r["sample_id"]] == int(r["new_tokens"]) - 1 for r in mine)  # the first is the prefill's
    assert all(float(r["latency_s"]) >= float(r["total_s"]) - 1e-9 for r in rows)  # waits for its neighbours
    saved = json.loads((batched / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary)) and saved["batch_size"] == 3 and saved["batching"] == batching
    tokens = sum(sum(s["new_tokens"]) for p in method for s in p["steps"])
    active = sum(len(s["rows"]) for p in method for s in p["steps"])
    assert saved["tau_step"] == pytest.approx(tokens / active) and saved["n_steps"] == sum(len(p["steps"])
                                                                                           for p in method)
    per_sample = {}  # the interval is over the 6 samples (a request's steps together), not over the steps
    for s in (s for p in method for s in p["steps"]):
        for sid, n in zip(s["rows"], s["new_tokens"]):
            per_sample.setdefault(sid, []).append(n)
    taus = [sum(v) / len(v) for v in per_sample.values()]
    assert len(taus) == 6 and saved["tau_step_range"] == pytest.approx([min(taus), max(taus)])
    assert saved["n_requests"] == 8 and saved["latency_p50"] <= saved["latency_p90"] <= saved["latency_p99"]
    assert saved["latency_p50_range"][0] <= saved["latency_p50"] <= saved["latency_p50_range"][1]  # 8 < 10 requests
    assert saved["batch_tokens_per_s"] == pytest.approx(sum(p["tokens"] for p in method)
                                                        / sum(p["wall_s"] for p in method))
    assert "speedup_range" in saved and saved["exact_match_rate"] == 1.0


def test_the_vanilla_beside_a_batched_method_is_charged_only_its_own_cache_slots(tmp_path):
    """The run's shared cache is allocated for the larger need (Lookahead's window of 60 adds scratch slots to each
    row); the vanilla timed beside the method has the peak vanilla has alone at the same batch size."""
    common = ("bench.max_new_tokens=8", "task.ids=[chat-01,code-01]", "bench.batch_size=2")
    for name, method in (("look", ("method=lookahead", "method.window=60")), ("alone", ("method=vanilla",))):
        Runner().run(resolve(make_cfg(tmp_path, *method, *common), tmp_path / name), report=False)
    look, alone = read_rows(tmp_path / "look"), read_rows(tmp_path / "alone")
    assert {float(r["ref_peak_mem_mb"]) for r in look} == {float(r["peak_mem_mb"]) for r in alone}  # one value
    assert all(float(r["peak_mem_mb"]) > float(r["ref_peak_mem_mb"]) for r in look)


def test_request_shares_split_each_step_among_its_active_requests():
    """Two requests admitted together (prefills 1 s and 2 s), three steps of 0.6 s: both in the first two, one in
    the last; a third admitted (continuous) before the third step with a 1 s prefill that the step's time leaves out."""
    times = [RequestTimes(0.0, 1.0, 4.8), RequestTimes(1.0, 3.0, 4.2), RequestTimes(4.2, 5.2, 5.8)]
    steps = [BatchStep([0, 1], [1, 1], 3.6), BatchStep([0, 1], [1, 1], 4.2), BatchStep([0, 2], [1, 1], 5.8)]
    got = shares(SimpleNamespace(times=times, steps=steps, start_s=0.0))
    assert [p for p, _ in got] == pytest.approx([1.0, 2.0, 1.0])
    assert [d for _, d in got] == pytest.approx([0.3 + 0.3 + 0.3, 0.3 + 0.3, 0.3])
    assert sum(p + d for p, d in got) == pytest.approx(5.8)


def test_break_even_batch_is_where_the_speedup_crosses_one():
    pts = lambda *s: [{"batch": 2**i, "speedup": v} for i, v in enumerate(s)]  # noqa: E731
    b, text = break_even(pts(1.5, 1.2, 0.8, 0.6))  # 1.2 at 2, 0.8 at 4: halfway in log2
    assert b == pytest.approx(2 * math.sqrt(2)) and text == "2.8"
    assert break_even(pts(0.9, 0.8)) == (None, "< 1")
    assert break_even(pts(1.9, 1.4, 1.1)) == (None, "> 4")


def test_batch_summary_is_empty_for_a_batch_one_run_and_old_run_directories(tmp_path):
    assert batch_summary([{"status": "ok", "sample_id": "a", "turn": "0"}], []) == {}
    assert read_steps(tmp_path) == []


@pytest.mark.parametrize("override, message", [
    (("method=triforce", "bench.batch_size=2"), "method triforce cannot decode bench.batch_size=2"),
    (("method=swift", "bench.batch_size=4"), "set bench.batch_size=1"),
    (("bench.batch_size=2", "bench.reuse_reference=true"), "bench.reuse_reference=true"),
    (("bench.batch_size=0",), "bench.batch_size"),
    (("bench.batching=dynamic",), "bench.batching"),
])
def test_batch_settings_a_run_cannot_honour_fail_before_a_model_loads(tmp_path, monkeypatch, override, message):
    monkeypatch.setattr(Engine, "load", lambda *a, **k: pytest.fail("model loaded before validation"))
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")) as err:
        resolve(make_cfg(tmp_path, *override), tmp_path / "run")
    assert "\n" not in str(err.value)


@pytest.mark.slow  # a sweep of four CLI jobs and the plot script in subprocesses
def test_batch_sweep_through_the_cli_and_its_plot(tmp_path):
    proc = run_cli("-m", "experiment=batch_sweep", "model=tiny_llama", "method=prompt_lookup,suffix_decoding",
                   "bench.batch_size=1,2",
                   "bench.max_samples=3", "bench.max_new_tokens=8", "bench.bootstrap=20", "bench.progress=false",
                   f"bench.output_dir={tmp_path}/sweep", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = sorted((tmp_path / "sweep").rglob("summary.json"))
    assert len(summaries) == 4
    got = {(s["method"], s.get("batch_size", 1)) for s in map(lambda p: json.loads(p.read_text()), summaries)}
    assert got == {(m, b) for m in ("prompt-lookup", "suffix-decoding") for b in (1, 2)}
    assert all(json.loads(p.read_text())["exact_match_rate"] == 1.0 for p in summaries)
    plot = import_script("plot")
    assert plot.main([str(tmp_path / "sweep"), "--batch", "--wandb-mode", "disabled"]) == 0
    assert (tmp_path / "sweep" / "plots" / "batch_sweep.png").stat().st_size > 0
    from fafo.bench.tools.batch_curve import series, table

    data = series([tmp_path / "sweep"])
    assert [e["label"] for e in data] == ["prompt-lookup", "suffix-decoding"]
    assert all([p["batch"] for p in e["points"]] == [1, 2] and all(p["n"].startswith("3") for p in e["points"])
               for e in data)
    assert all(p["interval"] is not None and p["tokens_per_s"] and p["ref_tokens_per_s"]
               for e in data for p in e["points"])
    text = table(data)
    assert text.count("| prompt-lookup |") == 2 and "break-even batch" in text and "{" in text


def test_batch_curve_refuses_one_batch_size_and_names_runs_it_does_not_show(tmp_path):
    from fafo.bench.tools.batch_curve import series, table, write
    from tests.report_runs import write_run

    write_run(tmp_path, "b1", "m", "lookahead", seed=1, config={"bench": {"batch_size": 1}})
    with pytest.raises(SystemExit, match=r"one batch size per method \(bench\.batch_size=1\), so there is no curve"):
        write([tmp_path])
    for rel, seed, temperature in (("b2/t0", 2, 0.0), ("b2/t7", 3, 0.7)):
        write_run(tmp_path, rel, "m", "lookahead", seed=seed,
                  config={"bench": {"batch_size": 2}, "sampling": {"temperature": temperature}})
    (entry,) = series([tmp_path])
    assert [p["batch"] for p in entry["points"]] == [1, 2] and entry["hidden"] == 1
    assert entry["hidden_keys"] == ["sampling.temperature"]
    assert "1 run(s) not shown: each shares its (method, batch size) with a more complete run, shown instead; " \
           "they differ in sampling.temperature" in table([entry])
    assert write([tmp_path], tmp_path / "plots")[1][0].stat().st_size > 0


def test_a_compiled_batched_run_compiles_no_graph_while_timed(tmp_path):
    """Compiled steps at bench.batch_size=4 over 6 samples (some two-turn): timed passes of 4, 2 and 1 active rows
    (as batches shrink and the last samples come) find every graph compiled by the warm-up, which decodes a batch
    per row bucket, and every request equals vanilla."""
    run = tmp_path / "run"
    Runner().run(resolve(make_cfg(tmp_path, *SETTINGS, "bench.batch_size=4", "bench.compile=true",
                                  "bench.compile_backend=aot_eager"), run), report=False)
    rows = read_rows(run)
    assert {r["status"] for r in rows} == {"ok"} and all(r["exact_match"] == "True" for r in rows)
    assert [r["compiles"] for r in rows] == ["0"] * len(rows)
    assert min(len(s["rows"]) for p in read_steps(run) for s in p["steps"]) == 1  # a bucket of one row was timed
