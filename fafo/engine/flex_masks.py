"""FlexAttention's block masks for eager steps, derived by the engine from the decoder's plan.

A decoder says which step tokens each query sees (``AttentionPlan.step_mask``) and where its fixed region ends
(``region_len`` below a static ``region_capacity``); the BlockMasks FlexAttention needs are built here, once per
mask tensor and once per region capacity, and reused step after step. So decoders never branch on the backend.
Compiled steps derive theirs in :class:`fafo.engine.compiled.CompiledStep`.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from fafo.engine.attention import AttentionPlan
from fafo.engine.block_masks import length_block_mask, step_block_mask
from fafo.engine.kernels import written


class FlexMasks:
    """Block masks of eager FlexAttention steps, kept across steps and generations (see module docstring).

    Args:
        device: where the masks live.
        keep: how many step masks are kept (a decoder has a few step shapes; FAFO 1-2, Lookahead a handful).
    """

    def __init__(self, device, keep: int = 16):
        self.device, self.keep = device, keep
        self._step: OrderedDict[tuple, tuple] = OrderedDict()
        self._regions: dict[int, object] = {}

    def fill(self, plan: AttentionPlan, n_queries: int) -> AttentionPlan:
        """``plan`` with its missing step and region block masks (unchanged when it needs none). A batched step
        (``prefix_length`` given: each row's own) also gets length masks over the prefix it reads."""
        changes = {}
        if plan.step_mask is not None and plan.step_block_mask is None:
            changes["step_block_mask"] = self.step(plan.step_mask)
        split = n_queries if plan.region_from is None else plan.region_from
        if plan.prefix_length is not None and plan.prefix_block_mask is None and split:
            changes["prefix_block_mask"] = length_block_mask(plan.prefix_length, split, plan.prefix)
            if plan.region_from is not None and plan.dense_layers:
                changes["dense_block_mask"] = length_block_mask(plan.prefix_length, n_queries, plan.prefix)
        if plan.region_from is not None and plan.region_block_mask is None and plan.region_capacity:
            if plan.region_length is not None:
                region = self.region(plan.region_capacity, len(plan.region_length)).set(plan.region_length)
            else:
                region = self.region(plan.region_capacity).set(plan.region_len)
            changes["region_block_mask"] = region.block_mask(n_queries - plan.region_from)
        return plan.replace(**changes) if changes else plan

    def step(self, mask):
        """The BlockMask of a ``[Q, Q]`` step mask, built once per mask tensor (and rebuilt if it is written)."""
        key = (id(mask), written(mask))
        hit = self._step.get(key)
        if hit is None or hit[0] is not mask:  # the mask is held, so its id is not reused while cached
            hit = self._step[key] = (mask, step_block_mask(mask))
            while len(self._step) > self.keep:
                self._step.popitem(last=False)
        return hit[1]

    def region(self, capacity: int, batch: int = 1):
        """The live region length(s) below ``capacity`` and its block masks (one per query count)."""
        if (capacity, batch) not in self._regions:
            self._regions[capacity, batch] = LiveLength(capacity, self.device, batch)
        return self._regions[capacity, batch]


class LiveLength:
    """A live length below a static capacity: a ``[1]`` tensor (``[B]``: one per batch row) plus BlockMasks over
    the capacity that read it.

    The masks' active KV block counts are written in place with the length, so one BlockMask per query count
    serves every step of every generation (:func:`fafo.engine.block_masks.length_block_mask`: all blocks partial,
    the mask_mod trims the last live block). An int length is written only when it changes, and a mask's count only
    when it changes (once per ``BLOCK_SIZE`` tokens): on a device each write is a launch, and a decoder sets a length
    before every compiled forward.
    """

    def __init__(self, capacity: int, device, batch: int = 1):
        self.capacity, self.value = capacity, 0
        self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self._masks: dict[int, object] = {}
        self._counts: dict[int, int | None] = {}  # the block count each mask holds (None: one per row)

    def set(self, length: int | torch.Tensor) -> "LiveLength":
        """The live length: an int (every row) or a ``[B]`` tensor on the device (each row's; copied in)."""
        if isinstance(length, torch.Tensor):
            self.length.copy_(length)
            self.value = None
        elif length != self.value:
            self.value = length
            self.length.fill_(length)
        for n_queries, bm in self._masks.items():
            self._count(n_queries, bm)
        return self

    def _count(self, n_queries: int, bm) -> None:
        """``kv_num_blocks`` [B, 1, QB] = the live key blocks of each row."""
        size = bm.BLOCK_SIZE[1]
        if self.value is None:
            bm.kv_num_blocks.copy_(((self.length + size - 1) // size)[:, None, None].expand_as(bm.kv_num_blocks))
            self._counts[n_queries] = None
        elif self._counts.get(n_queries) != self.blocks(size):
            self._counts[n_queries] = self.blocks(size)
            bm.kv_num_blocks.fill_(self._counts[n_queries])

    def blocks(self, size: int) -> int:
        """The key blocks of ``size`` keys the int length reaches into."""
        return -(-self.value // size)

    def tensors(self) -> list[torch.Tensor]:
        """What it writes: the length and its masks' block counts."""
        return [self.length, *(bm.kv_num_blocks for bm in self._masks.values())]

    def block_mask(self, n_queries: int):
        if n_queries not in self._masks:
            bm = self._masks[n_queries] = length_block_mask(self.length, n_queries, self.capacity)
            self._counts[n_queries] = None  # as built: unknown
            self._count(n_queries, bm)
        return self._masks[n_queries]
