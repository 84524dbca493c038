"""Micro-benchmark: FAFO's fixed-region KV layout vs. a scattered selection, under FlexAttention.

What it measures
----------------
FAFO's "fumble" queries (n streams x k tokens, e.g. n=40, k=6 -> 240 query rows) attend only to a compressed
subset C(kv) of the KV cache (e.g. F=760 entries: a StreamingLLM sink + local window). FAFO keeps those entries
physically contiguous in a *fixed* region at the head of the cache (slots ``[0, F)``), so one static FlexAttention
block mask touches only the first ``ceil(F / 128)`` KV blocks and the attention cost stays flat as the context
grows (FAFO paper, section 4.4 "fixed compressed region" and App. H).

Without that layout the same F entries are scattered over the whole cache: StreamingLLM applied to a plain cache
leaves the sink at the start and the local window at the end (``--scatter streaming``), a selection such as
Quest's pages lands anywhere (``--scatter random``: F uniformly random slots). The block mask then has (partially)
active KV blocks wherever a selected entry lives, and the kernel loads many more blocks. In a plain cache such a
mask also changes every decode step (the window slides, the selection is re-scored), so it would have to be
rebuilt per step; the build time is reported apart for that reason.

For every context length the script

* builds random queries ``q: [1, H, n*k, D]`` and a cache ``k, v: [1, H_kv, ctx, D]``;
* **fixed**: mask_mod ``kv_idx < fixed_len[0]`` (the length lives in a tensor, so the compiled kernel is not
  specialised on it), block mask built once with ``KV_LEN = ctx``, compiled ``flex_attention`` over the whole
  cache tensor;
* **scattered**: the same number F of selected slots, mask_mod ``selected[kv_idx]`` (a boolean tensor), block mask
  built once, the same compiled ``flex_attention``;
* reports the active KV blocks of each BlockMask (``kv_num_blocks + full_kv_num_blocks``, summed over query
  blocks) out of all (query block, KV block) tiles, the block-mask build time (eager ``create_block_mask`` and,
  when compiling, ``torch.compile(create_block_mask, dynamic=True)``), the first call (compilation) apart, and
  the median of ``--repeats`` timed calls after ``--warmup`` calls;
* checks once per context that both layouts give the same output when the fixed region holds the scattered
  entries' K/V (they are copied into slots ``[0, F)`` of a second cache), and that both match dense SDPA over the
  gathered entries; a mismatch raises.

It writes one CSV row per context and layout (``--out``), prints a table, and with ``--plot`` saves a PNG
(time vs. context, log2 x-axis) next to the CSV.

Examples::

    python scripts/bench_fumble_attention.py                                  # paper-sized, 1k..32k
    python scripts/bench_fumble_attention.py --scatter streaming random --plot
    python scripts/bench_fumble_attention.py --contexts 512 1024 --heads 4 --kv-heads 2 --head-dim 16 \\
        --streams 4 --k 2 --budget 130 --repeats 2 --warmup 1 --out /tmp/x.csv   # CI-sized

On CPU, eager ``flex_attention`` is an unfused reference implementation (it materialises the full score matrix and
ignores block sparsity), so only the compiled numbers say anything about the layout; ``--no-compile`` is for
smoke tests. If compilation fails, the script falls back to eager with a printed note and marks the rows.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F_nn

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "results" / "bench" / "fumble_attention.csv"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SCATTERS = ("streaming", "random")
CSV_COLUMNS = [
    "context", "layout", "scatter", "budget", "heads", "kv_heads", "head_dim", "streams", "k", "q_rows", "dtype",
    "device", "compiled", "median_ms", "min_ms", "first_call_ms", "active_kv_blocks", "total_kv_tiles",
    "block_density", "block_size", "mask_build_eager_ms", "mask_build_compiled_ms", "check_max_abs_diff",
    "threads", "torch",
]
EAGER_WARNING = "flex_attention called without torch.compile"


# ----------------------------------------------------------------------------------------------- mask_mods
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
    q_len, kv_len = bm.seq_lengths
    q_bs, kv_bs = bm.BLOCK_SIZE
    batch_heads = math.prod(bm.kv_num_blocks.shape[:-1])
    return active, batch_heads * math.ceil(q_len / q_bs) * math.ceil(kv_len / kv_bs)


# ----------------------------------------------------------------------------------------------- runners
def _flex_fixed(q, k, v, block_mask, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


def _flex_scattered(q, k, v, block_mask, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


class Flex:
    """flex_attention, compiled or eager; a failing compiled call falls back to eager, with a printed note.

    torch 2.13 quirk: when dynamo's automatic-dynamic marks the tensor a mask_mod closes over as dynamic (its
    size changed between calls: ``fixed_len`` [1] then ``selected`` [ctx] through one shared compiled
    ``flex_attention``, or ``selected`` growing with the context), the CPU flex template fails to build
    (``CppCompileError: 'cur_qSplitSize8' was not declared``). So the captured tensors are marked static
    (:func:`_mark_static`; q/k/v may still go dynamic), the ``selected`` bitmap has one size for all contexts,
    and each layout gets its own compiled entry point (a distinct code object: separate caches, recompile counts).
    """

    ENTRY = {"fixed": _flex_fixed, "scattered": _flex_scattered}

    def __init__(self, compiled: bool, dynamic: bool | None):
        from torch.nn.attention.flex_attention import flex_attention

        self.eager = flex_attention
        self.compiled = compiled
        self.fns = {name: torch.compile(fn, dynamic=dynamic) for name, fn in self.ENTRY.items()} if compiled else {}
        self.note: str | None = None

    def __call__(self, layout: str, q, k, v, block_mask):
        gqa = q.shape[1] != k.shape[1]
        if self.compiled:
            try:
                return self.fns[layout](q, k, v, block_mask, gqa)
            except Exception as e:  # noqa: BLE001 - any compile failure: report and go on eagerly
                self.note = f"compiled flex_attention failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
                print(f"NOTE: {self.note}; falling back to eager flex_attention (unfused, block sparsity ignored "
                      "on CPU): the remaining timings do not reflect the layout", file=sys.stderr)
                self.compiled = False
        return self.eager(q, k, v, block_mask=block_mask, enable_gqa=gqa)


class MaskBuilder:
    """create_block_mask, eager and (optionally) compiled with dynamic=True."""

    def __init__(self, compiled: bool):
        from torch.nn.attention.flex_attention import create_block_mask

        self.eager = create_block_mask
        self.compiled = torch.compile(create_block_mask, dynamic=True) if compiled else None
        self.note: str | None = None

    def build(self, mask_mod, q_len, kv_len, device, compiled=False):
        fn = self.compiled if compiled else self.eager
        return fn(mask_mod, None, None, q_len, kv_len, device=device)

    def time(self, mask_mod, q_len, kv_len, device, repeats, sync) -> tuple[float, float | None]:
        """(median eager build ms, median compiled build ms or None), compilation excluded."""
        eager = _timed(lambda: self.build(mask_mod, q_len, kv_len, device), repeats, 1, sync)[1]
        comp = None
        if self.compiled is not None:
            try:
                comp = _timed(lambda: self.build(mask_mod, q_len, kv_len, device, True), repeats, 1, sync)[1]
            except Exception as e:  # noqa: BLE001
                self.note = f"compiled create_block_mask failed ({type(e).__name__}); reporting eager build only"
                print(f"NOTE: {self.note}", file=sys.stderr)
                self.compiled = None
        return eager, comp


def _mark_static(t: torch.Tensor) -> torch.Tensor:
    """Keep a mask_mod's captured tensor static under torch.compile (see :class:`Flex`)."""
    torch._dynamo.mark_static(t)
    return t


def _sync_fn(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _timed(fn, repeats: int, warmup: int, sync) -> tuple[float, float, float]:
    """(first call ms, median ms, min ms): the first call (compilation) apart, then warmup, then repeats."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(max(0, warmup - 1)):
        fn()
    sync()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(times), min(times)


def _tolerance(dtype: torch.dtype) -> float:
    return 2e-4 if dtype == torch.float32 else 2e-2


def check_equivalence(flex: Flex, q, k, v, idx, bm_fixed, bm_scat, budget) -> float:
    """Fixed layout over a cache holding the selected entries in [0, F) == scattered layout == dense SDPA."""
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :budget], v2[:, :, :budget] = k[:, :, idx], v[:, :, idx]
    out_fixed = flex("fixed", q, k2, v2, bm_fixed).float()
    out_scat = flex("scattered", q, k, v, bm_scat).float()
    ref = F_nn.scaled_dot_product_attention(q.float(), k[:, :, idx].float(), v[:, :, idx].float(),
                                            enable_gqa=q.shape[1] != k.shape[1])
    diff = max((out_fixed - out_scat).abs().max().item(), (out_fixed - ref).abs().max().item(),
               (out_scat - ref).abs().max().item())
    if not math.isfinite(diff) or diff > _tolerance(q.dtype):
        raise RuntimeError(f"fixed and scattered layouts disagree (max abs diff {diff:.3g} > "
                           f"{_tolerance(q.dtype):.1g}, context {k.shape[2]})")
    return diff


# ----------------------------------------------------------------------------------------------- main
@dataclass
class Row:
    context: int
    layout: str
    scatter: str
    first_call_ms: float
    median_ms: float
    min_ms: float
    active: int
    tiles: int
    block_size: int
    build_eager_ms: float
    build_compiled_ms: float | None
    diff: float | None
    compiled: bool


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768],
                   help="cache lengths (KV_LEN) to measure")
    p.add_argument("--heads", type=int, default=32, help="query heads H")
    p.add_argument("--kv-heads", type=int, default=8, help="KV heads H_kv (GQA when < heads)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--streams", type=int, default=40, help="fumble streams n")
    p.add_argument("--k", type=int, default=6, help="tokens per stream k (query rows = n*k)")
    p.add_argument("--budget", type=int, default=760, help="compressed KV budget F = |C(kv)|")
    p.add_argument("--sink", type=int, default=4, help="StreamingLLM attention-sink tokens (--scatter streaming)")
    p.add_argument("--scatter", nargs="+", choices=SCATTERS, default=["streaming"],
                   help="scattered layout(s): StreamingLLM in a plain cache and/or uniformly random slots")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help="auto: float32 on CPU, float16 on CUDA")
    p.add_argument("--device", default=None, help="default: cuda if available else cpu")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (median reported)")
    p.add_argument("--warmup", type=int, default=2, help="calls before timing (the first one compiles)")
    p.add_argument("--no-compile", action="store_true",
                   help="eager flex_attention / create_block_mask (on CPU: unfused, ignores block sparsity)")
    p.add_argument("--no-compile-block-mask", action="store_true",
                   help="time only eager create_block_mask (skips compiling it: saves ~10-15 s on a cold cache)")
    p.add_argument("--dynamic", choices=["auto", "true", "false"], default="auto",
                   help="torch.compile dynamic= for flex_attention (auto: static first, dynamic after a recompile)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads on CPU (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="CSV path (directories are created)")
    p.add_argument("--plot", action="store_true", help="also save a PNG next to the CSV")
    args = p.parse_args(argv)
    for name in ("heads", "kv_heads", "head_dim", "streams", "k", "budget"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.heads % args.kv_heads:
        p.error(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")
    if args.sink < 0 or args.sink > args.budget:
        p.error("--sink must be in [0, --budget]")
    return args


def run(args: argparse.Namespace) -> list[Row]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype] if args.dtype != "auto" else (torch.float16 if device.type == "cuda" else torch.float32)
    args.device_name, args.dtype_name = str(device), str(dtype).removeprefix("torch.")
    sync = _sync_fn(device)
    compiled = not args.no_compile
    dynamic = {"auto": None, "true": True, "false": False}[args.dynamic]
    flex, masks = Flex(compiled, dynamic), MaskBuilder(compiled and not args.no_compile_block_mask)
    gen = torch.Generator().manual_seed(args.seed)
    H, Hkv, D, F = args.heads, args.kv_heads, args.head_dim, args.budget
    Q = args.streams * args.k
    contexts = []
    for ctx in args.contexts:
        if ctx < F:
            print(f"NOTE: skipping context {ctx} < budget {F}", file=sys.stderr)
        else:
            contexts.append(ctx)
    if not contexts:
        raise SystemExit("error: every --contexts value is smaller than --budget")
    rows: list[Row] = []
    for ctx in contexts:
        q = torch.randn(1, H, Q, D, generator=gen).to(device, dtype)
        k = torch.randn(1, Hkv, ctx, D, generator=gen).to(device, dtype)
        v = torch.randn(1, Hkv, ctx, D, generator=gen).to(device, dtype)

        fixed_len = torch.tensor([F], device=device)
        _mark_static(fixed_len)
        fixed_mod = fixed_region_mask(fixed_len)
        b_eager, b_comp = masks.time(fixed_mod, Q, ctx, device, args.repeats, sync)
        bm_fixed = masks.build(fixed_mod, Q, ctx, device)  # built once, outside the timed loop
        active, tiles = block_counts(bm_fixed)
        first, med, mn = _timed(lambda: flex("fixed", q, k, v, bm_fixed), args.repeats, args.warmup, sync)
        rows.append(Row(ctx, "fixed", "", first, med, mn, active, tiles, bm_fixed.BLOCK_SIZE[1], b_eager, b_comp,
                        None, flex.compiled))

        for scatter in args.scatter:
            idx = scattered_slots(scatter, ctx, F, args.sink, gen).to(device)
            # One bitmap of the largest context's size for all contexts (a static cache's capacity): the mask
            # tensor's shape never changes, so the compiled graphs are reused across contexts.
            selected = torch.zeros(max(contexts), dtype=torch.bool, device=device)
            selected[idx] = True
            _mark_static(selected)
            scat_mod = selected_mask(selected)
            b_eager, b_comp = masks.time(scat_mod, Q, ctx, device, args.repeats, sync)
            bm_scat = masks.build(scat_mod, Q, ctx, device)
            active, tiles = block_counts(bm_scat)
            first, med, mn = _timed(lambda: flex("scattered", q, k, v, bm_scat), args.repeats, args.warmup, sync)
            diff = check_equivalence(flex, q, k, v, idx, bm_fixed, bm_scat, F)
            rows.append(Row(ctx, "scattered", scatter, first, med, mn, active, tiles, bm_scat.BLOCK_SIZE[1],
                            b_eager, b_comp, diff, flex.compiled))
        print(f"  context {ctx}: done", file=sys.stderr, flush=True)
    return rows


def write_csv(rows: list[Row], args) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fmt = lambda x: "" if x is None else (f"{x:.4f}" if isinstance(x, float) else x)  # noqa: E731
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({
                "context": r.context, "layout": r.layout, "scatter": r.scatter, "budget": args.budget,
                "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "streams": args.streams,
                "k": args.k, "q_rows": args.streams * args.k, "dtype": args.dtype_name, "device": args.device_name,
                "compiled": int(r.compiled), "median_ms": fmt(r.median_ms), "min_ms": fmt(r.min_ms),
                "first_call_ms": fmt(r.first_call_ms), "active_kv_blocks": r.active, "total_kv_tiles": r.tiles,
                "block_density": f"{r.active / r.tiles:.4f}", "block_size": r.block_size,
                "mask_build_eager_ms": fmt(r.build_eager_ms), "mask_build_compiled_ms": fmt(r.build_compiled_ms),
                "check_max_abs_diff": "" if r.diff is None else f"{r.diff:.3g}",
                "threads": args.threads_used, "torch": torch.__version__,
            })


def print_table(rows: list[Row], args) -> None:
    fixed = {r.context: r for r in rows if r.layout == "fixed"}
    head = (f"{'context':>8} {'scatter':>9} {'fixed_ms':>9} {'scat_ms':>9} {'ratio':>6} {'blocks fix/scat/all':>20} "
            f"{'build_ms fix/scat (eager)':>26} {'(compiled)':>14} {'compile_s f/s':>14}")
    print(f"\nFumble attention: q [1,{args.heads},{args.streams * args.k},{args.head_dim}], kv heads {args.kv_heads}, "
          f"budget F={args.budget}, {args.dtype_name} on {args.device_name}, "
          f"{'compiled' if not args.no_compile else 'EAGER'} flex_attention, {args.threads_used} threads, "
          f"median of {args.repeats}")
    print(head)
    print("-" * len(head))
    c = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    for r in rows:
        if r.layout != "scattered":
            continue
        f = fixed[r.context]
        print(f"{r.context:>8} {r.scatter:>9} {f.median_ms:>9.2f} {r.median_ms:>9.2f} "
              f"{r.median_ms / f.median_ms:>6.2f} "
              f"{f'{f.active}/{r.active}/{r.tiles}':>20} "
              f"{f'{f.build_eager_ms:.2f}/{r.build_eager_ms:.2f}':>26} "
              f"{f'{c(f.build_compiled_ms)}/{c(r.build_compiled_ms)}':>14} "
              f"{f'{f.first_call_ms / 1e3:.1f}/{r.first_call_ms / 1e3:.1f}':>14}")
    if not all(r.compiled for r in rows):
        print("NOTE: some rows ran eager flex_attention (unfused; on CPU it ignores block sparsity): "
              "their times do not reflect the layout.")


def plot(rows: list[Row], args) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = args.out.with_suffix(".png")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    series = {"fixed": [r for r in rows if r.layout == "fixed"]}
    for s in args.scatter:
        series[f"scattered ({s})"] = [r for r in rows if r.scatter == s]
    for name, rs in series.items():
        xs = [r.context for r in rs]
        ax1.plot(xs, [r.median_ms for r in rs], marker="o", label=name)
        ax2.plot(xs, [r.build_eager_ms for r in rs], marker="o", label=f"{name}, eager")
        if any(r.build_compiled_ms is not None for r in rs):
            ax2.plot(xs, [r.build_compiled_ms for r in rs], marker="x", ls="--", label=f"{name}, compiled")
    for ax, title in ((ax1, "flex_attention (median ms)"), (ax2, "create_block_mask (median ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (KV_LEN)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Fumble attention, {args.streams}x{args.k} queries, F={args.budget}, "
                 f"{args.dtype_name} on {args.device_name}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> list[Row]:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    import torch._dynamo.config as dynamo_config

    # A silent fallback after the recompile limit would time the eager path: make it an error (caught -> note).
    # Headroom in case graphs are rebuilt per context (e.g. --dynamic false).
    patch = {"fail_on_recompile_limit_hit": True,
             "recompile_limit": max(dynamo_config.recompile_limit, len(args.contexts) + 4)}
    patch = {key: val for key, val in patch.items() if hasattr(dynamo_config, key)}
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        with warnings.catch_warnings(), dynamo_config.patch(**patch):
            warnings.filterwarnings("ignore", message=EAGER_WARNING)
            warnings.filterwarnings("ignore", message=".*_compile flag on create_block_mask.*")
            rows = run(args)
            args.threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    write_csv(rows, args)
    print_table(rows, args)
    print(f"\nwrote {args.out}")
    if args.plot:
        print(f"wrote {plot(rows, args)}")
    return rows


if __name__ == "__main__":
    main()
