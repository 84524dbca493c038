"""``python -m fafo.bench``: the Hydra app (config groups model, method, task, sampling, bench, experiment).

Examples::

    python -m fafo.bench                                   # tiny random model, built-in prompts, CPU
    python -m fafo.bench model=llama3_8b_instruct task=mt_bench method=vanilla
    python -m fafo.bench -m model=tiny_llama,tiny_qwen2 bench.max_new_tokens=16,32
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fafo.errors import ConfigError


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
