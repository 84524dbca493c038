"""The Hydra callback of ``python -m fafo.bench`` (``conf/config.yaml`` ``hydra.callbacks``): ``bench.output_dir``
checked before Hydra creates any directory (one ``error:`` line, exit status 2); each sweep job's outcome written
to ``<sweep dir>/.sweeps/<sweep id>/<job>.json`` (jobs that run elsewhere, SLURM, report back too); at the end one
line per job (its plan with ``bench.plan=true``, else what ran and measured, then the failures), exit status 1 when
any job failed or would fail.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from fafo.errors import ConfigError

SWEEP_ENV = "FAFO_SWEEP_ID"
# not what a job measured
NOISE = ("bench.output_dir=", "bench.progress=", "bench.reference_dir=", "bench.plan=", "wandb.")


def check_output_dir(output_dir) -> None:
    """bench.output_dir must be a directory or creatable as one (no regular file on its path)."""
    path = Path(str(output_dir)).expanduser()
    part = next(p for p in (path, *path.parents) if p.exists())
    if not part.is_dir():
        raise ConfigError(f"bench.output_dir={str(output_dir)!r}: {part} is a file, not a directory; set "
                          "bench.output_dir to a directory path")


def _check_output_dir(config: DictConfig) -> None:
    try:
        check_output_dir(config.bench.output_dir)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


def job_line(outcome: dict) -> str:
    """One line for a finished job: what ran and what it measured (or its error)."""
    shown = [o for o in outcome.get("overrides") or [] if not o.lstrip("+~").startswith(NOISE)]
    overrides = " ".join(shown) or "(no overrides)"
    if outcome.get("plan"):
        return f"{outcome['plan']}  [{overrides}]"
    if outcome.get("error"):
        return f"FAILED  {overrides}  {outcome['error']}"
    try:
        s = json.loads((Path(outcome["run_dir"]) / "summary.json").read_text())
    except (OSError, ValueError):
        return f"FAILED  {overrides}  no summary.json in {outcome['run_dir']}"
    model = s.get("model", "?") + (f" ({s['checkpoint']})" if s.get("checkpoint") else "")
    params = f"{s['n_params'] / 1e6:.1f}M params" if isinstance(s.get("n_params"), (int, float)) else ""

    def num(key):
        return f"{s[key]:.3f}" if isinstance(s.get(key), (int, float)) else "-"

    ci = s.get("speedup_ci95")
    ci = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if isinstance(ci, list) and len(ci) == 2 else ""
    parts = [model, params, s.get("dtype", "?"), s.get("method", "?"), s.get("task", "?"),
             f"tau {num('tau')}", f"speedup {num('speedup')}{ci}"]
    if s.get("n_failed"):
        parts.append(f"{s['n_failed']} failed rows")
    return "ok      " + "  ".join(p for p in parts if p)


def jobs_dir(sweep_dir) -> Path | None:
    """Where this sweep's job outcomes go (None outside a sweep started by :class:`SweepReport`)."""
    sweep_id = os.environ.get(SWEEP_ENV)
    return Path(str(sweep_dir)) / ".sweeps" / sweep_id if sweep_id else None


def record_outcome(jobs: Path, outcome: dict) -> None:
    """Write one job's outcome (num, run_dir, overrides, error or None) for the end-of-sweep report; a launcher
    writes it for a job that ended without reporting (killed, out of memory, node failure)."""
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{outcome['num']:06d}.json").write_text(json.dumps(outcome))


class SweepReport(Callback):
    """Checks bench.output_dir early, records each sweep job's outcome and reports the sweep at its end."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_output_dir(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_output_dir(config)
        os.environ[SWEEP_ENV] = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        jobs = jobs_dir(config.hydra.sweep.dir)
        if jobs is None or config.hydra.mode.name != "MULTIRUN":
            return
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # a failed job's value is what it raised (said below)
                value = job_return.return_value
            error = value.get("error") if isinstance(value, dict) else None
        except Exception as exc:  # noqa: BLE001 - the job's own failure, reported with the sweep
            value, error = None, f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        record_outcome(jobs, {"num": int(config.hydra.job.num), "run_dir": str(config.hydra.runtime.output_dir),
                              "overrides": list(job_return.overrides or []), "error": error,
                              "plan": value.get("plan") if isinstance(value, dict) else None})

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = jobs_dir(config.hydra.sweep.dir)
        if jobs is None or not jobs.is_dir():
            return
        outcomes = [json.loads(p.read_text()) for p in sorted(jobs.glob("*.json"))]
        for p in jobs.glob("*.json"):
            p.unlink()
        jobs.rmdir()
        try:
            jobs.parent.rmdir()  # .sweeps/ goes too unless another sweep is running
        except OSError:
            pass
        failed = [o for o in outcomes if o.get("error")]
        if any(o.get("plan") for o in outcomes):  # bench.plan=true: one plan line per job, in job order
            print("\n".join([f"== fafo-bench plan: {len(outcomes)} jobs, {len(failed)} would fail =="]
                             + [job_line(o) for o in outcomes]), flush=True)
            if failed:
                print(f"error: {len(failed)} of {len(outcomes)} jobs would fail (problems above and in each job's "
                      "plan.json); fix them before submitting the sweep", file=sys.stderr, flush=True)
                sys.exit(1)
            return
        lines = [f"== fafo-bench sweep: {len(outcomes)} jobs, {len(failed)} failed =="]
        lines += [job_line(o) for o in outcomes if not o.get("error")]
        lines += [job_line(o) for o in failed]
        print("\n".join(lines), flush=True)
        if failed:
            print(f"error: {len(failed)} of {len(outcomes)} sweep jobs failed (listed above); fix them and re-run "
                  "the sweep (finished jobs are resumed, not redone)", file=sys.stderr, flush=True)
            sys.exit(1)
