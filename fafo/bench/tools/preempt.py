"""A clean stop when a scheduler takes the machine back (preemption, time limit, requeue).

SLURM warns a job before it ends it: SIGUSR2 (or SIGUSR1) ``signal_delay_s`` seconds before the time limit
(``sbatch --signal``), SIGTERM on preemption, ``scontrol requeue`` and ``scancel``, then SIGKILL after the
partition's GraceTime or the cluster's KillWait (https://slurm.schedmd.com/sbatch.html#OPT_signal,
https://slurm.schedmd.com/preempt.html). :class:`PreemptGuard` turns any of these signals into a stop at a clean
point of the benchmark loop:

* the signal only raises a flag: the sample being measured goes on, its rows are appended whole (fafo.bench.records)
  and :func:`sample_done`, which the runner calls after every sample while a guard is installed
  (:data:`fafo.bench.runner.SAMPLE_HOOKS`), raises :class:`Preempted`;
* a sample that does not finish within ``finish_within_s`` of the signal is abandoned: :class:`Preempted` is raised
  wherever the code is, except inside a record write, which completes first. Nothing of an abandoned sample is on
  record, so the resumed job measures it from its start and every finished one is kept as written.

:class:`Preempted` derives from BaseException: neither the runner's per-sample handling (which records a failed row)
nor the sweep's per-job handling (which records a failed job) mistakes it for a failure. Whoever installed the
guard decides what follows (fafo.bench.tools.slurm requeues the job through submitit).
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
_ACTIVE: PreemptGuard | None = None


class Preempted(BaseException):
    """The job was asked to stop; raised at a sample boundary or when the sample in progress is abandoned."""

    def __init__(self, signum: int, abandoned: bool):
        self.signum, self.abandoned = signum, abandoned
        what = "abandoned the sample in progress" if abandoned else "stopped after a finished sample"
        super().__init__(f"{signal.Signals(signum).name}: {what}")


@dataclass
class PreemptGuard:
    """Signal handlers for a clean stop (see the module docstring).

    ``finish_within_s``: seconds a signalled sample may still take before it is abandoned, per signal (the time the
    scheduler leaves before SIGKILL, minus what exiting and requeueing need); ``default_s`` for the others.
    """

    finish_within_s: dict[int, float] = field(default_factory=dict)
    default_s: float = 20.0
    signum: int | None = None        # the first stop signal received
    received_at: float | None = None
    _previous: dict = field(default_factory=dict, repr=False)

    def install(self) -> PreemptGuard:
        global _ACTIVE
        from fafo.bench.runner import SAMPLE_HOOKS

        if sample_done not in SAMPLE_HOOKS:
            SAMPLE_HOOKS.append(sample_done)
        for sig in (*STOP_SIGNALS, signal.SIGALRM):
            self._previous[sig] = signal.getsignal(sig)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_stop_signal)
        signal.signal(signal.SIGALRM, self._on_deadline)
        _ACTIVE = self
        return self

    def uninstall(self) -> None:
        global _ACTIVE
        from fafo.bench.runner import SAMPLE_HOOKS

        if sample_done in SAMPLE_HOOKS:
            SAMPLE_HOOKS.remove(sample_done)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        _ACTIVE = None

    def previous_handler(self, sig: int):
        """The handler ``sig`` had before :meth:`install` (e.g. submitit's requeue handler)."""
        return self._previous.get(sig)

    @property
    def stopping(self) -> bool:
        return self.signum is not None

    def check(self) -> None:
        """Raise :class:`Preempted` if a stop signal came (called between samples)."""
        if self.signum is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise Preempted(self.signum, abandoned=False)

    def _on_stop_signal(self, signum, frame) -> None:
        if self.signum is not None:  # e.g. the SIGTERM that follows our own requeue: already stopping
            return
        self.signum, self.received_at = signum, time.monotonic()
        grace = self.finish_within_s.get(signum, self.default_s)
        print(f"{signal.Signals(signum).name} received: finishing the sample in progress (abandoned after "
              f"{grace:.0f} s), then stopping; finished samples are on record", file=sys.stderr, flush=True)
        signal.setitimer(signal.ITIMER_REAL, max(grace, 0.01))

    def _on_deadline(self, signum, frame) -> None:
        if self.signum is None:
            return
        if _inside_record_write(frame):  # a row or output being appended completes first
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        raise Preempted(self.signum, abandoned=True)


def _inside_record_write(frame) -> bool:
    from fafo.bench.records import RecordWriter, write_json_atomic

    protected = {RecordWriter.write.__code__, RecordWriter.rewrite.__code__, RecordWriter.__init__.__code__,
                 write_json_atomic.__code__}
    while frame is not None:
        if frame.f_code in protected:
            return True
        frame = frame.f_back
    return False


def sample_done() -> None:
    """The runner's hook after each sample: stop here if a guard is installed and a stop signal came."""
    if _ACTIVE is not None:
        _ACTIVE.check()
