"""The Hydra callback of ``python -m fafo.bench`` (``conf/config.yaml`` ``hydra.callbacks``) and what a rerun says
it resumes (:func:`resume_note`: a run whose directory holds rows already says so before it runs).

``bench.output_dir`` checked before Hydra creates any directory (one ``error:`` line, exit status 2); each
sweep job's outcome written to ``<sweep dir>/.sweeps/<sweep id>/<job>.json`` (jobs that run elsewhere, SLURM,
report back too); at the end one line per job (its plan with ``bench.plan=true``, else what ran and measured, then
the failures), exit status 1 when any job failed or would fail.
"""

from __future__ import annotations

import collections
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

from fafo.bench.records import read_rows
from fafo.errors import ConfigError

SWEEP_ENV = "FAFO_SWEEP_ID"
# not what a job measured
NOISE = ("bench.output_dir=", "bench.progress=", "bench.reference_dir=", "bench.plan=", "wandb.")


def check_output_dir(output_dir) -> None:
    """bench.output_dir must be a directory or creatable as one (no regular file on its path); empty, the runs would
    go under the filesystem's root."""
    if not str(output_dir or "").strip():
        raise ConfigError("bench.output_dir is empty; give a directory, or leave bench.output_dir out for its default")
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


def override_key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def sweep_shape(config: DictConfig) -> tuple[int, list[str]]:
    """(number of jobs, swept keys) of the sweep Hydra's basic sweeper runs: ``hydra.sweeper.params`` (a preset's
    own) then the command line's overrides, a later one of a key replacing an earlier one, as the sweeper does."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params") or {}
    args = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    sizes = {}
    for o in OverridesParser.create().parse_overrides(args):
        sizes[o.get_key_element()] = len(list(o.sweep_string_iterator())) if o.is_discrete_sweep() else 1
    n = 1
    for size in sizes.values():
        n *= size
    return n, [k for k, size in sizes.items() if size > 1]


def swept_values(outcome: dict, swept) -> str:
    """The job's values of the swept keys (``method=vanilla bench.max_new_tokens=4``); all its overrides (noise
    left out) when nothing is known to be swept."""
    shown = [o for o in outcome.get("overrides") or [] if not o.lstrip("+~").startswith(NOISE)]
    if swept:
        shown = [o for o in shown if override_key(o) in swept] or shown
    return " ".join(shown) or "(no overrides)"


def differing(outcomes: list[dict]) -> set[str]:
    """The override keys whose values differ between the jobs (or that only some jobs set)."""
    values: dict[str, set] = {}
    for o in outcomes:
        for item in o.get("overrides") or []:
            values.setdefault(override_key(item), set()).add(item)
    return {k for k, v in values.items()
            if len(v) > 1 or sum(any(override_key(i) == k for i in o.get("overrides") or []) for o in outcomes)
            < len(outcomes)}


def clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


# ------------------------------------------------------------------ what a rerun resumes
def recorded(run_dir: str | Path) -> dict[str, list[dict]]:
    """{run: its rows on record} of a run directory and of the runs below it (a comparison's methods)."""
    root = Path(run_dir)
    out = {}
    for path in sorted(root.rglob("samples.csv")) if root.is_dir() else []:
        if "_reference" not in path.relative_to(root).parts and (rows := read_rows(path)):
            out[path.parent.relative_to(root).as_posix()] = rows
    return out


def resume_note(run_dir: str | Path, expected: int | None = None) -> str | None:
    """``resuming DIR: ...``: how many rows are on record (ok, failed), skipped, and what is left to run; None for
    a fresh run. ``expected``: the (sample, turn, repeat)s the run has in all (one run, not a comparison)."""
    runs = recorded(run_dir)
    if not runs:
        return None
    rows = [r for rs in runs.values() for r in rs]
    failed = sum(r.get("status") != "ok" for r in rows)
    kept = f"{len(rows)} (sample, turn, repeat)s on record ({len(rows) - failed} ok, {failed} failed, not retried)"
    if len(runs) > 1 or "." not in runs:
        kept += " in " + ", ".join(f"{name} {len(rs)}" for name, rs in runs.items())
    left = ""
    if expected is not None:
        left = "; nothing left to run, the summary is recomputed" if len(rows) >= expected else \
            f"; {expected - len(rows)} of {expected} left to run"
    return f"resuming {run_dir}: {kept} are skipped{left}"


def interrupted_note(run_dir: str | Path) -> str:
    """What a Ctrl-C leaves: every row written before it is on disk, and the same command resumes the run."""
    rows = sum(len(rs) for rs in recorded(run_dir).values())
    return f"interrupted: {run_dir} keeps the {rows} (sample, turn, repeat)s on record; the same command resumes it"


def job_line(outcome: dict, swept=()) -> str:
    """One line for a finished job: its swept values (every override when ``swept`` is empty), then what it
    measured (or its error)."""
    overrides = swept_values(outcome, swept)
    if outcome.get("plan"):
        return f"{outcome['plan']}  [{overrides}]"
    if outcome.get("error"):
        return f"FAILED  {overrides}  {outcome['error']}"
    try:
        s = json.loads((Path(outcome["run_dir"]) / "summary.json").read_text())
    except (OSError, ValueError):
        if (Path(outcome["run_dir"]) / "compare.csv").exists():  # a comparison: its table is in compare.md
            return f"ok      {overrides}  comparison: {Path(outcome['run_dir']) / 'compare.md'}"
        return f"FAILED  {overrides}  no summary.json in {outcome['run_dir']}"
    model = s.get("model", "?") + (f" ({s['checkpoint']})" if s.get("checkpoint") else "")
    params = f"{s['n_params'] / 1e6:.1f}M params" if isinstance(s.get("n_params"), (int, float)) else ""

    def num(key):
        return f"{s[key]:.3f}" if isinstance(s.get(key), (int, float)) else "-"

    ci = s.get("speedup_ci95")
    ci = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if isinstance(ci, list) and len(ci) == 2 else ""
    parts = [f"[{overrides}]", model, params, s.get("dtype", "?"), s.get("method", "?"), s.get("task", "?"),
             f"tau {num('tau')}", f"speedup {num('speedup')}{ci}"]
    if s.get("n_failed"):
        parts.append(f"{s['n_failed']} failed rows")
    return "ok      " + "  ".join(p for p in parts if p)


def distinct_errors(failed: list[dict], heading: str, what: str = "error(s)") -> str:
    """The failed jobs' errors once each, with how many jobs each stopped (in job order): a sweep of 51 jobs that
    all lack one of 3 data sets reads as 3 problems, not 51."""
    counts = collections.Counter(o["error"].removeprefix("error: ") for o in failed)  # a run's error is a line
    return "\n".join([f"-- {heading}: {len(counts)} distinct {what} --"]
                     + [f"{n:4d} job(s): {error}" for error, n in counts.items()])


def job_record(outcome: dict, swept) -> dict:
    """One job of a sweep as a table row: its swept values, status, tau, speedup and run directory."""
    try:
        s = json.loads((Path(outcome["run_dir"]) / "summary.json").read_text())
    except (OSError, ValueError):
        s = {}
    values = {override_key(o): o.partition("=")[2] for o in outcome.get("overrides") or []
              if override_key(o) in swept}
    return {**values, "status": "FAILED" if outcome.get("error") else "ok", "error": outcome.get("error") or "",
            "tau": s.get("tau"), "speedup": s.get("speedup"), "speedup_kind": s.get("speedup_kind"),
            "run_dir": outcome["run_dir"]}


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
    """Checks bench.output_dir early, records each sweep job's outcome, prints one progress line per finished job
    (in the process that runs the jobs) and reports the sweep at its end."""

    def __init__(self) -> None:
        self.n_jobs, self.swept, self.started, self.done, self.resumed = None, [], time.time(), 0, 0

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_output_dir(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_output_dir(config)
        os.environ[SWEEP_ENV] = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.started = time.time()
        try:
            self.n_jobs, self.swept = sweep_shape(config)
        except Exception:  # noqa: BLE001 - a sweep the basic sweeper does not describe: no counter
            self.n_jobs, self.swept = None, []
        print(f"== fafo-bench sweep: {self.n_jobs or '?'} jobs"
              + (f" over {', '.join(self.swept)}" if self.swept else "") + f" into {config.hydra.sweep.dir} ==",
              file=sys.stderr, flush=True)

    @staticmethod
    def log_wandb(config: DictConfig, outcomes: list[dict], swept) -> None:
        """The sweep's table of jobs as its own W&B run (fafo.bench.tools.wandb_log.log_sweep); a W&B problem is one
        note, never the sweep's failure."""
        from fafo.bench.tools.wandb_log import log_sweep

        try:
            log_sweep(config, Path(str(config.hydra.sweep.dir)), [job_record(o, swept) for o in outcomes])
        except Exception as exc:  # noqa: BLE001 - the jobs ran; W&B is a copy of what they wrote
            print(f"note: the sweep's W&B run was not written: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode.name != "MULTIRUN" or config.bench.get("plan"):
            return
        self.resumed += bool(recorded(config.hydra.runtime.output_dir))

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
        outcome = {"num": int(config.hydra.job.num), "run_dir": str(config.hydra.runtime.output_dir),
                   "overrides": list(job_return.overrides or []), "error": error,
                   "plan": value.get("plan") if isinstance(value, dict) else None}
        record_outcome(jobs, outcome)
        if self.n_jobs and not outcome["plan"]:  # the jobs run in this process (not SLURM's)
            self.done += 1
            elapsed = time.time() - self.started
            left = elapsed / self.done * (self.n_jobs - self.done)
            print(f"[job {self.done} of {self.n_jobs}, {clock(elapsed)} elapsed, about {clock(left)} left] "
                  f"{job_line(outcome, self.swept)}", flush=True)

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
                             + [job_line(o, set(self.swept) | differing(outcomes)) for o in outcomes]), flush=True)
            if failed:
                print(distinct_errors(failed, "what stops them", "problem(s) (each job's first)"), flush=True)
                print(f"error: {len(failed)} of {len(outcomes)} jobs would fail (problems above; every job's in its "
                      "plan.json); fix them before submitting the sweep", file=sys.stderr, flush=True)
                sys.exit(1)
            return
        swept = set(self.swept) | differing(outcomes)
        resumed = f"{self.resumed} resumed from their records, " if self.resumed else ""
        lines = [f"== fafo-bench sweep: {len(outcomes)} jobs, {len(failed)} failed == ({resumed}"
                 f"{clock(time.time() - self.started)} in all)"]
        lines += [job_line(o, swept) for o in outcomes if not o.get("error")]
        lines += [job_line(o, swept) for o in failed]
        print("\n".join(lines + ([distinct_errors(failed, "why they failed")] if failed else [])), flush=True)
        self.log_wandb(config, outcomes, swept)
        if failed:
            print(f"error: {len(failed)} of {len(outcomes)} sweep jobs failed (listed above); fix them and re-run "
                  "the sweep (finished jobs are resumed, not redone)", file=sys.stderr, flush=True)
            sys.exit(1)
