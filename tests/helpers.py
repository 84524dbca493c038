"""Helpers shared by the test modules: composing configs, running the CLI (in a subprocess or in this process),
reading a run's rows, building task files, rendering the tiny tokenizer's prompts, and the tiny draft model. Test
modules import from here, never from each other."""

import copy
import functools
import importlib
import itertools
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from torch.overrides import TorchFunctionMode

from fafo.bench.naming import CONF
from fafo.bench.records import read_rows as read_samples_csv
from fafo.engine.tiny_tokenizer import CHAT_MARKERS
from tasks.spec_bench import SUBTASKS

REPO = Path(__file__).resolve().parents[1]
# this tree first; a PYTHONPATH already set stays behind it (make test-compat's --target folder of wheels)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
       "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
# the tiny draft of TriForce and the compiled cases: one layer, hidden 32
DRAFT_SPEC = {"family": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "intermediate_size": 64, "seed": 11}
NOISE = ("Writing model shards", "warning: the machine is busy")  # stderr lines that are not the error
# paper presets (they set `paper:`); smoke, demo and equal_budget* are not paper tables
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml") if "paper" in OmegaConf.load(p))


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container's cpuset narrows; os.cpu_count does not)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cores_per_worker() -> int:
    """This test process's share of the CPUs when ``pytest -n`` (pytest-xdist) runs the suite on several workers:
    a test that runs the real model on every core would otherwise oversubscribe them (about 3x slower)."""
    return max(1, usable_cpus() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def import_script(name: str):
    """A module of ``scripts/`` (``make_tables``, ``plot``, ``generic_table``...), imported as the scripts import
    each other."""
    if str(REPO / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO / "scripts"))
    return importlib.import_module(name)


def compose_with(*overrides, conf=CONF):
    """The config a run with ``overrides`` composes, Hydra's own node included (``${hydra:...}`` resolves)."""
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    HydraConfig().set_config(cfg)  # ${hydra:...} interpolations resolve as in a real run
    return cfg


def sweep_jobs(cfg) -> list[list[str]]:
    """The override lists of a preset's multirun: the cartesian product of hydra.sweeper.params."""
    params = cfg.hydra.sweeper.params or {}
    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
            else [f"{o.get_key_element()}={o.get_value_element_as_str()}"] for o in overrides]
    return [list(job) for job in itertools.product(*axes)]


@functools.lru_cache(maxsize=None)
def _composed_jobs(preset: str) -> tuple:
    base = compose_with(f"experiment={preset}")
    return tuple((tuple(job), compose_with(f"experiment={preset}", *job)) for job in sweep_jobs(base))


def preset_jobs(preset: str):
    """Yield ``(job overrides, config)`` for every job of ``preset``'s multirun (:func:`sweep_jobs`), composed once
    per test session (the tests that walk every preset share them); each config is a fresh copy, made Hydra's
    current config as it is yielded (``${hydra:...}`` resolves as in that job's run)."""
    for job, cfg in _composed_jobs(preset):
        cfg = copy.deepcopy(cfg)
        HydraConfig().set_config(cfg)
        yield list(job), cfg


def make_cfg(tmp_path, *overrides):
    """A runner config writing under ``tmp_path``: W&B and the progress bar off."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"bench.output_dir={tmp_path}", "wandb.mode=disabled",
                                            "bench.progress=false", *overrides])


def read_rows(run_dir) -> list[dict]:
    """A run's ``samples.csv`` rows as strings, read as everything that reads a run reads them (checksums checked):
    a row the reader drops fails the test."""
    path, repairs = Path(run_dir) / "samples.csv", []
    assert path.is_file(), f"{path} was not written"
    rows = read_samples_csv(path, repairs)
    assert not repairs, repairs
    return rows


def run_cli(*args, cwd, wait=True, timeout=600, env=None):
    """``python -m fafo.bench ARGS`` in a subprocess (offline, W&B off; ``env`` adds variables). ``wait=False``:
    the running ``Popen`` (stdout and stderr piped)."""
    env = {**ENV, **(env or {})}
    cmd = [sys.executable, "-m", "fafo.bench", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout, check=False)


def cli_in_process(args, monkeypatch, capsys, out_dir, loads=False):
    """``python -m fafo.bench ARGS`` in this process: (exit status, stderr lines without progress noise). Unless
    ``loads``, a model that loads fails the test (bad input must stop before)."""
    from fafo.engine.engine import Engine

    if not loads:
        monkeypatch.setattr(Engine, "load", lambda *a, **k: pytest.fail("a model was loaded before the error"))
    monkeypatch.setattr(sys, "argv", ["fafo.bench", f"bench.output_dir={out_dir}", "wandb.mode=disabled",
                                      "bench.progress=false", *args])
    capsys.readouterr()
    try:
        runpy.run_module("fafo.bench", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None  # later in-process tests must not see this run's overrides
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip() and not line.startswith(NOISE)]


def chat(*turns, system=None):
    """The tiny template's rendering of alternating user/assistant turns, ending with the generation prompt."""
    out = "<s>" + (f"<|system|>\n{system}<|end|>\n" if system is not None else "")
    for i, content in enumerate(turns):
        out += f"<|{'user' if i % 2 == 0 else 'assistant'}|>\n{content}<|end|>\n"
    return out + "<|assistant|>\n"


def ids_of(tok, text, special=False):
    return tok(text, add_special_tokens=special).input_ids


def is_raw(tok, ids):
    """A raw prompt: BOS first and no chat marker anywhere."""
    return ids[0] == tok.bos_token_id and not set(tok.convert_tokens_to_ids(list(CHAT_MARKERS))) & set(ids)


def words(n, seed=0):
    """``n`` words of plain prose (a full stop every ninth), different per ``seed``."""
    vocab = ["river", "bridge", "garden", "letter", "window", "summer", "market", "lantern", "harbour", "meadow"]
    return " ".join(vocab[(i * 7 + seed) % len(vocab)] + ("." if i % 9 == 8 else "") for i in range(n))


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def task_from_conf(name, *overrides):
    """The task ``task=<name>`` builds, as a run would."""
    from fafo.bench.spec import build

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"task={name}", *overrides])
    return build(cfg.task, "task")


# ------------------------------------------------------------------ FAFO's fixed region (test_fafo, test_compress)
def track_region_after_commits(monkeypatch) -> list[bool]:
    """Patch FAFOState.commit to record, after every step, whether the region holds exactly C's selection."""
    from fafo.fafo import FAFOState

    checks = []
    original = FAFOState.commit

    def commit_and_check(self, step):
        original(self, step)
        checks.append(region_holds_selection(self.layout))

    monkeypatch.setattr(FAFOState, "commit", commit_and_check)
    return checks


def region_holds_selection(layout) -> bool:
    """After a step: per layer and KV head, the fixed region's positions are exactly C's selection."""
    sel = layout.compression.select(layout)
    L, H, _ = layout.pos.shape
    sel = sel.expand(L, H, -1) if sel.dim() == 1 else sel
    region = layout.pos[:, :, : layout.region_len]
    return region.shape == sel.shape and bool((region.sort(-1).values == sel.sort(-1).values).all())


def assert_cache_is_permuted_prefill(eng, layout, history):
    """Every cached entry equals the KV a plain prefill of the committed text computes at its position."""
    ref_cache = eng.model.new_cache(512)
    n = layout.n
    eng.prefill(ref_cache, history[:n])
    for layer in range(len(ref_cache.keys)):
        for h in range(ref_cache.keys[layer].shape[1]):
            pos = layout.pos[layer, h, :n]
            assert sorted(pos.tolist()) == list(range(n))
            for ours, ref in ((layout.cache.keys, ref_cache.keys), (layout.cache.values, ref_cache.values)):
                torch.testing.assert_close(ours[layer][:, h, :n], ref[layer][:, h, pos], atol=1e-5, rtol=0)


SPEC_BENCH_MT = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def write_question_jsonl(path: Path, per_category: int = 1) -> Path:
    """A Spec-Bench-shaped question.jsonl: MT-Bench rows (2 turns, 8 fine categories) then the 5 one-turn subtasks,
    question ids 81.. in file order, `reference` where the release has one."""
    rows, qid = [], 81
    for i in range(per_category):
        for cat in SPEC_BENCH_MT[: max(1, per_category)]:
            rows.append({"question_id": qid, "category": cat, "turns": [f"Write about {cat} {i}.", "Now shorter."]})
            qid += 1
    for cat in SUBTASKS[1:]:
        for i in range(per_category):
            row = {"question_id": qid, "category": cat, "turns": [f"{cat} question {i}: repeat 1, 2, 3, 1, 2, 3"]}
            if cat != "qa":
                row["reference"] = [f"answer {i}"]
            rows.append(row)
            qid += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class ReadsOnTheHost(TorchFunctionMode):
    """Counts ``tolist`` reads. Any torch mode on the stack makes the CPU take a device's path
    (``fafo.engine.batching.host_logits``), so inside this one the CPU reads what a device would."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += getattr(func, "__name__", "") == "tolist"
        return func(*args, **(kwargs or {}))
