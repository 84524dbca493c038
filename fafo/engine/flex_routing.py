"""Which Triton kernel a compiled FlexAttention call gets, and how the engine shapes each call so that one exists.

Inductor lowers ``flex_attention`` on CUDA to one of two templates (``torch/_inductor/kernel/flex/flex_attention.py:
flex_attention``, torch 2.11 to 2.15 alike):

* **flex-decoding** (``torch/_inductor/kernel/flex/flex_decoding.py``). ``_use_flex_decoding`` picks it when the
  BACKEND option is AUTO (``TRITON_DECODE`` forces it) and ``FORCE_USE_FLEX_ATTENTION`` is unset, the query length
  is 1..127, batch and head counts are static, the BlockMask has one head (under GQA) and the group
  ``G = Hq // Hkv`` is a power of two. ``create_flex_decoding_kernel`` packs the G query heads of one KV head into
  ``BLOCK_M`` rows (``kernel_options["BLOCK_M"]``, default ``max(next_power_of_2(Q * G), 16)``) and launches
  ``(cdiv(Q * G, BLOCK_M), B * Hkv, SPLIT_KV)`` programs, SPLIT_KV = 2 x SMs / (B * Hkv) slices of the keys merged
  afterwards (``get_split_k``). It skips every config unless ``SPARSE_Q_BLOCK_SIZE % BLOCK_M == 0``; with none
  left, autotuning raises ``NoValidChoicesError`` (from 2.14, a ``ValueError`` naming the kernel options).
* **the main template** otherwise: ``(cdiv(Q, BLOCK_M), B, Hq)`` programs, each one block of queries of one query
  head reading every key of the call (no split over the keys); its configs' ``BLOCK_M``/``BLOCK_N`` (16..128)
  divide the engine's 128-blocks.

With the engine's 128 x 128 blocks, a decoding-eligible call with ``Q * G > 128`` therefore has no kernel (Llama-3-8B,
G = 4: Token Recycling's 81-row trees, SuffixDecoding's 65, SAM's 40, Lookahead 5/15/15's 120 rows), and a group
that is not a power of two (Qwen2.5-7B: 28 / 4 = 7) sends even a one-token decode to the main template: Hq programs
each reading the whole cache alone, a slow vanilla that would inflate every speedup measured against it.

:func:`flex_route` is the engine's rule, applied to every call of a compiled step:

1. ``Q >= 128``: torch's own choice, the main template, with cdiv(Q, 128) x Hq programs. Shapes that are not
   static (eager steps on CUDA, compiled once with dynamic shapes): the main template, forced, so the choice does
   not depend on which sizes dynamo specialised.
2. ``1 < Q < 128`` (every draftless method's verification step but FAFO's): the main template, **forced**. The
   decoding template computed wrong attention for such steps under GQA on the first GPU run (NVIDIA H200, torch
   2.11.0+cu130, Triton 3.6): on a Llama of group 4 with two KV heads, Prompt Lookup (11 rows), TriForce (7), SAM
   (40), Lookahead (120), Token Recycling (81) and SuffixDecoding (65) all left the eager tokens at the first or a
   later step by float32 logit gaps of 0.1-4.9 (not fp16 ties), while FAFO's 481-row steps (main template),
   vanilla's one-token steps and Prompt Lookup on a Qwen2 of group 7 (one KV head, padded to 8; decoding template)
   matched. Copying q, k and v dense made the chain and Lookahead steps match on group 4 but not the two tree
   methods, and a causal 11-row step compiled alone (``scripts/gpu_flex_probe.py``) was wrong (relative error
   0.76-0.86 against float64) in every layout of q, k and v; the cause inside the template is not established.
   Routed so, every case matched on an NVIDIA H100 (torch 2.11.0+cu130: 12 methods x groups 4, 7, 1, 3) and an
   H200. On that H200 (2026-11-27) the probe found the decoding template right for the same shapes in isolation;
   the rule stays until a whole model routed to it is token-identical. The cost: the main template does not split
   the keys, so a short step's prefix is read by Hq programs (32 on a 7B model) instead of about 2 x SMs; on that
   H100 at 7B a 64- or 128-token step cost 2.2-3.3 ms more than a 1-token one at 4096 tokens of context and 0.2-1.5
   ms more at 512, charged to the method, never to vanilla. (Reading the prefix in chunks seen as extra KV heads,
   to give the template more programs, computed wrong attention on that H200 and was removed.)
3. ``Q == 1``: the decoding template. A group that is not a power of two (Qwen2.5-7B: 28 / 4 = 7) is **padded**
   with zero query heads to ``G' = next_power_of_2(G)`` and the padded rows of the output dropped: its cost is
   ``(G' - G) / G`` more arithmetic in a kernel bound by reading the keys, the same key traffic, and copies of q
   and the output, O(Hq * D) against the cache's O(S * Hkv * D). ``BLOCK_M`` is torch's default
   (``max(G', 16)``, which divides the engine's 128-blocks for every group up to 128), else the query block.
4. Where neither fits (a query block that is not a power of two), the main template is forced
   (:func:`fafo.engine.torch_compat.main_template_option`).

:func:`lowered_kernel` restates torch's decision for given kernel options, so tests check every route against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fafo.engine.torch_compat import main_template_option

SHORT_QUERY = 128  # _use_flex_decoding: query lengths below this may take the decoding kernel
MAIN_CONFIG_BLOCK = 128  # the largest BLOCK_M / BLOCK_N among the main template's forward configs


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def is_power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def default_block_m(q_len: int, group: int) -> int:
    """``create_flex_decoding_kernel``'s BLOCK_M when kernel_options name none (CUDA; 16 is Triton's dot minimum)."""
    return max(next_power_of_2(q_len * group), 16)


def lowered_kernel(q_len: int, hq: int, hkv: int, q_block: int, options: dict | None = None, mask_heads: int = 1,
                   static: bool = True) -> tuple[str, bool]:
    """``(template, has_config)``: the template inductor lowers a flex_attention call to (``"decoding"`` or
    ``"attention"``), and whether any of its configs survives (False: no kernel, the compile fails). Torch 2.11 to
    2.15: ``flex_attention.py: flex_attention`` and ``flex_decoding.py: _use_flex_decoding,
    create_flex_decoding_kernel``.

    q_len, hq: the query's length and heads as the kernel sees them; hkv: key/value heads; q_block: the BlockMask's
    ``BLOCK_SIZE[0]`` (SPARSE_Q_BLOCK_SIZE); mask_heads: the BlockMask's head count; static: batch and head counts
    are static in the compiled graph.
    """
    options = options or {}
    backend = options.get("BACKEND", "AUTO")
    group = hq // hkv
    mask_ok = mask_heads == 1 if hq != hkv else mask_heads in (1, hq)
    eligible = (not options.get("FORCE_USE_FLEX_ATTENTION", False) and 0 < q_len < SHORT_QUERY and static
                and mask_ok and is_power_of_2(group))
    if backend == "TRITON_DECODE" or (backend == "AUTO" and eligible):
        block_m = options.get("BLOCK_M", default_block_m(q_len, group))
        return "decoding", q_block % block_m == 0 and block_m % group == 0
    block_m = options.get("BLOCK_M", MAIN_CONFIG_BLOCK)
    return "attention", q_block % block_m == 0


@dataclass(frozen=True)
class FlexRoute:
    """How one flex_attention call is issued.

    Attributes:
        kernel: the template it lowers to, ``"decoding"`` or ``"attention"`` (the main template).
        heads: query heads passed to the kernel (``hq``, or ``hkv * G'`` with zero heads padded in).
        options: kernel_options for ``flex_attention``.
    """

    kernel: str
    heads: int
    options: dict


def flex_route(q_len: int, hq: int, hkv: int, q_block: int = 128, static: bool = True) -> FlexRoute:
    """The engine's rule for a flex_attention call of ``q_len`` queries in ``hq`` heads over ``hkv`` KV heads with
    a one-head BlockMask of query block ``q_block`` (see the module docstring). A pure function of its arguments."""
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not split into {hkv} KV heads")
    if not static:  # dynamic head counts: torch takes the main template; say so, so the choice never varies
        return FlexRoute("attention", hq, main_template_option())
    if q_len >= SHORT_QUERY:
        return FlexRoute("attention", hq, {})
    if q_len > 1:  # rule 2: the decoding template was measured wrong for multi-row steps
        return FlexRoute("attention", hq, main_template_option())
    group = next_power_of_2(hq // hkv)
    heads = hkv * group
    if q_block % default_block_m(q_len, group) == 0:
        return FlexRoute("decoding", heads, {})
    if is_power_of_2(q_block) and q_block >= 16 and q_block % group == 0:
        return FlexRoute("decoding", heads, {"BLOCK_M": q_block})
    return FlexRoute("attention", hq, main_template_option())


def pad_query_groups(q: torch.Tensor, hkv: int, group: int) -> torch.Tensor:
    """q ``[B, Hkv * G, Q, D]`` -> ``[B, Hkv * group, Q, D]``: each KV head's G query heads, then zero heads."""
    B, hq, Q, D = q.shape
    qg = q.unflatten(1, (hkv, hq // hkv))
    zeros = qg.new_zeros(B, hkv, group - hq // hkv, Q, D)
    return torch.cat([qg, zeros], dim=2).flatten(1, 2)


def drop_padded_groups(out: torch.Tensor, lse: torch.Tensor, hkv: int, group: int):
    """The rows of the real query heads (the first ``group`` of each KV head's padded group) of out and lse."""
    out = out.unflatten(1, (hkv, -1))[:, :, :group].flatten(1, 2)
    return out, lse.unflatten(1, (hkv, -1))[:, :, :group].flatten(1, 2)
