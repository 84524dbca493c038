"""What FAFO's region swaps cost per decoding step: padded to the bound a step knows without reading the device,
against only the pairs that move an entry.

FAFO keeps its compressed view C(kv) in the first slots of the static cache by swapping entries in and out (FAFO
paper, section 4.4 and App. H). Per (layer, KV head) the swap lists pair each row's evicted region slots with the
slots of the entries it admits, and each other region slot, which keeps its entry, with itself. A step could pad
them to the most entries any row may swap, computed from Python ints (``Compression.max_swaps``), and read nothing
back: for Quest that bound is its whole ``token_budget``, since each step's query may choose other pages. A step
instead reads back how many entries its busiest row swaps (one sync) and lists that many pairs per row.
On a device the lists are one gather into a temporary and one scatter back (``KVCache.move_rows``), so padding costs
memory traffic; on a CPU the cache drops the self-pairs first (reading host lists costs no sync).

This times ``KVCache.move_rows`` on a cache of a model's widths for lists of ``--width`` pairs per (layer, KV head),
of which ``--fractions`` move an entry: ``padded`` to the bound, ``compact`` as a step runs them when every row
swaps as many entries (the busiest row's count is then every row's). Both variants are checked to leave the same
cache. The difference is what the step's one read saves; a sync costs some tens of microseconds on a GPU. On CUDA
the defaults are Llama-2-7B's widths in float16 and Quest's default budget::

    python scripts/bench_region_swaps.py --device cuda --out results/bench/region_swaps.csv
    python scripts/bench_region_swaps.py --device cuda --kv-heads 8   # a GQA model of 8 KV heads
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fafo.bench.timing import load_average  # noqa: E402
from fafo.bench.tools.engine_timing import copy_bandwidth, device_name, timed  # noqa: E402
from fafo.engine.cache import KVCache  # noqa: E402
from fafo.engine.engine import DTYPES  # noqa: E402

COLUMNS = ["device", "device_name", "dtype", "layers", "kv_heads", "head_dim", "slots", "width", "fraction",
           "real_pairs", "variant", "median_ms", "min_ms", "moved_bytes", "listed_bytes", "copy_gb_per_s", "threads",
           "load", "torch"]
# (layers, KV heads, head dim, dtype) when not given: Llama-2-7B on CUDA, the host table's widths on a CPU
DEFAULT_WIDTHS = {"cuda": (32, 32, 128, "float16"), "cpu": (32, 2, 16, "float32")}


def swap_lists(layers: int, heads: int, width: int, real: int, slots: int, generator: torch.Generator):
    """``(src, dst)``, each ``[L, H, 2 * width]``, laid out as ``FixedRegion`` lays out a reselection's swaps: in
    every row ``real`` pairs exchange a region slot (below ``width``) with a slot past the region, each row its own
    random picks, and the other region slots, which keep their entries, are paired with themselves."""
    rows = layers * heads
    out = torch.rand(rows, width, generator=generator).argsort(-1)  # the region's slots, the evicted ones first
    into = out.clone()  # the kept slots pair with themselves
    into[:, :real] = torch.rand(rows, slots - width, generator=generator).argsort(-1)[:, :real] + width
    out, into = out.view(layers, heads, width), into.view(layers, heads, width)
    return torch.cat([out, into], -1), torch.cat([into, out], -1)


def region_swaps(device: torch.device, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, slots: int,
                 width: int, fractions: list[float], repeats: int, seed: int = 0) -> list[dict]:
    """One row per (fraction, variant): the median and fastest ``move_rows`` over ``repeats`` calls
    (``0 < width <= slots - width``: as many slots past the region as in it)."""
    cache = KVCache(layers, 1, kv_heads, slots, head_dim, dtype, device)
    cache.kv.normal_()
    cache.entry_table()  # built once, as FixedRegion builds it before decoding
    entry = head_dim * cache.kv.element_size() * 2  # a key and a value row
    copy = copy_bandwidth(device)
    rows, gen = [], torch.Generator().manual_seed(seed)
    for fraction in fractions:
        real = max(1, round(fraction * width))
        src, dst = (t.to(device) for t in swap_lists(layers, kv_heads, width, real, slots, gen))
        keep = torch.cat([torch.arange(real), torch.arange(width, width + real)]).to(device)  # the real pairs
        lists = {"padded": (src, dst), "compact": (src[..., keep], dst[..., keep])}
        after = {}
        for variant, (s, d) in lists.items():  # the same cache afterwards, whichever lists moved it
            probe = KVCache.view(cache.kv.clone())
            probe.move_rows(s, d)
            after[variant] = probe.kv
        if not torch.equal(after["padded"], after["compact"]) or torch.equal(after["padded"], cache.kv):
            raise RuntimeError(f"region swaps: padded and compact lists left different caches (fraction {fraction})")
        del after, probe
        for variant, (s, d) in lists.items():
            _, median_ms, min_ms = timed(lambda: cache.move_rows(s, d), repeats, 2, device)
            rows.append({
                "device": device.type, "device_name": device_name(device), "dtype": str(dtype).split(".")[-1],
                "layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "slots": slots, "width": width,
                "fraction": fraction, "real_pairs": real, "variant": variant, "median_ms": round(median_ms, 4),
                "min_ms": round(min_ms, 4), "moved_bytes": layers * kv_heads * 2 * real * entry,
                "listed_bytes": s.numel() * entry, "copy_gb_per_s": round(copy / 1e9, 1),
                "threads": torch.get_num_threads(), "load": load_average(), "torch": torch.__version__})
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", type=int, help="default: 32 (Llama-2-7B on CUDA; the host table's on a CPU)")
    p.add_argument("--kv-heads", type=int, help="default: 32 on CUDA, 2 on a CPU")
    p.add_argument("--head-dim", type=int, help="default: 128 on CUDA, 16 on a CPU")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default: float16 on CUDA, float32 on a CPU")
    p.add_argument("--slots", type=int, default=4096, help="cache slots (a 4k context)")
    p.add_argument("--width", type=int, default=1024, help="pairs listed per (layer, KV head): Quest's token_budget")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0],
                   help="share of the listed pairs that move an entry")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, help="torch threads on a CPU")
    p.add_argument("--out", type=Path, default=Path("results/bench/region_swaps.csv"))
    args = p.parse_args(argv)
    if any(not 0 < f <= 1 for f in args.fractions):
        p.error("--fractions: each must be in (0, 1]")
    if not 0 < args.width <= args.slots - args.width:
        p.error(f"--width {args.width} must be positive and leave as many slots past the region (--slots "
                f"{args.slots} >= 2 x width); raise --slots or lower --width")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    layers, heads, dim, dtype = DEFAULT_WIDTHS["cuda" if device.type == "cuda" else "cpu"]
    rows = region_swaps(device, args.layers or layers, args.kv_heads or heads, args.head_dim or dim,
                        DTYPES[args.dtype or dtype], args.slots, args.width, args.fractions, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print("| fraction | real pairs | padded ms | compact ms | padded / compact | moved MB | listed MB (padded) |")
    print("|---|---|---|---|---|---|---|")
    for padded, compact in zip(rows[::2], rows[1::2]):
        ratio = padded["median_ms"] / max(compact["median_ms"], 1e-9)
        print(f"| {padded['fraction']} | {padded['real_pairs']} | {padded['median_ms']:.3f} | "
              f"{compact['median_ms']:.3f} | {ratio:.2f} | {padded['moved_bytes'] / 1e6:.1f} | "
              f"{padded['listed_bytes'] / 1e6:.1f} |")
    r = rows[0]
    print(f"{r['device_name']}, {r['dtype']}, {r['layers']} layers x {r['kv_heads']} KV heads x {r['head_dim']}, "
          f"width {r['width']}, medians of {args.repeats} (copy bandwidth {r['copy_gb_per_s']} GB/s, "
          f"load {r['load']}); CSV: {args.out}")
    return rows


if __name__ == "__main__":
    main()
