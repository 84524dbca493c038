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

import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch

from fafo.compress.base import Compression, group_scores, per_head_bookkeeping_bytes
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
        keys = region.cache.kv[0]  # [L, B, H_kv, S, D]; identity layout after prefill: slot = position
        n_pages, D = -(-region.capacity // self.page_size), keys.shape[-1]
        # [L, B, H_kv, pages, 2D] float32: each page's elementwise max key, then its min key (one row: one score
        # matmul). Scores are computed in float32; bounds kept in it cost no conversion of them per step.
        bounds = torch.empty((*keys.shape[:3], n_pages, 2 * D), dtype=torch.float32, device=keys.device)
        bounds[..., :D], bounds[..., D:] = float("-inf"), float("inf")
        region.state.update(bounds=bounds, kmax=bounds[..., :D], kmin=bounds[..., D:])
        # [2 (min, max), 2, D]: clamping a query to these gives its positive part, then its negative part (filled on
        # the device: no host data to copy)
        signs = region.state["signs"] = torch.zeros(2, 2, D, device=keys.device)
        signs[0, 1], signs[1, 0] = float("-inf"), float("inf")
        region.state["page_of"] = region.arange(0, region.capacity) // self.page_size  # [capacity]: a position's page
        region.state["page_tokens"] = torch.arange(n_pages * self.page_size, device=keys.device).view(n_pages, -1)
        with warnings.catch_warnings():  # torch warns once per process that index_reduce_ is a beta API
            warnings.filterwarnings("ignore", "index_reduce", UserWarning)
            self._update(region, 0, region.n)
        region.state["query"] = queries

    def after_append(self, region, new_slots, query) -> None:
        self._update(region, region.n - len(new_slots), region.n)
        if query is not None:
            region.state["query"] = query

    def _update(self, region, lo: int, hi: int) -> None:
        """Fold the keys of positions ``[lo, hi)`` into their pages' min/max, every layer at once (two ops). They
        are the prompt's or the newest entries, which sit at slot = position until a reselection moves them.
        ``index_reduce_`` takes the pages as one ``[hi - lo]`` index (a ``scatter_reduce_`` needs it expanded
        to the keys' shape: on a CPU 2-3x slower for a step's few entries)."""
        new = region.cache.kv[0, ..., lo:hi, :]  # [L, B, H_kv, N, D]: a view
        new = new if new.dtype == torch.float32 else new.float()  # half precision: one op for both reductions
        pages = region.state["page_of"][lo:hi]
        region.state["kmax"].index_reduce_(3, pages, new, "amax")
        region.state["kmin"].index_reduce_(3, pages, new, "amin")

    def upper_bound(self, q: torch.Tensor, bounds: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
        """Page scores ``[..., H_q, P]`` float32, each >= q.k for every key of its page.

        q: [..., H_q, D]; bounds: [..., H_kv, P, 2D] float32, each page's max key M then min key m; signs:
        [2, 2, D] the lower limits (0, -inf) and upper limits (inf, 0) of a clamp giving q+ then q- (a query's
        positive and negative parts). ``sum_i max(q_i M_i, q_i m_i)`` is ``q+ . M + q- . m``: one clamp (which
        also makes a half-precision query float32, by type promotion) and one matmul of ``[q+ | q-]`` with
        ``[M | m]``, batched over the leading dims and KV heads (one ``bmm``: ``matmul`` on 5-d operands adds a
        reshape of its output)."""
        h_kv, n_pages, width = bounds.shape[-3:]
        signed = torch.clamp(q[..., None, :], min=signs[0], max=signs[1]).flatten(-2)  # [..., H_q, 2D]
        scores = torch.bmm(signed.view(-1, signed.shape[-2] // h_kv, width),  # [... * H_kv, G, 2D]
                           bounds.flatten(0, -3).transpose(1, 2))  # [... * H_kv, 2D, P]
        return scores.view(*signed.shape[:-1], n_pages)  # [..., H_q, P]

    def select(self, region) -> torch.Tensor:
        """Every layer at once: [L, H_kv, K] positions (the top pages per KV head in no particular order, then the
        current page)."""
        n, P = region.n, self.page_size
        n_pages, page_budget = -(-n // P), self.budget // P
        if n_pages <= page_budget:
            return region.arange(0, n)
        q = region.state["query"][..., -1, :]  # [L, B, H_q, D]
        bounds = region.state["bounds"][..., : n_pages - 1, :]  # [L, B, H_kv, P', 2D]
        scores = self.upper_bound(q, bounds, region.state["signs"])
        scores = group_scores(scores, bounds.shape[-3], self.gqa_reduce)[:, 0]  # [L, H_kv, P']
        # [L, H_kv, page_budget - 1] in no particular order: the region orders its swaps by slot, not by selection
        pages = torch.topk(scores, page_budget - 1, dim=-1, sorted=False).indices
        first = (n_pages - 1) * P  # the current page's first position
        current = region.state["page_of"][first : first + 1].expand(*pages.shape[:2], 1)  # [L, H_kv, 1]: a view
        pages = torch.cat([pages, current], -1)
        # each page's positions, the current page's cut at n: [L, H_kv, K]
        return region.state["page_tokens"][pages].flatten(-2)[..., : (page_budget - 1) * P + n - first]

    def state_bytes(self, args, slots: int) -> int:
        """The page bounds (float32), the clamp's limits, the page tables, the region's per-head bookkeeping and a
        step's selection mask ``[L, H_kv, n]``: at Llama-2-7B's widths after 32K positions, 2.1 + 0.5 GB."""
        L, H, D, pages = args.n_layers, args.n_kv_heads, args.head_dim, -(-slots // self.page_size)
        bounds, signs = L * H * pages * 2 * D * 4, 2 * 2 * D * 4
        tables = (slots + pages * self.page_size) * 8  # each position's page, each page's positions
        return bounds + signs + tables + per_head_bookkeeping_bytes(args, slots) + L * H * slots

    def max_swaps(self, region, n_appended: int) -> int:
        # While every page fits, C(kv) is the whole cache and nothing moves. Past that, the top pages are chosen
        # afresh from each query (and K shrinks when a new page starts), so the whole region may change.
        n_pages = -(-region.n // self.page_size)
        return 0 if n_pages <= self.budget // self.page_size else self.budget

