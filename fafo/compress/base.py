"""KV compression functions C and FAFO's fixed-region cache layout.

A compression function is a small dataclass (fields = hyperparameters = Hydra schema, validated in
``__post_init__``) that answers one question: which cached entries, by logical position, form the compressed
view ``C(kv)`` now. :class:`FixedRegion` keeps exactly those entries physically in slots ``[0, budget)`` of the
static cache, the layout of FAFO section 4.4 / App. H::

    [ C(kv): fixed region, slots [0, budget) | R(kv): the rest, slots [budget, n) | scratch for this step ]

so the fumble attention reads a static block range whatever the context length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from fafo.engine.cache import KVCache


@dataclass
class Compression(ABC):
    """Base class of KV compression functions (StreamingLLM, Quest, SnapKV...)."""

    @property
    @abstractmethod
    def budget(self) -> int:
        """Entries in C(kv) once the cache holds more than that (the fixed region's size)."""

    @abstractmethod
    def select(self, n_cached: int) -> torch.Tensor:
        """Logical positions (long, CPU) forming C(kv) when positions ``[0, n_cached)`` are cached."""


class FixedRegion:
    """Physical layout ``[C(kv) | R(kv)]`` of a static cache, maintained by swapping (FAFO App. H).

    ``pos[s]`` is the logical position held by slot ``s`` (-1: empty). Slots ``[0, n)`` hold the ``n`` cached
    entries, the first ``min(n, budget)`` of them being exactly ``compression.select(n)``.

    Args:
        cache: the static cache whose slots are moved.
        compression: the function C.
        capacity: slots available for committed entries (scratch for a step's new KV lies beyond).
    """

    def __init__(self, cache: KVCache, compression: Compression, capacity: int):
        self.cache, self.compression = cache, compression
        self.budget = compression.budget
        self.pos = torch.full((capacity,), -1, dtype=torch.long)
        self.n = 0

    @property
    def region_len(self) -> int:
        """Valid entries in the fixed region (less than the budget only while the cache is shorter)."""
        return min(self.n, self.budget)

    def prefill_slots(self, n_prompt: int) -> torch.Tensor:
        """Slots for the prompt's KV so that C(prompt) lands in the fixed region directly (no copy): [T] long."""
        selected = self.compression.select(n_prompt)
        rest = torch.ones(n_prompt, dtype=torch.bool)
        rest[selected] = False
        order = torch.cat([selected, torch.nonzero(rest).flatten()])  # slot s holds position order[s]
        slots = torch.empty(n_prompt, dtype=torch.long)
        slots[order] = torch.arange(n_prompt)
        self.pos[:n_prompt] = order
        self.n = n_prompt
        return slots

    def commit(self, scratch_slots: torch.Tensor, positions: torch.Tensor) -> None:
        """Append entries computed in scratch slots (positions ``n, n+1, ...``), then swap the fixed region so
        it holds exactly C(kv) again: newly selected entries in, evicted ones out to where the new ones were."""
        a = scratch_slots.numel()
        new_slots = torch.arange(self.n, self.n + a)
        self.cache.move(scratch_slots.to(self.cache.keys[0].device), new_slots.to(self.cache.keys[0].device))
        self.pos[self.n : self.n + a] = positions
        self.n += a
        self._reselect()

    def _reselect(self) -> None:
        f = self.region_len
        want = torch.zeros(self.n, dtype=torch.bool)  # indexed by logical position (positions are 0..n-1)
        want[self.compression.select(self.n)] = True
        in_region = want[self.pos[: self.n]]
        evict = torch.nonzero(~in_region[:f]).flatten()  # fixed slots holding unselected entries
        admit = torch.nonzero(in_region[f:]).flatten() + f  # selected entries outside the region
        assert evict.numel() == admit.numel(), "compression selected more entries than its budget"
        if evict.numel():
            src = torch.cat([evict, admit])
            dst = torch.cat([admit, evict])
            dev = self.cache.keys[0].device
            self.cache.move(src.to(dev), dst.to(dev))
            self.pos[dst] = self.pos[src].clone()

    def region_positions(self) -> torch.Tensor:
        """Logical positions currently in the fixed region (for tests and debugging)."""
        return self.pos[: self.region_len].clone()
