"""FlexAttention as inductor's Triton kernels compute it, on the CPU: only the key blocks a BlockMask lists.

Eager ``flex_attention`` (the CPU's reference, ``torch/_higher_order_ops/flex_attention.py: math_attention``)
evaluates the mask_mod over every query and key and never reads a BlockMask's block lists, so a wrong
``kv_num_blocks`` or ``kv_indices`` is invisible on the CPU. The CUDA templates (``torch/_inductor/kernel/flex/
flex_attention.py`` and ``flex_decoding.py``, torch 2.11 and 2.13) read, for each batch row, query head and query
block, the blocks ``kv_indices[:kv_num_blocks]`` with the mask_mod applied and ``full_kv_indices[:full_kv_num_blocks]``
without it, and no key past the call's length; nothing else. :func:`block_sparse_flex_lse` does exactly that, with
the same contract as :func:`fafo.engine.torch_compat.flex_attention_lse`.
"""

from __future__ import annotations

import torch


def _listed(block_mask, b: int, h: int, n_q: int, n_kv: int) -> torch.Tensor:
    """[n_q, n_kv] bool: the keys batch row ``b``, query head ``h`` reads, per query."""
    bs_q, bs_kv = block_mask.BLOCK_SIZE
    seen = torch.zeros(n_q, n_kv, dtype=torch.bool)
    lists = [(block_mask.kv_num_blocks, block_mask.kv_indices, True),
             (block_mask.full_kv_num_blocks, block_mask.full_kv_indices, False)]
    for counts, indices, masked in lists:
        if counts is None:
            continue
        mb, mh = b % counts.shape[0], h % counts.shape[1]  # one mask for every row / head broadcasts
        for qb in range(-(-n_q // bs_q)):
            rows = torch.arange(qb * bs_q, min(n_q, (qb + 1) * bs_q))
            for j in indices[mb, mh, qb, : int(counts[mb, mh, qb])].tolist():
                cols = torch.arange(j * bs_kv, min(n_kv, (j + 1) * bs_kv))
                if not len(cols):
                    continue
                keep = torch.ones(len(rows), len(cols), dtype=torch.bool)
                if masked:
                    keep = block_mask.mask_mod(torch.tensor(b), torch.tensor(h), rows[:, None], cols[None, :])
                seen[rows[:, None], cols[None, :]] |= keep.expand(len(rows), len(cols)).bool()
    return seen


def block_sparse_flex_lse(fn, q, k, v, block_mask, scale, kernel_options=None):
    """``(out, lse)`` of q ``[B, Hq, Q, D]`` over k, v ``[B, Hkv, K, D]`` reading only the listed blocks; a query
    that reads no key gets out 0 and lse -inf, as the kernels give. ``fn`` and ``kernel_options`` are ignored."""
    B, Hq, Q, _ = q.shape
    K, group = k.shape[2], Hq // k.shape[1]
    if block_mask is None:
        seen = torch.ones(B, Hq, Q, K, dtype=torch.bool)
    else:
        seen = torch.stack([torch.stack([_listed(block_mask, b, h, Q, K) for h in range(Hq)]) for b in range(B)])
    scores = (q.double() @ k.double().repeat_interleave(group, 1).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    p = torch.where(seen, torch.exp(scores - torch.where(lse.isfinite(), lse, 0)[..., None]), 0)
    out = p @ v.double().repeat_interleave(group, 1)
    return out.to(q.dtype), lse.float()
