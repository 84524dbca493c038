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
        batch: batch size (1 for every speculative method).
        n_kv_heads: KV heads per layer (GQA: fewer than query heads).
        max_len: physical slots per layer.
        head_dim: per-head dimension.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.kv = torch.zeros((2, n_layers, batch, n_kv_heads, max_len, head_dim), dtype=dtype, device=device)
        self.keys = list(self.kv[0].unbind(0))  # per layer [B, Hkv, S, D], views of kv
        self.values = list(self.kv[1].unbind(0))
        self.max_len = max_len

    def tensors(self) -> list[torch.Tensor]:
        """The buffer and its per-layer views (what CUDA graphs must keep at static addresses)."""
        return [self.kv, *self.keys, *self.values]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def attend(self, layer, q, k, v, slots, plan, scale, backend):
        if slots is not None:  # the first len(slots) tokens of the step are kept; the rest stay scratch
            n = slots.shape[0]
            self.write(layer, slots, k[:, :, :n], v[:, :, :n])
        return attend(backend, q, self.keys[layer], self.values[layer], k, v, plan, scale)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots: [Q] long; k, v: [B, Hkv, Q, D]."""
        self.keys[layer].index_copy_(2, slots, k)
        self.values[layer].index_copy_(2, slots, v)

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
        start = 0
        for i in range(1, len(src) + 1):
            if i == len(src) or src[i] != src[i - 1] + 1 or dst[i] != dst[i - 1] + 1:
                a, b, n = src[start], dst[start], i - start
                self.kv[:, :, :, :, b : b + n].copy_(self.kv[:, :, :, :, a : a + n])
                start = i

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Per (layer, KV head) slot copies: src, dst ``[L, H_kv, N]`` long (the same in keys and values, for every
        batch row); values are gathered before any write. Two ops, whatever the depth."""
        _, L, B, H, _, D = self.kv.shape
        n = src.shape[-1]
        shape = (2, L, B, H, n, D)
        src = src[None, :, None, :, :, None].expand(shape)
        dst = dst[None, :, None, :, :, None].expand(shape)
        self.kv.scatter_(SLOT_DIM, dst, self.kv.gather(SLOT_DIM, src))

    def copy_from(self, other: "KVCache", src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy ``other``'s entries at slots ``src`` to this cache's slots ``dst`` in every layer (same model)."""
        self.kv.index_copy_(SLOT_DIM, dst, other.kv.index_select(SLOT_DIM, src))
