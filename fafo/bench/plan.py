"""``bench.plan=true``: check a run or a whole sweep against the real models before a GPU-hour is spent.

For each job, WITHOUT loading weights: the model's config and tokenizer (hub id through the local Hugging Face
cache, or a local directory), every sample built with the task's own template, truncation and filters, and

* the **context**: :func:`fafo.engine.context.context_limit` (rope scaling, ``max_sequence_length``, an explicit
  ``model.max_len`` above the trained length with a warning);
* **every turn** of a multi-turn sample, with the longest possible earlier answers (``max_new_tokens + 8`` tokens each
  where the sample replays the model's own answers; the gold ones where it replays those);
* the method's (and the reference's) **scratch slots** (``Decoder.extra_slots``);
* **memory** (:mod:`fafo.bench.plan_memory`) against ``bench.gpu_mem_gb`` (default: this machine's GPU, else 80).

A sample that does not fit fails the job, or with ``bench.drop_unfit=true`` is dropped before any timing and
counted (``n_dropped`` in the summary). A normal run performs the same checks for its own job (:func:`check_run`)
before loading weights. The plan of a job is one printed line and ``plan.json`` in the job's directory; the
process exits with status 1 when any job would fail.

``bench.plan`` assumes the job will run on a GPU (``bench.device=auto`` -> CUDA, so ``bench.dtype=auto`` -> float16
and ``bench.compile=auto`` -> compiled) unless ``bench.device=cpu`` is set.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import torch
from omegaconf import DictConfig

from fafo.bench.plan_memory import GB, HEADROOM, job_memory
from fafo.bounds import bounded_fields
from fafo.engine.context import context_limit, trained_context
from fafo.errors import ConfigError

ANSWER_MARGIN = 8  # tokens an earlier answer may gain when re-tokenized inside the chat template
DEFAULT_GPU_GB = 80.0
MAX_PRINTED = 20  # problem lines printed per job (plan.json keeps all)


@dataclass
class JobPlan:
    """What ``bench.plan`` found for one job (the fields of ``plan.json``)."""

    job: str = ""
    n_samples: int = 0
    n_fit: int = 0
    n_dropped: int = 0
    n_fail: int = 0
    n_filtered: int = 0  # dropped by the task's own filter (e.g. LongSpec's 1200 < length <= context - 2000)
    n_beyond_trained: int = 0  # samples using positions past the checkpoint's trained length (model.max_len)
    context_limit: int = 0
    trained_context: int = 0
    max_needed: int = 0
    weights_gb: float = 0.0
    kv_gb: float = 0.0
    method_gb: float = 0.0
    act_gb: float = 0.0
    peak_gb: float = 0.0
    gpu_gb: float = 0.0
    est_gpu_hours: float | None = None
    fits: bool = False
    problems: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kept: list = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("kept")
        return out

    def line(self) -> str:
        verdict = "ok  " if self.fits else "FAIL"
        hours = f"  ~{self.est_gpu_hours:.2f} GPU h" if self.est_gpu_hours is not None else ""
        dropped = f" ({self.n_filtered} by the task filter)" if self.n_filtered else ""
        beyond = f" ({self.n_beyond_trained} past the trained {self.trained_context})" if self.n_beyond_trained else ""
        return (f"{verdict}  {self.job}  samples {self.n_samples}: fit {self.n_fit}{beyond}, dropped "
                f"{self.n_dropped + self.n_filtered}{dropped}, would fail {self.n_fail}  context {self.context_limit} "
                f"(needs {self.max_needed})  peak {self.peak_gb:.1f} GB of {self.gpu_gb:.0f} (weights "
                f"{self.weights_gb:.1f}, KV {self.kv_gb:.1f}, method {self.method_gb:.1f}, activations "
                f"{self.act_gb:.1f}){hours}")

    def summary_fields(self) -> dict:
        """What a run's summary records about its samples' fit (counts, never silent)."""
        return {"n_dropped": self.n_dropped + self.n_filtered, "n_dropped_unfit": self.n_dropped,
                "n_dropped_filter": self.n_filtered, "n_beyond_trained": self.n_beyond_trained,
                "context_limit": self.context_limit, "plan_peak_gb": round(self.peak_gb, 3)}


def worst_turn(task, tokenizer, sample, max_new: int) -> tuple[int, int]:
    """(turn, prompt tokens) of the sample's longest prompt, earlier own answers at their longest."""
    worst = (0, 0)
    for turn in range(len(sample.turns)):
        n = len(task.prompt_ids(tokenizer, sample, turn, [""] * turn))
        if sample.chat and sample.followup == "own":
            n += turn * (max_new + ANSWER_MARGIN)
        worst = max(worst, (n, turn))
    return worst[1], worst[0]


def _filtered(task, tokenizer) -> int:
    """Samples the task's own filter drops (too short/long for it) among its selected ones."""
    try:
        return sum(1 for s in task.samples() if not task.usable(tokenizer, s))
    except Exception:  # noqa: BLE001 - reported when the samples are built
        return 0


def _scratch_knobs(method, max_new: int) -> list[str]:
    """The method's counts (fields declared with :func:`fafo.bounds.at_least`) whose halving, within their declared
    bound, lowers its scratch slots: what an error asks to lower."""
    base, names = method.extra_slots(max_new), []
    for name, bound in bounded_fields(type(method)).items():
        value = getattr(method, name)
        if "ge" not in bound or not isinstance(value, int) or value // 2 < max(bound["ge"], 1):
            continue
        try:
            if replace(method, **{name: value // 2}).extra_slots(max_new) < base:
                names.append(f"method.{name}")
        except Exception:  # noqa: BLE001 - a combination its cross-field checks refuse: not a knob to suggest
            continue
    return names


def _fix(job, prompt: int, max_new: int, scratch: int, context: int, trained: int) -> str:
    needed = prompt + max_new + scratch
    if prompt + max_new <= context:  # only the method's scratch overflows
        knobs = _scratch_knobs(job.method, max_new) or ["the method's sizes"]
        return f"lower {' or '.join(knobs)}, or raise model.max_len to {needed}"
    past = f" (past the trained {trained}: allowed, with a warning)" if needed > trained else ""
    return (f"raise model.max_len to {needed}{past}, lower bench.max_new_tokens, truncate with "
            "task.max_input_tokens, or drop such samples before timing with bench.drop_unfit=true")


def assess(job, gpu_gb: float | None, drop_unfit: bool = False, running: bool = False) -> JobPlan:
    """The plan of one job. ``job`` has ``cfg, method, reference, task, ckpt, samples, dtype, compile, max_new_tokens``
    (a :class:`~fafo.bench.runner.Runner` before loading, or :func:`plan_job`'s namespace); ``gpu_gb`` None skips
    the memory check (a CPU run). ``running``: a sample the task cannot build is kept (the run records it as a
    failed row and goes on) instead of failing the plan."""
    config, tok = job.ckpt.config, job.ckpt.tokenizer
    context, warning = context_limit(config, job.cfg.model.get("max_len"))
    trained = trained_context(config)
    plan = JobPlan(job=job_label(job), n_samples=len(job.samples), context_limit=context, trained_context=trained,
                   n_filtered=_filtered(job.task, tok), warnings=[warning] if warning else [])
    longest, fitted, cost = 0, 0, 0.0
    curve = job.cost_curve if getattr(job, "cost_curve", None) is not None else None
    for s in job.samples:
        max_new = job.max_new_tokens(s)
        scratch = max(job.method.extra_slots(max_new), job.reference.extra_slots(max_new))
        try:
            turn, prompt = worst_turn(job.task, tok, s, max_new)
        except Exception as exc:  # noqa: BLE001 - a sample the task cannot build
            line = (f"sample {s.id!r}: cannot be built ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}); fix the data or leave it out with task.ids")
            if running:
                plan.kept.append(s)
                plan.warnings.append(line)
            else:
                plan.n_fail += 1
                plan.problems.append(line)
            continue
        needed = prompt + max_new + scratch
        plan.max_needed = max(plan.max_needed, needed)
        if needed > context:
            where = f" turn {turn}" if len(s.turns) > 1 else ""
            reason = (f"sample {s.id!r}{where}: {prompt} prompt + {max_new} new + {scratch} scratch = {needed} tokens "
                      f"> context {context}")
            if drop_unfit:
                plan.n_dropped += 1
                plan.dropped.append(reason)
            else:
                plan.n_fail += 1
                plan.problems.append(f"{reason}; {_fix(job, prompt, max_new, scratch, context, trained)}")
            continue
        plan.kept.append(s)
        plan.n_beyond_trained += needed > trained
        longest, fitted = max(longest, prompt), max(fitted, needed)  # a later turn prefills its whole prompt
        if curve is not None:
            ctx = prompt + max_new // 2
            cost += len(s.turns) * 2 * max_new * curve.latency(1, ctx) * job.cfg.bench.repeats  # reference + method
    plan.n_fit = len(plan.kept)
    if plan.kept:
        mem = job_memory(config, job.method, job.reference, fitted, longest, job.dtype, job.compile is not None)
        plan.weights_gb, plan.kv_gb = mem.weights / GB, mem.kv / GB
        plan.method_gb, plan.act_gb, plan.peak_gb = mem.method / GB, mem.activations / GB, mem.peak / GB
    if curve is not None:
        plan.est_gpu_hours = cost / 1000 / 3600
    plan.gpu_gb = gpu_gb or 0.0
    if gpu_gb is not None and plan.peak_gb > HEADROOM * gpu_gb:
        plan.problems.append(
            f"memory: peak {plan.peak_gb:.1f} GB (weights {plan.weights_gb:.1f}, KV {plan.kv_gb:.1f}, method "
            f"{plan.method_gb:.1f}, activations {plan.act_gb:.1f}) > {HEADROOM:.0%} of the {gpu_gb:g} GB GPU "
            "(bench.gpu_mem_gb); shorten the prompts (task.max_input_tokens / task.input_tokens), cap model.max_len, "
            "or use a larger GPU")
    if not plan.kept and not plan.problems:
        plan.problems.append("no sample fits: every sample was dropped; raise model.max_len or lower "
                             "bench.max_new_tokens")
    plan.fits = not plan.problems
    return plan


def job_label(job) -> str:
    names = getattr(job, "names", None) or {}
    return " / ".join(str(names.get(k, "?")) for k in ("model", "method", "task"))


def gpu_memory_limit(bench: DictConfig, device: torch.device) -> float | None:
    """GB the job may use: the smaller of ``bench.gpu_mem_gb`` and this machine's GPU; without a GPU here, a plan
    takes ``bench.gpu_mem_gb`` or 80 (None: a CPU run, not checked)."""
    value = bench.get("gpu_mem_gb")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise ConfigError(f"bench.gpu_mem_gb={value!r} must be a number of GB > 0 (e.g. 80) or null")
    if device.type != "cuda":
        return None
    if torch.cuda.is_available():
        here = torch.cuda.get_device_properties(device).total_memory / GB
        return min(here, float(value)) if value is not None else here
    return float(value) if value is not None else DEFAULT_GPU_GB


def check_run(runner) -> JobPlan:
    """A normal run's own plan, before loading weights: refuses (ConfigError) or drops samples that cannot run."""
    bench = runner.bench
    plan = assess(runner, gpu_memory_limit(bench, runner.device), bool(bench.get("drop_unfit", False)), running=True)
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr, flush=True)
    if plan.n_dropped or plan.n_filtered:
        print(f"note: {plan.n_dropped + plan.n_filtered} samples dropped before timing ({plan.n_filtered} by the "
              f"task's filter, {plan.n_dropped} that do not fit the context {plan.context_limit}); counted in the "
              "summary as n_dropped", file=sys.stderr, flush=True)
    if not plan.fits:
        more = f" (and {len(plan.problems) - 1} more: run with bench.plan=true to list them)" \
            if len(plan.problems) > 1 else ""
        raise ConfigError(plan.problems[0] + more)
    return plan


def plan_job(cfg: DictConfig, overrides=(), choice: str | None = None) -> JobPlan:
    """Build one job's parts as the runner does (settings, task, checkpoint config and tokenizer; no weights) and
    assess it. A setting or data problem becomes the job's one problem line."""
    from fafo.bench.cost_curve import CostCurve
    from fafo.bench.naming import model_name
    from fafo.bench.setup import (build, check_bench, check_config, method_node, resolve_compile, resolve_dtype,
                                  resolve_model)

    job = SimpleNamespace(cfg=cfg, names={"model": cfg.model.get("name"), "method": cfg.method.get("name"),
                                          "task": cfg.task.get("name")})
    try:
        check_config(cfg, overrides)
        check_bench(cfg.bench)
        device = torch.device("cuda" if cfg.bench.device == "auto" else cfg.bench.device)
        job.dtype = resolve_dtype(cfg.bench.dtype, device)
        job.compile = resolve_compile(cfg.bench, device)
        sampling = build(cfg.sampling, "sampling")
        job.method = build(method_node(cfg.method), "method")
        job.reference = build(cfg.bench.reference, "bench.reference")
        job.method.check_sampling(sampling)
        job.reference.check_sampling(sampling)
        job.cost_curve = CostCurve.load(cfg.bench.cost_curve) if cfg.bench.get("cost_curve") else None
        job.task = build(cfg.task, "task")
        job.task.samples()
        compress = getattr(job.method, "compress", None)
        if compress is not None:
            job.names["method"] = str(job.names["method"]).format(compress=compress.label)
        job.names["model"] = model_name(cfg.model, overrides, choice)
        job.ckpt = resolve_model(cfg.model, overrides, choice, weights=False)
        job.samples = job.task.samples(job.ckpt.tokenizer)[: cfg.bench.max_samples or None]
        job.method.check_target(job.ckpt.config, job.ckpt.tokenizer, weights=False)
        job.max_new_tokens = lambda s: cfg.bench.max_new_tokens or s.max_new_tokens
        return assess(job, gpu_memory_limit(cfg.bench, device), bool(cfg.bench.get("drop_unfit", False)))
    except ConfigError as exc:
        return JobPlan(job=job_label(job), problems=[f"{exc}"])


def run_plan(cfg: DictConfig, run_dir: Path, overrides=(), choice: str | None = None) -> JobPlan:
    """``bench.plan=true`` for one job: assess, print its line (and its problems), write ``plan.json``."""
    plan = plan_job(cfg, overrides, choice)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    lines = [plan.line()] + [f"  warning: {w}" for w in plan.warnings]
    lines += [f"  problem: {p}" for p in plan.problems[:MAX_PRINTED]]
    if len(plan.problems) > MAX_PRINTED:
        lines.append(f"  ... {len(plan.problems) - MAX_PRINTED} more problems in {run_dir / 'plan.json'}")
    print("\n".join(lines), flush=True)
    return plan
