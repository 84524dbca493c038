"""StreamingLLM / LM-Infinite compression: attention sinks + a local window.

Based on StreamingLLM (https://arxiv.org/abs/2309.17453) and LM-Infinite (https://arxiv.org/abs/2308.16137):
keep the first ``sink`` tokens and the most recent ``local`` ones. Keys keep their original positions (FAFO's
prompts are shorter than the pre-training length, so no re-rotation is needed). The FAFO paper's best
Init+Local budget is about 760 tokens (Table 13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from fafo.compress.base import Compression
from fafo.bounds import at_least, check_bounds


@dataclass
class StreamingLLM(Compression):
    """Sink + local window.

    Attributes:
        sink: initial tokens always kept (StreamingLLM's start_size; 4 in its examples).
        local: most recent tokens kept.
    """

    label: ClassVar[str] = "stream"
    budget_fields: ClassVar[tuple[str, ...]] = ("sink", "local")
    host_selection: ClassVar[str] = "host"  # the sinks and the window follow from the count of entries

    sink: int = at_least(0, 4)  # 0: the recent window alone
    local: int = at_least(1, 756)

    def __post_init__(self):
        check_bounds(self, "method.compress")

    @property
    def budget(self) -> int:
        return self.sink + self.local

    def _ranges(self, n: int) -> list[tuple[int, int]]:
        return [(0, n)] if n <= self.budget else [(0, self.sink), (n - self.local, n)]

    def select(self, region) -> torch.Tensor:
        ranges = self._ranges(region.n)
        return region.arange(*ranges[0]) if len(ranges) == 1 else torch.cat([region.arange(*r) for r in ranges])

    def select_host(self, region) -> np.ndarray:
        return np.concatenate([np.arange(*r) for r in self._ranges(region.n)])

    def max_swaps(self, region, n_appended: int) -> int:
        # The region only grows while n <= budget and C(kv) is then everything: nothing moves. Past that, the
        # sinks and the window's older entries already sit in the region; only appended entries enter the window.
        return 0 if region.n <= self.budget else min(n_appended, self.local)
