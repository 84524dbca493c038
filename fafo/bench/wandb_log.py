"""Weights & Biases logging: config, one log step per row, the per-sample table and the summary.

``offline`` by default (files under the run directory, sync later with ``wandb sync``), ``online`` by flag,
``disabled`` in tests. wandb is imported only when a mode other than ``disabled`` is asked for.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fafo.errors import ConfigError

MODES = ("offline", "online", "disabled")


class WandbLogger:
    def __init__(self, cfg: DictConfig, run_dir: Path, run_name: str):
        mode = cfg.wandb.mode
        if mode not in MODES:
            raise ConfigError(f"wandb.mode={mode!r} is not a wandb mode; use one of {', '.join(MODES)}")
        self.run = None
        if mode == "disabled":
            return
        import wandb

        self.run = wandb.init(
            project=cfg.wandb.project, entity=cfg.wandb.get("entity"), group=cfg.wandb.get("group"),
            name=run_name, mode=mode, dir=str(run_dir), reinit="finish_previous",
            config=OmegaConf.to_container(cfg, resolve=True), tags=list(cfg.wandb.get("tags") or []),
            settings=wandb.Settings(silent=mode == "offline"),  # offline: no console chatter (the run dir says where)
        )

    def log_row(self, row: dict) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float))})

    def finish(self, rows: list[dict], summary: dict) -> None:
        if self.run is None:
            return
        import wandb

        if rows:
            columns = list(rows[0])
            self.run.log({"samples": wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])})
        self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
        self.run.finish()
