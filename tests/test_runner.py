"""The runner end to end on the tiny model: records, metrics, resume, reference reuse, failures, sweeps."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from baselines.prompt_lookup import PromptLookupDecoder
from baselines.vanilla import VanillaDecoder
from fafo.bench.records import SAMPLE_COLUMNS
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.engine.engine import Engine
from fafo.errors import ConfigError
from tests.helpers import REPO, make_cfg, read_rows, run_cli

SUMMARY_KEYS = {"model", "method", "task", "n_samples", "new_tokens", "tau", "tau_request", "tokens_per_s",
                "speedup", "speedup_mean", "peak_mem_mb", "exact_match_rate", "dtype", "device", "torch",
                "transformers", "git_sha"}


@dataclass
class FailingDecoder(VanillaDecoder):
    """Vanilla that raises on one sample (recognised by its prompt length) or after `crash_after` calls."""

    fail_prompt_len: int = -1
    crash_after: int = -1
    calls: int = 0

    def generate(self, engine, prompt_ids, max_new_tokens, *args, **kwargs):
        FailingDecoder.calls += 1
        if self.crash_after >= 0 and FailingDecoder.calls > self.crash_after:
            raise KeyboardInterrupt  # a killed process: nothing after this point runs
        if len(prompt_ids) == self.fail_prompt_len:
            raise RuntimeError("CUDA out of memory (simulated)")
        return super().generate(engine, prompt_ids, max_new_tokens, *args, **kwargs)


def test_end_to_end_records_and_metrics(tmp_path):
    run_dir = tmp_path / "run"
    summary = Runner().run(resolve(make_cfg(tmp_path, "bench.max_new_tokens=12", "bench.max_samples=6"), run_dir))
    rows = read_rows(run_dir)
    assert list(rows[0]) == SAMPLE_COLUMNS
    assert {r["status"] for r in rows} == {"ok"}
    assert len(rows) == 8  # 6 samples, two of them two-turn
    assert all(r["exact_match"] == "True" and r["first_mismatch"] == "-1" for r in rows)
    assert all(float(r["tau"]) == 1.0 and int(r["forwards"]) == int(r["new_tokens"]) - 1 for r in rows)
    assert all(float(r["prefill_s"]) + float(r["decode_s"]) == pytest.approx(float(r["total_s"])) for r in rows)
    saved = json.loads((run_dir / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(saved) and saved == json.loads(json.dumps(summary))
    assert saved["exact_match_rate"] == 1.0 and saved["tau"] == 1.0 and saved["n_samples"] == 6
    assert saved["accept_hist"] == {"1": sum(int(r["forwards"]) for r in rows)}  # vanilla: one token per forward
    assert saved["speedup"] == pytest.approx(
        sum(float(r["ref_total_s"]) for r in rows) / sum(float(r["total_s"]) for r in rows))
    outputs = [json.loads(line) for line in (run_dir / "outputs.jsonl").read_text().splitlines()]
    assert [(o["sample_id"], o["turn"]) for o in outputs] == [(r["sample_id"], int(r["turn"])) for r in rows]
    assert all(len(o["tokens"]) == int(r["new_tokens"]) for o, r in zip(outputs, rows))


def test_second_turn_is_built_from_first_answer(tmp_path):
    run_dir = tmp_path / "run"
    Runner().run(resolve(make_cfg(tmp_path, "bench.max_new_tokens=8", "task.ids=[multi-01]"), run_dir))
    rows = read_rows(run_dir)
    assert [r["turn"] for r in rows] == ["0", "1"]
    first = json.loads((run_dir / "outputs.jsonl").read_text().splitlines()[0])
    assert int(rows[1]["prompt_tokens"]) > int(rows[0]["prompt_tokens"]) + len(first["tokens"]) - 2


def test_crashed_run_resumes_without_redoing_or_losing_rows(tmp_path):
    run_dir = tmp_path / "run"
    cfg = make_cfg(tmp_path, "bench.max_new_tokens=6", "bench.warmup=0", "bench.reuse_reference=false")
    OmegaConf.update(cfg, "method._target_", "tests.test_runner.FailingDecoder")
    OmegaConf.update(cfg, "method.crash_after", 7, force_add=True)
    FailingDecoder.calls = 0
    with pytest.raises(KeyboardInterrupt):
        Runner().run(resolve(cfg, run_dir))
    before = read_rows(run_dir)
    assert 0 < len(before) < 14 and not (run_dir / "summary.json").exists()
    with open(run_dir / "samples.csv", "a") as f:  # killed in the middle of writing a row
        f.write("chat-09,0,0,chat,tiny-lla")
    OmegaConf.update(cfg, "method.crash_after", -1)
    summary = Runner().run(resolve(cfg, run_dir))
    after = read_rows(run_dir)
    keys = [(r["sample_id"], r["turn"], r["repeat"]) for r in after]
    assert len(keys) == len(set(keys)) == 14  # 12 samples, two of them two-turn: each exactly once
    assert after[: len(before)] == before  # nothing already written was lost or rewritten
    assert summary["n_samples"] == 12 and summary["exact_match_rate"] == 1.0


def test_failing_sample_is_recorded_and_the_run_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    cfg = make_cfg(tmp_path, "bench.max_new_tokens=4", "bench.warmup=0", "task.ids=[chat-01,multi-01,code-01]")
    spec = resolve(cfg, run_dir)
    bad = len(spec.task.prompt_ids(spec.ckpt.tokenizer, spec.samples[1], 0, []))
    OmegaConf.update(cfg, "method._target_", "tests.test_runner.FailingDecoder")
    OmegaConf.update(cfg, "method.fail_prompt_len", bad, force_add=True)
    summary = Runner().run(resolve(cfg, run_dir))
    status = {(r["sample_id"], r["turn"]): r["status"] for r in read_rows(run_dir)}
    assert status[("chat-01", "0")] == status[("code-01", "0")] == "ok"
    assert status[("multi-01", "0")].startswith("error: RuntimeError: CUDA out of memory")
    assert status[("multi-01", "1")] == "skipped: turn 0 failed"
    assert summary["n_failed"] == 2 and summary["n_samples"] == 2


def test_reference_timing_is_interleaved_unless_a_stored_one_qualifies(tmp_path):
    Runner().run(resolve(make_cfg(tmp_path, "bench.max_new_tokens=5", "bench.max_samples=3"), tmp_path / "a"))
    assert all(r["ref_source"] == "interleaved" for r in read_rows(tmp_path / "a"))
    # one stored timing per sample is never reused: timed again beside the method
    reuse = ["bench.reuse_reference=true", "bench.busy_load=1000"]
    summary = Runner().run(resolve(make_cfg(tmp_path, "bench.max_new_tokens=5", "bench.max_samples=3", *reuse),
                     tmp_path / "b"))
    assert all(r["ref_source"] == "interleaved" for r in read_rows(tmp_path / "b"))
    assert summary["ref_reuse_refused"]["n"] == 3 and summary["exact_match_rate"] == 1.0
    summary = Runner().run(resolve(make_cfg(tmp_path, "bench.max_new_tokens=4", "bench.max_samples=2",
                                            "bench.repeats=3", "bench.max_spread=1000"), tmp_path / "d"))
    rows = read_rows(tmp_path / "d")
    assert sorted({r["repeat"] for r in rows}) == ["0", "1", "2"] and len(rows) == 6
    per_repeat = [sum(float(r["ref_total_s"]) for r in rows if r["repeat"] == k)
                  / sum(float(r["total_s"]) for r in rows if r["repeat"] == k) for k in "012"]
    assert summary["speedup_min"] == pytest.approx(min(per_repeat))
    assert summary["speedup_max"] == pytest.approx(max(per_repeat))
    lo, hi = summary["speedup_range"]  # 2 samples: the per-sample range, never a "95 %" interval
    assert lo <= summary["speedup"] <= hi and "speedup_ci95" not in summary and summary["interval"] == "range"
    assert all(int(r["threads"]) >= 1 and r["load"] != "" for r in rows)
    assert {"threads", "load_start", "load_end", "cpu_name"} <= set(summary)
    # three repeats within the spread bound: reused by a later run that asks for it, and reported as such
    summary = Runner().run(resolve(make_cfg(tmp_path, "bench.max_new_tokens=4", "bench.max_samples=2",
                                            "bench.repeats=3", "bench.max_spread=1000", "bench.reuse_max_spread=1000",
                                            *reuse), tmp_path / "e"))
    assert {r["ref_source"] for r in read_rows(tmp_path / "e")} == {"stored"}
    assert summary["ref_sources"] == {"stored": 6}
    # the key holds the thread count (and the host and the engine's commit): other threads, no reuse
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        Runner().run(resolve(make_cfg(tmp_path, "bench.max_new_tokens=4", "bench.max_samples=2", "bench.repeats=3",
                        "bench.max_spread=1000", "bench.reuse_max_spread=1000", *reuse), tmp_path / "f"))
    finally:
        torch.set_num_threads(threads)
    assert {r["ref_source"] for r in read_rows(tmp_path / "f")} == {"interleaved"}


@pytest.mark.parametrize("override,setting", [
    ("bench.dtype=float64", "bench.dtype"),
    ("bench.device=cuda:0", "bench.device"),
    ("bench.repeats=0", "bench.repeats"),
    ("bench.max_new_tokens=100000", "bench.max_new_tokens"),
    ("task.ids=[nope]", "task.ids"),
    ("sampling.temperature=-1", "sampling.temperature"),
    ("model.attention=xformers", "model.attention"),
    ("model=llama2_7b_chat", "model.path"),
])
def test_bad_settings_fail_before_loading_a_model(tmp_path, monkeypatch, override, setting):
    monkeypatch.setattr(Engine, "load", lambda *a, **k: pytest.fail("model loaded before validation"))
    if override.startswith("bench.device=cuda"):
        pytest.importorskip("torch").cuda.is_available() and pytest.skip("CUDA present")
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")) as err:
        Runner().run(resolve(make_cfg(tmp_path, override), tmp_path / "run"))
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_cli_prints_one_error_line_and_exits_2(tmp_path):
    proc = run_cli("bench.dtype=float64", f"bench.output_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: bench.dtype='float64' must be one of auto, float32, float16, bfloat16 (auto = float16 on CUDA, "
        "float32 on CPU)"]
    proc = run_cli("method=nope", cwd=tmp_path)  # an unknown option: one line before Hydra (fafo.bench.cli_check)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: method=nope: no such method option (the options: conf/method/*.yaml)"]


@pytest.mark.slow
def test_two_by_two_multirun_completes(tmp_path):
    proc = run_cli("-m", "model=tiny_llama,tiny_qwen2", "bench.max_new_tokens=4,8", "bench.max_samples=2",
                   f"bench.output_dir={tmp_path}", "wandb.mode=disabled", "bench.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summaries = sorted(tmp_path.glob("*/builtin/vanilla/*/summary.json"))
    assert len(summaries) == 4, proc.stdout[-2000:]
    got = {(json.loads(s.read_text())["model"], s.parent.name) for s in summaries}
    assert got == {(m, f"bench.max_new_tokens={n},bench.max_samples=2") for m in ("tiny-llama", "tiny-qwen2")
                   for n in (4, 8)}
    assert all(json.loads(s.read_text())["exact_match_rate"] == 1.0 for s in summaries)


def test_user_prompts_file_and_wandb_offline_log(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"id": 1, "text": "def add(a, b):\n"}) + "\n"
                    + json.dumps({"id": "c", "turns": ["Hi there.", "And again?"], "max_new_tokens": 3}) + "\n")
    run_dir = tmp_path / "run"
    cfg = make_cfg(tmp_path, "task=prompts", f"task.data_path={data}", "bench.max_new_tokens=null",
                   "task.max_new_tokens=5", "wandb.mode=offline")
    summary = Runner().run(resolve(cfg, run_dir))
    rows = read_rows(run_dir)
    assert [(r["sample_id"], r["turn"], r["new_tokens"]) for r in rows] == [("1", "0", "5"), ("c", "0", "3"),
                                                                          ("c", "1", "3")]
    assert summary["task"] == "prompts" and summary["exact_match_rate"] == 1.0
    assert list(run_dir.glob("wandb/offline-run-*/run-*.wandb")), "no offline W&B run was written"


@pytest.mark.slow
def test_sigkilled_run_resumes_each_sample_exactly_once(tmp_path):
    import signal
    import time

    args = ["bench.max_new_tokens=200", "bench.ignore_eos=true", "bench.warmup=0", "bench.progress=false",
            f"bench.output_dir={tmp_path}", "wandb.mode=disabled"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "fafo.bench", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    csv_path = None
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        found = list(tmp_path.glob("tiny_llama/builtin/vanilla/*/samples.csv"))
        if found and len(found[0].read_text().splitlines()) >= 3:  # header + 2 rows
            csv_path = found[0]
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert csv_path is not None and proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    killed_rows = read_rows(csv_path.parent)
    assert len(killed_rows) < 14
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_rows(csv_path.parent)
    keys = [(r["sample_id"], r["turn"]) for r in rows]
    assert len(keys) == len(set(keys)) == 14 and rows[: len(killed_rows)] == killed_rows
    outputs = [json.loads(x) for x in (csv_path.parent / "outputs.jsonl").read_text().splitlines()]
    assert sorted((o["sample_id"], o["turn"]) for o in outputs) == sorted((k, int(t)) for k, t in keys)
    assert json.loads((csv_path.parent / "summary.json").read_text())["n_samples"] == 12


@pytest.mark.slow
def test_ctrl_c_is_one_line_exit_130_and_the_same_command_resumes(tmp_path):
    """SIGINT (Ctrl-C) mid-run: no traceback, the rows written are kept and counted, the rerun skips them."""
    import signal
    import time

    args = ["bench.max_new_tokens=200", "bench.ignore_eos=true", "bench.warmup=0", "bench.progress=false",
            "task.ids=[chat-01,chat-02,chat-03,chat-04]", f"bench.output_dir={tmp_path}", "wandb.mode=disabled"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "fafo.bench", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal's
    deadline, sent = time.time() + 300, False
    while time.time() < deadline and proc.poll() is None:
        found = list(tmp_path.glob("tiny_llama/builtin/vanilla/*/samples.csv"))
        if found and len(found[0].read_text().splitlines()) >= 3:  # header + 2 rows
            proc.send_signal(signal.SIGINT)
            sent = True
            break
        time.sleep(0.02)
    err = proc.communicate(timeout=120)[1]
    assert sent and proc.returncode == 130, err[-2000:]
    (run_dir,) = {p.parent for p in tmp_path.glob("tiny_llama/builtin/vanilla/*/samples.csv")}
    kept = read_rows(run_dir)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (  # a busy machine's warning may come first
        f"interrupted: {run_dir} keeps the {len(kept)} (sample, turn, repeat)s on record; the same command resumes "
        f"it"), err[-2000:]
    assert 2 <= len(kept) < 4 and not (run_dir / "error.txt").exists()
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 0 and f"resuming {run_dir}: {len(kept)} " in done.stderr, done.stderr[-2000:]
    rows = read_rows(run_dir)
    assert len(rows) == 4 and rows[: len(kept)] == kept


@pytest.mark.parametrize("method,label", [("fafo_stream", "fafo-stream"), ("fafo_2forward", "fafo-2forward-stream")])
def test_fafo_through_the_runner_is_lossless(tmp_path, method, label):
    cfg = make_cfg(tmp_path, f"method={method}", "method.n=6", "method.k=3", "bench.max_new_tokens=12",
                   "bench.max_samples=4", "method.compress.local=16")
    summary = Runner().run(resolve(cfg, tmp_path / "run"))
    rows = read_rows(tmp_path / "run")
    assert summary["exact_match_rate"] == 1.0 and summary["method"] == label
    assert all(int(r["forwards"]) <= int(r["new_tokens"]) - 1 for r in rows)
    assert summary["tau"] == pytest.approx(summary["new_tokens"] / sum(int(r["forwards"]) + 1 for r in rows))


def test_a_second_writer_of_the_same_run_directory_is_refused(tmp_path):
    from fafo.bench.records import RecordWriter

    first = RecordWriter(tmp_path / "run")
    with pytest.raises(ConfigError, match="another job"):
        RecordWriter(tmp_path / "run")
    first.close()
    RecordWriter(tmp_path / "run").close()  # free again once the first job is done


def eos_first(checkpoint, tmp_path, sample: str = "chat-01") -> Path:
    """A copy of a tiny model whose EOS is the first token it answers ``sample`` with: that answer is one token."""
    src, dst = checkpoint("llama_mha"), tmp_path / "eos_first"
    shutil.copytree(src, dst)
    probe = tmp_path / "probe"
    Runner().run(resolve(make_cfg(tmp_path, f"model.path={dst}", "bench.max_new_tokens=2", f"task.ids=[{sample}]",
                    "bench.warmup=0"), probe), report=False)
    first = json.loads((probe / "outputs.jsonl").read_text().splitlines()[0])["tokens"][0]
    (dst / "generation_config.json").write_text(json.dumps({"eos_token_id": first}))
    return dst


def test_a_one_token_answer_is_recorded_without_a_speedup(checkpoint, tmp_path):
    """An answer that is one EOS: the run (progress bar on) completes, the row has no speedup, the summary counts
    it apart and every speedup comes from the other samples alone."""
    model = eos_first(checkpoint, tmp_path)
    cfg = make_cfg(tmp_path, f"model.path={model}", "method=prompt_lookup", "bench.max_new_tokens=8",
                   "task.ids=[chat-01,code-01,struct-01]", "bench.progress=true")
    summary = Runner().run(resolve(cfg, tmp_path / "run"))
    rows = {r["sample_id"]: r for r in read_rows(tmp_path / "run")}
    one = rows["chat-01"]
    assert one["status"] == "ok" and one["new_tokens"] == "1" and one["forwards"] == "0"
    assert one["speedup"] == one["speedup_e2e"] == one["speedup_decode"] == "" and one["tau"] == ""
    long = [r for r in rows.values() if int(r["new_tokens"]) > 1]
    assert summary["n_no_decode"] == len(rows) - len(long) >= 1 and "chat-01/0" in summary["no_decode"]
    if long:  # the speedup is the other samples' alone
        want = (sum(int(r["new_tokens"]) for r in long) / sum(float(r["total_s"]) for r in long)) / \
            (sum(int(r["ref_new_tokens"]) for r in long) / sum(float(r["ref_total_s"]) for r in long))
        assert summary["speedup_e2e"] == pytest.approx(want, rel=1e-9)


@pytest.mark.slow
def test_a_checkpoint_whose_first_answer_is_eos_runs_through_the_cli_and_tables(checkpoint, tmp_path):
    model = eos_first(checkpoint, tmp_path)
    out = tmp_path / "runs"
    proc = run_cli(f"model.path={model}", "method=prompt_lookup", "bench.max_new_tokens=8", "bench.progress=true",
                   "task.ids=[chat-01,code-01]", f"bench.output_dir={out}", "wandb.mode=disabled", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (summary_path,) = out.glob("**/summary.json")
    rows = {r["sample_id"]: r for r in read_rows(summary_path.parent)}
    assert rows["chat-01"]["new_tokens"] == "1" and rows["chat-01"]["speedup"] == ""
    assert "n_no_decode" in proc.stdout and "no decode step" in proc.stdout
    tables = subprocess.run([sys.executable, str(REPO / "scripts" / "make_tables.py"), str(out)], capture_output=True,
                            text=True, cwd=tmp_path, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert tables.returncode == 0, tables.stderr[-2000:]
    assert "∅1" in tables.stdout and "no decode step" in tables.stdout


@dataclass
class EagerLookup(PromptLookupDecoder):
    """Prompt Lookup declaring forwards that cannot run compiled (as a method with its own caches would)."""

    eager_forwards: ClassVar[str] = "a test method's own eager forwards"


ONE_BASELINE = ["model=tiny_llama", "bench.max_new_tokens=8", "task.ids=[chat-01,code-01]", "bench.compile=true",
                "bench.compile_backend=aot_eager"]


def test_a_method_that_cannot_compile_races_the_compiled_vanilla(tmp_path):
    """One baseline: an eager method's speedup is against the compiled vanilla every other method races, with its
    speedup against an eager vanilla timed beside it."""
    cfg = make_cfg(tmp_path, *ONE_BASELINE)
    OmegaConf.update(cfg, "method._target_", "tests.test_runner.EagerLookup")
    OmegaConf.update(cfg, "method.name", "eager-lookup", force_add=True)
    summary = Runner().run(resolve(cfg, tmp_path / "run"), report=False)
    rows = read_rows(tmp_path / "run")
    assert summary["reference_backend"] == "compiled" and summary["method_backend"] == "eager"
    assert summary["compile"] is not None and "test method's own eager forwards" in summary["timing_note"]
    assert summary["compiled_graphs"] >= 1 and summary["n_compiled"] == 0  # vanilla's steps compiled in warm-up
    assert all(float(r["eager_ref_total_s"]) > 0 and float(r["ref_total_s"]) > 0 for r in rows)
    want = (sum(int(r["new_tokens"]) for r in rows) / sum(float(r["total_s"]) for r in rows)) / \
        (sum(int(r["ref_new_tokens"]) for r in rows) / sum(float(r["eager_ref_total_s"]) for r in rows))
    assert summary["speedup_vs_eager"] == pytest.approx(want, rel=1e-9) and summary["exact_match_rate"] == 1.0


@pytest.mark.slow
def test_a_comparison_with_an_eager_method_has_one_baseline(tmp_path):
    out = tmp_path / "out"
    proc = run_cli(*ONE_BASELINE, "compare.methods=[vanilla,lookahead,prompt_lookup]", "bench.progress=false",
                   "+compare.overrides.prompt_lookup=['method._target_=tests.test_runner.EagerLookup']",
                   f"bench.output_dir={out}", "hydra.run.dir=" + str(out / "cmp"), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = {p.parent.name: json.loads(p.read_text()) for p in (out / "cmp").glob("*/summary.json")}
    assert {s["reference_backend"] for s in summaries.values()} == {"compiled"}  # the same vanilla for every row
    assert {n: s["method_backend"] for n, s in summaries.items()} == {
        "vanilla": "compiled", "lookahead": "compiled", "prompt_lookup": "eager"}
    assert all(s["aa_speedup"] is not None for n, s in summaries.items() if n != "vanilla")  # A/A beside each
    md = (out / "cmp" / "compare.md").read_text()
    assert "every speedup is against the same compiled vanilla (one baseline per table)" in md
    assert "prompt-lookup ran eagerly (x" in md and "| prompt-lookup (eager) |" in md
