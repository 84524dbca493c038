"""SnapKV: prompt entries chosen by the attention of an observation window, per KV head.

Based on SnapKV (https://arxiv.org/abs/2404.14469; FasterDecoding/SnapKV ``update_kv``). After prefill, per
layer: the last ``window`` prompt queries attend all prompt keys (softmax in float32, causal inside the window);
their attention to the keys before the window is summed over the window rows, smoothed by a 1-D pooling
(``kernel``, stride 1, padding kernel//2; ``avg`` counts the zero padding like the official code), and the top
``capacity - window`` keys per KV head are kept together with the window itself (query-head scores of a GQA
group are averaged, as kvpress does, rather than repeating KV per query head). SnapKV does not evict during
decoding; FAFO's fixed region must stay bounded, so generated tokens are kept in a local window of ``local``
most recent ones (the FAFO paper, App. G.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from fafo.compress.base import Compression, group_scores, per_head_bookkeeping_bytes, topk_positions_per_head
from fafo.bounds import at_least, check_bounds, one_of
from fafo.errors import ConfigError


@dataclass
class SnapKV(Compression):
    """Attributes:
    capacity: prompt entries kept, the observation window included (max_capacity_prompt).
    window: observation window (the last prompt tokens).
    kernel: pooling kernel size.
    pooling: max or avg.
    local: most recent generated tokens kept.
    gqa_reduce: how a KV head combines its query heads' scores: mean or max.
    """

    label: ClassVar[str] = "snapkv"
    budget_fields: ClassVar[tuple[str, ...]] = ("capacity", "local")
    # the prompt picks stay in the region once placed; the generated window follows from the count of entries
    host_selection: ClassVar[str] = "host_after_prefill"

    capacity: int = at_least(2, 1024)  # and above window (__post_init__)
    window: int = at_least(1, 32)
    kernel: int = at_least(1, 7)  # and odd (__post_init__)
    pooling: str = one_of(("max", "avg"), "max", why="how the window's votes are smoothed")
    local: int = at_least(1, 256)
    gqa_reduce: str = one_of(("mean", "max"), "mean", why="how a KV head combines its query heads' votes")

    def __post_init__(self):
        check_bounds(self, "method.compress")
        if not self.window < self.capacity:
            raise ConfigError(f"method.compress: window={self.window} must be < capacity={self.capacity}")
        if self.kernel % 2 == 0:
            raise ConfigError(f"method.compress.kernel={self.kernel} must be odd (pooled with padding "
                              "kernel//2, an even kernel would not give one score per key)")

    @property
    def budget(self) -> int:
        return self.capacity + self.local

    def state_bytes(self, args, slots: int) -> int:
        """The prompt picks ``[L, H_kv, capacity]`` and the region's per-head bookkeeping (the prefill's selection
        differs by head). The prefill's scoring (one layer's window logits at a time, after the prefill's own
        activations are freed) is below those activations, which the plan counts."""
        return args.n_layers * args.n_kv_heads * self.capacity * 8 + per_head_bookkeeping_bytes(args, slots)

    def prefill_query_rows(self, n_prompt: int) -> torch.Tensor:
        return torch.arange(max(0, n_prompt - self.window), n_prompt)

    def window_scores(self, q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """q: [B, H_q, w, D] window queries; keys: [B, H_kv, T, D] prompt keys -> [B, H_kv, T - w] pooled scores."""
        B, Hq, w, D = q.shape
        T, Hkv = keys.shape[2], keys.shape[1]
        k = keys.repeat_interleave(Hq // Hkv, dim=1)
        logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(D)  # [B, H_q, w, T]
        row = torch.arange(w, device=q.device)[:, None] + (T - w)
        logits = logits.masked_fill(torch.arange(T, device=q.device)[None, :] > row, float("-inf"))
        votes = torch.softmax(logits, dim=-1)[..., : T - w].sum(dim=-2)  # [B, H_q, T - w]
        pool = F.max_pool1d if self.pooling == "max" else F.avg_pool1d
        pooled = pool(votes.flatten(0, 1)[:, None], self.kernel, stride=1, padding=self.kernel // 2)
        return group_scores(pooled[:, 0].view(B, Hq, T - w), Hkv, self.gqa_reduce)

    def after_prefill(self, region, queries) -> None:
        T = region.n
        region.state["prompt_len"] = T
        if T <= self.capacity:
            region.state["kept"] = torch.arange(T, device=region.device)
            return
        kept = []
        window = torch.arange(T - self.window, T, device=region.device)
        for layer, keys in enumerate(region.cache.keys):  # identity layout after prefill: slot = position
            scores = self.window_scores(queries[layer], keys[:, :, :T])[0]  # [H_kv, T - w]
            top = topk_positions_per_head(scores, self.capacity - self.window)
            kept.append(torch.cat([top, window.expand(top.shape[0], -1)], dim=1))
        region.state["kept"] = torch.stack(kept)  # [L, H_kv, capacity]

    def select(self, region) -> torch.Tensor:
        kept, T, n = region.state["kept"], region.state["prompt_len"], region.n
        recent = region.arange(max(T, n - self.local), n)
        if kept.dim() == 1:
            return torch.cat([kept, recent])
        return torch.cat([kept, recent.expand(*kept.shape[:2], -1)], dim=-1)

    def select_host(self, region) -> np.ndarray:
        return np.arange(max(region.state["prompt_len"], region.n - self.local), region.n)

    def max_swaps(self, region, n_appended: int) -> int:
        # The kept prompt entries and the window's older entries already sit in the region (K never shrinks);
        # only appended entries enter the window. A short prompt with a short generation keeps everything.
        T = region.state["prompt_len"]
        if T <= self.capacity and region.n - T <= self.local:
            return 0
        return min(n_appended, self.local)
