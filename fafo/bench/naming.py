"""Which checkpoint a run uses and what it is called: a given path wins, names come from the checkpoint.

Rules (the README's "Your own checkpoint" section says the same):

* **A given path is the thing used, always.** ``model.path`` (hub id or directory) or ``model.gguf_file`` typed
  on the command line is loaded whatever the model group is; what only comes with the group (the ``tiny`` spec
  of the built-in random models, a preset's GGUF file such as ``model=smollm2_135m``'s) is used only when no path
  is given. ``model.path=DIR model.gguf_file=F.gguf`` together is one source: file F inside DIR.
* **Both given is an error.** Where the command line names a built-in model (``model=tiny_llama``, any
  ``model.tiny...`` key, or ``model=smollm2_135m``) *and* a path, the run stops with one line naming both and the
  fix. A built-in model that comes only from the default group (or from an ``experiment=`` preset) is not
  "given": ``model.path=X`` alone loads X.
* **Names.** An explicit ``model.name=...`` is used as is. Otherwise a checkpoint given by path is named after
  itself: the hub id (``org/name``), the directory's name, or the GGUF file's name without ``.gguf``. A preset used
  as it is keeps its name (``tiny-llama``, ``llama2-7b-chat``: the paper tables are keyed by those).
* **Run directories** (``results/runs/<model>/...``): the group option (``tiny_llama``, ``llama2_7b_chat``) for a
  preset used as it is, so existing result trees keep resuming; the run's model name (``/`` -> ``--``) where a
  path or ``model.name`` was given. ``model.path=...`` also stays in the overrides part of the directory, so two
  checkpoints whose directories share a name never resume into each other's run.

"Given" means typed on the command line: Hydra's ``overrides.task``. Without Hydra (``Runner`` built from a
composed config in Python) nothing counts as given: a config holding both a path and a tiny spec uses the path
and names the run after it; a path with a GGUF file is the file inside the path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import OmegaConf

from fafo.errors import ConfigError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cli_overrides() -> tuple[list[str], str | None]:
    """(the command line's overrides of this job, the chosen model group option); ([], None) outside Hydra."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return [], None
    hc = HydraConfig.get()
    return list(hc.overrides.task), hc.runtime.choices.get("model")


def given_keys(overrides) -> set[str]:
    """The keys an override list sets, as typed: ``model=x`` -> ``model`` (the group choice),
    ``++model.tiny.seed=3`` -> ``model.tiny.seed``. Deletions (``~key``) set nothing."""
    keys = set()
    for item in overrides or ():
        item = str(item)
        if item.startswith("~") or "=" not in item:
            continue
        keys.add(item.split("=", 1)[0].lstrip("+"))
    return keys


def checkpoint_name(path: str) -> str:
    """A checkpoint's own name: a hub id as is (``org/name``), a directory's name (``/ckpt/my-llama/`` ->
    ``my-llama``)."""
    text = str(path).rstrip("/\\") or str(path)
    local = Path(os.path.expanduser(text))
    if _HUB_ID.match(text) and not local.exists():
        return text
    return local.name or local.resolve().name or text


def dir_name(name: str) -> str:
    """A model name as one directory level (``org/name`` -> ``org--name``)."""
    return re.sub(r"[^\w.,=+-]+", "_", str(name).replace("/", "--")) or "model"


def _both(builtin: str, what: str, given: str, value) -> ConfigError:
    return ConfigError(f"{builtin} ({what}) and {given}={value} are both given; drop {builtin} to benchmark "
                       f"{value}, or drop {given} to use {what}")


def model_source(model_cfg, overrides=(), choice: str | None = None) -> str | None:
    """Which of the model config's sources is loaded: ``"gguf"`` (``model.gguf_file``, inside ``model.path`` when
    both are set), ``"path"`` (a hub id or checkpoint directory), ``"tiny"`` (a built-in random model) or None.

    A source typed on the command line (``model.path``, ``model.gguf_file``) wins over one that only comes with
    the model group (a ``tiny`` spec, a preset's ``gguf_file``); where the command line also names the group's
    source (``model=<option>`` or ``model.tiny...``) that is ambiguous: one ConfigError line names both and the fix.
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
    """The model's name in records, summaries, W&B and run directories (see module doc)."""
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


def model_dir(choice, model_cfg, overrides) -> str:
    """The ``<model>`` level of a run directory (``hydra.run.dir`` / ``hydra.sweep.subdir``, see module doc)."""
    given = given_keys(overrides)
    model_cfg = model_cfg if model_cfg is not None else {}
    try:
        name = model_name(model_cfg, overrides, choice)
    except ConfigError:  # reported by the runner, with the exit status of a bad setting
        return str(choice or "model")
    if given & {"model.path", "model.gguf_file", "model.name"} or name != model_cfg.get("name"):
        return dir_name(name)
    return str(choice or name)


def _model_dir_resolver(choice, model_cfg, overrides) -> str:
    if OmegaConf.is_config(model_cfg):
        model_cfg = OmegaConf.to_container(model_cfg, resolve=True)
    if OmegaConf.is_config(overrides):
        overrides = OmegaConf.to_container(overrides, resolve=True)
    return model_dir(choice, model_cfg, overrides)


# used by hydra.run.dir / hydra.sweep.subdir in conf/config.yaml
OmegaConf.register_new_resolver("fafo_model_dir", _model_dir_resolver, replace=True)
