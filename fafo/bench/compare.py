"""Side-by-side comparison (``compare.methods``; ``python -m fafo.bench experiment=demo``, the README's main job):
every method composed as ``method=<name> <your overrides> <compare.overrides.<name>>`` would compose it, resolved
before the model loads once, then run as an ordinary run on the shared engine into ``<run dir>/<method>/`` (a rerun
resumes), each warmed (``compare.warm_each``) with its own A/A floor (``compare.aa_each``). Then one table and a plot
of every method on the (sample, turn)s all of them completed (:mod:`fafo.bench.tools.compare_table`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from fafo.bench.naming import CONF
from fafo.errors import ConfigError

REFERENCE = "vanilla"


def method_configs(cfg: DictConfig, overrides: list[str]) -> dict[str, DictConfig]:
    """``{method: composed config}`` for every method of ``cfg.compare.methods``.

    ``overrides`` are the command line's; its ``method``/``compare`` overrides are replaced per method."""
    from hydra import compose

    methods = list(cfg.compare.get("methods") or [])
    if not methods:
        raise ConfigError("compare.methods is empty; list conf/method names, e.g. compare.methods=[vanilla,lookahead]")
    per_method = cfg.compare.get("overrides") or {}
    keep = [o for o in overrides if not o.lstrip("+~").startswith(("method", "compare"))]
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
