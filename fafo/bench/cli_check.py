"""The command line checked before Hydra composes it: a misspelt group option (``method=fafo_steam``) or setting
(``bench.max_new_token=5``, ``+bench.max_new_token=5``) is one ``error:`` line naming the closest valid name
(:func:`difflib.get_close_matches`), instead of Hydra's multi-line error or a run that loads a model first. So is a
method override in a comparison (``experiment=demo method.n=4``), which would reach none of the compared methods.

Only what is certainly wrong is refused; anything this check cannot judge (a malformed override, a config that
does not compose) is left to Hydra and the run's own checks.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

from fafo.bench.naming import CONF
from fafo.errors import ConfigError

FLAGS_WITH_VALUE = {"-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "--info",
                    "--experimental-rerun"}
CONFIG_DIRS = {"-cp", "--config-path", "-cd", "--config-dir"}
HELP = {"-h", "--help", "--hydra-help", "-c", "--cfg", "--resolve", "--shell-completion", "-sc", "--version"}


def group_options(conf: Path = CONF) -> dict[str, list[str]]:
    """{group: its options} for every config group under ``conf`` (``method``, ``method/compress``, ...)."""
    out = {}
    for d in sorted(p for p in conf.rglob("*") if p.is_dir()):
        group = d.relative_to(conf).as_posix()
        if not group.startswith("hydra"):
            out[group] = sorted(p.stem for p in d.glob("*.yaml"))
    return out


def suggest(word: str, names, prefix: str = "") -> str:
    """``; did you mean <prefix>X?`` for the closest of ``names`` ("" when none is close)."""
    close = difflib.get_close_matches(word, sorted(set(names)), n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def overrides_of(argv: list[str]) -> list[str] | None:
    """The overrides of a command line (flags and their values left out); None for a help or config print."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in HELP:
            return None
        elif arg in FLAGS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def check_command_line(argv: list[str], conf: Path = CONF) -> None:
    """Raise ConfigError for the first misspelt group option or setting of ``argv`` (``sys.argv[1:]``)."""
    args = overrides_of(argv)
    if not args or any(a in CONFIG_DIRS for a in argv) or any(a.startswith("hydra.searchpath") for a in args):
        return  # configs beyond conf/ (a user's own methods): left to Hydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except Exception:  # noqa: BLE001 - Hydra says what is malformed
        return
    groups = group_options(conf)
    chosen: dict[str, list[str]] = {}  # group -> the options the command line picks (several in a sweep)
    for o in parsed:
        if o.is_hydra_override() or o.is_delete() or o.key_or_group not in groups:
            continue
        values = list(o.sweep_string_iterator()) if o.is_discrete_sweep() else \
            [] if o.is_sweep_override() else [o.get_value_element_as_str()]
        for value in values:
            if value not in groups[o.key_or_group] and value != "null":
                group = o.key_or_group
                raise ConfigError(f"{group}={value}: no such {group} option"
                                  f"{suggest(value, groups[group], prefix=f'{group}=')} (the options: "
                                  f"conf/{group}/*.yaml)")
        chosen[o.key_or_group] = values
    check_comparison(parsed, chosen, conf)
    settings = [o for o in parsed if not o.is_hydra_override() and not o.is_delete() and not o.is_force_add()
                and o.key_or_group not in groups and "@" not in o.key_or_group]
    if not settings:
        return
    configs = compositions(chosen, conf, every_job=False)
    if not configs:
        return
    if not all(any(has_key(c, o.key_or_group) for c in configs) for o in settings):
        configs = compositions(chosen, conf)  # a setting only some jobs of the sweep have
    for o in settings:
        key = o.key_or_group
        if any(has_key(c, key) for c in configs):
            continue
        if o.is_add():
            schemas = [schema_fields(c, key) for c in configs]
            fields = [f for s in schemas if s is not None for f in s]
            if None in schemas or not fields or key.rpartition(".")[2] in fields:
                continue  # a setting its dataclass has, or a node without a schema (compare.overrides.<method>)
            parent = key.rpartition(".")[0]
            raise ConfigError(f"+{key} is not a setting{suggest(key, [f'{parent}.{f}' for f in fields])} "
                              f"(every {parent} setting: docs/running.md)")
        known = [k for c in configs for k in dotted_keys(c)] + list(groups)
        raise ConfigError(f"{key} is not a setting{suggest(key, known)} (every setting: docs/running.md; a key "
                          "no config has is added with +key=value)")


def check_comparison(parsed: list, chosen: dict[str, list[str]], conf: Path) -> None:
    """A method override in a comparison (``experiment=demo method.n=4``) is refused with where it goes instead, before
    the setting checks would call it unknown (the default method may lack it) or the run would drop it."""
    from fafo.bench.compare import is_method_override, method_override_error

    method_args = [o for o in parsed if not o.is_hydra_override() and is_method_override(o.input_line)]
    if not method_args:
        return
    given = [o for o in parsed if o.key_or_group == "compare.methods" and not o.is_delete()]
    if given:
        comparing = bool(given[-1].value())
    elif "experiment" not in chosen:
        comparing = False  # config.yaml compares nothing; only a preset does
    else:
        # composed without the method's own groups: a comparison does not hang on them, and vanilla has no compress
        configs = compositions({g: v for g, v in chosen.items() if not is_method_override(g)}, conf, every_job=False)
        comparing = bool(configs and (configs[0].get("compare") or {}).get("methods"))
    if comparing:
        raise method_override_error(method_args[0].input_line)


def compositions(chosen: dict[str, list[str]], conf: Path, every_job: bool = True) -> list:
    """The config composed with the command line's group options: the first of each, then (``every_job``) each
    other option of a swept group in turn and each of a preset's own sweep (a setting is known when any job of the
    sweep has it); [] if it does not compose."""
    from hydra import compose, initialize_config_dir

    first = [f"{g}={v[0]}" for g, v in chosen.items() if v]
    variants = [first] + [[o for o in first if not o.startswith(f"{g}=")] + [f"{g}={v}"]
                          for g, values in chosen.items() for v in values[1:]] * every_job
    out = []
    try:
        with initialize_config_dir(str(conf), version_base="1.3"):
            for overrides in variants:
                cfg = compose("config", overrides=overrides, return_hydra_config=True)
                out.append(cfg)
                params = (cfg.hydra.sweeper.get("params") or {}) if every_job else {}  # a preset's (table2)
                for group, values in params.items():
                    for value in str(values).split(","):
                        out.append(compose("config", overrides=[o for o in overrides if not o.startswith(f"{group}=")]
                                           + [f"{group}={value.strip()}"]))
    except Exception:  # noqa: BLE001 - a config that does not compose is Hydra's to report
        return []
    return out


def has_key(cfg, key: str) -> bool:
    node = cfg
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            return False
        node = node[part]
    return True


def dotted_keys(node, prefix: str = "") -> list[str]:
    out = []
    for k in node.keys() if hasattr(node, "keys") else ():
        if k == "hydra" and not prefix:
            continue
        out.append(f"{prefix}{k}")
        try:
            child = node[k]
        except Exception:  # noqa: BLE001 - a missing interpolation
            continue
        out += dotted_keys(child, f"{prefix}{k}.")
    return out


def schema_fields(cfg, key: str) -> list[str] | None:
    """The settings of the dataclass the parent node of ``key`` builds (``bench``: the bench settings; a node
    with a ``_target_``: that class), None when the parent has no schema."""
    parent = key.rpartition(".")[0]
    if not parent or not has_key(cfg, parent):
        return None
    node = cfg
    for part in parent.split("."):
        node = node[part]
    if parent == "bench":
        from fafo.bench.settings import Bench

        cls = Bench
    elif hasattr(node, "keys") and "_target_" in node:
        from hydra.utils import get_object

        try:
            cls = get_object(str(node["_target_"]))
        except Exception:  # noqa: BLE001
            return None
    else:
        return None
    return [f.name for f in dataclasses.fields(cls) if f.init] if dataclasses.is_dataclass(cls) else None
