"""Static, preallocated KV cache.

One key and one value tensor per layer, ``[B, H_kv, max_len, D]``, allocated once. Keys are stored *post-RoPE*,
so a cached entry can be moved to another physical slot (compression, FAFO's fixed region) without touching its
logical position. The cache itself keeps no notion of "length": decoders own that bookkeeping and say, per step,
which slots new KV goes to and which slots are visible (:class:`fafo.engine.attention.AttentionPlan`).
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer static key/value buffers.

    Args:
        n_layers: number of transformer layers.
        batch: batch size (1 for every speculative method).
        n_kv_heads: KV heads per layer (GQA: fewer than query heads).
        max_len: physical slots per layer.
        head_dim: per-head dimension.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]  # [B, Hkv, S, D]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_len = max_len

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots: [Q] long; k, v: [B, Hkv, Q, D]."""
        self.keys[layer].index_copy_(2, slots, k)
        self.values[layer].index_copy_(2, slots, v)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the entries of slots ``src`` to slots ``dst`` in every layer (src, dst: [N] long).

        Used to compact accepted tokens written to scratch slots into their final place. ``src`` and ``dst`` may
        overlap: the source entries are gathered before anything is written.
        """
        for layer in range(len(self.keys)):
            for buf in (self.keys[layer], self.values[layer]):
                buf.index_copy_(2, dst, buf.index_select(2, src))
