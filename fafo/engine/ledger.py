"""The forward ledger: every forward that reads a model's weights, counted by kind, at the engine boundary.

Counting where the forward happens (:meth:`fafo.engine.engine.Engine.forward`) rather than in each decoder makes
every method's tau comparable: a forward cannot be left out by one method and counted by another. The kinds:

* ``prefill``: the prompt (and whatever a method appends to it in the same forward, e.g. Lookahead's window);
* ``verify``: a forward over the target's full cache whose outputs decide what is committed (one per decoding
  step; vanilla's decode forwards are its verifications of nothing);
* ``draft``: a self-draft of the target's own weights that commits nothing by itself: SWIFT's layer-skipped
  pass, QuantSpec's INT4 pass, TriForce's retrieval-cache (middle) pass, FAFO-2forward's fumble pass;
* ``aux``: any other forward of the target's weights (SWIFT's layer-set scoring).

A separate draft model (TriForce's llama-68m) has an engine and a ledger of its own; a draft that is not an
engine (LongSpec's draft layer) reports its forwards to the decode loop directly.

Every model call (any engine's, and LongSpec's draft layer) also goes through :func:`model_call`, which adds its
duration to the process-wide :data:`MODEL_TIME`: the decode loop's *host time* is its wall time minus that
(:func:`fafo.decoding.decode`). Host-work probes (:mod:`fafo.bench.tools.host_probe`) registered in
:data:`MODEL_TIME` are suspended inside model calls, so they count only the work a step does around its forwards.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import torch

KINDS = ("prefill", "verify", "draft", "aux")


@dataclass(frozen=True)
class ForwardCounts:
    """Forwards of one model by kind, and the tokens they carried (padding included: it is computed)."""

    prefill: int = 0
    verify: int = 0
    draft: int = 0
    aux: int = 0
    tokens: int = 0

    @property
    def total(self) -> int:
        return self.prefill + self.verify + self.draft + self.aux

    def __sub__(self, other: ForwardCounts) -> ForwardCounts:
        return ForwardCounts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


@dataclass(frozen=True)
class ForwardRecord:
    """One forward as its cost depends on it: kind, tokens carried, cached slots read (see ForwardLedger.record)."""

    kind: str
    tokens: int
    prefix: int
    region_rows: int = 0
    region_len: int = 0
    share: float = 1.0
    batch: int = 1


@dataclass
class ForwardLedger:
    """Running counts of one engine's forwards (never reset: a generation reads the difference of two marks)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    tokens: int = 0
    uploads: int = 0  # host-to-device conversions of step inputs (Engine.upload): at most one per forward
    log: list | None = None  # when a list: one ForwardRecord per forward (the runner's projection reads it)

    def record(self, kind: str, n_tokens: int, prefix: int = 0, region_rows: int = 0, region_len: int = 0,
               share: float = 1.0, batch: int = 1) -> None:
        """One forward of ``n_tokens`` tokens (padding included) attending ``prefix`` cached slots, of which the
        last ``region_rows`` rows attend only the first ``region_len`` (FAFO's fumble streams over C(kv)); ``share``:
        the fraction of the model's sub-layers it ran (SWIFT's layer-skipped drafts run fewer); ``batch``: rows
        (requests) it carried, each ``n_tokens`` long, ``prefix`` and ``region_len`` their largest."""
        if kind not in self.counts:
            raise ValueError(f"unknown forward kind {kind!r}; one of {KINDS}")
        self.counts[kind] += 1
        self.tokens += n_tokens * batch
        if self.log is not None:
            self.log.append(ForwardRecord(kind, n_tokens, prefix, region_rows, region_len, share, batch))

    def mark(self) -> ForwardCounts:
        return ForwardCounts(**self.counts, tokens=self.tokens)

    @contextmanager
    def paused(self):
        """Forwards inside are not counted (a check that is no decoder's work, e.g. the float32 tie check)."""
        counts, tokens, log = dict(self.counts), self.tokens, self.log
        self.log = None
        try:
            yield
        finally:
            self.counts, self.tokens, self.log = counts, tokens, log


class ModelTime:
    """Seconds spent inside model calls in this process, and the host-work probes to suspend there.

    On CUDA a call's time is its device time (CUDA events, read when :attr:`seconds` is asked for, after the
    step's own synchronisation): wall time minus it is what the device spends waiting for the host. Elsewhere
    the call is synchronous and its wall time is used.
    """

    def __init__(self):
        self._seconds = 0.0
        self._events: list = []  # (start, end) CUDA event pairs not yet read
        self.probes: list = []  # objects with .around(call) -> call() (fafo.bench.tools.host_probe)

    @property
    def seconds(self) -> float:
        self.fold()
        return self._seconds

    def fold(self) -> None:
        """Add the recorded CUDA calls' device time (waits for the last one)."""
        if self._events:
            self._events[-1][1].synchronize()
            self._seconds += sum(a.elapsed_time(b) for a, b in self._events) / 1000
            self._events.clear()


MODEL_TIME = ModelTime()


def model_call(fn, *args, device: torch.device | None = None, **kwargs):
    """``fn(*args, **kwargs)``, one forward of a model, timed into :data:`MODEL_TIME` (probes suspended)."""
    call = functools.partial(fn, *args, **kwargs)
    for probe in MODEL_TIME.probes:
        call = functools.partial(probe.around, call)
    if device is not None and device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = call()
        end.record()
        MODEL_TIME._events.append((start, end))
        if len(MODEL_TIME._events) >= 8192:  # calls outside any decode loop: bounded memory (one wait)
            MODEL_TIME.fold()
        return out
    t = time.perf_counter()
    out = call()
    MODEL_TIME._seconds += time.perf_counter() - t
    return out
