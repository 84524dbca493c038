"""Attention kernels that return the log-sum-exp, and the gathered (block-sparse) step attention.

The engine splits a step's attention into a *prefix* part (the cache) and a *step* part (the step's own tokens)
and merges them by log-sum-exp (:mod:`fafo.engine.attention`). Both parts must therefore return ``(out, lse)``,
which ``F.scaled_dot_product_attention`` does not. These helpers call the fused kernels behind it that do:

* CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` (tiled, never materialises the ``[Q, K]`` scores,
  accepts GQA key/value heads and an additive mask);
* CUDA: ``aten._scaled_dot_product_efficient_attention`` with ``compute_log_sumexp``;
* anything else: the exact float32 maths of :func:`reference_attention_lse`.

GQA without copies: when every query of a group sees the same keys (no mask, or a mask that only limits the key
length), the ``G`` query heads sharing a KV head are folded into the query rows, ``[B, Hkv, G*Q, D]``, so the kernel
reads each KV head once and no ``repeat_interleave`` copy is made.

A step mask that is mostly empty (FAFO's candidate chains and fumble streams: each of 481 queries sees at most
k + 1 = 7 step keys) is computed by *gathering*: each query's visible keys are listed once per mask
(:class:`GatheredMask`, ``[Q, L]`` indices, ``L`` = the most keys any query sees), and the attention runs over
``[Q, L]`` instead of ``[Q, Q]`` — the per-branch computation, for any mask (chains, trees, Jacobi windows).

At batch B (requests decoded together) a length is one per row (``[B]``) and a step mask may be one per row
(``[B, Q, Q]``): each row is a request with its own prefix and its own tree.
"""

from __future__ import annotations

import weakref

import torch

NEG_INF = float("-inf")
GATHER_MAX_DENSITY = 0.25  # gather when the busiest query sees at most this fraction of the step


def reference_attention_lse(q, k, v, mask, scale):
    """Exact attention returning (out, lse): the dense reference.

    q: [B, Hkv, G, Q, D]; k, v: [B, Hkv, K, D]; mask: bool broadcastable to [B, Hkv, G, Q, K] (e.g. [Q, K]) or None.
    out: [B, Hkv, G, Q, D] float32; lse: [B, Hkv, G, Q] float32 (-inf for a query that sees nothing).
    """
    scores = torch.matmul(q, k[:, :, None].transpose(-1, -2)).float() * scale  # [B, Hkv, G, Q, K]
    if mask is not None:
        scores = scores.masked_fill(~mask, NEG_INF)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.clamp_min(torch.finfo(torch.float32).min)[..., None])
    out = torch.matmul(probs.to(v.dtype), v[:, :, None]).float()
    return out, lse


def merge(o1, l1, o2, l2):
    """Combine two partial attentions over disjoint key sets by their log-sum-exps (o: [..., Q, D], l: [..., Q])."""
    lse = torch.logaddexp(l1, l2)
    w1 = torch.exp(l1 - lse).nan_to_num(0.0)[..., None]
    w2 = torch.exp(l2 - lse).nan_to_num(0.0)[..., None]
    return o1 * w1 + o2 * w2


def _fused(q, k, v, scale, mask=None, causal=False):
    """One fused-kernel call, heads of q and k equal or GQA. q: [B, H, R, D] -> out [B, H, R, D], lse [B, H, R].

    ``mask``: additive float mask broadcastable to [R, K] (CPU) or None.
    """
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=scale)
        return out, lse
    if q.device.type == "cuda" and q.shape[1] == k.shape[1] and mask is None:
        # unmasked only: the kernel's bias must meet alignment rules a [1, K] mask does not. Not yet run on a GPU
        # in this project's CI: eager CUDA steps are a fallback (CUDA's default is compiled FlexAttention).
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, causal, scale=scale)[:2]
        return out, lse[..., : q.shape[2]]  # the lse may be padded along the queries
    return None


def attention_lse(q, k, v, scale, length: torch.Tensor | None = None, causal: bool = False):
    """Unmasked attention of every query over all of ``k`` (or its first ``length[0]`` keys), with the lse.

    q: [B, Hq, Q, D]; k, v: [B, Hkv, K, D]; length: optional [1] or [B] long tensor, the live keys of every row or
    of each row (compiled steps: the live part of a static capacity; batched steps: each request's prefix);
    causal: query i sees keys ``<= i`` (then K == Q). Returns out [B, Hq, Q, D] float32 and lse [B, Hq, Q] float32
    (-inf for a query that sees no key).
    """
    B, Hq, Q, D = q.shape
    Hkv, K = k.shape[1], k.shape[2]
    G = Hq // Hkv
    if K == 0:
        return q.new_zeros(B, Hq, Q, D, dtype=torch.float32), q.new_full((B, Hq, Q), NEG_INF, dtype=torch.float32)
    mask = None
    if length is not None:  # [1 or B, 1, 1, K] additive: the kernel broadcasts it over heads and query rows
        mask = torch.zeros(length.shape[0], 1, 1, K, dtype=q.dtype, device=q.device).masked_fill(
            torch.arange(K, device=q.device) >= length[:, None, None, None], NEG_INF)
    if causal:  # rows differ: keep the heads apart (the CPU kernel reads GQA heads itself)
        res = _fused(q, k, v, scale, causal=True) if q.device.type == "cpu" or G == 1 else None
        grouped = False
    else:  # fold the G query heads of a KV head into the rows: [B, Hkv, G*Q, D]
        res = _fused(q.reshape(B, Hkv, G * Q, D), k, v, scale, mask)
        grouped = True
    if res is None:
        cmask = None
        if causal:
            cmask = torch.ones(Q, K, dtype=torch.bool, device=q.device).tril()
        elif length is not None:
            cmask = torch.arange(K, device=q.device) < length[:, None, None, None, None]  # [1 or B, 1, 1, 1, K]
        out, lse = reference_attention_lse(q.reshape(B, Hkv, G, Q, D), k, v, cmask, scale)
        return out.view(B, Hq, Q, D), lse.view(B, Hq, Q)
    out, lse = res
    if grouped:
        out, lse = out.reshape(B, Hq, Q, D), lse.reshape(B, Hq, Q)
    if length is not None:  # the kernels report lse 0 for a fully masked row; it must be -inf to merge
        lse = lse.masked_fill((length == 0)[:, None, None], NEG_INF)
    return out.float(), lse.float()


def gather_width(most_keys: int, Q: int, static: bool = False) -> int:
    """The key-list width ``L`` of a step mask of ``Q`` queries whose busiest query sees ``most_keys`` keys: that
    count rounded up to a power of two (at most ``Q``). Under static shapes (a compiled step) only two widths per
    ``Q``: the widest that is still sparse (a power of two) or ``Q`` (the dense kernel), so that trees of every depth
    share two graphs instead of compiling one per depth."""
    width = min(Q, 1 << (max(1, most_keys) - 1).bit_length())
    if not static:
        return width
    widest_sparse = 1 << int(GATHER_MAX_DENSITY * Q).bit_length() >> 1  # 0 when no width is sparse
    return widest_sparse if width <= widest_sparse else Q


class GatheredMask:
    """A ``[Q, Q]`` step mask as per-query key lists: ``index`` [Q, L] long, ``valid`` [Q, L] bool (a ``[B, Q, Q]``
    mask, one per batch row: ``[B, Q, L]`` each).

    ``L``: :func:`gather_width` (``static``: the width a compiled step takes); padding entries point at key 0 and
    are invalid.
    """

    def __init__(self, mask: torch.Tensor, static: bool = False):
        counts = mask.sum(dim=-1)
        Q = mask.shape[-1]
        width = gather_width(int(counts.max()), Q, static)
        order = torch.sort(mask.to(torch.uint8), dim=-1, descending=True, stable=True).indices[..., :width]
        self.valid = torch.arange(width, device=mask.device) < counts[..., None]  # [(B,) Q, L]
        self.index = torch.where(self.valid, order, torch.zeros_like(order))  # [(B,) Q, L], visible keys first
        self.width = width

    @property
    def sparse(self) -> bool:
        """Whether gathering beats the dense kernel: the busiest query sees a small part of the step."""
        return self.width <= GATHER_MAX_DENSITY * self.index.shape[-2]


_gathered: dict[tuple[int, bool], tuple] = {}


def written(mask: torch.Tensor) -> int:
    """How often ``mask`` was written in place (a cache key). A tensor made under ``torch.inference_mode`` tracks no
    count, so 0: every mask made in a generation is one (a method's ``generate`` runs in inference mode, and the
    engine uploads masks in it), and none is edited in place once a forward has read it (the step masks are built
    once per shape, or anew each step)."""
    return 0 if mask.is_inference() else mask._version


def gathered_mask(mask: torch.Tensor, static: bool = False) -> GatheredMask:
    """The :class:`GatheredMask` of ``mask``, computed once per mask tensor (and again if it is edited in place)."""
    key = (id(mask), static)
    hit = _gathered.get(key)
    if hit is not None and hit[0]() is mask and hit[1] == written(mask):
        return hit[2]
    for k in [k for k, (ref, _, _) in _gathered.items() if ref() is None]:  # drop dead masks
        del _gathered[k]
    gm = GatheredMask(mask, static)
    _gathered[key] = (weakref.ref(mask), written(mask), gm)
    return gm


def gathered_attention_lse(q, k, v, gm: GatheredMask, scale):
    """Step attention over each query's own key list.

    q: [B, Hq, Q, D]; k, v: [B, Hkv, Q, D] (the step's keys) -> out [B, Hq, Q, D] float32, lse [B, Hq, Q] float32.
    Cost O(Q * L * D) per head instead of O(Q^2 * D).
    """
    B, Hq, Q, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    qg = q.reshape(B, Hkv, G, Q, D).permute(0, 1, 3, 2, 4)  # [B, Hkv, Q, G, D]
    if gm.index.dim() == 2:  # one mask for every row
        kg, vg = k[:, :, gm.index], v[:, :, gm.index]  # [B, Hkv, Q, L, D]
        valid = gm.valid[:, None, :]  # [Q, 1, L]
    else:  # each row its own: [B, Q, L] key lists gathered per row
        L = gm.width
        index = gm.index.reshape(B, 1, Q * L, 1).expand(B, Hkv, Q * L, D)
        kg, vg = (t.gather(2, index).view(B, Hkv, Q, L, D) for t in (k, v))
        valid = gm.valid[:, None, :, None, :]  # [B, 1, Q, 1, L]
    scores = torch.matmul(qg, kg.transpose(-1, -2)).float() * scale  # [B, Hkv, Q, G, L]
    scores = scores.masked_fill(~valid, NEG_INF)
    lse = torch.logsumexp(scores, dim=-1)  # [B, Hkv, Q, G]; every query sees itself, so finite
    probs = torch.exp(scores - lse[..., None])
    out = torch.matmul(probs.to(vg.dtype), vg).float()  # [B, Hkv, Q, G, D]
    return out.permute(0, 1, 3, 2, 4).reshape(B, Hq, Q, D), lse.permute(0, 1, 3, 2).reshape(B, Hq, Q)


def step_attention_lse(q, k, v, step_mask: torch.Tensor | None, scale, gathered: GatheredMask | None = None):
    """The step part: causal (``step_mask`` None), gathered (a sparse mask) or the fused kernel with the mask.
    ``step_mask``: [Q, Q] (every row) or [B, Q, Q] (one per batch row)."""
    if step_mask is None:
        return attention_lse(q, k, v, scale, causal=True)
    gm = gathered if gathered is not None else gathered_mask(step_mask)
    if gm.sparse:
        return gathered_attention_lse(q, k, v, gm, scale)
    B, Hq, Q, D = q.shape
    rows = step_mask if step_mask.dim() == 2 else step_mask[:, None]  # [Q, Q] or [B, 1, Q, Q]
    additive = torch.zeros(rows.shape, dtype=q.dtype, device=q.device).masked_fill(~rows, NEG_INF)
    res = _fused(q, k, v, scale, additive) if q.device.type == "cpu" or Hq == k.shape[1] else None
    if res is None:
        mask = step_mask if step_mask.dim() == 2 else step_mask[:, None, None]  # [B, 1, 1, Q, Q]
        out, lse = reference_attention_lse(q.reshape(B, k.shape[1], -1, Q, D), k, v, mask, scale)
        return out.view(B, Hq, Q, D), lse.view(B, Hq, Q)
    return res[0].float(), res[1].float()
