"""Batched steps: the forwards of several requests' decoding steps run as one forward over the batch.

A decoder builds each forward of a step as :class:`StepInputs` (host values where they change from step to step;
tensors it keeps on the device, such as a mask fixed for the generation, may stay there). One request runs them
alone (:func:`forward_one`); at batch B, :func:`forward_rows` stacks the requests' inputs, one
request per cache row, into ``[B, Q]`` tokens, positions and slots, each row with its own prefix length (and FAFO's
region length) and its own step mask, and runs them in ONE forward (the engine: :meth:`Engine.forward`). Rows are
padded to the batch's largest step (or to the method's static size under ``engine.static_shapes``) by the rule of
:mod:`fafo.engine.static_shapes`: padding tokens repeat the row's last token at its last position, write their KV
to the row's next scratch slots, see only the prefix and themselves (or come after every real token of a causal
row), so a row's real logits are those of its step alone.

Compiled steps specialise a graph per (rows, step shape): the rows are padded to a *bucket* (a power of two, or
the cache's row count, :func:`batch_bucket`), so a batch that shrinks as requests finish compiles at most
log2(B) + 1 graphs per step shape. A padding row repeats row 0's inputs on a free cache row (its outputs are
dropped; nothing it writes is read). Eager steps run exactly the active rows: a finished request costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from fafo.engine.attention import AttentionPlan
from fafo.engine.cache import KVCache
from fafo.engine.torch_compat import modes_active


@dataclass
class StepInputs:
    """One forward of one request's decoding step.

    Attributes:
        tokens, positions: ``[Q]`` host values (or tensors).
        slots: ``[Q']`` cache slots of the first Q' tokens' KV (None: none kept).
        plan: the attention plan (``prefix``, ``region_len``: this request's; ``step_mask`` ``[Q, Q]``).
        logits: rows whose logits come back: ``"all"``, ``"last"`` or indices.
        pad_to: the most tokens this kind of step has (the static shape under ``engine.static_shapes``).
        alone: the forward to run instead when the request runs alone (batch 1), e.g. vanilla's 1-token step for a
            tree method's step that drafted nothing; a batch runs the step itself, padded as its other rows.
        kind: what the forward is for (:mod:`fafo.engine.ledger`).
        host_mask, host_logits: ``plan.step_mask`` and ``logits`` on the host, where the decoder keeps them on the
            device: a batch stacks them with other requests' that differ (Lookahead's rows in other phases).
    """

    tokens: object
    positions: object
    slots: object
    plan: AttentionPlan
    logits: object = "all"
    pad_to: int | None = None
    kind: str = "verify"
    alone: StepInputs | None = None
    host_mask: np.ndarray | None = None
    host_logits: np.ndarray | None = None


def forward_one(engine, cache: KVCache, steps: list[StepInputs]) -> StepLogits:
    """The forwards of one request's decoding step, in order; with several (a draft, then a verification) every
    forward's tokens, positions and slots go to the device in one copy."""
    steps = [s.alone or s for s in steps]
    if len(steps) > 1 and not (engine.static_shapes and any(s.pad_to for s in steps)):
        flat = engine.upload(*[v for s in steps for v in (s.tokens, s.positions, s.slots)])
        steps = [replace(s, tokens=flat[3 * i], positions=flat[3 * i + 1], slots=flat[3 * i + 2])
                 for i, s in enumerate(steps)]
    outs, queries = [], []
    for s in steps:
        capture = s.plan.capture_rows is not None
        out = engine.forward(cache, s.tokens, s.positions, s.slots, s.plan, s.logits, kind=s.kind, pad_to=s.pad_to,
                             **({"queries": True} if capture else {}))
        outs.append(out[0] if capture else out)
        queries.append(out[1] if capture else None)
    return StepLogits(outs, queries=queries)


def batch_bucket(n: int, capacity: int) -> int:
    """The rows a compiled step of ``n`` active requests runs: the next power of two, at most ``capacity``."""
    return min(capacity, 1 << max(n - 1, 0).bit_length())


def bucket_count(capacity: int) -> int:
    """How many row counts compiled steps of a ``capacity``-row cache run (each its own graphs)."""
    return len(bucket_fillers(capacity, capacity))


def bucket_fillers(requests: int, capacity: int) -> list[int]:
    """One request count per bucket that a batch of ``requests`` runs as it shrinks (its largest count in that
    bucket), largest first: a warm-up that decodes batches of these sizes compiles every graph the batch can meet,
    whichever order its requests finish in (``requests=4, capacity=4``: 4, 2, 1)."""
    largest = {batch_bucket(n, capacity): n for n in range(1, requests + 1)}
    return sorted(largest.values(), reverse=True)


class StepLogits:
    """The logits a step's forwards returned, ``outs[f]``: ``[B, R, V]`` (one request per row, ``counts[f][b]`` of
    its rows real), read on the host at most once: the argmax (and top-k) of every row of every forward come back
    in ONE device read, however many requests and forwards the step has (one sync per step on a GPU)."""

    def __init__(self, outs: list[torch.Tensor], counts: list[list[int]] | None = None,
                 queries: list[torch.Tensor | None] | None = None):
        self.outs = outs
        self.counts = counts or [[o.shape[1]] * o.shape[0] for o in outs]
        self.queries = queries or [None] * len(outs)  # per forward: [L, B, H_q, R, D] (plan.capture_rows)
        self._argmax: list[np.ndarray] | None = None
        self._topk: dict[int, list[np.ndarray]] = {}

    def row(self, b: int) -> list[RowLogits]:
        """Request ``b``'s logits, one per forward."""
        return [RowLogits(self, f, b) for f in range(len(self.outs))]

    def argmax(self, f: int) -> np.ndarray:
        if self._argmax is None:
            self._argmax = self._read(lambda x: x.argmax(-1)[..., None], 1, host=lambda x: x.argmax(-1)[..., None])
        return self._argmax[f]

    def topk(self, f: int, k: int) -> np.ndarray:
        if k not in self._topk:
            self._topk[k] = self._read(lambda x: x.topk(k, dim=-1).indices, k)
        return self._topk[k][f]

    def _read(self, fn, width: int, host=None) -> list[np.ndarray]:
        """``fn`` of every forward's logits ([B, R, width] each), read in one copy; or ``host`` (the same
        function on numpy arrays) of each, where the logits are host arrays already (:func:`host_logits`)."""
        if host is not None and host_logits(self.outs):
            return [host(o.numpy()) for o in self.outs]
        if len(self.outs) == 1:
            return [fn(self.outs[0]).cpu().numpy()]
        shapes = [o.shape[:2] for o in self.outs]
        flat = fn(torch.cat([o.flatten(0, 1) for o in self.outs])).cpu().numpy()
        parts = np.split(flat, np.cumsum([b * r for b, r in shapes])[:-1])
        return [p.reshape(b, r, width) for p, (b, r) in zip(parts, shapes)]


def argmax_rows(logits: torch.Tensor) -> list | int:
    """The argmax over the last axis of ``logits``, read on the host as (nested) Python ints (one int for one row
    ``[V]``): by numpy where the logits are host memory already (:func:`host_logits`), else one device op and one
    read."""
    if host_logits([logits]):
        return logits.numpy().argmax(-1).tolist()
    return logits.argmax(-1).tolist()


def greedy_chain(forward, feed, n: int, buffer: torch.Tensor, stop=()) -> list[int]:
    """``n`` greedy tokens, each ``forward(feed, i, into)``: the argmax of the forward's last logits row as a
    ``[1, 1]`` long tensor (:meth:`~fafo.engine.engine.Engine.forward` with ``greedy=True`` and ``into``), the
    ``feed`` of the next call. On the host (a CPU outside any torch mode: numpy's argmax) each is read as it comes
    and the chain stops after a token in ``stop``. On a device each token is written to ``buffer[i]`` (``into``:
    ``buffer``, ``[>= n]`` long where the forwards run) and fed from there, and the chain is read once at its end,
    then cut after its first token in ``stop``: one sync per chain instead of one per token, and the device runs the
    forwards past a stop token that the host could not see. A compiled step computes the argmax in its graph and
    copies it into the buffer, the one copy a CUDA graph's output needs anyway: a launch per token, not two."""
    if n == 0:
        return []
    out, on_device = [], not (buffer.is_cpu and not modes_active())  # the buffer is where the forwards run
    for i in range(n):
        token = forward(feed, i, buffer[i : i + 1].view(1, 1) if on_device else None)
        if on_device:
            feed = token
            continue
        out.append(int(token))
        feed = out[-1:]
        if out[-1] in stop:
            break
    if on_device:
        out = buffer[:n].tolist()
        out = out[: next((i + 1 for i, t in enumerate(out) if t in stop), n)]
    return out


def host_logits(outs: list[torch.Tensor]) -> bool:
    """Whether logits are read by numpy where they are: float32/64 CPU tensors, outside any torch mode.

    On the CPU the logits already are host memory, and torch's CPU ``argmax`` is not vectorised: over FAFO's
    281 rows of a 1024-token vocabulary it takes about 8x numpy's time (the same rule: the first index of the
    largest value, NaN counting as the largest). Under a torch mode (a probe counting what a device launches and
    reads, :mod:`fafo.bench.tools.host_probe`) the device path runs, as it does on a GPU."""
    if modes_active():
        return False
    for o in outs:  # a loop, not all() over a generator: asked once or more per forward
        if not o.is_cpu or o.dtype not in _HOST_DTYPES:
            return False
    return True


_HOST_DTYPES = (torch.float32, torch.float64)


class RowLogits:
    """One request's logits from one forward of a step: :attr:`tensor` ``[R, V]`` (the rows it asked for), and
    their :meth:`argmax` / :meth:`topk` on the host (read with every other row's: :class:`StepLogits`)."""

    __slots__ = ("step", "f", "b")

    def __init__(self, step: StepLogits, f: int, b: int):
        self.step, self.f, self.b = step, f, b

    @property
    def tensor(self) -> torch.Tensor:
        return self.step.outs[self.f][self.b, : self.step.counts[self.f][self.b]]

    def argmax(self) -> np.ndarray:
        """``[R]`` the argmax token of each row, on the host."""
        return self.step.argmax(self.f)[self.b, : self.step.counts[self.f][self.b], 0]

    def topk(self, k: int, rows: list[int] | None = None) -> np.ndarray:
        """``[R, k]`` the top-k tokens of each row (of ``rows`` only: ``[len(rows), k]``), on the host. Where the
        logits are host memory (:func:`host_logits`) only ``rows`` are ranked: torch's CPU top-k costs about 1.5 us
        a row of a 1024-token vocabulary, and Token Recycling keeps one row per distinct token of its tree (on a
        repetitive text, about 8 of 72 nodes). On a device every row is ranked in the one kernel, read with every
        other request's."""
        if rows is not None and host_logits([self.step.outs[self.f]]):
            return self.tensor[rows].topk(k, dim=-1).indices.numpy()
        top = self.step.topk(self.f, k)[self.b, : self.step.counts[self.f][self.b]]
        return top if rows is None else top[rows]

    @property
    def queries(self) -> torch.Tensor | None:
        """The post-RoPE queries of the rows its plan's ``capture_rows`` named (``[L, 1, H_q, R, D]``), or None."""
        queries = self.step.queries[self.f]
        return None if queries is None else queries[:, self.b : self.b + 1]


def forward_rows(engine, cache: KVCache, steps: list[StepInputs]) -> tuple[torch.Tensor, dict | None, list[int], int]:
    """One forward of ``steps[b]`` in cache row ``b`` for every b (rows ``[0, len(steps))`` of ``cache``): the
    requests' own forwards of one kind, batched. Returns the logits ``[B', R, V]`` (B' >= B: padding rows of a
    compiled step come last), the captured queries (``[L, B', H_q, R, D]``, None when the plans capture
    none), how many of its rows each request asked for, and the tokens each row computed.

    Every step must be of the same kind and method (equal region start, region capacity, dense layers and
    captured rows)."""
    n = len(steps)
    first = steps[0]
    if any(s.kind != first.kind for s in steps):
        raise ValueError("a batched forward runs one kind of forward: " + ", ".join(sorted({s.kind for s in steps})))
    if any(s.plan.prefix_lens is not None for s in steps):
        raise ValueError("per-query prefix lengths (prefix_lens) cannot be batched")
    rows = batch_bucket(n, cache.batch) if engine.compiled is not None else n
    steps = steps + [first] * (rows - n)  # padding rows: row 0's step, on free cache rows
    view = cache.rows(rows)
    engine.keep_address(view)
    lens = [len(s.tokens) for s in steps]
    Q = max(lens + [s.pad_to for s in steps if s.pad_to and engine.static_shapes])
    plans = [s.plan for s in steps]
    plan = first.plan.replace(
        prefix=max(p.prefix for p in plans), prefix_length=np.array([p.prefix for p in plans]),
        step_mask=_masks(steps, lens, Q), step_block_mask=None, prefix_block_mask=None, region_block_mask=None,
        dense_block_mask=None, step_gather=None)
    if first.plan.region_from is not None:
        if any(p.region_from != first.plan.region_from or p.region_capacity != first.plan.region_capacity
               for p in plans):
            raise ValueError("batched rows must share the region's start and capacity")
        plan = plan.replace(region_len=max(p.region_len for p in plans),
                       region_length=np.array([p.region_len for p in plans]))
    logits, counts = _logit_rows(steps, lens, Q)
    tokens = _stack([s.tokens for s in steps], Q, _repeat_last)
    positions = _stack([s.positions for s in steps], Q, _repeat_last)
    capture = plan.capture_rows is not None
    out = engine.forward(view, tokens, positions, _slots([s.slots for s in steps], lens, Q), plan, logits,
                         kind=first.kind, **({"queries": True} if capture else {}))
    logits, queries = out if capture else (out, None)
    return logits, queries, counts[:n], Q


def _stack(values: list, width: int, fill) -> np.ndarray | torch.Tensor:
    """``[B, width]``: each row's values, then ``fill(row, k)`` for its k missing ones. Host values are stacked by
    numpy (the engine uploads them with the step); tensors a decoder keeps on the device, on the device."""
    if any(isinstance(v, torch.Tensor) for v in values):
        values = [torch.as_tensor(v, device=next(t.device for t in values if isinstance(t, torch.Tensor)))
                  for v in values]
        return torch.stack([v if len(v) == width else torch.cat([v, fill(v, width - len(v))]) for v in values])
    out = np.empty((len(values), width), dtype=np.int64)
    for b, v in enumerate(values):
        v = np.asarray(v, dtype=np.int64)
        out[b, : len(v)], out[b, len(v):] = v, fill(v, width - len(v))
    return out


def _repeat_last(v, k):
    return v[-1:].repeat(k)


def _next_slots(v, k):
    steps = torch.arange(k, device=v.device) if isinstance(v, torch.Tensor) else np.arange(k)
    return v[-1] + 1 + steps


def _slots(values: list, lens: list[int], Q: int):
    """``[B, Q']`` slots: a row whose slots cover its every token is padded with the slots after its last one
    (:func:`fafo.engine.static_shapes.pad_step`); rows that keep a fixed number of tokens' KV keep those."""
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        raise ValueError("batched rows must all keep KV or all not")
    full = [len(v) == n for v, n in zip(values, lens)]
    width = Q if any(full) else len(values[0])
    if not all(full) and any(len(v) != width for v, f in zip(values, full) if not f):
        raise ValueError(f"batched rows keep different numbers of tokens' KV: {[len(v) for v in values]}")
    return _stack(values, width, _next_slots)


def _masks(steps: list[StepInputs], lens: list[int], Q: int):
    """The step's mask: one for every row (shared, unpadded) or ``[B, Q, Q]`` with each row's padded: padding
    tokens see themselves only; a causal row (no mask) stays causal, its padding after every real token."""
    masks = [s.plan.step_mask for s in steps]
    if all(m is None for m in masks):
        return None
    if all(m is masks[0] for m in masks) and all(n == Q for n in lens):
        return masks[0]
    masks = [m if s.host_mask is None else s.host_mask for m, s in zip(masks, steps)]
    if any(isinstance(m, torch.Tensor) for m in masks):  # masks kept on the device, of rows in different phases
        device = next(m.device for m in masks if isinstance(m, torch.Tensor))
        out = torch.eye(Q, dtype=torch.bool, device=device).repeat(len(masks), 1, 1)
        for b, (m, n) in enumerate(zip(masks, lens)):
            if m is None:
                out[b] = torch.ones(Q, Q, dtype=torch.bool, device=device).tril()
            else:
                out[b, :n, :n] = torch.as_tensor(m, device=device)
        return out
    out = np.tile(np.eye(Q, dtype=bool), (len(masks), 1, 1))
    for b, (m, n) in enumerate(zip(masks, lens)):
        if m is None:
            out[b] = np.tri(Q, dtype=bool)
        else:
            out[b, :n, :n] = m
    return out


def _logit_rows(steps: list[StepInputs], lens: list[int], Q: int):
    """(the forward's ``logits`` argument, how many rows each request gets back)."""
    specs = [s.logits for s in steps]
    if all(isinstance(s, str) and s == "all" for s in specs):
        return "all", lens
    if all(s is specs[0] for s in specs) and not isinstance(specs[0], str) and all(n == Q for n in lens):
        return specs[0], [len(specs[0])] * len(specs)
    specs = [x if s.host_logits is None else s.host_logits for x, s in zip(specs, steps)]
    rows = [([n - 1] if s == "last" else list(range(n))) if isinstance(s, str) else s for s, n in zip(specs, lens)]
    counts = [len(r) for r in rows]
    return _stack(rows, max(counts), _repeat_last), counts
