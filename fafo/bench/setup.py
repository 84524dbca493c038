"""Everything the runner checks and resolves before a model is loaded.

Each problem is one :class:`~fafo.errors.ConfigError` line naming the setting and the fix.
"""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fafo.engine.compiled import COMPILE_MODES, CompileOptions
from fafo.engine.engine import DTYPES, check_backend
from fafo.engine.loader import load_hf_config, load_tokenizer, resolve_checkpoint
from fafo.engine.tiny import tiny_checkpoint
from fafo.errors import ConfigError


def build(node: DictConfig, setting: str, **kwargs):
    """``hydra.utils.instantiate`` that surfaces our ConfigError (Hydra wraps errors raised in constructors)."""
    if node is None or "_target_" not in node:
        raise ConfigError(f"{setting} has no _target_; choose one of the configs in conf/{setting}/")
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
    positive = {"repeats": 1, "warmup": 0}
    for key, low in positive.items():
        if not isinstance(bench[key], int) or bench[key] < low:
            raise ConfigError(f"bench.{key}={bench[key]!r} must be an integer >= {low}")
    for key in ("max_samples", "max_new_tokens"):
        value = bench[key]
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"bench.{key}={value!r} must be a positive integer or null")


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


@dataclass
class Checkpoint:
    """A resolved model: its directory, transformers config and tokenizer (weights not loaded yet)."""

    path: Path
    config: object
    tokenizer: object
    identity: str  # what the reference key uses to name the weights

    @property
    def context(self) -> int:
        return self.config.max_position_embeddings


def resolve_model(model_cfg: DictConfig) -> Checkpoint:
    """Find (or build, for the tiny models) the checkpoint and read its config and tokenizer."""
    if model_cfg.get("tiny"):
        spec = OmegaConf.to_container(model_cfg.tiny, resolve=True)
        path = tiny_checkpoint(spec)
        identity = f"tiny:{path.name}"
    elif model_cfg.get("path"):
        path = resolve_checkpoint(str(model_cfg.path), model_cfg.get("revision"))
        identity = f"{model_cfg.path}@{model_cfg.get('revision') or 'main'}"
    else:
        raise ConfigError("model.path is not set; give a hub id or a local checkpoint directory "
                          "(or choose model=tiny_llama)")
    check_backend(model_cfg.get("attention", "sdpa"))
    return Checkpoint(path, load_hf_config(path), load_tokenizer(path), identity)


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
