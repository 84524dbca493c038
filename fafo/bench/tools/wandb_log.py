"""Weights & Biases logging: config, one log step per row, the per-sample table and the summary. ``offline`` by
default (files under the run directory, ``wandb sync`` later), ``online`` by flag, ``disabled`` in tests. The mode
is ``wandb.mode`` on the command line, else the ``WANDB_MODE`` environment variable, else ``offline``
(``conf/config.yaml``). wandb is an optional extra: without it ``offline`` runs with W&B off (one note) and
``online`` is refused before a model loads.

One W&B run per run directory: a comparison's methods log into the comparison's run (:func:`shared_run`; keys
prefixed ``<method>/``), with its table and plot; a sweep's jobs are runs of one W&B group (the sweep directory),
beside the sweep's own run holding the table of its jobs (:func:`log_sweep`). A
run's W&B id is kept in ``<run dir>/wandb-run.json``, so a resumed run continues the same W&B run (``resume="allow"``;
offline, ``wandb sync`` merges its attempts). Each attempt also writes its summary as JSON beside its offline log,
``<run dir>/wandb/<offline-run-...>/files/wandb-summary.json``, readable without syncing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import string
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from fafo.bench.tools.report_format import fmt_prompts
from fafo.errors import ConfigError
from fafo.extras import available, install_hint, require

MODES = ("offline", "online", "disabled")
ALIASES = {"dryrun": "offline", "run": "online"}  # wandb's own older spellings of WANDB_MODE
ID_FILE = "wandb-run.json"
_noted: set[str] = set()  # the note on a missing wandb is printed once per process (compare runs several methods)
_shared: list = []  # the open comparison run (shared_run), innermost last


def check_wandb(cfg: DictConfig) -> str:
    """``wandb.mode``, checked before a model loads: ConfigError for an unknown mode and for ``online`` without
    wandb installed (a sync that was asked for cannot happen)."""
    mode = cfg.get("wandb", {}).get("mode", "disabled")
    mode = ALIASES.get(mode, mode)
    if mode not in MODES:
        source = " (from the WANDB_MODE environment variable)" if os.environ.get("WANDB_MODE") == mode else ""
        raise ConfigError(f"wandb.mode={mode!r}{source} is not a wandb mode; use one of {', '.join(MODES)}")
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


def run_id(run_dir: Path) -> str:
    """The W&B id of a run directory: the one on record in ``wandb-run.json``, else a new one put there."""
    path = Path(run_dir) / ID_FILE
    try:
        return json.loads(path.read_text())["id"]
    except (OSError, ValueError, KeyError):
        path.parent.mkdir(parents=True, exist_ok=True)
        new = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))  # W&B's id form
        path.write_text(json.dumps({"id": new}) + "\n")
        return new


def sweep_group() -> str | None:
    """The W&B group of a sweep job: its sweep directory (None outside a sweep)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hydra = HydraConfig.get()
    except (ImportError, ValueError):  # not a Hydra app (a run built in Python)
        return None
    return str(hydra.sweep.dir) if getattr(hydra.mode, "name", None) == "MULTIRUN" else None


def start(cfg: DictConfig, run_dir: Path, name: str, job_type: str, config: dict | None = None,
          group: str | None = None):
    """A W&B run for ``run_dir`` (None when logging is off): its id kept beside it, resumed when it exists;
    ``config``: what its config holds (default: ``cfg`` itself)."""
    mode = wandb_mode(cfg)
    if mode == "disabled":
        return None
    import wandb

    if os.environ.get("WANDB_MODE") == "":  # wandb refuses an empty WANDB_MODE; the mode is passed here
        os.environ.pop("WANDB_MODE")
    return wandb.init(
        project=cfg.wandb.project, entity=cfg.wandb.get("entity"),
        group=cfg.wandb.get("group") or group or sweep_group(), name=name, mode=mode, dir=str(run_dir),
        id=run_id(run_dir), resume="allow", job_type=job_type, reinit="finish_previous",
        config=OmegaConf.to_container(cfg, resolve=True) if config is None else config,
        tags=list(cfg.wandb.get("tags") or []),
        settings=wandb.Settings(silent=mode == "offline"),  # offline: no console chatter (the run dir says where)
    )


def log_sweep(cfg: DictConfig, sweep_dir: Path, jobs: list[dict]) -> Path | None:
    """The sweep's own W&B run in its group (``<sweep dir>/wandb-run.json`` keeps its id, so a rerun of the sweep
    continues it): one table row per job (its swept values, status, tau, speedup, run directory); returns its
    summary file (None when logging is off)."""
    run = start(cfg, Path(sweep_dir), "sweep", "sweep", config={"sweep_dir": str(sweep_dir), "jobs": len(jobs)},
                group=str(sweep_dir))
    if run is None:
        return None
    import wandb

    columns = list(dict.fromkeys(k for job in jobs for k in job))
    run.log({"jobs": wandb.Table(columns=columns, data=[[job.get(c) for c in columns] for job in jobs])})
    return finish(run, {"n_jobs": len(jobs), "n_failed": sum(job.get("status") != "ok" for job in jobs)})


def finish(run, summary: dict) -> Path | None:
    """Update the run's summary, finish it and write the summary to ``files/wandb-summary.json`` where W&B did not
    (offline); returns that file."""
    run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str))})
    files = Path(run.dir)
    values = {k: run.summary[k] for k in run.summary.keys() if isinstance(run.summary[k], (int, float, str, bool))}
    run.finish()
    path = files / "wandb-summary.json"
    if not path.exists():
        path.write_text(json.dumps(values, indent=1, sort_keys=True) + "\n")
    return path


class WandbLogger:
    """One run's W&B logging: its own W&B run, or, inside :func:`shared_run`, the comparison's (keys prefixed with
    the method)."""

    def __init__(self, cfg: DictConfig, run_dir: Path, run_name: str):
        self.prefix, self.own = "", True
        if _shared:
            self.run, self.prefix, self.own = _shared[-1].run, f"{Path(run_dir).name}/", False
            return
        self.run = start(cfg, run_dir, run_name, "run")

    def config(self, values: dict) -> None:
        """Add to the W&B run's config (e.g. the machine's state as the run starts)."""
        if self.run is not None:
            self.run.config.update({f"{self.prefix}{k}": v for k, v in values.items()}, allow_val_change=True)

    def log_row(self, row: dict) -> None:
        if self.run is not None:
            self.run.log({f"{self.prefix}{k}": v for k, v in row.items() if isinstance(v, (int, float))})

    def finish(self, rows: list[dict], summary: dict) -> None:
        """Log the rows as a table and the summary's numbers and strings (``prompt_formats`` as its one-line text,
        e.g. ``chat template 2, raw text 1``, so that runs can be filtered by it)."""
        if self.run is None:
            return
        import wandb

        if summary.get("prompt_formats"):
            summary = {**summary, "prompt_formats": fmt_prompts(summary)}

        if rows:
            columns = list(rows[0])
            self.run.log({f"{self.prefix}samples": wandb.Table(columns=columns,
                                                                data=[[r.get(c) for c in columns] for r in rows])})
        if self.own:
            finish(self.run, summary)
        else:
            self.run.summary.update({f"{self.prefix}{k}": v for k, v in summary.items()
                                     if isinstance(v, (int, float, str))})


class SharedRun:
    """The W&B run of a comparison (:func:`shared_run`)."""

    def __init__(self, run):
        self.run = run
        self.summary_path: Path | None = None

    def log_comparison(self, run_dir: Path) -> None:
        """The comparison's table (``compare.csv`` as a W&B table; each method's summary is in the run's summary
        under ``<method>/``), its Markdown and its plot (``compare.png``)."""
        if self.run is None:
            return
        import pandas as pd
        import wandb

        run_dir = Path(run_dir)
        if (run_dir / "compare.csv").exists():
            table = pd.read_csv(run_dir / "compare.csv")
            self.run.log({"comparison": wandb.Table(dataframe=table.astype(object).where(table.notna(), None))})
        if (run_dir / "compare.md").exists():
            self.run.log({"comparison_md": wandb.Html(f"<pre>{(run_dir / 'compare.md').read_text()}</pre>")})
        if (run_dir / "compare.png").exists():
            self.run.log({"comparison_plot": wandb.Image(str(run_dir / "compare.png"))})


@contextlib.contextmanager
def shared_run(cfg: DictConfig, run_dir: Path, name: str):
    """One W&B run for a comparison: every :class:`WandbLogger` opened inside logs into it; it is finished (its
    summary written) on the way out."""
    shared = SharedRun(start(cfg, run_dir, name, "compare"))
    _shared.append(shared)
    try:
        yield shared
    finally:
        _shared.pop()
        if shared.run is not None:
            shared.summary_path = finish(shared.run, {})
