"""Static, preallocated KV cache.

One tensor ``[2, L, B, H_kv, max_len, D]`` (keys, then values, of every layer), allocated once; ``keys[l]`` and
``values[l]`` are its per-layer views ``[B, H_kv, max_len, D]``, which the model reads and writes. Keys are stored
*post-RoPE*, so a cached entry can be moved to another physical slot (compression, FAFO's fixed region) without
touching its logical position. Moving entries is one gather and one scatter over every layer at once
(:meth:`KVCache.move`, :meth:`KVCache.move_rows`), whatever the depth: a decode step launches the same few ops on a
7B model as on a 70B one. The cache itself keeps no notion of "length": decoders own that bookkeeping and say, per
step, which slots new KV goes to and which slots are visible (:class:`fafo.engine.attention.AttentionPlan`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from fafo.engine.attention import AttentionPlan, attend
from fafo.engine.torch_compat import modes_active

SLOT_DIM = 4  # the slot axis of KVCache.kv: [2, L, B, H_kv, S, D]


class Cache(ABC):
    """What the model's attention layers ask of a cache: keep a step's KV and attend over it
    (:meth:`fafo.engine.model.Attention.forward`). :class:`KVCache` is the engine's; a method may bring its own
    (QuantSpec's quantized cache, ``baselines/quantspec_cache.py``)."""

    @abstractmethod
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | None,
               plan: AttentionPlan, scale: float, backend: str) -> torch.Tensor:
        """One layer's attention of a step: q [B, Hq, Q, D] post-RoPE, the step's k, v [B, Hkv, Q, D], the slots
        keeping the KV of the step's first ``len(slots)`` tokens (None: nothing kept) -> [B, Hq, Q, D]."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes the cache holds on its device."""


class KVCache(Cache):
    """Static key/value buffers of every layer in one tensor.

    Args:
        n_layers: number of transformer layers.
        batch: rows (requests decoded together; 1 for one request at a time).
        n_kv_heads: KV heads per layer (GQA: fewer than query heads).
        max_len: physical slots per layer.
        head_dim: per-head dimension.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.bind(torch.zeros((2, n_layers, batch, n_kv_heads, max_len, head_dim), dtype=dtype, device=device))
        self.pending: list | None = None

    def bind(self, kv: torch.Tensor) -> None:
        """Make ``kv`` (a buffer, or a view of rows of one) this cache's storage."""
        self.kv = kv
        self.keys = list(kv[0].unbind(0))  # per layer [B, Hkv, S, D], views of kv
        self.values = list(kv[1].unbind(0))
        self.max_len = kv.shape[SLOT_DIM]
        self._first_rows: dict[int, KVCache] = {}
        self._entries = self._entry_rows = None  # built at the first per-row move (:meth:`entry_table`)

    @classmethod
    def view(cls, kv: torch.Tensor) -> "KVCache":
        """A cache over ``kv`` (a view of another cache's rows: writes and moves land in that cache)."""
        cache = cls.__new__(cls)
        cache.bind(kv)
        cache.pending = None  # a request's row in a batch: its commit moves, done with every row's (fafo.batch)
        return cache

    @property
    def batch(self) -> int:
        return self.kv.shape[2]

    def row(self, b: int) -> "KVCache":
        """Row ``b`` as a batch-1 cache of its own (a view; :meth:`bind` it to another row when the request moves)."""
        return KVCache.view(self.kv[:, :, b : b + 1])

    def rows(self, n: int) -> "KVCache":
        """The first ``n`` rows (a view, the same object at every call): a batched step over the requests there."""
        if n == self.batch:
            return self
        if n not in self._first_rows:
            self._first_rows[n] = KVCache.view(self.kv[:, :, :n])
        return self._first_rows[n]

    def copy_row(self, src: int, dst: int, n_slots: int) -> None:
        """Copy the first ``n_slots`` slots of row ``src`` to row ``dst`` in every layer (one op)."""
        self.kv[:, :, dst, :, :n_slots].copy_(self.kv[:, :, src, :, :n_slots])

    def tensors(self) -> list[torch.Tensor]:
        """The buffer and its per-layer views (what CUDA graphs must keep at static addresses)."""
        return [self.kv, *self.keys, *self.values]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def attend(self, layer, q, k, v, slots, plan, scale, backend):
        return self.layer(layer).attend(layer, q, k, v, slots, plan, scale, backend)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots: [Q] long (the same slots in every row) or [B, Q] (each row's own); k, v: [B, Hkv, Q, D]."""
        self.layer(layer).write(slots, k, v)

    def layer(self, i: int) -> "LayerKV":
        """Layer ``i``'s keys and values as a cache of their own (views: writes land in this cache)."""
        return LayerKV(self.keys[i], self.values[i])

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the entries of slots ``src`` to slots ``dst`` in every layer and head (src, dst: [N] long).

        Used to compact accepted tokens written to scratch slots into their final place. ``src`` and ``dst`` may
        overlap: the source entries are gathered before anything is written. Two ops, whatever the depth.
        """
        self.kv.index_copy_(SLOT_DIM, dst, self.kv.index_select(SLOT_DIM, src))

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        """Copy slots listed on the host, one slice copy per run of consecutive pairs: no index reaches the device
        (FAFO's commit: the current token's entry and the accepted candidate's run). ``src`` and ``dst`` must not
        overlap."""
        for a, b, n in _runs(src, dst):
            self.kv[:, :, :, :, b : b + n].copy_(self.kv[:, :, :, :, a : a + n])

    def swap_slots(self, a: list[int], b: list[int]) -> None:
        """Exchange the entries of slots ``a[i]`` and ``b[i]`` in every layer (host lists, no slot in both): three
        slice copies per run of consecutive pairs, no index on the device (a StreamingLLM region's swaps)."""
        for x, y, n in _runs(a, b):
            held = self.kv[:, :, :, :, x : x + n].clone()
            self.kv[:, :, :, :, x : x + n].copy_(self.kv[:, :, :, :, y : y + n])
            self.kv[:, :, :, :, y : y + n].copy_(held)

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Per (layer, KV head) slot copies: src, dst ``[L, H_kv, N]`` long (the same in keys and values, for every
        batch row); values are gathered before any write. Four ops, whatever the depth."""
        self._move_entries(src[:, None], dst[:, None])

    def move_per_row(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Slot copies of each batch row: src, dst ``[B, N]`` long (the same in every layer, head, keys and
        values); values are gathered before any write. Four ops, whatever the depth and the batch."""
        self._move_entries(src[None, :, None], dst[None, :, None])

    def _move_entries(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """src, dst: slots broadcastable to ``[L, B, H_kv, N]``. The cache is read as a table of entries (one row of
        D values per key or value of a layer, batch row, head and slot) and the moves are one ``index_select`` and
        one ``index_copy_`` of whole rows: on a CPU 3-4x faster than a ``gather`` / ``scatter_`` over
        ``[2, L, B, H_kv, N, D]``, which index element by element (FAFO-Quest's swaps on the host table's 32-layer
        model: 820 -> 210 us). On a CPU, outside a probe's torch mode, the lists are first read to drop the pairs
        of a slot with itself (FAFO's swap lists pad each row to its busiest row's swaps with kept slots): on a
        device that read would be a sync and a data-dependent size, and the lists are one kernel each anyway."""
        entries, first = self.entry_table()
        src, dst = torch.add(first, src[None]).flatten(), torch.add(first, dst[None]).flatten()  # [2 L B H_kv N]
        if entries.device.type == "cpu" and not modes_active():  # host memory: reading the lists costs no sync
            moved = torch.nonzero(src != dst).view(-1)  # a slot paired with itself: a no-op copy
            src, dst = src.index_select(0, moved), dst.index_select(0, moved)
        entries.index_copy_(0, dst, entries.index_select(0, src))

    def entry_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache as ``[rows, D]`` (a view of its storage) and the row of slot 0 of every (kv, layer, batch
        row, head), ``[2, L, B, H_kv, 1]``; works for a view of another cache's batch rows too. Built at the first
        call (a few ops): call it before decoding so that no step builds it."""
        if self._entries is None:
            kv, D = self.kv, self.kv.shape[-1]
            if kv.stride(-1) != 1 or kv.stride(SLOT_DIM) != D or any(st % D for st in kv.stride()[:SLOT_DIM]):
                raise ValueError(f"KVCache: entries of D={D} values must be contiguous rows, strides {kv.stride()}")
            first = sum(torch.arange(n, device=kv.device).view([-1 if d == i else 1 for d in range(SLOT_DIM)])
                        * (kv.stride(i) // D) for i, n in enumerate(kv.shape[:SLOT_DIM]))
            extent = sum((n - 1) * st for n, st in zip(kv.shape, kv.stride())) // D + 1
            self._entries, self._entry_rows = kv.as_strided((extent, D), (D, 1)), first[..., None]
        return self._entries, self._entry_rows

    def copy_from(self, other: "KVCache", src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy ``other``'s entries at slots ``src`` to this cache's slots ``dst`` in every layer (same model)."""
        self.kv.index_copy_(SLOT_DIM, dst, other.kv.index_select(SLOT_DIM, src))


def _runs(src: list[int], dst: list[int]):
    """``(src start, dst start, length)`` of each run of pairs consecutive in both lists."""
    start = 0
    for i in range(1, len(src) + 1):
        if i == len(src) or src[i] != src[i - 1] + 1 or dst[i] != dst[i - 1] + 1:
            yield src[start], dst[start], i - start
            start = i


class LayerKV(Cache):
    """One layer of a :class:`KVCache`: its keys and values ``[B, H_kv, S, D]``, and the layer index a model passes
    ignored. A compiled sub-layer takes it as an input, so one graph serves every layer
    (:mod:`fafo.engine.skipping_step`): the graph reads tensors, never the index it would guard on."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    def attend(self, layer, q, k, v, slots, plan, scale, backend):
        if slots is not None:  # the first len(slots) tokens of the step are kept; the rest stay scratch
            n = slots.shape[-1]
            self.write(slots, k[:, :, :n], v[:, :, :n])
        return attend(backend, q, self.keys, self.values, k, v, plan, scale)

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if slots.dim() == 1:
            self.keys.index_copy_(2, slots, k)
            self.values.index_copy_(2, slots, v)
            return
        index = slots[:, None, :, None].expand(k.shape)
        self.keys.scatter_(2, index, k)
        self.values.scatter_(2, index, v)
