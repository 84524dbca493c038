"""The command line checked before Hydra composes it: a misspelt group option (``method=fafo_steam``) or setting
(``bench.max_new_token=5``, ``+bench.max_new_token=5``) is one ``error:`` line naming the closest valid name
(:func:`difflib.get_close_matches`), instead of Hydra's multi-line error or a run that loads a model first. So is a
method override in a comparison (``experiment=demo method.n=4``), which would reach none of the compared methods,
and a sweep's setting that one of its jobs lacks (``-m method=vanilla,fafo_stream method.k=4``); one that every job
has reaches each of them (:func:`sweep_ready`). So is a setting naming a file, a directory or the run typed empty
(:func:`check_empty_values`).

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


# settings that name a file, a directory or the run: typed empty (``bench.output_dir=$OUT`` with OUT unset) they
# would fall back to a default or name the filesystem's root ("" + "/model/task/..."), so they are refused
NAMED_BY_TEXT = {"path": "a hub id or a directory", "data_path": "a data file or directory",
                 "gguf_file": "a GGUF file", "output_dir": "a directory", "reference_dir": "a directory",
                 "cost_curve": "a cost-curve CSV", "name": "a name", "revision": "a branch, tag or commit"}


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


def multirun_flag_first(argv: list[str]) -> list[str]:
    """``fafo-bench model=x -m a=1,2``: Hydra's argument parser takes the overrides as one run of words, so a ``-m``
    after one leaves the rest as "unrecognized arguments"; moved to the front it is the sweep that was typed."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    return flags + [a for a in argv if a not in flags] if flags and argv[0] not in flags else argv


def check_command_line(argv: list[str], conf: Path = CONF, multirun: bool | None = None) -> list[str]:
    """Raise ConfigError for the first misspelt group option or setting of ``argv`` (``sys.argv[1:]``); return the
    command line Hydra should get (``argv``, with the rewrites of :func:`sweep_ready` in a sweep: ``multirun``,
    by default whether ``argv`` has ``-m`` or ``hydra.mode=MULTIRUN``, moved first by :func:`multirun_flag_first`)."""
    argv = multirun_flag_first(argv)
    args = overrides_of(argv)
    if not args or any(a in CONFIG_DIRS for a in argv) or any(a.startswith("hydra.searchpath") for a in args):
        return argv  # configs beyond conf/ (a user's own methods): left to Hydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except Exception:  # noqa: BLE001 - Hydra says what is malformed
        return argv
    check_empty_values(parsed)
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
        return argv
    configs = compositions(chosen, conf, every_job=False)
    if not configs:
        return argv
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
            parent, _, name = key.rpartition(".")
            owner = owner_of(parent, [node_at(c, parent) for c in configs])
            raise ConfigError(f"+{key} is not a setting{node_hint(parent, owner, name, fields)} "
                              f"(every {parent} setting: docs/running.md)")
        raise ConfigError(f"{key} is not a setting{unknown_key_hint(key, configs, groups)} (every setting: "
                          "docs/running.md; a key no config has is added with +key=value)")
    if multirun is None:
        multirun = any(a in ("-m", "--multirun", "hydra.mode=MULTIRUN") for a in argv)
    return sweep_ready(argv, settings, chosen, conf, groups) if multirun else argv


def check_empty_values(parsed: list) -> None:
    """A setting of :data:`NAMED_BY_TEXT` typed with an empty value, alone or as one value of a sweep."""
    for o in parsed:
        what = NAMED_BY_TEXT.get(o.key_or_group.rpartition(".")[2])
        if what is None or o.is_hydra_override() or o.is_delete() or (o.is_sweep_override()
                                                                      and not o.is_discrete_sweep()):
            continue
        values = list(o.sweep_string_iterator()) if o.is_discrete_sweep() else [o.get_value_element_as_str()]
        if any(str(v).strip() in ("", "''", '""') for v in values):
            key = o.key_or_group
            raise ConfigError(f"{key} is empty (an unset shell variable?); give {what}, or leave {key} out for "
                              "its default")


def sweep_ready(argv: list[str], settings: list, chosen: dict[str, list[str]], conf: Path,
                groups: dict[str, list[str]]) -> list[str]:
    """A sweep's settings checked against, and made to reach, every job. Hydra sets each of them in every job of
    the sweep, so one that a job lacks (``-m method=vanilla,fafo_stream method.k=4``) fails that job: one
    ConfigError names the job first. And Hydra composes a sweep's base config first, from the command line without
    its swept values (a swept group at its default: ``method=vanilla``), and sets every other setting in it
    (facebookresearch/hydra issues 283 and 2888): ``-m method=fafo_quest,fafo_stream method.k=4`` fails there,
    vanilla having no ``method.k``, though every job has it. Such a setting is passed as a one-value sweep
    (``method.k=choice(4)``): Hydra sets it in each job alone, and names the job as typed (its run directory says
    ``method.k=4``). Only settings under a group with options to differ by (``method.*``, not ``bench.*``)."""
    plain = [o for o in settings if not o.is_add() and not o.is_sweep_override()
             and len(groups.get(o.key_or_group.split(".")[0], ())) > 1]
    if not plain:
        return argv
    jobs = compositions(chosen, conf)
    base = compositions({g: v for g, v in chosen.items() if len(v) == 1}, conf, every_job=False)
    preset_sweep = (base[0].hydra.sweeper.get("params") or {}) if base else {}  # table2's rows
    swept = {g for g, v in chosen.items() if len(v) > 1} | set(preset_sweep)
    for o in plain:
        lacking = [job for job in jobs if not has_key(job, o.key_or_group)]
        if lacking:
            job = " ".join(f"{g}={c}" for g, c in lacking[0].hydra.runtime.choices.items() if g in swept)
            raise ConfigError(f"{o.input_line}: the sweep's job with {job} has no {o.key_or_group}, and a setting on "
                              "the command line is set in every job of a sweep; sweep the jobs that have it on their "
                              "own")
    rewrite = {o.input_line: one_value_sweep(o.input_line) for o in plain
               if base and not has_key(base[0], o.key_or_group)}
    return [rewrite.get(a, a) for a in argv]


def one_value_sweep(line: str) -> str:
    """``key=choice(value)``, which Hydra expands back to ``key=value`` exactly; ``++key=value`` (a forced add,
    which sets it in the base config as well, at the cost of a run directory named with ``++``) for a value that
    would not come back as typed (``null``, quoted text, an interpolation)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key, value = line.split("=", 1)
    try:
        swept = OverridesParser.create().parse_overrides([f"{key}=choice({value})"])[0]
        if list(swept.sweep_string_iterator()) == [value]:
            return f"{key}=choice({value})"
    except Exception:  # noqa: BLE001 - Hydra's grammar refused it
        pass
    return f"++{line}"


def unknown_key_hint(key: str, configs: list, groups: dict[str, list[str]]) -> str:
    """The hint after ``<key> is not a setting``: under the deepest node of ``key`` that exists (``method`` in
    ``method.n``), :func:`node_hint` on that node's keys; without one, the closest dotted key of the whole config
    (``bnech.max_new_tokens``)."""
    parts = key.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:depth])
        nodes = [node_at(c, parent) for c in configs if has_key(c, parent)]
        nodes = [n for n in nodes if hasattr(n, "keys")]
        if nodes:
            children = [k for n in nodes for k in n.keys() if k != "_target_"]
            return node_hint(parent, owner_of(parent, nodes), parts[depth], children, parts[depth + 1:])
    known = [k for c in configs for k in dotted_keys(c)] + list(groups)
    return suggest(key, known)


def node_hint(parent: str, owner: str, name: str, settings: list[str], rest=(), shown: int = 12) -> str:
    """The closest of a node's own settings to ``name`` (``; did you mean method.stagger?``), or, with none close,
    the list of them (``; method (LookaheadDecoder) has: level, window, ...``). Matched on the one name, not the
    dotted key: a long shared prefix would make any sibling look close (``method.compress.sink`` for
    ``method.compress.token_budget``)."""
    settings = list(dict.fromkeys(settings))
    close = difflib.get_close_matches(name, settings, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {'.'.join([parent, close[0], *rest])}?"
    if not settings:
        return f"; {owner} has no settings"
    more = f", and {len(settings) - shown} more" if len(settings) > shown else ""
    return f"; {owner} has: {', '.join(settings[:shown])}{more}"


def owner_of(parent: str, nodes: list) -> str:
    """``method (LookaheadDecoder)``: a node's key with the classes its ``_target_`` builds, if any."""
    classes = [str(n["_target_"]).rpartition(".")[2] for n in nodes if hasattr(n, "keys") and "_target_" in n]
    return f"{parent} ({', '.join(dict.fromkeys(classes))})" if classes else parent


def node_at(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = node[part]
    return node


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
                                           + [f"{group}={value.strip()}"], return_hydra_config=True))
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
    node = node_at(cfg, parent)
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
