"""Attention plans and the two attention backends.

A forward step attends its queries to two key sets and merges the results by log-sum-exp (LongSpec's hybrid
tree attention):

* the *prefix*: KV already in the static cache, physical slots ``[0, prefix)``; query ``q`` may be limited to the
  first ``prefix_lens[q]`` slots (FAFO's fumble streams see only the fixed compressed region at the cache head);
* the *step*: this forward's own tokens, with an arbitrary ``[Q, Q]`` boolean mask (causal, tree, Jacobi window...).

Because the two parts are computed apart, no dense ``[Q, max_len]`` mask is ever built. Backends:

* ``sdpa`` (default): fused kernels (:mod:`fafo.engine.kernels`). A single-token step whose KV was just written
  after the prefix is one kernel call over the valid prefix (GQA heads folded into the rows, no K/V copies, no
  mask, no merge); other steps run the prefix and the region through the fused kernel and the step part either
  causal, gathered (a sparse mask: per-query key lists, the per-branch computation) or fused with the mask.
* ``dense``: the reference, exact float32 maths with dense masks (what the fast paths are tested against).
* ``flex``: FlexAttention with block masks (:mod:`fafo.engine.block_masks`), each call issued to a Triton kernel
  that exists for its shape (:mod:`fafo.engine.flex_routing`); compiled on CUDA, eager on CPU.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from fafo.engine import block_masks
from fafo.engine.block_masks import prefix_lens_block_mask, step_block_mask
from fafo.engine.flex_routing import drop_padded_groups, flex_route, pad_query_groups
from fafo.engine.kernels import GatheredMask, attention_lse, merge, reference_attention_lse, step_attention_lse
from fafo.engine.torch_compat import flex_attention_lse

BACKENDS = ("sdpa", "flex", "dense")


@dataclass
class AttentionPlan:
    """Which keys each query of a step may see.

    Attributes:
        prefix: cache slots ``[0, prefix)`` are visible (they hold KV written by earlier steps).
        prefix_lens: optional ``[Q]`` long tensor, query ``q`` sees only slots ``[0, prefix_lens[q])``
            (each <= ``prefix``); ``None`` means every query sees the whole prefix.
        step_mask: optional ``[Q, Q]`` bool tensor, ``True`` where a query may attend a step token; ``None`` is
            causal. Every query must see itself. A batched step may give one per row, ``[B, Q, Q]``.
        region_from: optional query index: queries ``[region_from, Q)`` see only the cache's fixed head region,
            slots ``[0, region_len)`` (FAFO's fumble streams over C(kv)); earlier queries see the whole prefix.
        region_len: valid slots of the fixed region (<= ``prefix``).
        region_capacity: a static upper bound of ``region_len`` (the region's slots): compiled steps read the
            region through it, so decoders with a region must set it (it must not vary from step to step).
        region_block_mask: flex only: a BlockMask for the region queries over the region's capacity, built once
            per generation (its mask_mod reads the live region length from a tensor).
        step_block_mask: flex only: a BlockMask equal to ``step_mask``, built once per generation.
        prefix_block_mask: flex only: a BlockMask for the queries that read the prefix (all of them, or those
            before ``region_from``) over slots ``[0, prefix)``; compiled steps pass the whole cache as the prefix
            and put the live length in this mask (:mod:`fafo.engine.compiled`).
        dense_block_mask: flex only: the same for every query of the step, used in ``dense_layers``.
        prefix_length, region_length: ``[1]`` long tensors set by compiled steps: the live lengths of the prefix
            and of the region, when ``prefix`` and ``region_len`` are their static capacities. In a batched step
            (:mod:`fafo.engine.batching`) ``[B]``: each row's own lengths among the ``prefix`` (``region_len``)
            slots read, the token's own slot counted in both when ``step_in_cache``.
        dense_layers: layers in which the region queries see the whole prefix after all (Quest's dense layers).
        capture_rows: rows whose post-RoPE queries the forward returns beside its logits (``[L, B, H_q, R, D]``;
            :meth:`fafo.engine.engine.Engine.forward` ``queries=True``), for query-aware compression (Quest,
            SnapKV) and TriForce's retrieval.
        step_in_cache: set by the engine when a causal step's KV was written to slots ``[prefix, prefix + Q)``
            before attention: the ``sdpa`` backend then reads a single token's own KV from the cache (one kernel
            call, no merge).
        step_gather: the ``step_mask`` as per-query key lists (:class:`~fafo.engine.kernels.GatheredMask`);
            computed once per mask tensor when ``None`` (compiled steps set it outside the graph).
        prefix_live, region_live: compiled ``sdpa`` steps: tensors whose *length* is the live prefix / region
            (marked dynamic, so one graph reads exactly the filled part of the cache at every length); ``prefix``
            and ``region_len`` are then static capacities.
    """

    prefix: int
    prefix_lens: torch.Tensor | None = None
    step_mask: torch.Tensor | None = None
    region_from: int | None = None
    region_len: int = 0
    region_capacity: int = 0
    region_block_mask: object | None = None
    step_block_mask: object | None = None
    prefix_block_mask: object | None = None
    dense_block_mask: object | None = None
    prefix_length: torch.Tensor | None = None
    region_length: torch.Tensor | None = None
    dense_layers: frozenset = frozenset()
    capture_rows: torch.Tensor | None = None
    step_in_cache: bool = False
    step_gather: GatheredMask | None = None
    prefix_live: torch.Tensor | None = None
    region_live: torch.Tensor | None = None

    def replace(self, **changes) -> "AttentionPlan":
        """``dataclasses.replace`` without its per-call reading of the fields: the engine replaces a plan a few
        times per forward, 1 us of host time each here against 3 us there (the class has no ``__post_init__`` and
        no ``init=False`` field, so copying the fields is all ``replace`` does). Not for code dynamo traces."""
        if not changes.keys() <= _PLAN_FIELDS:
            raise TypeError(f"AttentionPlan has no field {sorted(changes.keys() - _PLAN_FIELDS)}")
        new = object.__new__(AttentionPlan)
        new.__dict__.update(self.__dict__, **changes)
        return new

    def for_layer(self, layer: int) -> "AttentionPlan":
        """The plan as one layer sees it: in a dense layer the region queries read the whole prefix."""
        if self.region_from is None or layer not in self.dense_layers:
            return self
        # dataclasses.replace: this runs inside compiled forwards, where dynamo traces a dataclass's own init
        return replace(self, region_from=None, region_block_mask=None, prefix_block_mask=self.dense_block_mask)


_PLAN_FIELDS = frozenset(f.name for f in fields(AttentionPlan))


def causal_plan(prefix: int) -> AttentionPlan:
    """Ordinary decoding or (chunked) prefill: all of the prefix, causal within the step."""
    return AttentionPlan(prefix=prefix)


def tree_mask(parents: list[int] | torch.Tensor, device=None) -> torch.Tensor:
    """``[Q, Q]`` bool ancestor mask of a token tree given each node's parent index (-1 for a root)."""
    parents = torch.as_tensor(parents, dtype=torch.long, device=device)
    n = parents.numel()
    mask = torch.eye(n, dtype=torch.bool, device=device)
    for i in range(n):  # parents precede children, so each row extends its parent's row
        p = int(parents[i])
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def _prefix_mask(plan: AttentionPlan, device) -> torch.Tensor | None:
    if plan.prefix_lens is None:
        return None
    return torch.arange(plan.prefix, device=device)[None, :] < plan.prefix_lens[:, None]  # [Q, P]


def prefill_attention(q, k_step, v_step, plan: AttentionPlan, scale: float):
    """A step with no cached prefix (prefill): one fused SDPA call over its own tokens, nothing to merge."""
    return F.scaled_dot_product_attention(q, k_step, v_step, attn_mask=plan.step_mask,
                                          is_causal=plan.step_mask is None, scale=scale,
                                          enable_gqa=q.shape[1] != k_step.shape[1])


def dense_attention(q, k_cache, v_cache, k_step, v_step, plan: AttentionPlan, scale: float, query_chunk=1024):
    """Reference backend (``dense``): exact float32 maths with dense masks, the yardstick of the fast paths.

    q: [B, Hq, Q, D]; k_cache/v_cache: [B, Hkv, S, D]; k_step/v_step: [B, Hkv, Q, D] -> [B, Hq, Q, D].
    """
    B, Hq, Q, D = q.shape
    Hkv = k_step.shape[1]
    if plan.prefix == 0:
        return prefill_attention(q, k_step, v_step, plan, scale)
    qg = q.view(B, Hkv, Hq // Hkv, Q, D)
    if plan.step_in_cache and Q == 1 and plan.region_from is None and plan.prefix_length is not None:
        # a token whose KV is in the cache, counted by the live lengths: the cache alone holds every key it sees
        mask = torch.arange(plan.prefix, device=q.device) < plan.prefix_length[:, None, None, None, None]
        out = reference_attention_lse(qg, k_cache[:, :, :plan.prefix], v_cache[:, :, :plan.prefix], mask, scale)[0]
        return out.view(B, Hq, Q, D).to(q.dtype)
    step_mask = plan.step_mask
    if step_mask is None:
        step_mask = torch.ones(Q, Q, dtype=torch.bool, device=q.device).tril()
    elif step_mask.dim() == 3:  # one per batch row: [B, 1, 1, Q, Q] against the scores [B, Hkv, G, Q, K]
        step_mask = step_mask[:, None, None]
    prefix_mask = _prefix_mask(plan, q.device)
    split = Q if plan.region_from is None else plan.region_from
    outs = []
    for s in range(0, Q, query_chunk):  # bounds the [chunk, prefix] score tensor for long chunked prefills
        e = min(Q, s + query_chunk)
        parts = []
        for lo, hi, n_kv, length in ((s, min(e, split), plan.prefix, plan.prefix_length),
                                     (max(s, split), e, plan.region_len, plan.region_length)):
            if lo < hi:  # queries before the split read the whole prefix, the rest only the fixed region
                mask = None if prefix_mask is None else prefix_mask[lo:hi, :n_kv]
                if length is not None:  # of the n_kv slots read, the first `length` of each row are live
                    mask = torch.arange(n_kv, device=q.device) < length[:, None, None, None, None]  # [1|B,1,1,1,K]
                parts.append(reference_attention_lse(qg[..., lo:hi, :], k_cache[:, :, :n_kv], v_cache[:, :, :n_kv],
                                                   mask, scale))
        o1, l1 = torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-1)
        o2, l2 = reference_attention_lse(qg[..., s:e, :], k_step, v_step, step_mask[..., s:e, :], scale)
        outs.append(merge(o1, l1, o2, l2))
    return torch.cat(outs, dim=-2).view(B, Hq, Q, D).to(q.dtype)


def sdpa_attention(q, k_cache, v_cache, k_step, v_step, plan: AttentionPlan, scale: float):
    """Fast backend (same contract as :func:`dense_attention`).

    q: [B, Hq, Q, D]; k_cache/v_cache: [B, Hkv, S, D]; k_step/v_step: [B, Hkv, Q, D] -> [B, Hq, Q, D].
    """
    B, Hq, Q, D = q.shape
    if plan.prefix == 0:
        return prefill_attention(q, k_step, v_step, plan, scale)
    if plan.prefix_lens is not None:  # per-query prefix lengths: no decoder's hot path, the exact maths
        return dense_attention(q, k_cache, v_cache, k_step, v_step, plan, scale)
    prefix = plan.prefix if plan.prefix_live is None else plan.prefix_live.shape[0]
    if plan.step_in_cache and Q == 1 and plan.region_from is None:
        if plan.prefix_length is not None:  # compiled over the static capacity: the length counts the token too
            return attention_lse(q, k_cache[:, :, :prefix], v_cache[:, :, :prefix], scale,
                                 plan.prefix_length)[0].to(q.dtype)
        n = prefix + 1  # the valid prefix and the token itself, contiguous in the cache
        return attention_lse(q, k_cache[:, :, :n], v_cache[:, :, :n], scale)[0].to(q.dtype)
    split = Q if plan.region_from is None else plan.region_from
    parts = []
    if split > 0:  # queries before the split read the whole prefix
        n = prefix
        parts.append(attention_lse(q[:, :, :split], k_cache[:, :, :n], v_cache[:, :, :n], scale, plan.prefix_length))
    if split < Q:  # the rest only the fixed region at the head of the cache
        n = plan.region_len if plan.region_live is None else plan.region_live.shape[0]
        parts.append(attention_lse(q[:, :, split:], k_cache[:, :, :n], v_cache[:, :, :n], scale, plan.region_length))
    o1, l1 = parts[0] if len(parts) == 1 else (torch.cat([p[0] for p in parts], -2),
                                               torch.cat([p[1] for p in parts], -1))
    o2, l2 = step_attention_lse(q, k_step, v_step, plan.step_mask, scale, plan.step_gather)
    return merge(o1, l1, o2, l2).to(q.dtype)


_compiled_flex = None
NO_MASK_BLOCK = 1 << 30  # the block size of the mask flex_attention makes when given none (one block)


def _flex_call(q, k, v, block_mask, scale, compiled: bool):
    """One flex_attention call -> (out, lse) float32, issued as :func:`fafo.engine.flex_routing.flex_route` says.

    Inside a compiled step the outer compile lowers it (static shapes); eager steps on CUDA (``compiled``) go
    through one wrapper compiled with dynamic shapes, so a growing prefix does not recompile; on the CPU eager
    flex is the unfused reference."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    fn, static = flex_attention, True
    if torch.compiler.is_compiling():
        pass
    elif not compiled:  # eager flex is the unfused reference path on CPU; its per-call warning is noise here
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    else:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=True)
        fn, static = _compiled_flex, False
    hq, hkv = q.shape[1], k.shape[1]
    q_block = block_mask.BLOCK_SIZE[0] if block_mask is not None else NO_MASK_BLOCK
    route = flex_route(q.shape[2], hq, hkv, q_block, static)
    if route.heads != hq:
        q = pad_query_groups(q, hkv, route.heads // hkv)
    out, lse = flex_attention_lse(fn, q, k, v, block_mask, scale, route.options)
    if route.heads != hq:
        out, lse = drop_padded_groups(out, lse, hkv, hq // hkv)
    return out.float(), lse.float()


def flex_attention_backend(q, k_cache, v_cache, k_step, v_step, plan: AttentionPlan, scale: float):
    """FlexAttention backend (same contract as :func:`sdpa_attention`).

    Block masks given in the plan (:mod:`fafo.engine.flex_masks` for eager steps, :mod:`fafo.engine.compiled` for
    compiled ones) are used as they are; missing ones are built here (:mod:`fafo.engine.block_masks`) and stored on
    the plan, so the layers of one forward share them.
    """
    compiled = q.device.type == "cuda"
    Q, dev = q.shape[2], q.device
    if plan.step_in_cache and Q == 1 and plan.region_from is None and plan.prefix > 0:
        # vanilla's step: its own KV is in the cache, so one kernel call reads the prefix and the token
        n = plan.prefix if plan.prefix_length is not None else plan.prefix + 1
        return _flex_call(q, k_cache[:, :, :n], v_cache[:, :, :n], plan.prefix_block_mask, scale,
                          compiled)[0].to(q.dtype)
    bm_step = plan.step_block_mask
    if bm_step is None:
        bm_step = plan.step_block_mask = (causal_block_mask(Q, dev) if plan.step_mask is None
                                          else step_block_mask(plan.step_mask))
    o2, l2 = _flex_call(q, k_step, v_step, bm_step, scale, compiled)
    if plan.prefix == 0:
        return o2.to(q.dtype)
    split = Q if plan.region_from is None else plan.region_from
    parts = []
    if split > 0:
        bm = plan.prefix_block_mask
        if bm is None and plan.prefix_lens is not None:
            bm = prefix_lens_block_mask(plan.prefix_lens[:split], plan.prefix)
        n_kv = plan.prefix
        parts.append(_flex_call(q[:, :, :split], k_cache[:, :, :n_kv], v_cache[:, :, :n_kv], bm, scale, compiled))
    if split < Q:
        bm = plan.region_block_mask  # None: every slot of the region is live
        n_kv = bm.seq_lengths[1] if bm is not None else plan.region_len  # the kernel never reads past it
        parts.append(_flex_call(q[:, :, split:], k_cache[:, :, :n_kv], v_cache[:, :, :n_kv], bm, scale, compiled))
    o1, l1 = torch.cat([p[0] for p in parts], dim=-2), torch.cat([p[1] for p in parts], dim=-1)
    return merge(o1, l1, o2, l2).to(q.dtype)


_causal_masks: dict[tuple, object] = {}


def causal_block_mask(n: int, device):
    """:func:`fafo.engine.block_masks.causal_block_mask`, cached per length and device (prefill lengths repeat
    across turns; one length is kept)."""
    key = (n, str(device))
    if key not in _causal_masks:
        _causal_masks.clear()
        _causal_masks[key] = block_masks.causal_block_mask(n, device)
    return _causal_masks[key]


def attend(backend: str, q, k_cache, v_cache, k_step, v_step, plan: AttentionPlan, scale: float):
    """Dispatch to a backend by name (``sdpa``, ``dense`` or ``flex``)."""
    if backend == "sdpa":
        return sdpa_attention(q, k_cache, v_cache, k_step, v_step, plan, scale)
    if backend == "dense":
        return dense_attention(q, k_cache, v_cache, k_step, v_step, plan, scale)
    if backend == "flex":
        return flex_attention_backend(q, k_cache, v_cache, k_step, v_step, plan, scale)
    raise ValueError(f"unknown attention backend {backend!r}; use one of {BACKENDS}")
