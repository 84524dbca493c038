"""``python -m fafo.bench``: the Hydra app (config groups model, method, task, sampling, bench, experiment).

Examples::

    python -m fafo.bench                                   # tiny random model, built-in prompts, CPU
    python -m fafo.bench model=llama3_8b_instruct task=mt_bench method=vanilla
    python -m fafo.bench -m model=tiny_llama,tiny_qwen2 bench.max_new_tokens=16,32
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fafo.errors import ConfigError


def run_name(override_dirname: str) -> str:
    """A filesystem-safe directory name for a run's overrides ("default" when there are none)."""
    if not override_dirname:
        return "default"
    name = re.sub(r"[^\w.,=+-]+", "_", override_dirname)
    if len(name) > 120:
        name = name[:100] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


OmegaConf.register_new_resolver("fafo_run_name", run_name, replace=True)


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> dict | None:
    from fafo.bench.runner import Runner

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        return Runner(cfg, run_dir).run()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if HydraConfig.get().mode.name != "MULTIRUN":
            sys.exit(2)
        run_dir.mkdir(parents=True, exist_ok=True)  # a sweep goes on with its other jobs; the failure stays on disk
        (run_dir / "error.txt").write_text(f"error: {exc}\n")
        return None


if __name__ == "__main__":
    main()
