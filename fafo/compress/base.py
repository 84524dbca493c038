"""KV compression functions C and FAFO's fixed-region cache layout.

A compression function is a small dataclass (fields = hyperparameters = Hydra schema, validated in
``__post_init__``) that answers one question: which cached entries, by logical position, form the compressed
view ``C(kv)`` now, per layer and per KV head. :class:`FixedRegion` keeps exactly those entries physically in the
first slots of the static cache, the layout of FAFO section 4.4 / App. H::

    [ C(kv): fixed region, slots [0, budget) | R(kv): the rest, slots [budget, n) | scratch for this step ]

so the fumble attention reads a static block range whatever the context length. Selections may differ per
layer and KV head (Quest, SnapKV); each (layer, head) row of the cache is permuted on its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from fafo.engine.cache import KVCache


@dataclass
class Compression(ABC):
    """Base class of KV compression functions (StreamingLLM, Quest, SnapKV...).

    ``label`` is the short name method labels use (``name: fafo-{compress}`` in a method config);
    ``budget_fields`` the settings that size the fixed region (what an error asks to lower when it is too large).

    Hooks receive the :class:`FixedRegion` (its cache, ``n``, and a ``state`` dict for per-generation data) and
    the post-RoPE queries the engine captured (``{layer: [B, H_q, R, D]}``) for the rows named by :attr:`query_rows`.
    """

    label: ClassVar[str] = "custom"
    budget_fields: ClassVar[tuple[str, ...]] = ()

    def dense(self) -> frozenset[int]:
        """Layers in which C(kv) is the whole cache (fumble queries read everything there)."""
        return frozenset()

    @property
    @abstractmethod
    def budget(self) -> int:
        """Entries C(kv) holds at most (the fixed region's size)."""

    @property
    def wants_decode_query(self) -> bool:
        """Whether :meth:`after_append` needs the newest committed token's query (Quest)."""
        return False

    def prefill_query_rows(self, n_prompt: int) -> torch.Tensor | None:
        """Prompt rows whose queries :meth:`after_prefill` needs (None: none)."""
        return None

    def after_prefill(self, region: "FixedRegion", queries: dict[int, torch.Tensor] | None) -> None:
        """Called once the prompt's KV is cached (identity layout: slot = position)."""

    def after_append(self, region: "FixedRegion", new_slots: torch.Tensor, query: dict | None) -> None:
        """Called when new entries were appended at ``new_slots`` (before reselection); ``query`` holds the
        latest decode query per layer ([B, H_q, 1, D]) when the decoder captured one."""

    @abstractmethod
    def select(self, region: "FixedRegion") -> torch.Tensor:
        """Logical positions forming C(kv) for ``region.n`` cached entries: ``[K]`` (same for every layer and
        head) or ``[L, H_kv, K]``; K <= budget and equal across layers and heads. Built on ``region.device``
        without reading device data on the host (it runs every decoding step)."""

    def max_swaps(self, region: "FixedRegion", n_appended: int) -> int:
        """How many entries, at most, any (layer, KV head) must swap into the fixed region when it is reselected
        right after ``n_appended`` entries were appended (``region.n`` counts them) to a cache whose region held
        the previous selection.

        Computed from Python ints alone: it sizes the step's padded swap lists, so the step reads nothing back
        from the device. A bound that is too small would leave the region stale; a larger one only adds no-op
        swaps. The default, the budget, always holds: a selection has at most ``budget`` entries.
        """
        return self.budget


def topk_positions_per_head(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The shared top-k of score-based compressions (kvpress's ScorerPress step).

    scores: [..., H_kv, N] per-KV-head scores over candidate entries -> [..., H_kv, k] their indices, sorted
    ascending (the order is irrelevant to attention; sorted makes selections comparable in tests).
    """
    return torch.topk(scores, k, dim=-1).indices.sort(dim=-1).values


def group_scores(scores: torch.Tensor, n_kv_heads: int, reduce: str) -> torch.Tensor:
    """Combine per-query-head scores [..., H_q, N] into per-KV-head scores [..., H_kv, N] under GQA."""
    grouped = scores.unflatten(-2, (n_kv_heads, -1))
    return grouped.amax(dim=-2) if reduce == "max" else grouped.mean(dim=-2)


class FixedRegion:
    """Physical layout ``[C(kv) | R(kv)]`` of a static cache, maintained by swapping (FAFO App. H).

    For each layer l and KV head h, ``pos[l, h, s]`` is the logical position held by slot ``s`` (-1: empty) and
    ``slot_of[l, h, p]`` its inverse. Slots ``[0, n)`` hold the ``n`` cached entries; the first ``region_len``
    of them are exactly the current selection of the compression function.

    Args:
        cache: the static cache whose slots are moved (batch 1).
        compression: the function C.
        capacity: slots available for committed entries (scratch for a step's new KV lies beyond; one slot past
            ``capacity`` must exist in the cache: it is the no-op target of padded swaps).
    """

    def __init__(self, cache: KVCache, compression: Compression, capacity: int):
        self.cache, self.compression = cache, compression
        self.budget = compression.budget
        self.capacity = capacity
        self.device = cache.keys[0].device
        L, H = len(cache.keys), cache.keys[0].shape[1]
        self.pos = torch.full((L, H, capacity + 1), -1, dtype=torch.long, device=self.device)
        self.slot_of = torch.full((L, H, capacity + 1), -1, dtype=torch.long, device=self.device)
        self.pos[:, :, capacity] = capacity  # the junk slot holds a dummy position, so padded swaps stay no-ops
        self.slot_of[:, :, capacity] = capacity
        self.n = 0
        self.region_len = 0
        self.state: dict = {}  # the compression function's per-generation state (Quest metadata, SnapKV picks)

    def prefill(self, n_prompt: int, queries: dict | None = None) -> None:
        """The prompt's KV sits at slots ``[0, T)`` in position order; select C and swap it into place."""
        ar = torch.arange(n_prompt, device=self.device)
        self.pos[:, :, :n_prompt] = ar
        self.slot_of[:, :, :n_prompt] = ar
        self.n = n_prompt
        self.compression.after_prefill(self, queries)
        self._reselect(self.budget)

    def commit(self, scratch_slots: torch.Tensor, query: dict | None = None) -> None:
        """Append entries computed in scratch slots (positions ``n, n+1, ...``), then swap the fixed region so
        it holds exactly C(kv) again: newly selected entries in, evicted ones out to where those came from.

        Nothing here waits for the device (no host read of device data, no data-dependent shape), so a decoding
        step's only synchronisation stays the decoder's read of its accepted tokens. ``scratch_slots`` may live
        on the host: it is copied without blocking.
        """
        a = scratch_slots.numel()
        new = torch.arange(self.n, self.n + a, device=self.device)
        self.cache.move(scratch_slots.to(self.device, non_blocking=True), new)
        self.pos[:, :, self.n : self.n + a] = new
        self.slot_of[:, :, self.n : self.n + a] = new
        self.n += a
        self.compression.after_append(self, new, query)
        self._reselect(self.compression.max_swaps(self, a))

    def _reselect(self, max_swaps: int) -> None:
        """Swap C's current selection into slots ``[0, K)``; ``max_swaps`` bounds the evictions of any row."""
        L, H, _ = self.pos.shape
        sel = self.compression.select(self).to(self.device)
        sel = sel.expand(L, H, -1) if sel.dim() == 1 else sel  # [L, H, K]
        K = sel.shape[-1]
        want = torch.zeros(L, H, self.n, dtype=torch.bool, device=self.device)
        want.scatter_(2, sel, True)
        evict = ~want.gather(2, self.pos[:, :, :K])  # [L, H, K]: region slots holding unselected entries
        admit_slots = self.slot_of.gather(2, sel)  # [L, H, K]: where the selected entries are now
        admit = admit_slots >= K
        width = min(max_swaps, K)  # Python ints: no row evicts (nor admits: as many) more than this
        if width:
            junk = self.capacity  # padded pairs swap this unused slot with itself
            src_out = _first_true(torch.arange(K, device=self.device).expand(L, H, K), evict, width, junk)
            src_in = _first_true(admit_slots, admit, width, junk)
            src, dst = torch.cat([src_out, src_in], -1), torch.cat([src_in, src_out], -1)  # swap pairs
            self._move_rows(src, dst)
            moved = self.pos.gather(2, src)
            self.pos.scatter_(2, dst, moved)
            self.slot_of.scatter_(2, moved, dst)
        self.region_len = K

    def _move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Per (layer, head) slot copies: src/dst [L, H, N]; values are gathered before any write."""
        for layer in range(src.shape[0]):
            for buf in (self.cache.keys[layer], self.cache.values[layer]):
                D = buf.shape[-1]
                vals = buf.gather(2, src[layer][None, :, :, None].expand(buf.shape[0], -1, -1, D))
                buf.scatter_(2, dst[layer][None, :, :, None].expand(buf.shape[0], -1, -1, D), vals)


def _first_true(values: torch.Tensor, mask: torch.Tensor, width: int, fill: int) -> torch.Tensor:
    """Per row, the values where mask is True, first ``width`` of them, padded with ``fill``: [..., width]."""
    order = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True)[..., :width]
    picked = values.gather(-1, order)
    return torch.where(mask.gather(-1, order), picked, torch.full_like(picked, fill))
