"""Stages with time budgets: each stage runs until its deadline, work items that would not fit are skipped and
named, and an exception ends the stage (recorded with its traceback) without stopping the check.

Deadlines are cumulative (stage i must end by the start plus the budgets of stages 1..i), so time a stage leaves
unused goes to the later ones and the whole check never runs past the sum of the budgets. Inside a stage,
:meth:`Budget.each` starts an item only when the time left covers the longest item so far; a stage still running
at its deadline (plus a grace) is interrupted by ``SIGALRM`` (:class:`StageTimeout`, a ``BaseException`` so that
no ``except Exception`` in library code swallows it).
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
from dataclasses import dataclass, field

GRACE_S = 10.0  # past its deadline a stage is interrupted


class StageTimeout(BaseException):
    """Raised by the alarm in a stage that ran past its deadline."""


@dataclass
class StageResult:
    """What a stage did.

    Attributes:
        status: ``ok``, ``failed`` (an exception, or a check that did not pass), ``partial`` (out of time with
            items left), ``skipped`` (not started: no time left), ``not selected`` (``--stages`` names others),
            ``not run``.
        summary: one line for the final table.
        sections: Markdown blocks for the report.
        skipped: items not run for lack of time (the report names them).
        errors: tracebacks of exceptions caught in the stage or in its items.
    """

    name: str
    title: str
    budget_s: float
    status: str = "not run"
    seconds: float = 0.0
    summary: str = ""
    sections: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed_checks: list[str] = field(default_factory=list)


class Budget:
    """The running stage's deadline, and the items it has started."""

    def __init__(self, result: StageResult, deadline: float):
        self.result, self.deadline = result, deadline
        self.current: str | None = None
        self.note = ""  # what the item in progress found, printed with its time
        self._left_labels: list[str] = []

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def each(self, items: list, label=str):
        """Yield the items in order while the time left covers the longest one so far (the first always
        starts); the rest are recorded in ``result.skipped``."""
        labels = [label(x) for x in items]
        longest = 0.0
        for i, item in enumerate(items):
            if self.left() < longest:
                self.result.skipped.extend(labels[i:])
                return
            self.current, self._left_labels = labels[i], labels[i + 1:]
            t0 = time.perf_counter()
            yield item
            longest = max(longest, time.perf_counter() - t0)
            print(f"[gpu_check] {self.result.name}: {labels[i]}: {self.note or 'done'} in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            self.note = ""
        self.current, self._left_labels = None, []

    def interrupted(self) -> None:
        """Called on a timeout: the item in progress and those after it are the skipped ones."""
        if self.current is not None:
            self.result.skipped.append(f"{self.current} (interrupted)")
            self.result.skipped.extend(self._left_labels)


def _alarm(signum, frame):
    raise StageTimeout()


def run_stage(result: StageResult, fn, deadline: float, *args, grace: float = GRACE_S) -> StageResult:
    """Run ``fn(budget, result, *args)`` until ``deadline`` (a ``time.perf_counter`` value); past it by
    ``grace`` seconds the stage is interrupted."""
    budget = Budget(result, deadline)
    if budget.left() <= 1.0:
        result.status, result.summary = "skipped", "no time left"
        return result
    t0 = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, budget.left() + grace)
    try:
        fn(budget, result, *args)
        result.status = "failed" if result.failed_checks or result.errors else \
            "partial" if result.skipped else "ok"
    except StageTimeout:
        budget.interrupted()
        result.status = "partial"
        result.errors.append(f"out of time after {time.perf_counter() - t0:.0f} s (budget {result.budget_s:.0f} s)")
    except Exception:  # noqa: BLE001 - recorded; the next stage runs
        result.status = "failed"
        result.errors.append(traceback.format_exc())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        result.seconds = time.perf_counter() - t0
    if result.status == "failed":
        cause = (result.failed_checks or [result.errors[-1].strip().splitlines()[-1]])[0][:160]
        result.summary = f"{result.summary}; {cause}" if result.summary and cause not in result.summary else \
            result.summary or cause
    return result
