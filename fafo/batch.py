"""Decoding several requests at once: each step, ONE forward (per kind) for every active request.

Every request keeps everything a method keeps for one generation (its drafts, pool, automaton, tree, windows,
streams, compressed layout: its :class:`~fafo.decoding.StepState`) on its own row of a static cache
``[.., B, H_kv, S, D]`` (:meth:`~fafo.engine.cache.KVCache.row`). A step builds every request's forwards on the
host (:meth:`StepState.inputs`), runs each kind once for the batch (:func:`fafo.engine.batching.forward_rows`:
rows padded to the batch's largest step, each with its own prefix and mask), reads every request's logits in one
device read (:class:`~fafo.engine.batching.StepLogits`), then lets each request accept and commit its own tokens
(:meth:`StepState.outputs`, :meth:`StepState.commit`). So each request's tokens are those it would get alone
(greedy: identical; sampled: the same exact rule, its own generator), and so are its drafts, unless the method
learns across requests.

Scheduling (``batching``):

* ``static``: the next B requests start together; a request that finishes leaves the batch and costs nothing
  more (its row is freed and the batch shrinks: the last active request moves into the freed row, one copy of
  its live KV); the next B start when all have finished.
* ``continuous``: a finished request is replaced by the next waiting one at the next step (its prompt is
  prefilled into the freed row), as serving engines do; the batch shrinks only when none is waiting.

Prompts are prefilled one request at a time (each its own forward), as a request arrives.

How a caller decodes B requests (what the runner does)::

    check_batch(get_class(cfg.method._target_), B, name)  # before the model loads: one ConfigError line
    method = instantiate(cfg.method); method.setup(engine)  # as for one request (warm-up likewise)
    requests = [Request(ids, max_new_tokens, eos_ids, sampling.generator(i)) for i, ids in enumerate(prompts)]
    result = decode_batch(method, engine, requests, B, "static", sampling)  # or "continuous"

``requests`` are started in list order (the order a method's run-wide state learns in); ``generator`` is None
when greedy, else the request's own seeded generator (what it would get alone). ``engine.enable_compile`` before
the call gives compiled steps (graphs per bucket of rows and step shape). The :class:`BatchResult` holds, per
request ``i``:

* ``generations[i]``: a :class:`~fafo.decoding.Generation` like one request's: ``tokens`` (cut at EOS and
  max_new_tokens), ``accept_lengths`` (one per step it took part in: its ``tau``, ``mean_accept``), ``forwards``
  (prefill, verify, draft, aux: the batched forwards it was a row of), ``drafted`` / ``accepted``, ``extras``;
  its ``host_s`` is NaN (host time is the batch's: ``result.host_s``);
* ``times[i]``: ``admitted_s`` (its prefill began), ``first_token_s`` (prefill done), ``finished_s`` (its last
  token), all ``time.perf_counter()``: latency ``finished_s - admitted_s``, time per output token
  ``(finished_s - first_token_s) / (len(tokens) - 1)``; queueing is ``admitted_s - result.start_s``;

and per batched step ``result.steps[j]``: ``requests`` (the active requests, request order: ``len`` is the number
of active rows), ``new_tokens`` (what each committed that step, after the EOS cut) and ``end_s``. Batch throughput
is ``sum(len(g.tokens)) / (max(t.finished_s) - result.start_s)``. Each batched forward is also in
``engine.ledger`` (its ``batch``: rows). B = 1 is exactly :func:`fafo.decoding.decode`'s loop of one request after
another (tokens, acceptance, forwards, run-wide state).

Run-wide state a method learns across requests (SuffixDecoding's global tree, Token Recycling's matrix) is shared
by the batch and updated by one request after another in request order (drafts built, outputs read, requests
started and finished, in that order within each step): results are deterministic and do not depend on which cache
row holds which request. At B = 1 this is the order of one request after another, as :func:`fafo.decoding.decode`
runs them; at B > 1 a request sees the outputs of earlier requests that have finished and, as serving engines
do, what the requests beside it have generated so far.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from fafo.decoding import STEP_HOOKS, Decoder, Generation, Step, StepState, truncate_at_stop
from fafo.engine.batching import StepInputs, StepLogits, bucket_count, forward_rows
from fafo.engine.cache import KVCache
from fafo.engine.engine import Engine
from fafo.engine.ledger import MODEL_TIME, ForwardCounts
from fafo.engine.torch_compat import in_inference_mode, raise_recompile_limit
from fafo.errors import ConfigError
from fafo.sampling import GREEDY, Sampling

BATCHING = ("static", "continuous")
COMPILED_SHAPES = 32  # the graphs one request's compiled steps may need (fafo.engine.compiled.CompiledStep)


def check_batch(decoder: Decoder | type[Decoder], batch_size: int, name: str = "") -> None:
    """One clear error (before any model loads) when ``decoder`` cannot decode ``batch_size`` requests at once."""
    if batch_size > 1 and decoder.batch_refusal:
        label = name or (decoder if isinstance(decoder, type) else type(decoder)).__name__
        raise ConfigError(f"method {label} cannot decode bench.batch_size={batch_size} requests at once: "
                          f"{decoder.batch_refusal}; set bench.batch_size=1")


@dataclass
class Request:
    """One request: its prompt, budget, stop tokens and (sampling) its own generator."""

    prompt_ids: list[int]
    max_new_tokens: int
    eos_ids: tuple[int, ...] = ()
    generator: torch.Generator | None = None


@dataclass
class BatchStep:
    """One batched step: the requests it decoded (request order), the tokens each committed, when it ended."""

    requests: list[int]
    new_tokens: list[int]
    end_s: float


@dataclass
class RequestTimes:
    """``time.perf_counter()`` when a request was admitted, had its first token, and finished."""

    admitted_s: float
    first_token_s: float
    finished_s: float = math.nan


@dataclass
class BatchResult:
    """What :func:`decode_batch` produced.

    Attributes:
        generations: each request's :class:`~fafo.decoding.Generation`, in request order; its ``forwards`` count
            the forwards it took part in (a batched forward counts once for each of its requests) and its
            ``host_s`` is NaN (host time is the batch's: :attr:`host_s`).
        steps: every batched step in order (how many requests were active: ``len(step.requests)``).
        times: each request's admission, first token and finish times.
        start_s: ``time.perf_counter()`` when the first request was admitted.
        host_s: seconds outside model calls (building, reading, accepting, committing, moving rows).
    """

    generations: list[Generation]
    steps: list[BatchStep]
    times: list[RequestTimes]
    start_s: float
    host_s: float


@dataclass
class _Row:
    """A request being decoded on one cache row."""

    index: int
    request: Request
    state: StepState
    cache: KVCache  # the row's view: rebound when the request moves to another row
    tokens: list[int]
    finished: bool
    forwards: ForwardCounts
    accept_lengths: list[int] = field(default_factory=list)
    drafted: int | None = None
    accepted: int | None = None

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - len(self.tokens)

    def take(self, step: Step, inputs: list[StepInputs], widths: list[int]) -> None:
        """Count ``step`` (its forwards of ``widths`` tokens each) and cut it at EOS / max_new_tokens."""
        counts = {k: getattr(self.forwards, k) for k in ("prefill", "verify", "draft", "aux", "tokens")}
        for inp, width in zip(inputs, widths):
            counts[inp.kind] += 1
            counts["tokens"] += width
        self.forwards = ForwardCounts(**counts)
        if step.drafted is not None:
            self.drafted = (self.drafted or 0) + step.drafted
            self.accepted = (self.accepted or 0) + len(step.tokens) - 1
        new, self.finished = truncate_at_stop(step.tokens, self.remaining, self.request.eos_ids)
        self.tokens += new
        self.accept_lengths.append(len(new))

    def generation(self) -> Generation:
        n_draft, params = self.state.draft_model()
        return Generation(self.tokens, self.accept_lengths, self.forwards, n_draft, params, self.drafted,
                          self.accepted, self.state.extras(), math.nan)


@in_inference_mode  # as every method's generate (fafo.decoding.Decoder)
def decode_batch(decoder: Decoder, engine: Engine, requests: list[Request], batch_size: int,
                 batching: str = "static", sampling: Sampling | None = None) -> BatchResult:
    """Decode ``requests`` at most ``batch_size`` at a time (module docstring)."""
    check_batch(decoder, batch_size)
    if batching not in BATCHING:
        raise ConfigError(f"bench.batching={batching!r} is not a batching mode; use one of {', '.join(BATCHING)}")
    sampling = sampling or GREEDY
    need = max(len(r.prompt_ids) + r.max_new_tokens + decoder.extra_slots(r.max_new_tokens) for r in requests)
    cache = engine.cache(need, batch=batch_size)
    if engine.compiled is not None:  # each bucket of rows compiles the step shapes a single request does
        raise_recompile_limit(COMPILED_SHAPES * bucket_count(batch_size))
    queue, rows = deque(range(len(requests))), []
    generations: list[Generation | None] = [None] * len(requests)
    times: list[RequestTimes | None] = [None] * len(requests)
    steps: list[BatchStep] = []
    start, model0 = time.perf_counter(), MODEL_TIME.seconds

    def admit(b: int) -> _Row | None:
        """The next waiting request, prefilled into cache row ``b`` (None: none waits)."""
        if not queue:
            return None
        index = queue.popleft()
        req, admitted, mark = requests[index], time.perf_counter(), engine.ledger.mark()
        view = cache.row(b)
        view.pending = []  # its commit moves, done with every row's at the end of each step
        state = decoder.new_state(engine, req.prompt_ids, req.max_new_tokens, req.eos_ids, sampling, req.generator,
                                  cache=view)
        tokens, finished = truncate_at_stop([state.prefill()], req.max_new_tokens, req.eos_ids)
        times[index] = RequestTimes(admitted, time.perf_counter())
        return _Row(index, req, state, view, tokens, finished, engine.ledger.mark() - mark)

    def retire(done: list[_Row]) -> None:
        for row in sorted(done, key=lambda r: r.index):  # request order: run-wide state learns in that order
            row.state.finish(row.tokens)
            generations[row.index] = row.generation()
            times[row.index].finished_s = time.perf_counter()

    refill = admit if batching == "continuous" else None
    while queue or rows:
        if not rows:  # a static batch starts (continuous batching: the first one)
            rows = _free(cache, [admit(b) for b in range(min(batch_size, len(queue)))], retire, refill)
            continue  # requests whose first token ended them never step
        _step(engine, cache, rows)
        ordered = sorted(rows, key=lambda r: r.index)
        steps.append(BatchStep([r.index for r in ordered], [r.accept_lengths[-1] for r in ordered],
                               time.perf_counter()))
        rows = _free(cache, rows, retire, refill)
    host_s = time.perf_counter() - start - (MODEL_TIME.seconds - model0)
    return BatchResult(generations, steps, times, start, host_s)


def _step(engine: Engine, cache: KVCache, rows: list[_Row]) -> None:
    """One step of every row: inputs built and outputs read in request order, one forward per kind."""
    order = sorted(range(len(rows)), key=lambda i: rows[i].index)
    inputs: list[list[StepInputs]] = [[] for _ in rows]
    for i in order:
        inputs[i] = rows[i].state.inputs(rows[i].remaining)
    if len({len(x) for x in inputs}) != 1:
        raise ValueError("the requests of a batched step must run the same forwards")
    outs, queries, counts, widths = [], [], [], []
    for f in range(len(inputs[0])):
        out, captured, count, width = forward_rows(engine, cache, [x[f] for x in inputs])
        outs.append(out)
        queries.append(captured)
        counts.append(count)
        widths.append(width)
    logits = StepLogits(outs, counts, queries)
    for i in order:
        row = rows[i]
        step = row.state.outputs(row.remaining, logits.row(i))
        row.take(step, inputs[i], widths)
        if not row.finished:
            row.state.commit(step)
    _move(engine, cache, rows)
    for hook in STEP_HOOKS:
        hook()


def _move(engine: Engine, cache: KVCache, rows: list[_Row]) -> None:
    """Every row's commit moves of the step (accepted tokens' KV into place) in one copy and two ops: rows
    without a move, and the tail of shorter ones, copy slot 0 onto itself (no commit writes slot 0)."""
    moves = [row.cache.pending for row in rows]
    if not any(moves):
        return
    if any(len(m) > 1 for m in moves):
        raise ValueError("a request moved its KV twice in one step")
    width = max(len(m[0][0]) for m in moves if m)
    src, dst = np.zeros((2, len(rows), width), dtype=np.int64)
    for b, m in enumerate(moves):
        if m:
            (s, d), = m
            src[b, : len(s)], dst[b, : len(d)] = s, d
            m.clear()
    cache.rows(len(rows)).move_per_row(*engine.upload(src, dst))


def _free(cache: KVCache, rows: list[_Row], retire, admit=None) -> list[_Row]:
    """Retire the finished rows (request order). ``admit(b)`` (continuous batching) prefills the next waiting
    request into each freed row ``b``; rows left free are filled by moving the last active requests into them,
    so the active requests hold cache rows ``[0, n)``."""
    slots: list[_Row | None] = list(rows)
    while any(r is not None and r.finished for r in slots):  # a new request may end at its first token
        retire([r for r in slots if r is not None and r.finished])
        slots = [None if r is None or r.finished else r for r in slots]
        if admit is not None:
            slots = [admit(b) if r is None else r for b, r in enumerate(slots)]
    active = [r for r in slots if r is not None]
    holes = [b for b in range(len(active)) if slots[b] is None]
    moving = [b for b in range(len(active), len(slots)) if slots[b] is not None]
    for hole, src in zip(holes, moving):  # one copy of the request's live KV, every layer at once
        row = slots[src]
        cache.copy_row(src, hole, row.state.live_slots())
        row.cache.bind(cache.kv[:, :, hole : hole + 1])
        slots[hole] = row
    return slots[: len(active)]
