"""The ``bench`` group's settings as a dataclass with declared bounds (:mod:`fafo.bounds`), like every other group,
and the checks of the whole config that need no model. Each problem is one ConfigError line naming the setting.
conf/bench/default.yaml lists the same settings with what each one means."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf

from fafo.batch import BATCHING, check_batch
from fafo.bench.metrics import SPEEDUP_KINDS
from fafo.bench.naming import CONF
from fafo.decoding import Decoder
from fafo.bounds import above, at_least, check_bounds, check_node, one_of
from fafo.engine.compiled import COMPILE_MODES, CompileOptions
from fafo.engine.engine import DTYPES
from fafo.errors import ConfigError
from fafo.files import Source, check_directory_or_creatable


@dataclass(frozen=True)
class Bench:
    """How a run is measured (conf/bench/default.yaml). ``reference`` is the vanilla decoder's node (built apart)."""

    max_samples: int | None = at_least(1, None)
    max_new_tokens: int | None = at_least(1, None)
    seed: int = at_least(0, 0)
    device: str = "auto"
    dtype: str = one_of(("auto", *DTYPES), "auto", why="auto = float16 on CUDA, float32 on CPU")
    ignore_eos: bool = False
    compile: str | bool = one_of(("auto", True, False), "auto")
    compile_mode: str = one_of(("auto", *COMPILE_MODES), "auto", why="a torch.compile mode")
    compile_backend: str = "inductor"
    compile_attention: str = one_of(("auto", "flex", "sdpa"), "auto")
    warmup: int = at_least(0, 1)
    warmup_tokens: int = at_least(1, 64)
    repeats: int = at_least(1, 1)
    progress: bool = True
    output_dir: str = "results/runs"
    reuse_reference: bool = False
    max_spread: float = above(1.0, 1.5, why="a factor (max/min of a sample's repeats), e.g. 1.5")
    reuse_max_spread: float = above(1.0, 1.1, why="a factor (max/min of a stored reference's repeats), e.g. 1.1")
    aa_floor: bool = False
    cost_curve: str | None = None
    bootstrap: int = at_least(0, 1000)
    speedup_kind: str = one_of(SPEEDUP_KINDS, "e2e", why="e2e, decode or Spec-Bench's mean tokens/s")
    tie_margin: float = above(0.0, 0.1, inclusive=True, why="a float32 logit gap, e.g. 0.1")
    tie_check: str = one_of(("cpu", "device"), "cpu", why="where the float32 copy of the tie check lives")
    busy_load: float = above(0.0, 0.75, why="a load average per CPU core, e.g. 0.75")
    reference_dir: str | None = None
    reference: dict | None = None
    plan: bool = False
    gpu_mem_gb: float | None = above(0.0, None, why="GB of GPU memory, e.g. 80")
    drop_unfit: bool = False
    batch_size: int = at_least(1, 1)
    batching: str = one_of(BATCHING, "static",
                           why="static: B requests start together; continuous: a finished one is replaced at once")

    def __post_init__(self):
        check_bounds(self, "bench")


def bench_settings(node: DictConfig) -> Bench:
    """``cfg.bench`` checked (:func:`fafo.bounds.check_node`, the reference's node too) and built."""
    check_node(node, "bench", Bench)
    return Bench(**OmegaConf.to_container(node, resolve=True))


def check_batching(bench: Bench, method: Decoder, reference: Decoder, label: str) -> None:
    """``bench.batch_size`` > 1: both decoders decode B requests at once (:func:`fafo.batch.check_batch`), and no
    setting asks for a per-request timing the batch does not have."""
    if bench.batch_size == 1:
        return
    check_batch(method, bench.batch_size, label)
    check_batch(reference, bench.batch_size, "bench.reference")
    if bench.reuse_reference:
        raise ConfigError(f"bench.reuse_reference=true reuses one request's vanilla timing, which a batch of "
                          f"bench.batch_size={bench.batch_size} has not; set bench.reuse_reference=false")


def resolve_device(name: str, planning: bool = False) -> torch.device:
    """``bench.device``; ``planning`` (``bench.plan``): ``auto`` is the GPU the job will run on, present or not."""
    if name == "auto":
        return torch.device("cuda" if planning or torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"bench.device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"bench.device={name!r}: the harness runs on a CPU or a CUDA GPU only; use auto, cpu, "
                          f"cuda or cuda:N")
    if device.type == "cuda" and not planning:
        if not torch.cuda.is_available():
            raise ConfigError(f"bench.device={name!r} but CUDA is not available here; use bench.device=cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            valid = "cuda:0" if count == 1 else f"one of cuda:0 to cuda:{count - 1}"
            raise ConfigError(f"bench.device={name!r} but this machine has {count} CUDA device(s); use {valid}")
    return device


def resolve_dtype(name: str, device: torch.device) -> str:
    """auto: the papers' float16 on GPU; exact comparisons need float32 on CPU."""
    return ("float16" if device.type == "cuda" else "float32") if name == "auto" else name


def resolve_compile(bench: Bench, device: torch.device) -> CompileOptions | None:
    """``bench.compile*`` -> the compile options of decode steps, or None for eager. auto: compiled with CUDA graphs
    (``reduce-overhead``) on CUDA, eager on CPU."""
    if bench.compile is False or (bench.compile == "auto" and device.type != "cuda"):
        return None
    mode = bench.compile_mode if bench.compile_mode != "auto" else \
        "reduce-overhead" if device.type == "cuda" else "default"
    options = CompileOptions(mode=mode, backend=bench.compile_backend, attention=bench.compile_attention)
    import torch._dynamo  # the backends torch.compile knows by name, debug ones included (registry.py)

    backends = torch._dynamo.list_backends(exclude_tags=())
    if options.backend not in backends:
        close = difflib.get_close_matches(options.backend, backends, n=1, cutoff=0.6)
        raise ConfigError(f"bench.compile_backend={options.backend!r} is not a torch.compile backend"
                          f"{f' (did you mean {close[0]}?)' if close else ''}; use inductor (the default), aot_eager "
                          "or eager (torch._dynamo.list_backends() lists the others)")
    if options.cudagraphs and device.type != "cuda":
        raise ConfigError(f"bench.compile_mode={mode} replays CUDA graphs and needs a CUDA device; use "
                          f"bench.compile_mode={options.mode_without_cudagraphs} on CPU")
    if options.backend == "inductor" and device.type == "cpu" and options.attention_for(device) == "flex":
        raise ConfigError("bench.compile_attention=flex cannot be compiled by inductor on CPU (no FlexAttention "
                          "log-sum-exp output there); use bench.compile_attention=auto or "
                          "bench.compile_backend=aot_eager")
    return options


def check_config(cfg: DictConfig, overrides=()) -> None:
    """Checks of the whole config that need no model: keys added by ``+`` overrides, wandb.mode, model.max_len,
    bench.output_dir, bench.reference_dir."""
    from fafo.bench.tools.sweep import check_output_dir
    from fafo.bench.tools.wandb_log import check_wandb

    check_added_keys(overrides)
    check_wandb(cfg)  # an unknown mode, or online without wandb installed
    max_len = cfg.model.get("max_len")
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise ConfigError(f"model.max_len={max_len!r} must be a positive integer (cache slots; above the "
                          "checkpoint's trained length with a warning) or null for the checkpoint's own context")
    check_output_dir(cfg.bench.output_dir)
    if cfg.bench.get("reference_dir"):
        given = str(cfg.bench.reference_dir)
        check_directory_or_creatable(given, Source("bench.reference_dir", given, "set bench.reference_dir to a "
                                                   "directory path"))


def check_added_keys(overrides) -> None:
    """``+key=value`` overrides that add what no config reads: a misspelt group (``+nosuchgroup=foo``) would otherwise
    be accepted and ignored (a misspelt setting of a group is refused by its dataclass: ``+bench.repeat=3``)."""
    groups = {p.name for p in CONF.iterdir() if p.is_dir()} | set(OmegaConf.load(CONF / "config.yaml"))
    for item in map(str, overrides or ()):
        if not item.startswith("+") or "=" not in item:
            continue
        key = item.lstrip("+").split("=", 1)[0]
        top = key.partition(".")[0].split("/")[0].split("@")[0]
        if top not in groups:
            raise ConfigError(f"+{key} adds a setting no config reads: {top} is not a config group or setting "
                              f"(groups: {', '.join(sorted(g for g in groups if g not in ('defaults', 'hydra')))}); "
                              "remove it or fix its spelling")
