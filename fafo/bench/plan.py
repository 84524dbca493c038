"""A job's plan before a GPU-hour is spent, from the model's config and tokenizer and every sample as the task
builds it: the context (:func:`fafo.engine.context.context_limit`), every turn (earlier own answers at their longest,
``max_new_tokens + 8`` tokens each), the method's and the reference's scratch slots (``extra_slots``), and memory
against ``bench.gpu_mem_gb`` (else this GPU's, else 80 GB): weights and shared cache from the config, each decoder's
own buffers (``Decoder.plan_bytes``), the largest forward's activations, :data:`HEADROOM` kept free for the
allocator and the CUDA context. ``bench.plan=true`` prints it for every job without loading weights, assuming a GPU
unless ``bench.device=cpu``; a run assesses its own job before loading and refuses it, or drops the samples that
cannot fit with ``bench.drop_unfit=true`` (counted as ``n_dropped``).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

import torch

from fafo.bounds import bounded_fields
from fafo.engine.context import trained_context
from fafo.engine.engine import cache_slots
from fafo.engine.model import ModelArgs
from fafo.errors import ConfigError

ANSWER_MARGIN = 8  # tokens an earlier answer may gain when re-tokenized inside the chat template
HEADROOM = 0.95  # fraction of the GPU a job may plan to fill (allocator fragmentation, CUDA context)
GB, DEFAULT_GPU_GB = 1e9, 80.0
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass
class JobPlan:
    """What the plan found for one job (the fields of ``plan.json``)."""

    job: str = ""
    batch_size: int = 1  # requests decoded at once (bench.batch_size): the cache, state and step logits are per row
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
    prompt_formats: dict[str, int] = field(default_factory=dict)  # kept samples per rendering (Task.prompt_format)
    kept: list = field(default_factory=list, repr=False)
    cache_slots: int = field(default=0, repr=False)  # the largest kept sample's prompt + new tokens + scratch
    # the same with each decoder's own scratch, (method, reference): the slots each is charged (PeakMemory)
    own_slots: tuple[int, int] = field(default=(0, 0), repr=False)

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("kept", "cache_slots", "own_slots")}

    def line(self) -> str:
        if not self.fits and not self.context_limit and self.problems:  # stopped before its model and samples
            return f"FAIL  {self.job}  not assessed: the problem below stops it before its samples and memory"
        hours = f"  ~{self.est_gpu_hours:.2f} GPU h" if self.est_gpu_hours is not None else ""
        dropped = f" ({self.n_filtered} by the task filter)" if self.n_filtered else ""
        beyond = f" ({self.n_beyond_trained} past the trained {self.trained_context})" if self.n_beyond_trained else ""
        batch = f"  batch {self.batch_size}" if self.batch_size > 1 else ""
        return (f"{'ok  ' if self.fits else 'FAIL'}  {self.job}{batch}  samples {self.n_samples}: fit "
                f"{self.n_fit}{beyond}, "
                f"dropped {self.n_dropped + self.n_filtered}{dropped}, would fail {self.n_fail}  context "
                f"{self.context_limit} (needs {self.max_needed})  peak {self.peak_gb:.1f} GB of {self.gpu_gb:.0f} "
                f"(weights {self.weights_gb:.1f}, KV {self.kv_gb:.1f}, method {self.method_gb:.1f}, activations "
                f"{self.act_gb:.1f}){hours}")


def worst_turn(task, tokenizer, sample, max_new: int) -> tuple[int, int]:
    """(turn, prompt tokens) of the sample's longest prompt, earlier own answers at their longest."""
    worst = (0, 0)
    for turn in range(len(sample.turns)):
        n = len(task.prompt_ids(tokenizer, sample, turn, [""] * turn))
        if sample.chat and sample.followup == "own":
            n += turn * (max_new + ANSWER_MARGIN)
        worst = max(worst, (n, turn))
    return worst[1], worst[0]


def assess(spec) -> JobPlan:
    """The plan of the job ``spec`` (:class:`fafo.bench.spec.RunSpec`) describes. In a run (not ``spec.planning``)
    a sample the task cannot build is kept with a warning (the run records it as a failed row)."""
    config, tok, bench = spec.ckpt.config, spec.ckpt.tokenizer, spec.bench
    trained, gpu_gb = trained_context(config), gpu_memory_limit(bench, spec.device)
    plan = JobPlan(job=job_label(spec.names), batch_size=bench.batch_size, n_samples=len(spec.samples),
                   context_limit=spec.context,
                   trained_context=trained, n_filtered=_filtered(spec.task, tok),
                   warnings=[w for w in (spec.context_warning, spec.sampling.ignored()) if w])
    longest, cost = 0, 0.0
    for s in spec.samples:
        max_new = spec.max_new_tokens(s)
        own = (spec.method.extra_slots(max_new), spec.reference.extra_slots(max_new))
        scratch = max(own)
        try:
            turn, prompt = worst_turn(spec.task, tok, s, max_new)
        except Exception as exc:  # noqa: BLE001 - a sample the task cannot build
            line = (f"sample {s.id!r}: cannot be built ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}); fix the data or leave it out with task.ids")
            if spec.planning:
                plan.n_fail += 1
                plan.problems.append(line)
            else:
                plan.kept.append(s)
                plan.warnings.append(line)
            continue
        needed = prompt + max_new + scratch
        plan.max_needed = max(plan.max_needed, needed)
        if needed > spec.context:
            where = f" turn {turn}" if len(s.turns) > 1 else ""
            reason = (f"sample {s.id!r}{where}: {prompt} prompt + {max_new} new + {scratch} scratch = {needed} tokens "
                      f"> context {spec.context}")
            if bench.drop_unfit:
                plan.n_dropped += 1
                plan.dropped.append(reason)
            else:
                plan.n_fail += 1
                plan.problems.append(f"{reason}; {_fix(spec, prompt, max_new, scratch, trained)}")
            continue
        plan.kept.append(s)
        plan.n_beyond_trained += needed > trained
        longest, plan.cache_slots = max(longest, prompt), max(plan.cache_slots, needed)
        plan.own_slots = tuple(max(slots, prompt + max_new + x) for slots, x in zip(plan.own_slots, own))
        if spec.cost_curve is not None:  # reference + method, every turn and repeat, at the mean context
            cost += len(s.turns) * 2 * max_new * spec.cost_curve.latency(1, prompt + max_new // 2) * bench.repeats
    plan.n_fit = len(plan.kept)
    plan.prompt_formats = dict(Counter(spec.task.prompt_format(tok, s) for s in plan.kept))
    if plan.kept:
        memory(plan, spec, longest)
    plan.est_gpu_hours = cost / 1000 / 3600 if spec.cost_curve is not None else None
    plan.gpu_gb = gpu_gb or 0.0
    if gpu_gb is not None and plan.peak_gb > HEADROOM * gpu_gb:
        rows = f" for bench.batch_size={plan.batch_size} rows" if plan.batch_size > 1 else ""
        plan.problems.append(
            f"memory: peak {plan.peak_gb:.1f} GB{rows} (weights {plan.weights_gb:.1f}, KV {plan.kv_gb:.1f}, method "
            f"{plan.method_gb:.1f}, activations {plan.act_gb:.1f}) > {HEADROOM:.0%} of the {gpu_gb:g} GB GPU "
            "(bench.gpu_mem_gb); " + ("lower bench.batch_size, " if plan.batch_size > 1 else "")
            + "shorten the prompts (task.max_input_tokens / task.input_tokens), cap model.max_len, or use a larger GPU")
    if not plan.kept and not plan.problems:
        plan.problems.append("no sample fits: every sample was dropped; raise model.max_len or lower "
                             "bench.max_new_tokens")
    plan.fits = not plan.problems
    return plan


def memory(plan: JobPlan, spec, longest_prompt: int) -> None:
    """The job's peak: the larger of the reference's and the method's phases (weights, every decoder's kept buffers,
    this one's transient ones, the shared cache where a decoder uses it or compiled steps hold it, activations).
    At ``bench.batch_size`` B (:mod:`fafo.batch`) the cache has B rows, each request its own state (a decoder's
    transient buffers times B: drafts, pools and windows are per request; what it keeps across generations, e.g.
    Token Recycling's matrix, is shared by the batch) and a step's logits are B rows'; prompts are prefilled one
    request at a time, so the prefill's activations are one request's."""
    nbytes, compiled, rows = DTYPE_BYTES[spec.dtype], spec.compile is not None, plan.batch_size
    args, slots = ModelArgs.from_hf(spec.ckpt.config), cache_slots(plan.cache_slots)
    method, reference = (d.plan_bytes(args, slots, nbytes, compiled) for d in (spec.method, spec.reference))
    if rows > 1:
        method, reference = (replace(b, transient=b.transient * rows)
                             for b in (method, reference))
    kept, kv = method.kept + reference.kept, rows * slots * args.kv_bytes_per_slot(nbytes)
    steps = [1, *(spec.method.forward_tokens() or ()), spec.method.extra_slots(0) or 1]
    # an un-chunked prefill's MLP intermediates and residual stream, or one step's float32 logits
    act = max(longest_prompt * (3 * args.intermediate_size + 4 * args.dim) * nbytes + args.vocab_size * 4,
              rows * max(steps) * args.vocab_size * 4)
    phases = [(kv if b.uses_engine_cache or compiled or (o.uses_engine_cache and not b.releases_engine_cache) else 0,
               kept + b.transient) for b, o in ((method, reference), (reference, method))]
    weights = args.n_params() * nbytes
    plan.weights_gb, plan.act_gb = weights / GB, act / GB
    plan.kv_gb, plan.method_gb = max(p[0] for p in phases) / GB, max(p[1] for p in phases) / GB
    plan.peak_gb = max(weights + k + own + act for k, own in phases) / GB


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


def _fix(spec, prompt: int, max_new: int, scratch: int, trained: int) -> str:
    needed = prompt + max_new + scratch
    if prompt + max_new <= spec.context:  # only the method's scratch overflows
        knobs = _scratch_knobs(spec.method, max_new) or ["the method's sizes"]
        return f"lower {' or '.join(knobs)}, or raise model.max_len to {needed}"
    past = f" (past the trained {trained}: allowed, with a warning)" if needed > trained else ""
    return (f"raise model.max_len to {needed}{past}, lower bench.max_new_tokens, truncate with "
            "task.max_input_tokens, or drop such samples before timing with bench.drop_unfit=true")


def job_label(names: dict) -> str:  # model / method / task
    return " / ".join(str(names.get(k, "?")) for k in ("model", "method", "task"))


def gpu_memory_limit(bench, device: torch.device) -> float | None:
    """GB the job may use: the smaller of ``bench.gpu_mem_gb`` and this machine's GPU; without a GPU here, a plan
    takes ``bench.gpu_mem_gb`` or 80 (None: a CPU run, not checked)."""
    if device.type != "cuda":
        return None
    limits = [float(bench.gpu_mem_gb)] if bench.gpu_mem_gb is not None else []
    if torch.cuda.is_available():
        limits.append(torch.cuda.get_device_properties(device).total_memory / GB)
    return min(limits, default=DEFAULT_GPU_GB)


def checked(plan: JobPlan) -> JobPlan:
    """A run's own plan: warnings and drops said on stderr; a job that cannot run refused (ConfigError)."""
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
