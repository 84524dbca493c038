"""Side-by-side comparison (``compare.methods``; ``python -m fafo.bench experiment=demo``, the README's main job):
every method composed as ``method=<name> <your overrides> <compare.overrides.<name>>`` would compose it, resolved
before the model loads once, then run as an ordinary run on the shared engine into ``<run dir>/<method>/`` (a rerun
resumes), each warmed (``compare.warm_each``) with its own A/A floor (``compare.aa_each``). Then one table and a plot
of every method on the (sample, turn)s all of them completed (:mod:`fafo.bench.tools.compare_table`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from fafo.bench.naming import CONF
from fafo.errors import ConfigError

REFERENCE = "vanilla"


def method_configs(cfg: DictConfig, overrides: list[str]) -> dict[str, DictConfig]:
    """``{method: composed config}`` for every method of ``cfg.compare.methods``.

    ``overrides`` are the command line's; its ``compare`` overrides are replaced per method, and a ``method``
    override is refused (:func:`method_override_error`)."""
    from hydra import compose

    methods = list(cfg.compare.get("methods") or [])
    if not methods:
        raise ConfigError("compare.methods is empty; list conf/method names, e.g. compare.methods=[vanilla,lookahead]")
    per_method = cfg.compare.get("overrides") or {}
    for o in overrides:
        if is_method_override(o):
            raise method_override_error(o)
    keep = [o for o in overrides if not o.lstrip("+~").startswith("compare")]
    available = {p.stem for p in (CONF / "method").glob("*.yaml")}
    configs = {}
    for i, name in enumerate(methods):
        if name not in available:
            raise ConfigError(f"compare.methods: {name!r} is not a method config; use one of "
                              f"{', '.join(sorted(available))}")
        composed = compose(config_name="config", overrides=keep + [f"method={name}"] + list(per_method.get(name, [])))
        with_cfg = OmegaConf.to_container(composed, resolve=False)
        with_cfg.pop("compare", None)
        if i and not cfg.compare.get("warm_each", True):  # the first method warms the shared engine
            with_cfg["bench"]["warmup"] = 0
        if cfg.compare.get("aa_each", True) and name != REFERENCE:  # vanilla's own run is its A/A already
            with_cfg["bench"]["aa_floor"] = True
        configs[name] = OmegaConf.create(with_cfg)
    return configs


def is_method_override(override: str) -> bool:
    """Whether a command-line override picks or sets the method (``method=``, ``method.k=``, ``method/compress=``)."""
    return re.split(r"[./=@]", override.lstrip("+~"), maxsplit=1)[0] == "method"


def method_override_error(override: str) -> ConfigError:
    """A method override on a comparison's command line: every compared method is composed from its own name, so
    the override would reach none of them; the error says where it goes instead."""
    if override.lstrip("+~").split("=", 1)[0] == "method":
        fix = "list the methods to compare in compare.methods=[...]"
    else:
        fix = (f"give it per method, \"++compare.overrides.<method>=['{override}']\" (this replaces the "
               "list the preset gives that method: repeat the entries to keep)")
    return ConfigError(f"{override}: a comparison (compare.methods) composes every method from its own name, so a "
                       f"method override on the command line would reach none of them; {fix}, or run one method "
                       "alone: compare.methods=[] method=<name>")


def run_compare(cfg: DictConfig, run_dir: Path, overrides: list[str]) -> dict:
    """Run every method of ``cfg.compare.methods`` (see the module docstring); returns {method: summary}."""
    from fafo.bench.runner import Runner
    from fafo.bench.spec import resolve
    from fafo.bench.tools.compare_table import write_comparison

    specs = {name: resolve(c, run_dir / name) for name, c in method_configs(cfg, overrides).items()}
    bar = tqdm(total=sum(len(s.samples) for s in specs.values()), desc=f"compare {len(specs)} methods",
               file=sys.stderr, disable=not cfg.bench.progress)
    summaries, runner = {}, Runner()  # one engine, loaded by the first method
    for name, spec in specs.items():
        bar.set_description(f"{name} ({len(summaries) + 1}/{len(specs)})")
        summaries[name] = runner.run(spec, progress=bar, report=False)
    bar.close()
    write_comparison(cfg, run_dir, summaries)
    return summaries
