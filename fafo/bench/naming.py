"""What a run is called, where it is written and which checkpoint it loads, from Hydra's record of how it was asked
for (:class:`Job`) and the model config: ``python -m fafo.bench ARGS`` and ``resolve(compose_run(*ARGS))`` get the
same names and directory. The rules (docs/running.md, "Your own checkpoint"): a typed ``model.path`` /
``model.gguf_file`` is loaded whatever the model group, the group's built-in model (a ``tiny`` spec, a preset's GGUF
file) only when no path is given, and both typed is one ConfigError; a typed ``model.name`` names the run, else a
checkpoint given by path is named after itself, and a preset used as it is keeps its name (the paper tables are keyed
by those); directories are ``<model>/<task>/<method>/<overrides>``, the last Hydra's ``override_dirname``
(``default`` when empty), which keeps ``model.path``: two checkpoints whose directories share a name never resume
into each other.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from fafo.bounds import field_defaults, plain
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
    """A run's model name (records, summaries, W&B; None where the model config is refused) and its directory."""

    model: str | None
    model_dir: str
    task: str
    method: str
    overrides: str

    def path(self, *parts: str) -> str:
        """``model/task/method/overrides`` (or the parts named), the model part being ``model_dir``."""
        return "/".join(getattr(self, "model_dir" if p == "model" else p)
                        for p in parts or ("model", "task", "method", "overrides"))


def run_names(model_cfg, job: Job = Job()) -> RunNames:
    """Name a run (module doc); a model both given and built in names the directory after the group option."""
    if OmegaConf.is_config(model_cfg):
        model_cfg = OmegaConf.to_container(model_cfg, resolve=True)
    model_cfg, choice = model_cfg or {}, job.choices.get("model")
    try:
        name = model_name(model_cfg, job.overrides, choice)
    except ConfigError:
        name = None
    typed = given_keys(job.overrides) & {"model.path", "model.gguf_file", "model.name"}
    as_named = name and (typed or name != model_cfg.get("name"))  # else a preset used as it is: its option
    directory = _dir_part(str(name).replace("/", "--"), "model") if as_named else str(choice or name or "model")
    override_dir = _dir_part(job.override_dirname, "default")
    if len(override_dir) > 120:
        override_dir = override_dir[:100] + "-" + hashlib.sha1(override_dir.encode()).hexdigest()[:10]
    return RunNames(name, directory, str(job.choices.get("task")), str(job.choices.get("method")), override_dir)


def _dir_part(text: str, empty: str) -> str:
    return _UNSAFE.sub("_", text) or empty


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


def model_source(model_cfg, overrides=(), choice: str | None = None) -> str | None:
    """Which of the model config's sources is loaded (module doc): ``"gguf"`` (``model.gguf_file``, inside
    ``model.path`` when both are set), ``"path"`` (a hub id or directory), ``"tiny"`` or None; a typed source with
    the group's own also typed (``model=<option>``, ``model.tiny...``) is one ConfigError naming both."""
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
    return "path" if path else "tiny" if tiny else None


def _both(builtin: str, what: str, given: str, value) -> ConfigError:
    return ConfigError(f"{builtin} ({what}) and {given}={value} are both given; drop {builtin} to benchmark "
                       f"{value}, or drop {given} to use {what}")


def model_name(model_cfg, overrides=(), choice: str | None = None) -> str:
    """The model's name in records, summaries, W&B and run directories (module doc): a checkpoint's own name is
    its hub id, its directory's name or its GGUF file's (``foo.Q4_1.gguf`` -> ``foo.Q4_1``)."""
    given = given_keys(overrides)
    name, source = model_cfg.get("name"), model_source(model_cfg, overrides, choice)
    if name and "model.name" in given:
        return str(name)
    if source == "gguf" and ("model.gguf_file" in given or not name):
        return Path(str(model_cfg.get("gguf_file"))).name.removesuffix(".gguf")
    if source == "path" and ("model.path" in given or model_cfg.get("tiny") or model_cfg.get("gguf_file")
                             or not name):
        text = str(model_cfg.get("path")).rstrip("/\\") or str(model_cfg.get("path"))
        local = Path(os.path.expanduser(text))
        return text if HUB_ID.match(text) and not local.exists() else local.name or local.resolve().name or text
    return str(name or "tiny")


def checkpoint(model_cfg, job: Job = Job(), weights: bool = True) -> Checkpoint:
    """The checkpoint the model config names (:func:`model_source`), opened by the engine's loader
    (``weights=False``: no weight files, for ``bench.plan``)."""
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
    directory's parts from the config being resolved and its Hydra node (conf/config.yaml, experiment/demo.yaml)."""
    return run_names(_root_.get("model"), Job.of(_root_)).path(*parts)


OmegaConf.register_new_resolver("fafo_run_dir", _run_dir_resolver, replace=True)


def _store_class_defaults() -> None:
    """Each method and compression class's defaults (:func:`fafo.bounds.field_defaults`) as Hydra's config
    ``class_defaults/<Class>``: a conf/method/ YAML puts its class's first in its defaults list and sets only what
    differs, while every setting stays typed without ``+`` (``method.k=7``), and config.yaml lists them all."""
    import yaml
    from hydra.core.config_store import ConfigStore
    from hydra.utils import get_class

    for path in sorted((CONF / "method").rglob("*.yaml")):
        target = (yaml.safe_load(path.read_text()) or {}).get("_target_")
        try:  # _target_ first in config.yaml; one that does not import is refused when the run builds it
            node = {"_target_": target, **field_defaults(get_class(target))} if target else None
        except (ImportError, AttributeError, ValueError):
            node = None
        if node:
            ConfigStore.instance().store(group="class_defaults", name=target.rsplit(".", 1)[1], node=node)


_store_class_defaults()
