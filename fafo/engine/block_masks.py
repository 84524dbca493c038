"""Every FlexAttention BlockMask the engine uses, built from its block structure with ``BlockMask.from_kv_blocks``.

``create_block_mask`` evaluates the mask over a dense grid and keeps *fully visible* blocks apart from partial
ones; a kernel skips the mask_mod on a full block. Only torch 2.13 and later can turn that split off
(``separate_full_blocks=False``); on torch 2.11 a mask whose mod reads a live length from a tensor would, once the
length falls inside a block that was full when the mask was built, attend past it, for vanilla and a method alike
(the outputs would still agree). So the masks are built here from block indices computed on the device, the same
on every torch: every block whose mask_mod decides something is *partial* (the mod runs on it), a block is *full*
only where the mod is a constant True (below a causal diagonal), and no value is read back to the host.

Blocks are ``BLOCK`` x ``BLOCK`` (torch's default): the kernel routing (:mod:`fafo.engine.flex_routing`) assumes it.

A batched step (several requests, :mod:`fafo.engine.batching`) has a mask per row: lengths ``[B]`` and step masks
``[B, Q, Q]`` give BlockMasks with a batch dimension of B (still one head, as the routing requires).
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask

BLOCK = 128
_I32 = dict(dtype=torch.int32)


def n_blocks(n: int) -> int:
    return -(-n // BLOCK)


def _partial(active: torch.Tensor, mask_mod, q_len: int, kv_len: int) -> BlockMask:
    """A BlockMask whose active blocks (``active``: [q blocks, kv blocks] bool, or [B, ...] one per batch row)
    are all partial."""
    active = active if active.dim() == 3 else active[None]
    counts = active.sum(-1).to(**_I32)  # [B, QB]
    order = torch.argsort(active.to(**_I32), dim=-1, descending=True, stable=True).to(**_I32)  # active first
    return BlockMask.from_kv_blocks(counts[:, None], order[:, None], BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len))


def _below_length(length: torch.Tensor):
    def below_length(b, h, q_idx, kv_idx):
        return kv_idx < length[b]

    return below_length


def length_block_mask(length: torch.Tensor, n_queries: int, capacity: int) -> BlockMask:
    """``n_queries`` queries over the first ``length[b]`` of ``capacity`` keys in batch row b (``length``: a [1]
    or [B] long tensor read by the mask_mod at every call). Every block is partial and active; the caller keeps
    ``kv_num_blocks`` at the live block count (:class:`fafo.engine.flex_masks.LiveLength`), so the kernel skips
    the dead tail."""
    active = torch.ones(length.shape[0], n_blocks(n_queries), n_blocks(capacity), dtype=torch.bool,
                        device=length.device)
    return _partial(active, _below_length(length), n_queries, capacity)


def _step(step_mask: torch.Tensor):
    if step_mask.dim() == 3:  # one per batch row
        def step_rows(b, h, q_idx, kv_idx):
            return step_mask[b, q_idx, kv_idx]

        return step_rows

    def step(b, h, q_idx, kv_idx):
        return step_mask[q_idx, kv_idx]

    return step


def step_block_mask(step_mask: torch.Tensor) -> BlockMask:
    """The ``[Q, Q]`` (or ``[B, Q, Q]``) bool ``step_mask``, fixed once built: blocks holding a True are active,
    all partial."""
    Q, nb = step_mask.shape[-1], n_blocks(step_mask.shape[-1])
    padded = step_mask.new_zeros(*step_mask.shape[:-2], nb * BLOCK, nb * BLOCK)
    padded[..., :Q, :Q] = step_mask
    active = padded.view(*step_mask.shape[:-2], nb, BLOCK, nb, BLOCK).any(-1).any(-2)  # [(B,) QB, KB]
    return _partial(active, _step(step_mask), Q, Q)


def buffer_block_mask(buffer: torch.Tensor) -> BlockMask:
    """A ``[Q, Q]`` (or ``[B, Q, Q]``) bool ``buffer`` rewritten in place before each call (a compiled step's tree
    mask): every block is active and partial, so any content is read correctly."""
    nb = n_blocks(buffer.shape[-1])
    active = torch.ones(*buffer.shape[:-2], nb, nb, dtype=torch.bool, device=buffer.device)
    return _partial(active, _step(buffer), *buffer.shape[-2:])


def _below_prefix_lens(prefix_lens: torch.Tensor):
    def below_prefix_len(b, h, q_idx, kv_idx):
        return kv_idx < prefix_lens[q_idx]

    return below_prefix_len


def prefix_lens_block_mask(prefix_lens: torch.Tensor, n_keys: int) -> BlockMask:
    """Query ``q`` sees keys ``< prefix_lens[q]`` of ``n_keys``: a key block is active for a query block when some
    query of it reaches into the key block; all partial."""
    Q = prefix_lens.shape[0]
    longest = prefix_lens.new_zeros(n_blocks(Q) * BLOCK)
    longest[:Q] = prefix_lens
    longest = longest.view(-1, BLOCK).amax(1)  # [QB]
    starts = torch.arange(n_blocks(n_keys), device=prefix_lens.device) * BLOCK
    return _partial(starts[None] < longest[:, None], _below_prefix_lens(prefix_lens), Q, n_keys)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def causal_block_mask(n: int, device) -> BlockMask:
    """``n`` queries over ``n`` keys, causal: diagonal blocks partial, blocks below it full (the mod is True on
    them), none above. No dense ``[n, n]`` mask is evaluated, so a 128k-token prefill needs kilobytes for it, not
    16 GiB."""
    nb = n_blocks(n)
    rows = torch.arange(nb, device=device)
    diagonal = rows[:, None].expand(nb, nb).contiguous()  # row i: block i first (the rest unused)
    below = rows[None, :].expand(nb, nb).contiguous()  # row i: blocks 0..i-1 (the first i entries)
    return BlockMask.from_kv_blocks(
        torch.ones(1, 1, nb, device=device, **_I32), diagonal[None, None].to(**_I32),
        rows[None, None].to(**_I32), below[None, None].to(**_I32),
        BLOCK_SIZE=BLOCK, mask_mod=_causal, seq_lengths=(n, n))
