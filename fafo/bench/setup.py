"""Everything the runner checks and resolves before a model is loaded.

Each problem is one :class:`~fafo.errors.ConfigError` line naming the setting and the fix.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fafo.engine.compiled import COMPILE_MODES, CompileOptions
from fafo.engine.engine import DTYPES, check_backend
from fafo.engine.loader import Checkpoint, open_checkpoint
from fafo.bench.naming import model_source
from fafo.bench.metrics import SPEEDUP_KINDS
from fafo.bounds import check_bound, plain
from fafo.errors import ConfigError
from fafo.files import Source, check_directory_or_creatable


def build(node: DictConfig, setting: str, **kwargs):
    """``hydra.utils.instantiate`` that surfaces our ConfigError (Hydra wraps errors raised in constructors)."""
    if node is None or "_target_" not in node:
        raise ConfigError(f"{setting} has no _target_; choose one of the configs in conf/{setting}/")
    check_fields(node, setting)
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise ConfigError(f"{setting}: {str(exc).splitlines()[0]}; check conf/{setting}/ and your overrides") from None


def check_fields(node: DictConfig, setting: str) -> None:
    """Before instantiating a dataclass target: unknown keys, text where a number or a flag is expected
    (``sampling.temperature=abc``) and counts outside their declared bounds (``method.n=0``, see
    :mod:`fafo.bounds`), as one line naming the setting. Nested targets are checked too."""
    import dataclasses

    from hydra._internal.utils import _locate

    try:
        cls = _locate(str(node["_target_"]))
    except Exception:  # noqa: BLE001 - instantiate reports an unknown target itself
        return
    if not dataclasses.is_dataclass(cls):
        return
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in node:
        if key == "_target_":
            continue
        if key not in fields:
            known = f"its settings are {', '.join(fields)}" if fields else "it has no settings"
            raise ConfigError(f"{setting}.{key} is not a setting of {cls.__name__}; {known}")
        value = node[key]
        if isinstance(value, DictConfig) and "_target_" in value:
            check_fields(value, f"{setting}.{key}")
            continue
        default = fields[key].default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{setting}.{key}={value!r} must be true or false")
        elif isinstance(default, (int, float)) and isinstance(value, str):
            raise ConfigError(f"{setting}.{key}={value!r} must be a number (default {default})")
        check_bound(cls, key, value, f"{setting}.{key}")  # declared next to the field (fafo.bounds)


def method_node(cfg: DictConfig) -> DictConfig:
    """The method config without the keys that are not constructor arguments (``name``)."""
    node = OmegaConf.to_container(cfg, resolve=True)
    node.pop("name", None)
    return OmegaConf.create(node)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"bench.device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"bench.device={name!r} but CUDA is not available here; use bench.device=cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> str:
    if name == "auto":  # the papers' setting on GPU; exact comparisons need float32 on CPU
        return "float16" if device.type == "cuda" else "float32"
    if name not in DTYPES:
        raise ConfigError(f"bench.dtype={name!r} is not supported; use auto or one of {', '.join(DTYPES)}")
    return name


def check_bench(bench: DictConfig) -> None:
    positive = {"repeats": 1, "warmup": 0, "warmup_tokens": 1, "seed": 0, "bootstrap": 0}
    for key, low in positive.items():
        value = bench.get(key, low)
        if not _is_int(value) or value < low:
            raise ConfigError(f"bench.{key}={value!r} must be an integer >= {low}")
    for key, low, what in (("max_spread", 1.0, "a factor (max/min of a sample's repeats), e.g. 1.5"),
                           ("reuse_max_spread", 1.0, "a factor (max/min of a stored reference's repeats), e.g. 1.1"),
                           ("busy_load", 0.0, "a load average per CPU core, e.g. 0.75")):
        value = bench.get(key, low + 1)
        if not _is_number(value) or value <= low:
            raise ConfigError(f"bench.{key}={value!r} must be a number > {low:g}: {what}")
    if bench.get("tie_check", "cpu") not in ("cpu", "device"):
        raise ConfigError(f"bench.tie_check={bench.get('tie_check')!r} is not a place; use cpu (a float32 copy kept "
                          "on the CPU) or device (loaded on the device and freed around each check)")
    for key in ("reuse_reference", "ignore_eos", "progress", "aa_floor"):
        if not isinstance(bench.get(key, False), bool):
            raise ConfigError(f"bench.{key}={bench.get(key)!r} must be true or false")
    for key in ("max_samples", "max_new_tokens"):
        value = bench[key]
        if value is not None and (not _is_int(value) or value < 1):
            raise ConfigError(f"bench.{key}={value!r} must be a positive integer or null")
    kind = bench.get("speedup_kind", "e2e")
    if kind not in SPEEDUP_KINDS:
        raise ConfigError(f"bench.speedup_kind={kind!r} is not a speedup; use one of {', '.join(SPEEDUP_KINDS)} "
                          "(e2e: prefill included; decode: decoding speed; specbench: Spec-Bench's mean tokens/s)")
    margin = bench.get("tie_margin", 0.1)
    if not _is_number(margin) or margin < 0:
        raise ConfigError(f"bench.tie_margin={margin!r} must be a number >= 0 (a float32 logit gap, e.g. 0.1)")


def resolve_compile(bench: DictConfig, device: torch.device) -> CompileOptions | None:
    """``bench.compile*`` -> the compile options of decode steps, or None for eager (checked before loading).

    auto: compiled with CUDA graphs (``reduce-overhead``) on CUDA, eager on CPU.
    """
    enabled = bench.get("compile", "auto")
    if enabled not in ("auto", True, False):
        raise ConfigError(f"bench.compile={enabled!r} must be auto, true or false")
    if enabled is False or (enabled == "auto" and device.type != "cuda"):
        return None
    mode = bench.get("compile_mode", "auto")
    if mode == "auto":
        mode = "reduce-overhead" if device.type == "cuda" else "default"
    if mode not in COMPILE_MODES:
        raise ConfigError(f"bench.compile_mode={mode!r} is not a torch.compile mode; use auto or one of "
                          f"{', '.join(COMPILE_MODES)}")
    if mode == "reduce-overhead" and device.type != "cuda":
        raise ConfigError("bench.compile_mode=reduce-overhead replays CUDA graphs and needs a CUDA device; "
                          "use bench.compile_mode=default on CPU")
    attention = bench.get("compile_attention", "auto")
    if attention not in ("auto", "flex", "sdpa"):
        raise ConfigError(f"bench.compile_attention={attention!r} must be auto, flex or sdpa")
    backend = bench.get("compile_backend", "inductor")
    options = CompileOptions(mode=mode, backend=backend, attention=attention)
    if backend == "inductor" and device.type == "cpu" and options.attention_for(device) == "flex":
        raise ConfigError("bench.compile_attention=flex cannot be compiled by inductor on CPU (no FlexAttention "
                          "log-sum-exp output there); use bench.compile_attention=auto or "
                          "bench.compile_backend=aot_eager")
    return options


def resolve_model(model_cfg: DictConfig, overrides=(), choice: str | None = None, weights: bool = True) -> Checkpoint:
    """The checkpoint the model config names (:func:`fafo.engine.loader.open_checkpoint`; ``weights=False``: no
    weight files, for ``bench.plan``). ``model.path`` / ``model.gguf_file`` win over what only comes with the model
    group (a ``tiny`` spec, a preset's GGUF file): see :mod:`fafo.bench.naming`."""
    kind = model_source(model_cfg, overrides, choice)  # ConfigError where a built-in model and a path are both given
    check_backend(model_cfg.get("attention", "sdpa"))
    if kind is None:
        raise ConfigError("model.path is not set; give a hub id or a local checkpoint directory "
                          "(or choose model=tiny_llama)")
    given = {"gguf": ("gguf_file", "path", "revision"), "path": ("path", "revision"), "tiny": ("tiny",)}[kind]
    return open_checkpoint(weights=weights, **{k: plain(model_cfg.get(k)) for k in given})


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def environment(device: torch.device) -> dict:
    """Where numbers came from: device name, library versions, git sha."""
    import transformers

    from fafo import __version__

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    return {"device": str(device), "device_name": name, "torch": torch.__version__,
            "transformers": transformers.__version__, "fafo_bench": __version__, "git_sha": sha,
            "python": platform.python_version()}


CONF = Path(__file__).resolve().parents[2] / "conf"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_added_keys(overrides) -> None:
    """``+key=value`` overrides that add what no config knows: a misspelt group (``+nosuchgroup=foo``) or a
    misspelt ``bench`` setting (``+bench.repeat=3``) would otherwise be accepted and ignored."""
    groups = {p.name for p in CONF.iterdir() if p.is_dir()} | set(OmegaConf.load(CONF / "config.yaml"))
    bench_keys = set(OmegaConf.load(CONF / "bench" / "default.yaml"))
    for item in overrides or ():
        item = str(item)
        if not item.startswith("+") or "=" not in item:
            continue
        key = item.lstrip("+").split("=", 1)[0]
        top, _, rest = key.partition(".")
        top = top.split("/")[0].split("@")[0]
        if top not in groups:
            raise ConfigError(f"+{key} adds a setting no config reads: {top} is not a config group or setting "
                              f"(groups: {', '.join(sorted(g for g in groups if g not in ('defaults', 'hydra')))}); "
                              "remove it or fix its spelling")
        if top == "bench" and rest and rest.split(".")[0] not in bench_keys:
            raise ConfigError(f"+{key}: bench.{rest.split('.')[0]} is not a bench setting (see conf/bench/"
                              "default.yaml); remove it or fix its spelling")


def check_config(cfg: DictConfig, overrides=()) -> None:
    """Checks of the whole config that need no model: keys added by ``+`` overrides, wandb.mode, model.max_len,
    output_dir."""
    check_added_keys(overrides)
    from fafo.bench.wandb_log import check_wandb

    check_wandb(cfg)  # an unknown mode, or online without wandb installed
    max_len = cfg.model.get("max_len")
    if max_len is not None and (not _is_int(max_len) or max_len < 1):
        raise ConfigError(f"model.max_len={max_len!r} must be a positive integer (cache slots; above the "
                          "checkpoint's trained length with a warning) or null for the checkpoint's own context")
    check_output_dir(cfg.bench.output_dir)
    reference_dir = cfg.bench.get("reference_dir")
    if reference_dir:
        check_directory_or_creatable(reference_dir, Source("bench.reference_dir", str(reference_dir),
                                                           "set bench.reference_dir to a directory path"))


def check_output_dir(output_dir) -> None:
    """bench.output_dir must be a directory or creatable as one (no regular file on its path)."""
    path = Path(str(output_dir)).expanduser()
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                raise ConfigError(f"bench.output_dir={str(output_dir)!r}: {part} is a file, not a directory; set "
                                  "bench.output_dir to a directory path")
            return


def check_region_fits(method, context: int) -> None:
    """A compression function that keeps at least the whole context is a mistake (e.g. local=100000 at 4k)."""
    compress = getattr(method, "compress", None)
    budget = getattr(compress, "budget", None)
    if not _is_int(budget) or budget < context:
        return
    names = getattr(compress, "budget_fields", ())  # declared by the compression: the settings that size it
    knobs = " or ".join(f"method.compress.{name}" for name in names) or "method.compress's sizes"
    raise ConfigError(f"method.compress keeps {budget} entries, not fewer than the model context {context}, so it "
                      f"compresses nothing; lower {knobs} below {context}")
