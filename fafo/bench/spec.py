"""A run resolved once: :func:`resolve` turns a composed config into a frozen :class:`RunSpec` before any weight
loads, each setting checked on the way (one ``error:`` line each), in this order: the whole config and ``bench``;
device, dtype, compile; sampling, method, reference, the batch size; the cost curve; the task; the run directory's
lock; the checkpoint and the names; the samples with the tokenizer; the method against the target; the context; the
job's plan (:func:`fafo.bench.plan.assess`: refuse, or drop with ``bench.drop_unfit``). ``weights=False``
(``bench.plan``): config-only checkpoints, no plan yet.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fafo.bench.naming import Job, checkpoint, run_names, split_hydra
from fafo.bench.plan import JobPlan, assess, checked
from fafo.bench.records import check_lock_free
from fafo.bench.settings import (Bench, bench_settings, check_batching, check_config, resolve_compile, resolve_device,
                                 resolve_dtype)
from fafo.bounds import check_node
from fafo.compress.base import Compression
from fafo.decoding import Decoder
from fafo.engine.compiled import CompileOptions
from fafo.engine.context import context_limit
from fafo.engine.loader import Checkpoint
from fafo.errors import ConfigError
from fafo.sampling import Sampling


@dataclass(frozen=True)
class RunSpec:
    """Everything a run consists of: ``samples`` the ones that will run, ``cache_slots`` what the largest of them
    needs (compiled steps are specialised to one cache size), ``method_eager`` whether the method runs eagerly
    beside a compiled vanilla (``timing_note`` says why)."""

    cfg: DictConfig  # without Hydra's node; saved as the run's config.yaml
    bench: Bench
    names: dict  # model, task, method: what records, summaries and W&B call the run
    run_dir: Path
    device: torch.device
    dtype: str
    compile: CompileOptions | None
    method_eager: bool
    timing_note: str
    sampling: Sampling
    method: Decoder
    reference: Decoder
    task: object
    ckpt: Checkpoint
    samples: tuple
    context: int
    context_warning: str | None
    cost_curve: object | None
    planning: bool = False  # resolved for bench.plan (config-only checkpoints, a GPU assumed)
    plan: JobPlan | None = None
    cache_slots: int = 0

    def max_new_tokens(self, sample) -> int:
        """New tokens each turn of ``sample`` may generate: ``bench.max_new_tokens``, else the sample's own."""
        return self.bench.max_new_tokens or sample.max_new_tokens


def resolve(cfg: DictConfig, run_dir: str | Path | None = None, weights: bool = True) -> RunSpec:
    """The run ``cfg`` describes: composed by ``python -m fafo.bench``, or by :func:`fafo.bench.naming.compose_run`,
    whose Hydra node gives the CLI's names and, without ``run_dir``, its directory (``hydra.run.dir``)."""
    job = Job.of(cfg)  # the overrides typed and the group options chosen
    cfg, hydra_dir = split_hydra(cfg)
    if run_dir is None and hydra_dir is None:
        raise TypeError("resolve: no run directory; pass run_dir, or compose the config with "
                        "fafo.bench.naming.compose_run (it holds hydra.run.dir)")
    check_config(cfg, job.overrides)
    bench = bench_settings(cfg.bench)
    device = resolve_device(bench.device, planning=not weights)
    dtype, compile = resolve_dtype(bench.dtype, device), resolve_compile(bench, device)
    sampling = build(cfg.sampling, "sampling")
    method = build(method_node(cfg.method), "method")
    reference = build(cfg.bench.reference, "bench.reference")
    for decoder in (method, reference):
        decoder.check_sampling(sampling)
    check_batching(bench, method, reference, cfg.method.get("name") or type(method).__name__)
    note, method_eager = "", False  # one baseline: every method of a table races the same (compiled) vanilla
    if compile is not None and reference.eager_forwards:
        note, compile = ("timed eagerly, method and reference alike (bench.compile set; the reference cannot run "
                         f"compiled: {reference.eager_forwards})"), None
    elif compile is not None and method.eager_forwards:
        note, method_eager = (f"the method runs eagerly ({method.eager_forwards}); its speedup is against the compiled "
                              "vanilla every other method races; speedup_vs_eager (against an eager vanilla timed "
                              "beside it) is next to it"), True
    curve = None
    if bench.cost_curve:
        from fafo.bench.tools.cost_curve import CostCurve

        curve = CostCurve.load(bench.cost_curve)
    task = build(cfg.task, "task")
    task.samples()  # the task's own checks (ids, data files) before a checkpoint is fetched
    run_dir = Path(run_dir or hydra_dir)
    if weights:
        check_lock_free(run_dir)  # a second writer is refused now, not after loading its model
    ckpt = checkpoint(cfg.model, job, weights)  # model.path wins over a tiny spec (fafo.bench.naming)
    compress = getattr(method, "compress", None)  # e.g. "fafo-{compress}" -> "fafo-quest"
    label = cfg.method.get("name") or type(method).__name__
    names = {"model": run_names(cfg.model, job).model, "task": cfg.task.name,
             "method": label.format(compress=compress.label) if compress is not None else label}
    if sampling.from_generation_config and weights:  # sampling=model_default: the checkpoint (with weights) is known
        sampling = sampling.resolve(ckpt.path)
        for decoder in (method, reference):
            decoder.check_sampling(sampling)
    samples = task.samples(ckpt.tokenizer)[: bench.max_samples or None]  # the task's length filters need it
    method.check_target(ckpt.config, ckpt.tokenizer, weights=weights)
    context, warning = context_limit(ckpt.config, cfg.model.get("max_len"))
    spec = RunSpec(cfg, bench, names, run_dir, device, dtype, compile, method_eager, note, sampling, method,
                   reference, task, ckpt, tuple(samples), context, warning, curve, planning=not weights)
    if not weights:
        return spec
    plan = checked(assess(spec))  # context, every turn, scratch, memory: refuses or drops
    if isinstance(compress, Compression):
        compress.check_fits(context)
    return replace(spec, samples=tuple(plan.kept), plan=plan, cache_slots=plan.cache_slots)


def build(node: DictConfig, setting: str, **kwargs):
    """``hydra.utils.instantiate`` of a checked node (:func:`fafo.bounds.check_node`) that surfaces our
    ConfigError (Hydra wraps errors raised in constructors)."""
    if node is None or "_target_" not in node:
        raise ConfigError(f"{setting} has no _target_; choose one of the configs in conf/{setting}/")
    check_node(node, setting)
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise ConfigError(f"{setting}: {str(exc).splitlines()[0]}; check conf/{setting}/ and your overrides") from None


def method_node(cfg: DictConfig) -> DictConfig:
    """The method config without the keys that are not constructor arguments (``name``)."""
    node = OmegaConf.to_container(cfg, resolve=True)
    node.pop("name", None)
    return OmegaConf.create(node)
