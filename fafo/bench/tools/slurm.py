"""``hydra/launcher=slurm``: every job of a sweep is one task of a SLURM job array, through submitit.

(Hydra accepts launchers only from the ``hydra_plugins`` namespace: ``hydra_plugins/fafo_bench/slurm_launcher.py``
exposes this class there.)

hydra-submitit-launcher's SlurmLauncher (https://github.com/facebookresearch/hydra/tree/main/plugins/
hydra_submitit_launcher) with three changes a benchmark sweep needs:

* **Preemption and time limits** (in the job): a :class:`~fafo.bench.tools.preempt.PreemptGuard` replaces submitit's
  signal handlers, so SIGTERM / SIGUSR1 / SIGUSR2 stop the job at a sample boundary (or abandon the sample in
  progress when the scheduler's grace runs out); then the job is requeued with submitit's checkpoint protocol
  (https://github.com/facebookincubator/submitit/blob/main/docs/checkpointing.md: the launcher is checkpointable,
  submitit dumps it and calls ``scontrol requeue``). A SIGTERM of a job SLURM is already requeueing, preempting or
  cancelling is left to SLURM. The requeued job skips the rows already in its ``samples.csv``.
* **Waiting without accounting**: submitit asks ``sacct`` whether a job ended, which needs SLURM's accounting
  database; this launcher waits for the jobs' result files and asks ``squeue`` (every ``poll_s``) whether a job
  ended without one.
* **Jobs that die** (SIGKILL, out of memory, node failure, too many time limits) are reported as failed sweep jobs,
  named in the sweep's summary with their state and log, and the sweep exits non-zero, as with the local launcher;
  re-running the same sweep resubmits every job and each resumes from its records.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import OmegaConf, open_dict

from fafo.bench.tools.preempt import Preempted, PreemptGuard
from fafo.bench.tools.sweep import jobs_dir, record_outcome

MISSING_EXTRA = ("hydra/launcher=slurm needs hydra-submitit-launcher; install it with "
                 "pip install -c constraints.txt -e '.[slurm]'")

try:
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
except ImportError as exc:  # the optional extra; hydra_plugins/fafo_bench turns this into one error line
    raise ImportError(MISSING_EXTRA) from exc

# squeue states of a job that may still produce a result (a requeued job passes through COMPLETING and PENDING)
WAITING = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
           "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT", "RESV_DEL_HOLD"}


class SlurmLauncher(_SubmititSlurmLauncher):
    """See the module docstring. Parameters beyond submitit's (conf/hydra/launcher/slurm.yaml):

    ``poll_s``: seconds between ``squeue`` calls of the waiting sweep; ``result_grace_s``: how long a job that left
    the queue may take to show its result file (shared filesystems lag) before it counts as failed;
    ``preempt_grace_s``: how long a sample may still run after SIGTERM before it is abandoned (keep it below the
    cluster's KillWait / GraceTime; after SIGUSR the grace is derived from ``signal_delay_s``).
    """

    def __init__(self, poll_s: float = 10.0, result_grace_s: float = 15.0, preempt_grace_s: float = 20.0,
                 **params: Any) -> None:
        super().__init__(**params)
        self.poll_s, self.result_grace_s, self.preempt_grace_s = poll_s, result_grace_s, preempt_grace_s

    # ------------------------------------------------------------ in the job
    def __call__(self, *args: Any) -> JobReturn:
        delay = float(self.params.get("signal_delay_s") or 120)
        usr_grace = max(delay - 30.0, delay / 2)  # leaves time to exit and requeue before SIGKILL
        guard = PreemptGuard({signal.SIGUSR1: usr_grace, signal.SIGUSR2: usr_grace}, self.preempt_grace_s).install()
        try:
            return super().__call__(*args)
        except Preempted as stop:
            _stop_and_requeue(guard, stop)  # exits
            raise
        finally:
            guard.uninstall()

    # ------------------------------------------------------------ in the sweep's process
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None
        if shutil.which("sbatch") is None:
            print("error: hydra/launcher=slurm needs SLURM's sbatch on PATH (a cluster login node, or "
                  "scripts/slurm_local.sh up for a one-node SLURM here); or run the sweep with "
                  "hydra/launcher=local", file=sys.stderr, flush=True)
            sys.exit(2)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        params = dict(self.params)
        executor = submitit.AutoExecutor(cluster="slurm", folder=params.pop("submitit_folder"),
                                         slurm_max_num_timeout=params.pop("max_num_timeout", 0))
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
        job_params = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            print(f"  #{idx} : {' '.join(filter_overrides(overrides))}", file=sys.stderr, flush=True)
            job_params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        try:
            jobs = executor.map_array(self, *zip(*job_params))
        except (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError) as exc:
            said = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]  # sbatch's stderr, printed above
            print(f"error: sbatch refused the sweep's job array: {said[-1] if said else type(exc).__name__}; fix "
                  "the launcher's settings (hydra.launcher.partition, hydra.launcher.account, ...) or the cluster's "
                  "SLURM, or run the sweep with hydra/launcher=local", file=sys.stderr, flush=True)
            sys.exit(2)
        print(f"submitted SLURM job array {jobs[0].job_id.split('_')[0]} ({len(jobs)} jobs); sbatch script and logs "
              f"in {jobs[0].paths.folder.parent}", file=sys.stderr, flush=True)
        ended = wait_for_jobs(jobs, self.poll_s, self.result_grace_s)
        returns = []
        for job, (overrides, _, idx, _, _) in zip(jobs, job_params):
            try:
                returns.append(job.results()[0] if job.job_id not in ended else None)
            except Exception as exc:  # noqa: BLE001 - the job's own error (e.g. submitit gave up requeueing)
                last = [ln for ln in str(exc).splitlines() if ln.strip()]
                ended[job.job_id] = f"failed: {last[-1] if last else type(exc).__name__}"
                returns.append(None)
            if returns[-1] is None:
                returns[-1] = self._failed(job, overrides, idx, ended[job.job_id])
        return returns

    def _failed(self, job, overrides: list[str], idx: int, state: str) -> JobReturn:
        """A job that ended without reporting: recorded as a failed sweep job (SweepReport names it)."""
        reason = state if state.startswith("failed") else f"ended {state} without a result (killed, out of " \
                                                          "memory, node failure or time limit)"
        line = (f"error: SLURM job {job.job_id} {reason}; log: {job.paths.stderr}; re-run the sweep to resume "
                "it from its records")
        jobs = jobs_dir(self.config.hydra.sweep.dir)
        if jobs is not None:
            record_outcome(jobs, {"num": idx, "run_dir": self._run_dir(overrides, idx), "overrides": overrides,
                                  "error": line})
        return JobReturn(overrides=overrides, status=JobStatus.COMPLETED, _return_value={"error": line})

    def _run_dir(self, overrides: list[str], idx: int) -> str | None:
        """The run directory of a job, computed as hydra's run_job does (hydra.sweep.dir / hydra.sweep.subdir)."""
        hydra_cfg = HydraConfig.instance().cfg
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.num = idx
            HydraConfig.instance().set_config(cfg)
            return os.path.abspath(os.path.join(str(OmegaConf.select(cfg, "hydra.sweep.dir")),
                                                str(OmegaConf.select(cfg, "hydra.sweep.subdir"))))
        except Exception:  # noqa: BLE001 - only a detail of the failure report
            return None
        finally:
            HydraConfig.instance().cfg = hydra_cfg


def wait_for_jobs(jobs, poll_s: float, grace_s: float, squeue_down_s: float = 1800.0) -> dict[str, str]:
    """Wait until every job has its result file or has left the queue; returns {job id: squeue state} of the jobs
    that ended without a result (state GONE when squeue no longer lists them). squeue failing for longer than
    ``squeue_down_s`` (the controller is gone) ends the wait too."""
    waiting = {j.job_id: j for j in jobs}
    gone_since: dict[str, tuple[str, float]] = {}
    ended: dict[str, str] = {}
    last_query, squeue_ok = -float("inf"), time.monotonic()
    while waiting:
        for jid in [jid for jid, j in waiting.items() if j.paths.result_pickle.exists()]:
            del waiting[jid]
        now = time.monotonic()
        if waiting and now - last_query >= poll_s:
            last_query = now
            states = squeue_states({jid.split("_")[0] for jid in waiting})
            if states is not None:
                squeue_ok = now
            elif now - squeue_ok > squeue_down_s:
                print(f"error: squeue has failed for {squeue_down_s / 60:.0f} minutes; giving up waiting",
                      file=sys.stderr, flush=True)
                return {**ended, **{jid: "UNKNOWN (squeue failing)" for jid in waiting}}
            for jid in list(waiting):
                state = states.get(jid, "GONE") if states is not None else "RUNNING"  # squeue failed: wait on
                if state in WAITING:
                    gone_since.pop(jid, None)
                    continue
                first = gone_since.setdefault(jid, (state, now))[1]
                if now - first >= grace_s and not waiting[jid].paths.result_pickle.exists():
                    ended[jid] = gone_since[jid][0]
                    del waiting[jid]
        if waiting:
            time.sleep(min(1.0, poll_s))
    return ended


def squeue_states(array_ids: set[str]) -> dict[str, str] | None:
    """{job id (array_task): state} from squeue, finished jobs included while SLURM keeps them (MinJobAge)."""
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(sorted(array_ids))],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None if "Invalid job id" not in out.stderr else {}
    return dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)


def job_state(job_id: str) -> str:
    states = squeue_states({job_id}) or {}
    return states.get(job_id, "UNKNOWN")


def _stop_and_requeue(guard: PreemptGuard, stop: Preempted) -> None:
    """After a clean stop: requeue through submitit (its checkpoint protocol), unless SLURM is already ending the
    job (a SIGTERM of a job that is cancelled, requeued, preempted or out of time). Always exits."""
    import submitit

    env = submitit.JobEnvironment()
    name = signal.Signals(stop.signum).name
    if stop.signum == signal.SIGTERM and (state := job_state(env.job_id)) != "RUNNING":
        print(f"{name} while SLURM job {env.job_id} is {state}: stopped cleanly, SLURM decides what follows "
              "(a requeued job resumes from its records)", file=sys.stderr, flush=True)
        sys.exit(128 + stop.signum)
    usr_sig = getattr(signal, "SIG" + env.USR_SIG)  # submitit's time-limit signal (SUBMITIT_PREEMPT_SIGNAL)
    handler = getattr(guard.previous_handler(usr_sig), "__self__", None)  # submitit's SignalHandler
    print(f"{name}: stopped cleanly ({stop}); requeueing SLURM job {env.job_id}, which resumes from its records",
          file=sys.stderr, flush=True)
    try:
        if hasattr(handler, "checkpoint_and_try_requeue"):  # dumps the checkpoint, scontrol requeue, sys.exit
            handler.checkpoint_and_try_requeue(usr_sig)
        else:
            subprocess.check_call(["scontrol", "requeue", env.job_id], timeout=60)
    except subprocess.CalledProcessError as exc:
        print(f"requeue of SLURM job {env.job_id} failed ({exc}); re-run the sweep to resume it", file=sys.stderr,
              flush=True)
    sys.exit(-1)
