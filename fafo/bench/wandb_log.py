"""Weights & Biases logging: config, one log step per row, the per-sample table and the summary. ``offline`` by
default (files under the run directory, ``wandb sync`` later), ``online`` by flag, ``disabled`` in tests; wandb is
an optional extra: without it ``offline`` runs with W&B off (one note) and ``online`` is refused before a model loads.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fafo.errors import ConfigError
from fafo.extras import available, install_hint, require

MODES = ("offline", "online", "disabled")
_noted: set[str] = set()  # the note on a missing wandb is printed once per process (compare runs several methods)


def check_wandb(cfg: DictConfig) -> str:
    """``wandb.mode``, checked before a model loads: ConfigError for an unknown mode and for ``online`` without
    wandb installed (a sync that was asked for cannot happen)."""
    mode = cfg.get("wandb", {}).get("mode", "disabled")
    if mode not in MODES:
        raise ConfigError(f"wandb.mode={mode!r} is not a wandb mode; use one of {', '.join(MODES)}")
    if mode == "online":
        require("wandb", "wandb.mode=online")
    return mode


def wandb_mode(cfg: DictConfig) -> str:
    """The mode a run logs with: ``wandb.mode``, or ``disabled`` (and one note) when it is ``offline`` and wandb is
    not installed."""
    mode = check_wandb(cfg)
    if mode == "disabled" or available("wandb"):
        return mode
    if mode not in _noted:
        _noted.add(mode)
        print(f"note: wandb is not installed, so W&B logging is off (wandb.mode={mode}); to log: "
              f"{install_hint('wandb')}", file=sys.stderr, flush=True)
    return "disabled"


class WandbLogger:
    def __init__(self, cfg: DictConfig, run_dir: Path, run_name: str):
        mode = wandb_mode(cfg)
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

    def config(self, values: dict) -> None:
        """Add to the W&B run's config (e.g. the machine's state as the run starts)."""
        if self.run is not None:
            self.run.config.update(values, allow_val_change=True)

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
