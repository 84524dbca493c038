"""Bad input through the CLI: exit status 2, exactly one ``error:`` line naming the setting, no model loaded.

The table runs ``python -m fafo.bench`` in this process (``runpy``, as ``-m`` does) with ``Engine.load`` replaced
by a test failure, so a case that would load a model fails loudly. Sweeps: a failed job makes the sweep exit 1
and is listed; fixing it and re-running leaves no ``error.txt``.
"""

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from fafo.bench.records import RecordWriter
from fafo.engine.tiny import tiny_checkpoint
from tests.helpers import REPO, cli_in_process, run_cli

CUDA = torch.cuda.is_available()

# (override string, what the one error line must contain); {tmp} is the per-test directory of bad files
CASES = [
    ("bench.dtype=float64", "bench.dtype"),
    ("bench.dtype=float8", "bench.dtype"),
    ("bench.device=tpu", "bench.device"),
    ("bench.device=mps", "bench.device"),
    ("bench.device=meta", "bench.device"),
    pytest.param("bench.device=cuda:0", "bench.device", marks=pytest.mark.skipif(CUDA, reason="CUDA present")),
    ("bench.repeats=0", "bench.repeats"),
    ("bench.repeats=abc", "bench.repeats"),
    ("bench.repeats=1.5", "bench.repeats"),
    ("bench.warmup=-1", "bench.warmup"),
    ("bench.seed=abc", "bench.seed"),
    ("bench.seed=-3", "bench.seed"),
    ("bench.max_samples=0", "bench.max_samples"),
    ("bench.max_samples=abc", "bench.max_samples"),
    ("bench.max_new_tokens=0", "bench.max_new_tokens"),
    ("bench.max_new_tokens=100000", "bench.max_new_tokens"),
    ("bench.compile=maybe", "bench.compile"),
    ("bench.compile=true bench.compile_mode=fast", "bench.compile_mode"),
    pytest.param("bench.compile=true bench.compile_mode=reduce-overhead", "bench.compile_mode",
                 marks=pytest.mark.skipif(CUDA, reason="valid on CUDA")),
    ("bench.compile=true bench.compile_attention=xformers", "bench.compile_attention"),
    ("bench.compile=true bench.compile_backend=aot_eagr", "bench.compile_backend"),  # was torch's InvalidBackend
    ("bench.max_spread=0.5", "bench.max_spread"),
    ("bench.bootstrap=-1", "bench.bootstrap"),
    ("bench.busy_load=abc", "bench.busy_load"),
    ("bench.reuse_reference=maybe", "bench.reuse_reference"),
    ("bench.ignore_eos=maybe", "bench.ignore_eos"),
    ("bench.gpu_mem_gb=abc", "bench.gpu_mem_gb"),
    ("bench.output_dir={tmp}/afile/runs", "bench.output_dir"),
    ("+bench.repeat=3", "bench.repeat"),
    ("bench.output_dir=", "bench.output_dir"),  # $OUT unset: not the filesystem's root
    ("bench.cost_curve=", "bench.cost_curve"),
    ("model.path=", "model.path"),  # not the group's tiny model, silently
    ("model.path=''", "model.path"),
    ("model.gguf_file=", "model.gguf_file"),
    ("model.name=", "model.name"),
    ("task=prompts task.data_path=", "task.data_path"),
    ("model.max_len=-5", "model.max_len"),
    ("model.max_len=abc", "model.max_len"),
    ("model.attention=xformers", "model.attention"),
    ("model=llama2_7b_chat", "model.path"),
    ("model.path={tmp}/nowhere", "model.path"),
    ("model.path={tmp}/corrupt", "config.json"),
    ("model.path={tmp}/empty", "config.json"),
    ("model.path={tmp}/gpt2", "model.path"),
    ("model.path={tmp}/gelu", "hidden_act='gelu'"),  # a Llama the engine would compute with SiLU
    ("model.path={tmp}/mlpbias", "mlp_bias"),
    ("model.max_len=256 method=fafo_stream bench.max_new_tokens=8", "method.n"),
    ("method=fafo_stream method.n=0", "method.n"),
    ("method=fafo_stream method.k=0", "method.k"),
    ("method=fafo_stream method.n=abc", "method.n"),
    ("method=fafo_stream method.fused=maybe", "method.fused"),
    ("method=fafo_stream method.compress.local=100000 model.max_len=4096 bench.max_samples=1",
     "method.compress.local"),
    ("method=fafo_stream method.compress.sink=-1", "method.compress"),
    ("method=fafo_stream method.compress.local=abc", "method.compress.local"),
    ("method=lookahead method.window=0", "method.window"),
    ("method=lookahead method.level=1", "method.level"),
    ("method=swift method.skip_ratio=2", "method.skip_ratio"),
    ("method=triforce method.gamma1=0", "method.gamma1"),
    ("+method.foo=1", "method.foo"),
    ("sampling.temperature=-1", "sampling.temperature"),
    ("sampling.temperature=abc", "sampling.temperature"),
    ("sampling.top_p=1.5", "sampling.top_p"),
    ("sampling.top_k=-2", "sampling.top_k"),
    ("+sampling.min_p=2", "sampling.min_p"),
    ("sampling=model_default model.path={tmp}/nogen", "generation_config"),
    ("task.ids=[nope]", "task.ids"),
    ("task.limit=0", "task.limit"),
    ("task=prompts", "task.data_path"),
    ("task=prompts task.data_path={tmp}/nowhere.jsonl", "task.data_path"),
    ("task=prompts task.data_path={tmp}/bad.jsonl", "task.data_path"),
    ("task=mt_bench", "task.data_path"),
    ("task=gsm8k task.data_path={tmp}/nowhere", "task.data_path"),
    ("wandb.mode=sometimes", "wandb.mode"),
    ("+nosuchgroup=foo", "nosuchgroup"),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "afile").write_text("a regular file\n")
    for name, text in (("corrupt", '{"model_type": "llama", "hidden'), ("empty", ""),
                       ("gpt2", '{"model_type": "gpt2"}')):
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(text)
    (tmp / "bad.jsonl").write_text('{"id": 1, "text": "fine"}\n{oops\n')
    tiny = tiny_checkpoint(OmegaConf.to_container(OmegaConf.load(REPO / "conf/model/tiny_llama.yaml").tiny))
    shutil.copytree(tiny, tmp / "nogen")
    (tmp / "nogen" / "generation_config.json").unlink()
    for name, setting in (("gelu", {"hidden_act": "gelu"}), ("mlpbias", {"mlp_bias": True})):  # complete otherwise
        shutil.copytree(tiny, tmp / name)
        config = json.loads((tiny / "config.json").read_text())
        (tmp / name / "config.json").write_text(json.dumps({**config, **setting}))
    return tmp


@pytest.mark.parametrize("overrides,setting", CASES)
def test_bad_input_gives_one_line_before_any_model_loads(overrides, setting, bad_files, tmp_path, monkeypatch,
                                                         capsys):
    args = overrides.format(tmp=bad_files).split()
    code, lines = cli_in_process(args, monkeypatch, capsys, tmp_path / "runs")
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: ") and setting in lines[0], lines


def test_the_table_has_at_least_50_cases():
    assert len(CASES) >= 50


def test_a_busy_run_directory_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    holder = RecordWriter(tmp_path / "runs" / "tiny_llama" / "builtin" / "vanilla" / "default")
    try:
        code, lines = cli_in_process([], monkeypatch, capsys, tmp_path / "runs")
    finally:
        holder.close()
    assert code == 2 and len(lines) == 1 and "being written by another job" in lines[0], lines


def test_a_cuda_index_past_the_machines_gpus_is_refused(tmp_path, monkeypatch, capsys):
    """cuda:1 on a one-GPU node is one line naming the indices there are (torch would fail at the first tensor)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, lines = cli_in_process(["bench.device=cuda:1"], monkeypatch, capsys, tmp_path / "runs")
    assert code == 2 and len(lines) == 1 and "has 1 CUDA device(s); use cuda:0" in lines[0], lines


def test_unreachable_hub_fails_fast(monkeypatch):
    import socket

    from tasks.sources import read_hub
    from fafo.errors import ConfigError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)

    def no_network(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "create_connection", no_network)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="task.data_path.*unreachable"):
        read_hub("HuggingFaceH4/mt_bench_prompts", None, "train", None, "question.jsonl")
    assert time.perf_counter() - t0 < 15  # no half-minute of retries


@pytest.mark.slow
def test_sweep_with_a_failing_job_exits_1_and_a_fixed_rerun_leaves_no_error_txt(tmp_path):
    good, late = tmp_path / "good.jsonl", tmp_path / "late.jsonl"
    good.write_text(json.dumps({"id": "a", "text": "def add(a, b):\n"}) + "\n")
    args = ["-m", "task=prompts", f"task.data_path={good},{late}", "bench.max_new_tokens=3", "bench.warmup=0",
            f"bench.output_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "bench.progress=false"]
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 1, first.stderr[-2000:]
    failed = [line for line in first.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and f"task.data_path={late}" in failed[0] and "does not exist" in failed[0]
    assert sum(line.startswith("ok ") for line in first.stdout.splitlines()) == 1
    assert "1 of 2 sweep jobs failed" in first.stderr
    assert len(list((tmp_path / "runs").rglob("error.txt"))) == 1
    late.write_text(json.dumps({"id": "b", "text": "Hello"}) + "\n")  # the fix: the missing file appears
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    lines = again.stdout.splitlines()
    assert "2 jobs, 0 failed" in "\n".join(lines) and sum(line.startswith("ok ") for line in lines) == 2
    assert not list((tmp_path / "runs").rglob("error.txt"))
    assert not list((tmp_path / "runs").glob(".sweeps/*"))
    ok_line = next(line for line in lines if line.startswith("ok "))
    assert "vanilla" in ok_line and "prompts" in ok_line and "tau 1.000" in ok_line and "speedup" in ok_line


@pytest.mark.slow
@pytest.mark.parametrize("plan", [True, False])
def test_a_sweep_names_each_distinct_error_once_with_its_job_count(tmp_path, plan):
    """Four jobs stopped by two missing files: the sweep's end says two problems, two jobs each, once."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    res = run_cli("-m", "task=prompts", f"task.data_path={a},{b}", "method=vanilla,prompt_lookup",
                  f"bench.plan={str(plan).lower()}", f"bench.output_dir={tmp_path / 'runs'}", cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.startswith("-- "))
    want = "what stops them: 2 distinct problem(s)" if plan else "why they failed: 2 distinct error(s)"
    assert want in lines[heading]
    grouped = lines[heading + 1:]
    assert len(grouped) == 2 and all(line.startswith("   2 job(s): task.data_path=") for line in grouped), grouped
    assert str(a) in grouped[0] and str(b) in grouped[1] and "does not exist" in grouped[0]


@pytest.mark.slow
def test_single_run_error_txt_is_removed_after_success(tmp_path):
    run = Path(tmp_path)
    args = ["bench.max_new_tokens=2", "bench.max_samples=1", "bench.warmup=0", f"bench.output_dir={run}",
            "wandb.mode=disabled", "bench.progress=false"]
    stale = run / "tiny_llama" / "builtin" / "vanilla" / "bench.max_new_tokens=2,bench.max_samples=1,bench.warmup=0"
    stale.mkdir(parents=True)
    (stale / "error.txt").write_text("error: from an earlier attempt\n")
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (stale / "summary.json").exists() and not (stale / "error.txt").exists()
