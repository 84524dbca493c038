"""TriForce's two extra caches on our engine (https://arxiv.org/abs/2404.11912, official code
Infini-AI-Lab/TriForce @ 164c8c0, ``models/cache.py``): the target's retrieval cache (:class:`RetrievalCache`, the
official ``RetrievalCache``) and the draft model's StreamingLLM cache (:class:`StreamingDraft`, the official
``StreamingLLMEvictionCache``).
"""

from __future__ import annotations

import torch

from fafo.compress.base import group_scores
from fafo.engine.attention import causal_plan
from fafo.engine.batching import greedy_chain
from fafo.engine.cache import KVCache
from fafo.engine.engine import Engine
from fafo.engine.rope import apply_rotary, rotate_half


def select_chunks(keys: torch.Tensor, query: torch.Tensor, chunk: int, n_select: int, reduce: str) -> torch.Tensor:
    """The official ``init_graph_cache`` scoring: per KV head, chunk 0 then the best ``n_select - 1`` other chunks.

    keys: [..., H_kv, T', D] post-RoPE (T' a multiple of ``chunk``); query: [..., H_q, D] post-RoPE -> [..., H_kv,
    n_select] chunk indices, chunk 0 first, the rest in descending score order (leading dims: e.g. every layer at
    once). Scores are q . mean(chunk keys), no 1/sqrt(d), no softmax (as the official code), computed in float32;
    under GQA the query heads of a group are combined with ``reduce`` (``mean``: the sum of their scores; ``max``)
    -- the official code is MHA only.
    """
    h_kv, t, d = keys.shape[-3:]
    means = keys.float().unflatten(-2, (t // chunk, chunk)).mean(dim=-2)  # [..., H_kv, C, D]
    q = query.float().unflatten(-2, (h_kv, -1))  # [..., H_kv, G, D]
    scores = group_scores(torch.matmul(q, means.transpose(-1, -2)).flatten(-3, -2), h_kv, reduce)  # [..., H_kv, C]
    rest = torch.topk(scores[..., 1:], n_select - 1, dim=-1).indices + 1  # sorted: best first
    return torch.cat([torch.zeros_like(rest[..., :1]), rest], dim=-1)


class RetrievalCache:
    """C_r: slots ``[0, budget)`` hold retrieved chunks (ranked, chunk 0 first) and recent tokens; ``[budget,
    budget + scratch)`` hold the middle level's uncommitted tokens.

    Recent tokens (the prompt's tail after its last whole chunk, then every committed token) overwrite the
    lowest-ranked chunks first (official ``update_graph_cache``), stored from the end backwards (slot ``budget - 1
    - i`` for the i-th; attention is order-free, so no entry ever moves). The region is capped at ``budget - chunk``
    slots and wraps (oldest dropped), so chunk 0 stays (the official code would overwrite it, then fail).

    Args:
        kv: a cache of the target model with at least ``budget + scratch`` slots.
        budget: retrieved slots (a multiple of ``chunk``, >= 2 chunks).
        chunk: chunk size.
        reduce: GQA group combination of chunk scores (``mean`` or ``max``).
    """

    def __init__(self, kv: KVCache, budget: int, chunk: int, reduce: str = "mean"):
        self.kv, self.budget, self.chunk, self.reduce = kv, budget, chunk, reduce
        self.aligned = 0  # prompt tokens in whole chunks: positions >= aligned are "recent"

    def build(self, full: KVCache, aligned: int, queries: torch.Tensor, n_committed: int) -> None:
        """Select and gather chunks of ``full``'s first ``aligned`` slots with ``queries`` (``[L, 1, H_q, 1, D]``,
        post-RoPE), then place the recent tokens ``[aligned, n_committed)`` (official ``init_graph_cache``, and
        ``update_graph_cache_retrieval`` for a rebuild). Every layer at once: a handful of ops at any depth."""
        self.aligned = aligned
        n_sel, c = self.budget // self.chunk, self.chunk
        kv = full.kv[:, :, 0, :, :aligned]  # [2, L, H_kv, T', D]
        q = queries[:, 0, :, 0]  # [L, H_q, D]
        idx = select_chunks(kv[0], q, c, n_sel, self.reduce)  # [L, H_kv, n_sel]
        blocks = kv.unflatten(3, (aligned // c, c))  # [2, L, H_kv, C, c, D]
        idx = idx[None, :, :, :, None, None].expand(2, -1, -1, -1, c, blocks.shape[-1])
        self.kv.kv[:, :, 0, :, : self.budget] = blocks.gather(3, idx).flatten(3, 4)
        # where each later position's entry goes in the recent region (a ring from the end backwards), by position
        ring = self.budget - self.chunk
        pos = torch.arange(full.max_len, device=kv.device)
        self._recent_slot = self.budget - 1 - (pos - aligned).remainder(ring)
        self._positions = pos
        self.add_recent(full, aligned, n_committed)

    def add_recent(self, full: KVCache, lo: int, hi: int) -> None:
        """Copy the full cache's committed entries at positions ``[lo, hi)`` (their slots) into the recent region
        (two ops: slot indices are slices of tensors built with the chunks)."""
        lo = max(lo, hi - (self.budget - self.chunk))  # older ones would be overwritten within this very copy
        if lo >= hi:
            return
        self.kv.copy_from(full, self._positions[lo:hi], self._recent_slot[lo:hi])


class StreamingDraft:
    """The draft model on a StreamingLLM cache: ``start`` sink tokens + the ``window`` most recent committed tokens.

    Our engine keeps post-RoPE keys, so instead of re-rotating every key at its cache index each step (official),
    window tokens keep their original positions and the sinks are re-rotated, from a pristine copy, to sit right
    before the window's oldest token: the same query-key distances (hence no ``dynamic``/``longrope`` drafts).
    Slots: position p < start lives at slot p; p >= start at ``start + (p - start) % window`` (a ring); uncommitted
    tokens at positions D.. (D: committed positions) live in scratch right after the committed slots. Under
    ``engine.static_shapes`` each :meth:`propose` pads its catch-up forward to ``CATCH_UP`` tokens, then runs
    one-token forwards. Differences from the official cache and why CATCH_UP suffices: docs/methods/triforce.md.
    """

    PREFILL_CHUNK = 64  # official draft prefill chunk (utils/graph_infer.py::draft_run)
    ROTATIONS = 64  # sink rotations whose cos/sin one table holds (a rotation per commit is then 4 ops, not 8)
    CATCH_UP = 3  # static-shape length of propose's first forward (docs/methods/triforce.md)

    def __init__(self, engine: Engine, start: int, window: int, scratch: int):
        self.engine, self.start, self.window = engine, start, window
        self.scratch = max(scratch, min(self.PREFILL_CHUNK, window))
        self.kv = engine.new_cache(start + window + self.scratch)
        self.reset()

    def reset(self) -> None:
        self.D = 0  # committed positions [0, D) are in the sink/window slots
        self.spec: list[int] = []  # tokens at positions D, D+1, ... with KV in scratch
        self.delta = 0  # the sinks' current rotation
        self.pristine: tuple | None = None  # sink keys at positions 0.. and their rotate_half (float32)
        self.inv_freq = self.engine.model.rotary.inv_freq  # float32 [D/2]
        empty = self.inv_freq.new_empty(0, 2 * len(self.inv_freq))
        self.rotations = (0, empty, empty)  # the first delta of the table, its cos and sin rows
        # a proposal's greedy tokens where the device leaves them (a proposal's KV fits in scratch: so do they)
        self.chain = torch.empty(self.scratch, dtype=torch.long, device=self.engine.device)

    @property
    def nbytes(self) -> int:
        pristine = 0 if self.pristine is None else sum(t.numel() * t.element_size() for t in self.pristine)
        return self.kv.nbytes + self.engine.weights_nbytes + pristine

    def _base(self) -> int:
        return min(self.D, self.start + self.window)

    def _slot(self, p: int) -> int:
        return p if p < self.start else self.start + (p - self.start) % self.window

    def _forward(self, tokens: list[int], p0: int, logits, pad: int = 0, greedy: bool = False, into=None):
        """Run ``tokens`` at positions p0.. (p0 >= D), KV into scratch; they see committed slots and scratch < p0.
        With ``pad`` under ``engine.static_shapes`` (``logits="last"`` only): pieces of ``tokens`` padded to ``pad``
        tokens, the padding's KV in scratch past the real tokens' (no forward reads it before real tokens overwrite
        it; a commit moves real tokens only). Returns the last real token's logits, [1, 1, V] (``greedy``: its
        argmax, [1, 1], written ``into`` a tensor when one is given)."""
        if not (pad and self.engine.static_shapes):
            return self._run(tokens, p0, logits, greedy=greedy, into=into)
        assert logits == "last", logits
        for s in range(0, len(tokens), pad):
            piece = tokens[s : s + pad]
            last = [len(piece) - 1]  # a fixed count (1) of logits rows, uploaded with the step's inputs
            out = self._run(piece + piece[-1:] * (pad - len(piece)), p0 + s, last, greedy=greedy, into=into)
        return out

    def _run(self, tokens: list[int], p0: int, logits, eager: bool = False, kind: str = "verify",
             greedy: bool = False, into=None):
        """One forward of ``tokens`` at positions p0.., slots right after the committed ones and scratch < p0
        (``eager``: never compiled, for the prompt's chunks, whose lengths vary)."""
        off = self._base() + p0 - self.D
        if off + len(tokens) > self.kv.max_len:
            raise RuntimeError(f"triforce draft scratch overflow ({off + len(tokens)} > {self.kv.max_len} slots)")
        n = len(tokens)  # host positions and slots: one upload with the tokens
        return self.engine.forward(self.kv, tokens, list(range(p0, p0 + n)), list(range(off, off + n)),
                                   causal_plan(off), logits=logits, eager=eager, kind=kind, greedy=greedy,
                                   into=into)

    def prefill(self, prompt: list[int]) -> None:
        self.reset()
        full = self.start + self.window
        while self.D < len(prompt):
            n = full - self.D if self.D < full else min(self.PREFILL_CHUNK, self.window)
            chunk = prompt[self.D : self.D + n]
            self._run(chunk, self.D, "none", eager=True, kind="prefill")
            self.spec = chunk
            self.commit(prompt, 0, self.D + len(chunk))

    def _common(self, tokens: list[int], start: int, limit: int) -> int:
        k, limit = 0, min(len(self.spec), limit)
        while k < limit and self.spec[k] == tokens[self.D + k - start]:
            k += 1
        return k

    def propose(self, tokens: list[int], start: int, n: int, pick=None) -> list[int]:
        """Draft ``n`` tokens after the sequence whose token at position ``start + i`` is ``tokens[i]``
        (``start <= D``); KV already in scratch for a matching prefix is reused. Greedy unless ``pick``
        (``pick(logits_row [V], drafted_so_far) -> token``: the sampled path, which records its q rows).

        Greedy, the chain is :func:`greedy_chain`'s (the argmax in each forward): on a device one read per
        proposal, not one per token."""
        end = start + len(tokens)
        del self.spec[self._common(tokens, start, end - 1 - self.D) :]  # keep >= 1 token to feed
        if n == 0:
            return []
        feed = tokens[self.D + len(self.spec) - start :]  # host tokens whose KV this proposal writes, then its drafts
        p = self.D + len(self.spec)  # the next forward's first position

        def forward(tokens, i, into=None):  # static shapes: the catch-up padded to CATCH_UP tokens, then 1 token
            nonlocal p
            out = self._forward(tokens, p, "last", self.CATCH_UP if i == 0 else 0, greedy=pick is None, into=into)
            p += len(tokens)
            return out if pick is None else out[0, -1]  # the token [1, 1], or the logits row [V]

        if pick is None:
            out = greedy_chain(forward, feed, n, self.chain)
        else:
            out = []
            for i in range(n):
                out.append(int(pick(forward(out[-1:] if i else feed, i), out)))
        self.spec += feed + out[:-1]  # the last drafted token has no KV yet
        return out

    def commit(self, tokens: list[int], start: int, end: int) -> None:
        """Positions ``[D, end)`` are committed (``tokens[i]`` at ``start + i``): move the matching speculated KV
        from scratch into the sink/window slots, drop the rest of scratch, re-rotate the sinks."""
        k = self._common(tokens, start, end - self.D)
        moves = {self._slot(self.D + i): self._base() + i for i in range(k)}  # later positions win a slot
        moves = {d: s for d, s in moves.items() if d != s}
        # a moved entry comes from slot >= start + window (scratch, or a position past the ring while the base is
        # D) and goes to the ring below it: no slot is both, so a slice copy per run (the ring may wrap), no upload
        self.kv.copy_slots(list(moves.values()), list(moves))
        self.D += k
        self.spec = []
        self._rotate_sinks(max(0, self.D - self.start - self.window))

    def _rotate_sinks(self, delta: int) -> None:
        """Sinks at virtual positions ``delta + j``: just before the window's oldest token, as the official cache
        indices place them."""
        if delta == self.delta or self.start == 0:
            return
        sinks = self.kv.kv[0, :, :, :, : self.start]  # [L, B, H_kv, start, D]: every layer's sink keys
        if self.pristine is None:  # delta was 0 so far: the sinks are still as written at positions 0..start-1
            keys = sinks.to(torch.float32, copy=True)
            self.pristine = (keys, rotate_half(keys))  # float32, each [L, B, H_kv, start, D]
        first, cos, sin = self.rotations
        if not first <= delta < first + len(cos):  # the next ROTATIONS rotations' cos and sin, each [R, D] float32
            freqs = torch.arange(delta, delta + self.ROTATIONS, device=cos.device)[:, None] * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            first, cos, sin = self.rotations = delta, emb.cos(), emb.sin()
        keys, half = self.pristine  # the half-rotated keys kept from the first rotation
        sinks.copy_(apply_rotary(keys, cos[delta - first], sin[delta - first], half))  # rounded to the cache's dtype
        self.delta = delta
