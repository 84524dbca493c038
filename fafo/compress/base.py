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

import numpy as np
import torch

from fafo.engine.cache import KVCache
from fafo.errors import ConfigError


@dataclass
class Compression(ABC):
    """Base class of KV compression functions (StreamingLLM, Quest, SnapKV...).

    ``label`` is the short name method labels use (``name: fafo-{compress}`` in a method config);
    ``budget_fields`` the settings that size the fixed region (what an error asks to lower when it is too large).

    Hooks receive the :class:`FixedRegion` (its cache, ``n``, and a ``state`` dict for per-generation data) and
    the post-RoPE queries the engine captured (``[L, B, H_q, R, D]``, every layer's) for the rows named by
    :meth:`prefill_query_rows` (prefill) or by the decoder (decoding).
    """

    label: ClassVar[str] = "custom"
    budget_fields: ClassVar[tuple[str, ...]] = ()
    # where the region keeps its bookkeeping: "device" (every step), "host" (from the start) or "host_after_prefill"
    # (the prefill's selection on the device, every later change on the host): see select_host
    host_selection: ClassVar[str] = "device"

    def dense(self) -> frozenset[int]:
        """Layers in which C(kv) is the whole cache (fumble queries read everything there)."""
        return frozenset()

    @property
    @abstractmethod
    def budget(self) -> int:
        """Entries C(kv) holds at most (the fixed region's size)."""

    def check_fits(self, context: int) -> None:
        """Refuse a region that keeps at least the whole context (it would compress nothing: local=100000 at 4k)."""
        if self.budget >= context:
            knobs = " or ".join(f"method.compress.{name}" for name in self.budget_fields) or "method.compress's sizes"
            raise ConfigError(f"method.compress keeps {self.budget} entries, not fewer than the model context "
                              f"{context}, so it compresses nothing; lower {knobs} below {context}")

    @property
    def wants_decode_query(self) -> bool:
        """Whether :meth:`after_append` needs the newest committed token's query (Quest)."""
        return False

    def prefill_query_rows(self, n_prompt: int) -> torch.Tensor | None:
        """Prompt rows whose queries :meth:`after_prefill` needs (None: none)."""
        return None

    def after_prefill(self, region: "FixedRegion", queries: torch.Tensor | None) -> None:
        """Called once the prompt's KV is cached (identity layout: slot = position)."""

    def after_append(self, region: "FixedRegion", new_slots: torch.Tensor, query: torch.Tensor | None) -> None:
        """Called when new entries were appended at ``new_slots`` (before reselection): slots ``[region.n - a,
        region.n)`` for ``a`` entries, each at slot = position. ``query`` holds the latest decode query of every layer
        (``[L, B, H_q, 1, D]``) when the decoder captured one."""

    @abstractmethod
    def select(self, region: "FixedRegion") -> torch.Tensor:
        """Logical positions forming C(kv) for ``region.n`` cached entries: ``[K]`` (same for every layer and
        head) or ``[L, H_kv, K]``; K <= budget and equal across layers and heads. Built on ``region.device``
        without reading device data on the host (it runs every decoding step)."""

    def select_host(self, region: "FixedRegion") -> np.ndarray:
        """The positions C holds beyond the region's frozen slots ``[0, region.frozen)``, as a host array, the same
        for every layer and head; only called where :attr:`host_selection` is not ``"device"``.

        ``"host"``: nothing is frozen; this is all of C, a selection that follows from Python ints alone
        (StreamingLLM's). ``"host_after_prefill"``: the entries the prefill placed in the region stay there for the
        whole generation (per layer and head: SnapKV's prompt picks), and this names the others, all appended after
        the prompt. Either way the swaps then move the same slots in every layer and head: the region keeps one row
        of bookkeeping on the host (numpy) and moves entries by slice copies, so no index reaches the device."""
        raise NotImplementedError(f"{type(self).__name__} selects on the device")

    def state_bytes(self, args, slots: int) -> int:
        """Device bytes one generation's selection state takes at most beside the cache, for a region over
        ``slots`` cached positions of a model of ``args`` (``bench.plan``, before anything loads). None by default
        (a selection the same in every layer and head keeps one row of bookkeeping)."""
        return 0

    def max_swaps(self, region: "FixedRegion", n_appended: int) -> int:
        """How many entries, at most, any (layer, KV head) must swap into the fixed region when it is reselected
        right after ``n_appended`` entries were appended (``region.n`` counts them) to a cache whose region held
        the previous selection.

        Computed from Python ints alone: where it is 0 a step swaps and reads nothing, and it bounds the swaps of a
        region kept on the host; a selection made on the device is counted exactly (one read back) and swaps no more
        than that. A bound that is too small would leave the region stale; a larger one costs nothing more. The
        default, the budget, always holds: a selection has at most ``budget`` entries.
        """
        return self.budget


def per_head_bookkeeping_bytes(args, slots: int) -> int:
    """A region's bookkeeping once its selections differ by layer and KV head: the position each slot holds and
    the slot each position sits in, ``[L, H_kv, slots + 1]`` int64 each (:class:`FixedRegion`)."""
    return 2 * args.n_layers * args.n_kv_heads * (slots + 1) * 8


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

    For each layer l and KV head h, ``pos[l, h, s]`` is the logical position held by slot ``s`` and ``slot_of[l,
    h, p]`` its inverse. Slots ``[0, n)`` hold the ``n`` cached entries; the first ``region_len`` of them are
    exactly the current selection of the compression function. Both start as the identity: an entry appended at
    slot ``n`` sits at position ``n`` until a swap moves it, so appending writes nothing.

    Every step's bookkeeping is a fixed handful of ops over all layers and heads at once (the selection, the swap
    lists, one gather and one scatter of the cache: :meth:`KVCache.move_rows`), whatever the depth; the lists are as
    long as the most entries any row swaps, a count read back once per step. While every
    selection is one list for all layers and heads, the layout is too: the bookkeeping runs on one row and the swaps
    move the same slots everywhere (:meth:`KVCache.move`, a 1-d index). Where C's changes are known on the host
    (:attr:`Compression.host_selection`), the swaps move the same slots everywhere even when the prefill's selection
    differs per layer and head (SnapKV's): that row lives on the host (numpy) and the swaps are slice copies
    (:meth:`KVCache.swap_slots`), so a reselection launches a few copies and nothing else.

    Args:
        cache: the static cache whose slots are moved (batch 1).
        compression: the function C.
        capacity: slots available for committed entries (scratch for a step's new KV lies beyond).
    """

    def __init__(self, cache: KVCache, compression: Compression, capacity: int):
        self.cache, self.compression = cache, compression
        self.budget = compression.budget
        self.capacity = capacity
        self.device = cache.keys[0].device
        L, H = len(cache.keys), cache.keys[0].shape[1]
        self._arange = torch.arange(capacity + 1, device=self.device)  # slices of it are every step's ranges
        # [L, H, capacity + 1] (position `capacity`: one no selection holds, see _move_to_host); while every
        # selection has been the same for all layers and heads, one row stands for all of them (views of ``_line``)
        self._line = (self._arange.clone(), self._arange.clone())
        self._pos, self._slot_of = (line.expand(L, H, -1) for line in self._line)
        self.uniform = True
        self.n = 0
        self.region_len = 0
        self.frozen = 0  # slots [0, frozen) keep their entries for good (see Compression.select_host)
        self.on_host = False
        self.state: dict = {}  # the compression function's per-generation state (Quest metadata, SnapKV picks)
        if compression.host_selection == "host":
            self._move_to_host()
        else:
            cache.entry_table()  # per-(layer, head) swaps index it: built now, not inside a decoding step

    @property
    def pos(self) -> torch.Tensor:
        """``[L, H_kv, capacity + 1]``: the position each slot holds."""
        if not self.on_host:
            return self._pos
        return self._pos.index_select(-1, torch.from_numpy(self._host[2]).to(self.device))

    @property
    def slot_of(self) -> torch.Tensor:
        """``[L, H_kv, capacity + 1]``: the slot each position sits in."""
        if not self.on_host:
            return self._slot_of
        return torch.from_numpy(np.argsort(self._host[2])).to(self.device)[self._slot_of]

    def arange(self, start: int, end: int) -> torch.Tensor:
        """Positions ``[start, end)`` on the device (a view: no op), ``0 <= start <= end <= capacity``."""
        return self._arange[start:end]

    def prefill(self, n_prompt: int, queries: torch.Tensor | None = None) -> None:
        """The prompt's KV sits at slots ``[0, T)`` in position order; select C and swap it into place."""
        self.n = n_prompt
        self.compression.after_prefill(self, queries)
        self._reselect(self.budget)
        if self.compression.host_selection == "host_after_prefill":
            self._move_to_host()

    def commit(self, scratch_slots, query: torch.Tensor | None = None) -> None:
        """Append entries computed in scratch slots (positions ``n, n+1, ...``), then swap the fixed region so
        it holds exactly C(kv) again: newly selected entries in, evicted ones out to where those came from.

        A selection made on the device is read back once (one number: how many entries the busiest row swaps, a
        sync on a GPU) so that the swaps move only that many pairs per row; the rest runs without waiting for the
        device and without data-dependent shapes. A selection known on the host reads nothing. ``scratch_slots``: a
        host list of slots (moved by slice copies, :meth:`KVCache.copy_slots`) or a device tensor.
        """
        a = len(scratch_slots)
        if isinstance(scratch_slots, torch.Tensor):
            self.cache.move(scratch_slots, self.arange(self.n, self.n + a))
        else:
            self.cache.copy_slots(list(scratch_slots), list(range(self.n, self.n + a)))
        new = self.arange(self.n, self.n + a)
        self.n += a
        self.compression.after_append(self, new, query)
        self._reselect(self.compression.max_swaps(self, a))

    def _reselect(self, max_swaps: int) -> None:
        """Swap C's current selection into slots ``[0, K)``; ``max_swaps`` bounds the evictions of any row, and the
        swap lists are as long as the most evictions of a row (read back). Each row pairs its region slots holding
        unselected entries with the selected entries' slots past the region, both in slot order."""
        if self.on_host:
            return self._reselect_on_host(max_swaps)
        L, H, _ = self._pos.shape
        sel = self.compression.select(self).to(self.device)
        if sel.dim() == 3 and self.uniform:  # the first per-(layer, head) selection: every row its own from now
            self._pos, self._slot_of, self.uniform = self._pos.clone(), self._slot_of.clone(), False
        if self.uniform:  # [K]: one row's bookkeeping, its swaps the same slots of every layer and head
            pos, slot_of = self._line
        else:  # [L, H, K]
            pos, slot_of = self._pos, self._slot_of
            sel = sel.expand(L, H, -1) if sel.dim() == 1 else sel
        K = sel.shape[-1]
        width = min(max_swaps, K)  # Python ints: no row evicts (nor admits: as many) more than this
        if width:
            admit_slots = slot_of.gather(-1, sel)  # [..., K]: where the selected entries are now
            held = torch.zeros(*sel.shape[:-1], self.n, dtype=torch.bool, device=self.device)
            held.scatter_(-1, admit_slots, True)  # [..., n]: the slots holding a selected entry
            # the most evictions of any row, read back: lists padded to the Python bound alone would copy every
            # region entry of every row each step (Quest's whole budget: about 1 GB at Llama-2-7B's widths)
            width = K - int(held[..., :K].sum(-1, dtype=torch.int32).min())
        if width:
            # each [..., width] in slot order, ending in the row's e real pairs: the region's slots holding an
            # unselected entry (evicted), the selected entries' slots past the region (admitted); before them the
            # same region slots kept in both lists, so every other pair is a slot with itself (a no-op swap)
            src_out = _unheld_last(held[..., :K], width)
            src_in = torch.sort(admit_slots, dim=-1).values[..., -width:]
            pairs = torch.cat([src_out, src_in, src_in, src_out], -1)  # swap pairs: src then dst
            src, dst = pairs[..., : 2 * width], pairs[..., 2 * width :]
            if self.uniform:
                self.cache.move(src, dst)
            else:
                self.cache.move_rows(src, dst)
            moved = pos.gather(-1, src)
            pos.scatter_(-1, dst, moved)
            slot_of.scatter_(-1, moved, dst)
        self.region_len = K

    def _move_to_host(self) -> None:
        """Keep the bookkeeping on the host from now on: the region's current entries stay in slots ``[0, frozen)``
        and the ``n`` cached entries are marked as laid out per row (``capacity``: a position no selection holds);
        the device bookkeeping stays as it is, and :attr:`pos` reads it through the host's slot permutation."""
        self.frozen, self.on_host = self.region_len, True
        line = np.arange(self.capacity + 1)  # the position each slot holds (`capacity`: one of the n, per row)
        line[: self.n] = self.capacity
        # that, the slot of each position appended from now on, the slot each slot's entry held at the move
        self._host = (line, np.arange(self.capacity + 1), np.arange(self.capacity + 1))

    def _reselect_on_host(self, max_swaps: int) -> None:
        """:meth:`_reselect` on the host row: the same swaps (the region's slots holding unselected entries exchanged
        with the selected entries' slots past the region, both in slot order), so the layout is the device path's,
        slot for slot."""
        line, slot_of, moved_from = self._host
        sel = self.compression.select_host(self)
        K = self.frozen + len(sel)
        width = min(max_swaps, K)
        if width:
            want = np.zeros(self.capacity + 1, dtype=bool)
            want[sel] = True
            evict = np.flatnonzero(~want[line[self.frozen : K]]) + self.frozen
            admit = slot_of[sel]
            admit = np.sort(admit[admit >= K])  # in slot order, as the device path takes them
            m = min(width, len(evict), len(admit))  # equal counts when the region held C's last selection
            evict, admit = evict[:m], admit[:m]
            if m:
                self.cache.swap_slots(evict.tolist(), admit.tolist())
                src, dst = np.concatenate([evict, admit]), np.concatenate([admit, evict])
                moved = line[src]
                line[dst] = moved
                slot_of[moved] = dst  # `capacity` (entries laid out per row) takes any: no selection reads it
                moved_from[dst] = moved_from[src]
        self.region_len = K


def _unheld_last(held: torch.Tensor, width: int) -> torch.Tensor:
    """Per row, the last ``width`` slots of the row's held ones then its unheld ones, each in slot order: [...,
    width]. One stable sort puts the unheld (False) ones last."""
    return torch.sort(held.view(torch.int8), dim=-1, descending=True, stable=True).indices[..., -width:]
