"""Quest: query-aware page selection with per-page min/max key metadata.

Based on Quest (https://arxiv.org/abs/2406.10774; mit-han-lab/Quest kernels). Keys are grouped in pages of
``page_size`` logical positions; each page keeps the elementwise max ``M`` and min ``m`` of its keys per KV head,
updated incrementally as tokens are appended. For a post-RoPE query q the score
``u = sum_i max(q_i * M_i, q_i * m_i)`` upper-bounds ``q . k`` for every key of the page. All pages but the last
(partial) one are scored, the top ``token_budget // page_size - 1`` are kept per KV head (query-head scores of a
GQA group combined by ``gqa_reduce``) plus the last page. Layers below ``dense_layers`` attend densely, as in
Quest. In FAFO the selection is re-made after every step from the newest committed token's query and swapped
into the fixed region (the paper's "dynamic" case), so the static block mask still holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from fafo.compress.base import Compression, group_scores, topk_positions_per_head
from fafo.bounds import at_least, check_bounds, one_of
from fafo.errors import ConfigError


@dataclass
class Quest(Compression):
    """Attributes:
    token_budget: tokens attended (rounded down to whole pages), current page included.
    page_size: tokens per page (16 in all Quest scripts).
    dense_layers: the first layers stay dense (Quest skips 2).
    gqa_reduce: how a KV head combines its query heads' page scores: max or mean.
    """

    label: ClassVar[str] = "quest"
    budget_fields: ClassVar[tuple[str, ...]] = ("token_budget",)

    token_budget: int = at_least(2, 1024)  # and at least 2 pages (__post_init__)
    page_size: int = at_least(1, 16)
    dense_layers: int = at_least(0, 2)  # 0: every layer reads the selected pages
    gqa_reduce: str = one_of(("max", "mean"), "max", why="how a KV head combines its query heads' page scores")

    def __post_init__(self):
        check_bounds(self, "method.compress")
        if self.token_budget < 2 * self.page_size:
            raise ConfigError(f"method.compress: token_budget={self.token_budget} must hold at least 2 pages of "
                              f"page_size={self.page_size}")

    @property
    def budget(self) -> int:
        return self.token_budget // self.page_size * self.page_size

    @property
    def wants_decode_query(self) -> bool:
        return True

    def dense(self) -> frozenset[int]:
        return frozenset(range(self.dense_layers))

    def prefill_query_rows(self, n_prompt: int) -> torch.Tensor:
        return torch.tensor([n_prompt - 1])

    def after_prefill(self, region, queries) -> None:
        keys = region.cache.keys  # identity layout after prefill: slot = position
        n_pages = -(-region.capacity // self.page_size)
        shape = (*keys[0].shape[:2], n_pages, keys[0].shape[-1])  # [B, H_kv, pages, D]
        region.state["kmax"] = [torch.full(shape, float("-inf"), dtype=k.dtype, device=k.device) for k in keys]
        region.state["kmin"] = [torch.full(shape, float("inf"), dtype=k.dtype, device=k.device) for k in keys]
        self._update(region, torch.arange(region.n, device=region.device))
        region.state["query"] = queries

    def after_append(self, region, new_slots, query) -> None:
        self._update(region, new_slots)  # appended entries sit at slot == position until reselection
        if query is not None:
            region.state["query"] = query

    def _update(self, region, positions: torch.Tensor) -> None:
        pages = (positions // self.page_size)[None, None, :, None]
        for layer, k in enumerate(region.cache.keys):
            new = k[:, :, positions]  # [B, H_kv, N, D]
            idx = pages.expand_as(new)
            region.state["kmax"][layer].scatter_reduce_(2, idx, new, reduce="amax")
            region.state["kmin"][layer].scatter_reduce_(2, idx, new, reduce="amin")

    def upper_bound(self, q: torch.Tensor, kmax: torch.Tensor, kmin: torch.Tensor) -> torch.Tensor:
        """q: [B, H_q, D]; kmax/kmin: [B, H_kv, P, D] -> [B, H_q, P] page scores (>= q.k for the page's keys)."""
        group = q.shape[1] // kmax.shape[1]
        qg = q.unflatten(1, (kmax.shape[1], group))[..., None, :]  # [B, H_kv, G, 1, D]
        return torch.maximum(qg * kmax[:, :, None], qg * kmin[:, :, None]).sum(-1).flatten(1, 2)

    def select(self, region) -> torch.Tensor:
        n, P = region.n, self.page_size
        n_pages, page_budget = -(-n // P), self.budget // P
        if n_pages <= page_budget:
            return torch.arange(n, device=region.device)
        last = torch.arange((n_pages - 1) * P, n, device=region.device)
        per_layer = []
        for layer in range(len(region.cache.keys)):
            q = region.state["query"][layer][:, :, -1].float()  # [B, H_q, D]
            kmax = region.state["kmax"][layer][:, :, : n_pages - 1].float()
            kmin = region.state["kmin"][layer][:, :, : n_pages - 1].float()
            scores = group_scores(self.upper_bound(q, kmax, kmin), kmax.shape[1], self.gqa_reduce)[0]  # [H, P']
            pages = topk_positions_per_head(scores, page_budget - 1)  # [H_kv, page_budget - 1]
            tokens = (pages[..., None] * P + torch.arange(P, device=region.device)).flatten(1)
            per_layer.append(torch.cat([tokens, last.expand(tokens.shape[0], -1)], dim=1))
        return torch.stack(per_layer)  # [L, H_kv, K]

    def max_swaps(self, region, n_appended: int) -> int:
        # While every page fits, C(kv) is the whole cache and nothing moves. Past that, the top pages are chosen
        # afresh from each query (and K shrinks when a new page starts), so the whole region may change.
        n_pages = -(-region.n // self.page_size)
        return 0 if n_pages <= self.budget // self.page_size else self.budget
