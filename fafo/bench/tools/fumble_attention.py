"""FAFO's fumble attention under compiled FlexAttention: the fixed region vs the same entries scattered.

FAFO keeps its compressed KV C(kv) as a fixed region at the head of the cache (FAFO paper section 4.4 and
App. H), so the n*k fumble queries attend through one static block mask over ``ceil(F / 128)`` KV blocks. The
same F entries scattered in a plain cache (``streaming``: StreamingLLM's sink at the start and window at the end;
``random``: Quest-like picks anywhere) touch more blocks, and a scattered mask would be rebuilt every step.
:func:`fumble_rows` times both layouts per context (``scripts/bench_engine.py fumble``) and checks them against
dense SDPA. On CPU, eager ``flex_attention`` ignores block sparsity: only compiled numbers speak to the layout.
"""

from __future__ import annotations

import math
import sys
import warnings

import torch
import torch.nn.functional as F_nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from fafo.bench.tools.engine_timing import timed
from fafo.engine.engine import DTYPES

FUMBLE_COLUMNS = [
    "context", "layout", "scatter", "budget", "heads", "kv_heads", "head_dim", "streams", "k", "q_rows", "dtype",
    "device", "compiled", "median_ms", "min_ms", "first_call_ms", "active_kv_blocks", "total_kv_tiles",
    "block_density", "block_size", "mask_build_eager_ms", "mask_build_compiled_ms", "check_max_abs_diff",
    "threads", "torch",
]
SCATTERS = ("streaming", "random")


def fixed_region_mask(fixed_len: torch.Tensor):
    """mask_mod: a query sees slots ``kv_idx < fixed_len[0]`` (FAFO's fixed head region)."""

    def fixed(b, h, q_idx, kv_idx):
        return kv_idx < fixed_len[0]

    return fixed


def selected_mask(selected: torch.Tensor):
    """mask_mod: a query sees slot ``kv_idx`` iff ``selected[kv_idx]`` (a scattered selection)."""

    def scattered(b, h, q_idx, kv_idx):
        return selected[kv_idx]

    return scattered


def scattered_slots(scatter: str, ctx: int, budget: int, sink: int, gen: torch.Generator) -> torch.Tensor:
    """The F selected slot indices (sorted) of a plain cache of ``ctx`` entries."""
    if scatter == "streaming":  # StreamingLLM in a plain cache: the sink at the start, the window at the end
        s = min(sink, budget)
        return torch.cat([torch.arange(s), torch.arange(ctx - (budget - s), ctx)])
    if scatter == "random":  # any selection (Quest pages, SnapKV picks) spread over the whole cache
        return torch.randperm(ctx, generator=gen)[:budget].sort().values
    raise ValueError(f"unknown scatter {scatter!r}; use one of {SCATTERS}")


def block_counts(bm) -> tuple[int, int]:
    """(active KV blocks summed over query blocks, all query-block x KV-block tiles) of a BlockMask."""
    active = int(bm.kv_num_blocks.sum())
    if bm.full_kv_num_blocks is not None:
        active += int(bm.full_kv_num_blocks.sum())
    (q_len, kv_len), (q_bs, kv_bs) = bm.seq_lengths, bm.BLOCK_SIZE
    return active, math.prod(bm.kv_num_blocks.shape[:-1]) * math.ceil(q_len / q_bs) * math.ceil(kv_len / kv_bs)


def _flex_fixed(q, k, v, block_mask, gqa):  # one entry point per layout: separate compile caches (Fallback)
    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)


def _flex_scattered(q, k, v, block_mask, gqa):
    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)


class Fallback:
    """``fn`` under ``torch.compile(**kw)`` (when ``compiled``); after a failing compiled call, eager ``fn`` for good,
    with a printed note (``compiled`` then reads False).

    torch 2.13 quirk: when dynamo's automatic-dynamic marks the tensor a mask_mod closes over as dynamic (its size
    changed between calls), the CPU flex template fails to build (``CppCompileError: 'cur_qSplitSize8' was not
    declared``). So the captured tensors are marked static (``torch._dynamo.mark_static``), the ``selected`` bitmap
    has one size for all contexts, and each layout gets its own compiled entry point (separate caches).
    """

    def __init__(self, fn, compiled: bool, **kw):
        self.fn, self.compiled = fn, compiled
        self.fast = torch.compile(fn, **kw) if compiled else None

    def __call__(self, *args, **kw):
        if self.compiled:
            try:
                return self.fast(*args, **kw)
            except Exception as e:  # noqa: BLE001 - any compile failure: report and go on eagerly
                print(f"NOTE: compiled {self.fn.__name__} failed ({type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200]}); eager from now on (flex_attention: unfused, block sparsity "
                      "ignored on CPU): the remaining timings do not reflect the layout", file=sys.stderr)
                self.compiled = False
        return self.fn(*args, **kw)


def flex_layouts(compiled: bool) -> dict[str, Fallback]:
    return {"fixed": Fallback(_flex_fixed, compiled), "scattered": Fallback(_flex_scattered, compiled)}


def build_ms(build, mask_mod, q_len, kv_len, device, repeats) -> float | None:
    """Median ms to build the BlockMask with ``build`` (compilation apart); None when its compiled form failed."""
    ms = timed(lambda: build(mask_mod, None, None, q_len, kv_len, device=device), repeats, 1, device)[1]
    return ms if getattr(build, "compiled", True) else None


def check_equivalence(flex: dict, q, k, v, idx, bm_fixed, bm_scat, budget) -> float:
    """Fixed layout over a cache holding the selected entries in [0, F) == scattered layout == dense SDPA."""
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :budget], v2[:, :, :budget] = k[:, :, idx], v[:, :, idx]
    gqa = q.shape[1] != k.shape[1]
    out_fixed = flex["fixed"](q, k2, v2, bm_fixed, gqa).float()
    out_scat = flex["scattered"](q, k, v, bm_scat, gqa).float()
    ref = F_nn.scaled_dot_product_attention(q.float(), k[:, :, idx].float(), v[:, :, idx].float(), enable_gqa=gqa)
    diff = max((out_fixed - out_scat).abs().max().item(), (out_fixed - ref).abs().max().item(),
               (out_scat - ref).abs().max().item())
    tolerance = 2e-4 if q.dtype == torch.float32 else 2e-2
    if not math.isfinite(diff) or diff > tolerance:
        raise RuntimeError(f"fixed and scattered layouts disagree (max abs diff {diff:.3g} > {tolerance:.1g}, "
                           f"context {k.shape[2]})")
    return diff


def fumble(args) -> list[dict]:
    """The rows of ``scripts/bench_engine.py fumble`` (``args``: its options: device, dtype, contexts, heads,
    kv_heads, head_dim, streams, k, budget, sink, scatter, repeats, warmup, seed, no_compile)."""
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    import torch._dynamo.config as dynamo_config

    # A silent fallback after the recompile limit would time the eager path: make it an error (caught -> note).
    patch = {"fail_on_recompile_limit_hit": True,
             "recompile_limit": max(dynamo_config.recompile_limit, len(args.contexts) + 4)}
    patch = {key: val for key, val in patch.items() if hasattr(dynamo_config, key)}
    with warnings.catch_warnings(), dynamo_config.patch(**patch):
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        warnings.filterwarnings("ignore", message=".*_compile flag on create_block_mask.*")
        return fumble_rows(args, device, dtype)


def fumble_rows(args, device: torch.device, dtype: torch.dtype) -> list[dict]:
    flex = flex_layouts(not args.no_compile)
    compiled_mask = Fallback(create_block_mask, not args.no_compile, dynamic=True)
    gen = torch.Generator().manual_seed(args.seed)
    H, Hkv, D, F, Q = args.heads, args.kv_heads, args.head_dim, args.budget, args.streams * args.k
    shape = {"budget": F, "heads": H, "kv_heads": Hkv, "head_dim": D, "streams": args.streams, "k": args.k,
             "q_rows": Q, "dtype": args.dtype, "device": str(device)}
    for ctx in (c for c in args.contexts if c < F):
        print(f"NOTE: skipping context {ctx} < budget {F}", file=sys.stderr)
    contexts = [c for c in args.contexts if c >= F]
    if not contexts:
        raise SystemExit("error: every --contexts value is smaller than --budget")
    rows: list[dict] = []
    for ctx in contexts:
        q = torch.randn(1, H, Q, D, generator=gen).to(device, dtype)
        k = torch.randn(1, Hkv, ctx, D, generator=gen).to(device, dtype)
        v = torch.randn(1, Hkv, ctx, D, generator=gen).to(device, dtype)
        fixed_len = torch.tensor([F], device=device)
        torch._dynamo.mark_static(fixed_len)
        layouts = [("fixed", "", None, fixed_region_mask(fixed_len))]
        for scatter in args.scatter:
            idx = scattered_slots(scatter, ctx, F, args.sink, gen).to(device)
            # one bitmap of the largest context's size (a static cache's capacity): compiled graphs are reused
            selected = torch.zeros(max(contexts), dtype=torch.bool, device=device)
            selected[idx] = True
            torch._dynamo.mark_static(selected)
            layouts.append(("scattered", scatter, idx, selected_mask(selected)))
        bm_fixed = None
        for layout, scatter, idx, mask_mod in layouts:
            b_eager = build_ms(create_block_mask, mask_mod, Q, ctx, device, args.repeats)
            b_comp = build_ms(compiled_mask, mask_mod, Q, ctx, device, args.repeats) if not args.no_compile else None
            bm = create_block_mask(mask_mod, None, None, Q, ctx, device=device)  # built once, outside the timed loop
            bm_fixed = bm if layout == "fixed" else bm_fixed
            first, med, low = timed(lambda: flex[layout](q, k, v, bm, Hkv != H), args.repeats, args.warmup, device)
            diff = check_equivalence(flex, q, k, v, idx, bm_fixed, bm, F) if idx is not None else None
            active, tiles = block_counts(bm)
            rows.append({"context": ctx, "layout": layout, "scatter": scatter, **shape,
                         "compiled": int(flex[layout].compiled), "median_ms": med, "min_ms": low,
                         "first_call_ms": first, "active_kv_blocks": active, "total_kv_tiles": tiles,
                         "block_density": active / tiles, "block_size": bm.BLOCK_SIZE[1],
                         "mask_build_eager_ms": b_eager, "mask_build_compiled_ms": b_comp, "check_max_abs_diff": diff,
                         "threads": torch.get_num_threads(), "torch": torch.__version__})
        print(f"  context {ctx}: done", file=sys.stderr, flush=True)
    return rows


def fumble_report(args, rows: list[dict]) -> None:
    """Fixed vs scattered side by side per context (the first ``--threads`` count), and the plot (``--plot``)."""
