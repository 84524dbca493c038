"""What a run is called and where it is written, from Hydra's record of how it was asked for (:class:`Job`: the
overrides as typed, each group's option, ``override_dirname``) and the model config, so that ``python -m
fafo.bench ARGS`` and ``resolve(compose_run(*ARGS))`` in Python get the same names and directory. The rules are
docs/running.md's ("Your own checkpoint"):

* a typed ``model.path`` / ``model.gguf_file`` is loaded whatever the model group; the group's built-in model (a
  ``tiny`` spec, a preset's GGUF file) only when no path is given; a built-in model typed too is one ConfigError;
* names: a typed ``model.name`` as is; else a checkpoint given by path is named after itself (hub id, directory's
  name, GGUF file's name); a preset used as it is keeps its name (the paper tables are keyed by those);
* directories ``<model>/<task>/<method>/<overrides>``; ``<overrides>`` is Hydra's ``override_dirname`` (``default``
  when empty) and keeps ``model.path``, so two checkpoints whose directories share a name never resume into each
  other.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from fafo.bounds import plain
from fafo.engine.loader import HUB_ID, Checkpoint, open_checkpoint
from fafo.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf"  # the one config directory
_UNSAFE = re.compile(r"[^\w.,=+-]+")  # runs of characters a directory name does not keep


@dataclass(frozen=True)
class Job:
    """Hydra's record of how a run was asked for (its config's ``hydra`` node)."""

    overrides: tuple[str, ...] = ()  # hydra.overrides.task: as typed, e.g. ("model.path=/ckpt/x",)
    choices: dict = field(default_factory=dict)  # hydra.runtime.choices: {group: option}, e.g. {"model": "tiny_llama"}
    override_dirname: str = ""  # hydra.job.override_dirname: the overrides minus exclude_keys, sorted

    @classmethod
    def of(cls, cfg=None) -> Job:
        """From ``cfg.hydra`` (``compose(..., return_hydra_config=True)``), else from the running Hydra app, else
        nothing typed."""
        node = cfg.get("hydra") if isinstance(cfg, DictConfig) else None
        if node is None:
            from hydra.core.hydra_config import HydraConfig

            if not HydraConfig.initialized():
                return cls()
            node = HydraConfig.get()
        return cls(tuple(node.overrides.task), OmegaConf.to_container(node.runtime.choices),
                   str(node.job.get("override_dirname") or ""))


@dataclass(frozen=True)
class RunNames:
    """A run's model name (records, summaries, W&B) and the parts of its directory."""

    model: str | None  # None where the model config is refused (both given)
    model_dir: str
    task: str
    method: str
    overrides: str

    def path(self, *parts: str) -> str:
        """``model/task/method/overrides`` (or the parts named), the model part being ``model_dir``."""
        return "/".join(getattr(self, "model_dir" if p == "model" else p)
                        for p in parts or ("model", "task", "method", "overrides"))


def run_names(model_cfg, job: Job = Job()) -> RunNames:
    """Name a run (module doc). A model both given and built in (a ConfigError the runner reports) names the
    directory after the group option."""
    if OmegaConf.is_config(model_cfg):
        model_cfg = OmegaConf.to_container(model_cfg, resolve=True)
    model_cfg, choice = model_cfg or {}, job.choices.get("model")
    try:
        name = model_name(model_cfg, job.overrides, choice)
    except ConfigError:
        name = None
    typed = given_keys(job.overrides) & {"model.path", "model.gguf_file", "model.name"}
    as_named = name and (typed or name != model_cfg.get("name"))  # else a preset used as it is: its option
    directory = dir_name(name) if as_named else str(choice or name or "model")
    return RunNames(name, directory, str(job.choices.get("task")), str(job.choices.get("method")),
                    overrides_dir(job.override_dirname))


def compose_run(*overrides: str, config_dir: str | Path = CONF) -> DictConfig:
    """The config ``python -m fafo.bench OVERRIDES`` runs, with Hydra's node (the CLI's names and directory for
    :func:`fafo.bench.spec.resolve`), composed from ``config_dir`` unless Hydra is initialized already."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=list(overrides), return_hydra_config=True)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def split_hydra(cfg: DictConfig) -> tuple[DictConfig, str | None]:
    """(``cfg`` without Hydra's node, as the CLI's task function gets it; ``hydra.run.dir`` or None)."""
    if not isinstance(cfg, DictConfig) or cfg.get("hydra") is None:
        return cfg, None
    run_dir, cfg = str(cfg.hydra.run.dir), copy.deepcopy(cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg, run_dir


def given_keys(overrides) -> set[str]:
    """The keys an override list sets, as typed: ``model=x`` -> ``model`` (the group choice),
    ``++model.tiny.seed=3`` -> ``model.tiny.seed``. Deletions (``~key``) set nothing."""
    return {str(o).split("=", 1)[0].lstrip("+") for o in overrides or () if "=" in str(o) and str(o)[0] != "~"}


def checkpoint_name(path: str) -> str:
    """A checkpoint's own name: a hub id as is (``org/name``), a directory's name (``/ckpt/my-llama/`` ->
    ``my-llama``)."""
    text = str(path).rstrip("/\\") or str(path)
    local = Path(os.path.expanduser(text))
    if HUB_ID.match(text) and not local.exists():
        return text
    return local.name or local.resolve().name or text


def dir_name(name: str) -> str:
    """A model name as one directory level (``org/name`` -> ``org--name``)."""
    return _UNSAFE.sub("_", str(name).replace("/", "--")) or "model"


def overrides_dir(override_dirname: str) -> str:
    """Hydra's ``override_dirname`` as one directory level ("default" when empty; long ones end in a hash)."""
    name = _UNSAFE.sub("_", override_dirname) or "default"
    return name if len(name) <= 120 else name[:100] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]


def _both(builtin: str, what: str, given: str, value) -> ConfigError:
    return ConfigError(f"{builtin} ({what}) and {given}={value} are both given; drop {builtin} to benchmark "
                       f"{value}, or drop {given} to use {what}")


def model_source(model_cfg, overrides=(), choice: str | None = None) -> str | None:
    """Which of the model config's sources is loaded: ``"gguf"`` (``model.gguf_file``, inside ``model.path`` when
    both are set), ``"path"`` (a hub id or checkpoint directory), ``"tiny"`` (a built-in random model) or None.

    A source typed (``model.path``, ``model.gguf_file``) wins over one that only comes with the model group (a
    ``tiny`` spec, a preset's ``gguf_file``); where the overrides also name the group's source (``model=<option>``
    or ``model.tiny...``) that is ambiguous: one ConfigError line names both and the fix.
    """
    given = given_keys(overrides)
    path, gguf, tiny = model_cfg.get("path"), model_cfg.get("gguf_file"), model_cfg.get("tiny")
    typed = [k for k in ("model.gguf_file", "model.path") if k in given and model_cfg.get(k.split(".")[1])]
    group = f"model={choice or '...'}" if "model" in given else None
    tiny_keys = sorted(k for k in given if k == "model.tiny" or k.startswith("model.tiny."))
    if tiny and typed and (tiny_keys or group):
        raise _both(tiny_keys[0] if tiny_keys else group, "a built-in random tiny model", typed[0],
                    model_cfg.get(typed[0].split(".")[1]))
    if gguf:
        if "model.gguf_file" in given or "model.path" not in given or not path:
            return "gguf"
        if group:  # the group's GGUF file and a typed path
            raise _both(group, f"its GGUF file {gguf}", "model.path", path)
        return "path"  # model.path=X alone: X, not the default group's GGUF file
    if path:
        return "path"
    return "tiny" if tiny else None


def model_name(model_cfg, overrides=(), choice: str | None = None) -> str:
    """The model's name in records, summaries, W&B and run directories (module doc)."""
    given = given_keys(overrides)
    name, source = model_cfg.get("name"), model_source(model_cfg, overrides, choice)
    if name and "model.name" in given:
        return str(name)
    if source == "gguf" and ("model.gguf_file" in given or not name):
        return Path(str(model_cfg.get("gguf_file"))).name.removesuffix(".gguf")  # foo.Q4_1.gguf -> foo.Q4_1
    if source == "path" and ("model.path" in given or model_cfg.get("tiny") or model_cfg.get("gguf_file")
                             or not name):
        return checkpoint_name(str(model_cfg.get("path")))
    return str(name or "tiny")


def checkpoint(model_cfg, job: Job = Job(), weights: bool = True) -> Checkpoint:
    """The checkpoint the model config names under the rules above (:func:`model_source`), opened by the engine's
    loader (``weights=False``: no weight files, for ``bench.plan``)."""
    from fafo.engine.engine import check_backend

    kind = model_source(model_cfg, job.overrides, job.choices.get("model"))
    check_backend(model_cfg.get("attention", "sdpa"))
    if kind is None:
        raise ConfigError("model.path is not set; give a hub id or a local checkpoint directory "
                          "(or choose model=tiny_llama)")
    given = {"gguf": ("gguf_file", "path", "revision"), "path": ("path", "revision"), "tiny": ("tiny",)}[kind]
    return open_checkpoint(weights=weights, **{k: plain(model_cfg.get(k)) for k in given})


def _run_dir_resolver(*parts: str, _root_: DictConfig) -> str:
    """``${fafo_run_dir:}`` (``model/task/method/overrides``) or ``${fafo_run_dir:model,overrides}``: the run
    directory's parts named by :func:`run_names` from the config being resolved and its Hydra node."""
    return run_names(_root_.get("model"), Job.of(_root_)).path(*parts)


# used by hydra.run.dir / hydra.sweep.subdir in conf/config.yaml and conf/experiment/demo.yaml
OmegaConf.register_new_resolver("fafo_run_dir", _run_dir_resolver, replace=True)
