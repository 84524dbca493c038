"""Engine benchmarks, one mode each; a CSV per run (``--out``), medians with the thread count and load beside them.

Decode steps are compiled where the runner compiles them (``--compile auto``: on CUDA ``reduce-overhead`` with
CUDA graphs, inductor and compiled FlexAttention, as ``bench.compile=auto``; eager on a CPU), every shape is warmed
before it is timed (compilation and CUDA-graph recording are never timed), and without ``--model`` the model is a
random Llama built in memory on the device in the benchmark's dtype (``--shape``; nothing is written to disk):
``llama2-7b`` on CUDA, a small one on a CPU.

* ``roofline`` (default): one engine forward of ``--steps`` new tokens (1 = vanilla's step, 481 = a FAFO step
  n=m=40, k=6: ``1 + m*k + n*k``) over a cache of each ``--contexts`` length: the bytes it must read (weights +
  prefix KV), GB/s, the fraction of a device-to-device copy's bandwidth measured here and, on a known GPU, of the
  peak. ``--cache-slots N`` sizes the cache as a long run would. ``--curve``: the cost curve (steps 1..512,
  contexts 256..4096) and each method setting's tokens per forward and break-even tau
  (:mod:`fafo.bench.tools.cost_curve`; give the CSV to a run as ``bench.cost_curve=<csv>``). ``--batch 1 4 16``:
  the same grid for forwards of B rows at once (a ``batch`` column; batch 1 always measured), so the curve prices
  ``bench.batch_size`` runs and gives each method's break-even tau per batch size.
* ``vs-hf``: vanilla greedy decode per token, ours vs transformers ``generate`` (sdpa; dynamic and static cache)
  on the same weights (shared tensors) at ``--prompts`` lengths, prefill excluded alike: both compiled on CUDA
  (transformers compiles its static-cache decode itself), both eager on a CPU.
* ``fafo-step``: one FAFO step fused vs FAFO-2forward's two forwards after a ``--contexts`` prompt, and the share
  of the step inside ``attend``, on ``dense`` (reference maths) and ``sdpa`` (fast paths); eager by design (the
  share is measured by wrapping ``attend``).
* ``fumble``: FAFO's fumble queries over a compressed KV budget F under compiled FlexAttention, the fixed region
  vs the same entries scattered (:mod:`fafo.bench.tools.fumble_attention`).
* ``host``: every method config's work per decoding step outside its forwards (:mod:`fafo.bench.tools.host_work`).

Variants are interleaved over ``--repeats`` rounds::

    python scripts/bench_engine.py --device cuda --contexts 1024 16384 --plot
    python scripts/bench_engine.py --curve --model /ckpts/Llama-2-7b-chat-hf --out results/bench/curve.csv
    python scripts/bench_engine.py --curve --batch 1 4 16 64 --out results/bench/curve_batch.csv
    python scripts/bench_engine.py vs-hf --threads 1 2 --rounds 3
    python scripts/bench_engine.py fafo-step --threads 2 --context 1024
    python scripts/bench_engine.py fumble --scatter streaming random --plot
    python scripts/bench_engine.py host --layers 32 64 --new-tokens 64 --threads 1
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fafo.bench.tools import host_work  # noqa: E402
from fafo.bench.tools.cost_curve import CostCurve  # noqa: E402
from fafo.bench.tools.engine_timing import (AttentionTimer, bytes_per_forward, copy_bandwidth, device_name,  # noqa: E402
                                      fill_cache, forward_rows_step, forward_step, hf_ms_per_token,
                                      ours_ms_per_token, timed, warm_calls)
from fafo.bench.tools.fumble_attention import FUMBLE_COLUMNS, SCATTERS, fumble  # noqa: E402
from fafo.bench.tools.random_model import SHAPES, llama_config, random_engine, transformers_twin  # noqa: E402
from fafo.bench.timing import load_average, sync  # noqa: E402
from fafo.engine.compiled import COMPILE_MODES, WITHOUT_CUDAGRAPHS, CompileOptions, compile_stats  # noqa: E402
from fafo.engine.engine import DTYPES, Engine  # noqa: E402

MODES = ("roofline", "vs-hf", "fafo-step", "fumble", "host")
DEFAULTS = {  # per mode: (contexts, repeats, out)
    "roofline": ([1024, 2048, 4096], 5, "engine.csv"), "vs-hf": ([1024], 3, "decode.csv"),
    "fafo-step": ([1024], 3, "decode.csv"), "fumble": ([1024, 2048, 4096, 8192, 16384, 32768], 5,
                                                      "fumble_attention.csv"), "host": ([], 5, "host.csv")}
# Peak HBM bandwidth in bytes/s, matched against torch.cuda.get_device_name().
PEAK_BANDWIDTH = {
    "A100-SXM4-80GB": 2.039e12, "A100-SXM4-40GB": 1.555e12, "A100-PCIE-40GB": 1.555e12, "A100 80GB PCIe": 1.935e12,
    "H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12, "H100 NVL": 3.9e12, "H200": 4.8e12,
}
COLUMNS = ["device", "dtype", "attention", "batch", "context", "step_tokens", "median_ms", "min_ms", "bytes_read",
           "gb_per_s", "copy_fraction", "peak_fraction", "tokens_per_s", "threads", "loadavg", "torch", "device_name"]
DECODE_COLUMNS = ["bench", "threads", "context", "variant", "median_ms", "ratio_vs_ours", "attention_share",
                  "loadavg", "note"]
CURVE_STEPS = [1, 2, 4, 8, 16, 32, 64, 120, 128, 256, 481, 512]
CURVE_CONTEXTS = [256, 1024, 4096]


# ----------------------------------------------------------------------------------------------- shared
def default_shape(args) -> str:
    """The random model of a run without --model: Llama-2-7B's shape on CUDA; on a CPU a small one."""
    if args.device.startswith("cuda"):
        return "llama2-7b"
    return "embedded" if args.mode in ("roofline", "fumble") else "156m"


def compile_options(args) -> CompileOptions | None:
    """``--compile auto``: the runner's choice (``bench.compile=auto``): reduce-overhead on CUDA, eager on CPU."""
    mode = args.compile
    if mode == "auto":
        mode = "reduce-overhead" if args.device.startswith("cuda") else "off"
    if mode == "off":
        return None
    return CompileOptions(mode=mode, backend=args.compile_backend, attention=args.compile_attention)


def load_engine(args, slots: int, backend: str | None = None, compiled: bool = True) -> Engine:
    """``--model`` from disk, else a random model of ``--shape`` (+ ``--spec``) drawn on the device; compiled
    steps as ``--compile`` says; the cache allocated once with ``slots`` (compiled graphs are specialised to it)."""
    if args.model:
        engine = Engine.from_pretrained(args.model, device=args.device, dtype=args.dtype,
                                        backend=backend or args.attention)
    else:
        config = llama_config(args.shape, **json.loads(args.spec or "{}"))
        engine = random_engine(config, args.device, args.dtype, backend=backend or args.attention, seed=args.seed)
    options = compile_options(args) if compiled else None
    if options is not None:
        engine.enable_compile(options)
    engine.cache(max(args.cache_slots or 0, slots))
    return engine


def save_plot(panels, out: Path, title: str) -> None:
    """One log2-context panel per ``(title, {label: (xs, ys)}, y label, log y)``, saved as ``out``'s PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (name, series, ylabel, logy) in zip(axes[0], panels):
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="x" if "compiled" in label else "o", label=label)
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set(xlabel="context (cached tokens)", ylabel=ylabel, title=name)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    print(f"wrote {out.with_suffix('.png')}")


# ----------------------------------------------------------------------------------------------- roofline
def method_steps() -> dict[str, tuple[int, ...]]:
    """Tokens per target forward of each method's default and equal-budget settings (``Decoder.forward_tokens``)."""
    from baselines.lookahead import LookaheadDecoder
    from baselines.vanilla import VanillaDecoder
    from fafo.fafo import FAFODecoder

    decoders = {"vanilla": VanillaDecoder(), "fafo (n=m=40, k=6)": FAFODecoder(),
                "fafo-2forward (n=m=40, k=6)": FAFODecoder(fused=False), "lookahead (5/15/15)": LookaheadDecoder()}
    for budget, (n, k), w in ((16, (2, 4), 2), (120, (10, 6), 15), (480, (40, 6), 60)):
        decoders[f"fafo @{budget} (n=m={n}, k={k})"] = FAFODecoder(n=n, k=k)
        decoders[f"lookahead @{budget} (5/{w}/{w})"] = LookaheadDecoder(level=5, window=w, guess_set=w)
    return {name: d.forward_tokens() for name, d in decoders.items()}


def print_break_even(path: Path, contexts: list[int]) -> None:
    curve = CostCurve.load(path)
    for batch in sorted(curve.batches):
        rows = f", batch {batch} (rows per forward)" if len(curve.batches) > 1 else ""
        print(f"\nbreak-even tau (tau at which a step pays for itself) on {curve.device}{rows}:")
        print(f"{'method':<32} {'tokens/forward':>14}" + "".join(f" {'@' + str(c):>9}" for c in contexts))
        for name, steps in method_steps().items():
            print(f"{name:<32} {'+'.join(map(str, steps)):>14}"
                  + "".join(f" {curve.break_even_tau(steps, c, batch):9.2f}" for c in contexts))


def roofline(args) -> list[dict]:
    engine = load_engine(args, max(args.contexts) + max(args.steps))
    device, name = engine.device, device_name(engine.device)
    peak = next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None) if device.type == "cuda" else None
    copy_bw = copy_bandwidth(device)
    attention = engine.step_backend + (f"+compile:{engine.compiled.options.mode}" if engine.compiled else "")
    warmup = max(args.warmup, warm_calls(engine))
    rows = []
    for batch in args.batch:
        slots = engine.cache(0).max_len
        cache = engine.cache(slots, batch=batch)
        fill_cache(cache)  # timing only: random entries stand in for a prefill
        rows += _roofline_grid(args, engine, cache, batch, warmup, copy_bw, peak, attention, name)
    rows.sort(key=lambda r: (r["batch"], r["context"], r["step_tokens"]))
    if engine.compiled:
        stats = compile_stats()
        print(f"compiled {stats['graphs']} graphs in {stats['compile_s']:.1f} s (excluded from the timings)")
    return rows


def _roofline_grid(args, engine, cache, batch: int, warmup: int, copy_bw: float, peak, attention: str,
                   name: str) -> list[dict]:
    """Every (step, context) of the grid for forwards of ``batch`` rows (bytes read: the weights once, every row's
    context KV)."""
    device, rows = engine.device, []
    for step in args.steps:  # a step size is one compiled graph; the context is a tensor value
        for context in args.contexts:
            fn = forward_step(engine, cache, step, context, args.seed) if batch == 1 else \
                forward_rows_step(engine, cache, step, context, batch, args.seed)
            _, med, low = timed(fn, args.repeats, warmup, device)
            med = med / 1e3
            read = bytes_per_forward(engine, context) + (batch - 1) * (bytes_per_forward(engine, context)
                                                                       - bytes_per_forward(engine, 0))
            rows.append({"device": str(device), "dtype": args.dtype, "attention": attention, "batch": batch,
                         "context": context,
                         "step_tokens": step, "median_ms": med * 1e3, "min_ms": low, "bytes_read": read,
                         "gb_per_s": read / med / 1e9, "copy_fraction": read / med / copy_bw,
                         "peak_fraction": (read / med / peak) if peak else None, "tokens_per_s": batch * step / med,
                         "threads": torch.get_num_threads(), "loadavg": load_average(), "torch": torch.__version__,
                         "device_name": name})
            print(f"batch {batch:>3}  context {context:>7}  step {step:>4}  {med * 1e3:9.2f} ms  "
                  f"{read / med / 1e9:8.1f} GB/s  {read / med / copy_bw:6.1%} of copy bandwidth"
                  + (f"  {read / med / peak:6.1%} of peak" if peak else ""), flush=True)
    return rows


def roofline_report(args, rows: list[dict]) -> None:
    """The latency plot (``--plot``) and, with ``--curve``, each method setting's break-even tau."""
    if args.plot:
        first = [r for r in rows if r["threads"] == rows[0]["threads"] and r["batch"] == 1]  # the first --threads
        series = {f"{s} tokens": ([r["context"] for r in first if r["step_tokens"] == s],
                                  [r["median_ms"] for r in first if r["step_tokens"] == s]) for s in args.steps}
        save_plot([("engine forward", series, "forward latency (ms)", False)], args.out,
                  f"engine forward, {rows[0]['device']}, {rows[0]['dtype']}")
    if args.curve:
        print_break_even(args.out, args.contexts)


# ----------------------------------------------------------------------------------------------- vs-hf, fafo-step
def decode_row(bench, context, variant, med, ratio, note="", share=None) -> dict:
    return {"bench": bench, "threads": torch.get_num_threads(), "context": context, "variant": variant,
            "median_ms": med, "ratio_vs_ours": ratio, "attention_share": share, "loadavg": load_average(),
            "note": note}


def vs_hf(args) -> list[dict]:
    engine = load_engine(args, max(args.prompts) + args.new_tokens)
    hf = transformers_twin(engine)  # the same weight tensors
    variants = {"ours": lambda p, k: ours_ms_per_token(engine, p, k),
                "hf-dynamic": lambda p, k: hf_ms_per_token(hf, p, k, "dynamic"),
                "hf-static": lambda p, k: hf_ms_per_token(hf, p, k, "static")}
    rows = []
    for prompt_len in args.prompts:
        gen = torch.Generator().manual_seed(1)
        prompt = torch.randint(5, engine.model.args.vocab_size, (prompt_len,), generator=gen).tolist()
        # warm every variant at this very shape (transformers' static cache is sized prompt + new tokens, and
        # each size compiles on CUDA; ours compiles per step shape and records CUDA graphs on a second call)
        warm = 2 if engine.device.type == "cuda" else 1
        tokens = {name: [fn(prompt, args.new_tokens)[1] for _ in range(warm)][-1] for name, fn in variants.items()}
        same = tokens["ours"] == tokens["hf-dynamic"] == tokens["hf-static"]
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                times[name].append(fn(prompt, args.new_tokens)[0])
        med = {k: statistics.median(v) for k, v in times.items()}
        for name in variants:
            rows.append(decode_row("vs-hf", prompt_len, name, med[name], med[name] / med["ours"],
                                   f"tokens equal to HF: {same}"))
            print(f"threads {torch.get_num_threads()} prompt {prompt_len:>5} {name:<10} {med[name]:8.2f} ms/token "
                  f"(ours is {med[name] / med['ours']:.2f}x faster than this)  load {load_average()}", flush=True)
    return rows


def fafo_step(args) -> list[dict]:
    from fafo.fafo import FAFODecoder, FAFOState

    rows, context = [], args.contexts[0]
    for backend in ("dense", "sdpa"):
        engine = load_engine(args, context + 64, backend, compiled=False)
        prompt = torch.randint(5, engine.model.args.vocab_size, (context,), generator=torch.Generator().manual_seed(1))
        states = {}
        for name, fused in (("fused", True), ("2forward", False)):
            state = FAFOState(FAFODecoder(fused=fused), engine, prompt.tolist(), 64)
            state.prefill()
            states[name] = (state, state.candidates()[0])
            state.forward_logits(states[name][1])  # warm-up
        times, attn = {k: [] for k in states}, {k: [] for k in states}
        for _ in range(args.repeats):
            for name, (state, cands) in states.items():
                with AttentionTimer() as t:
                    t0 = time.perf_counter()
                    state.forward_logits(cands)
                    sync(engine.device)
                    times[name].append(time.perf_counter() - t0)
                attn[name].append(t.seconds / times[name][-1])
        for name in states:
            med, share = statistics.median(times[name]) * 1e3, statistics.median(attn[name])
            rows.append(decode_row("fafo-step", context, f"{backend} {name}", med,
                                   med / (statistics.median(times["fused"]) * 1e3), share=share))
            print(f"threads {torch.get_num_threads()} context {context} {backend:<5} {name:<8} {med:9.1f} ms/step "
                  f"attention {share:6.1%}  load {load_average()}", flush=True)
        del engine, states
    return rows


# ----------------------------------------------------------------------------------------------- fumble
def fumble_report(args, rows: list[dict]) -> None:
    """Fixed vs scattered side by side per context (the first ``--threads`` count), and the plot (``--plot``)."""
    rows = [r for r in rows if r["threads"] == rows[0]["threads"]]
    fixed = {r["context"]: r for r in rows if r["layout"] == "fixed"}
    print(f"\nFumble attention: q [1,{args.heads},{args.streams * args.k},{args.head_dim}], kv heads {args.kv_heads}, "
          f"budget F={args.budget}, {args.dtype} on {args.device}, {'EAGER' if args.no_compile else 'compiled'} "
          f"flex_attention, {rows[0]['threads']} threads, median of {args.repeats}")
    c = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    for r in (r for r in rows if r["layout"] == "scattered"):  # fixed / scattered
        f = fixed[r["context"]]
        print(f"context {r['context']:>6} {r['scatter']:>9}: {f['median_ms']:.2f} / {r['median_ms']:.2f} ms "
              f"({r['median_ms'] / f['median_ms']:.2f}x), active KV blocks {f['active_kv_blocks']} / "
              f"{r['active_kv_blocks']} of {r['total_kv_tiles']}, mask build {f['mask_build_eager_ms']:.2f} / "
              f"{r['mask_build_eager_ms']:.2f} ms eager, {c(f['mask_build_compiled_ms'])} / "
              f"{c(r['mask_build_compiled_ms'])} compiled, first call {f['first_call_ms'] / 1e3:.1f} / "
              f"{r['first_call_ms'] / 1e3:.1f} s")
    if not all(r["compiled"] for r in rows):
        print("NOTE: some rows ran eager flex_attention (unfused; on CPU it ignores block sparsity): "
              "their times do not reflect the layout.")
    if args.plot:
        series = {"fixed": [r for r in rows if r["layout"] == "fixed"],
                  **{f"scattered ({s})": [r for r in rows if r["scatter"] == s] for s in args.scatter}}
        times, builds = {}, {}
        for name, rs in series.items():
            xs = [r["context"] for r in rs]
            times[name] = (xs, [r["median_ms"] for r in rs])
            builds[f"{name}, eager"] = (xs, [r["mask_build_eager_ms"] for r in rs])
            if any(r["mask_build_compiled_ms"] is not None for r in rs):
                builds[f"{name}, compiled"] = (xs, [r["mask_build_compiled_ms"] for r in rs])
        save_plot([("flex_attention (median ms)", times, "ms", True),
                   ("create_block_mask (median ms)", builds, "ms", True)], args.out,
                  f"Fumble attention, {args.streams}x{args.k} queries, F={args.budget}, {args.dtype} on {args.device}")


# ----------------------------------------------------------------------------------------------- command line
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", choices=MODES, default="roofline")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default=None, help="default: float16 on CUDA, else float32")
    p.add_argument("--model", default=None, help="hub id or checkpoint dir (default: a random model, see --shape)")
    p.add_argument("--shape", choices=list(SHAPES), default=None,
                   help="the random model (default: llama2-7b on CUDA; on a CPU embedded, vs-hf/fafo-step 156m)")
    p.add_argument("--spec", default=None, help="JSON overriding the random model's config, e.g. a smaller one")
    p.add_argument("--contexts", "--context", type=int, nargs="+", default=None,
                   help="cache lengths; roofline 1024 2048 4096 (--curve 256 1024 4096), fafo-step 1024 (the "
                        "prompt), fumble 1024..32768")
    p.add_argument("--repeats", "--rounds", type=int, default=None, help="timed rounds (median): 5, decode modes 3")
    p.add_argument("--warmup", type=int, default=2, help="calls before timing (the first one compiles; at least 3 "
                                                         "under CUDA graphs)")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="torch.set_num_threads; the mode runs once per count (default: torch's)")
    p.add_argument("--out", type=Path, default=None, help="CSV (default results/bench/<mode's name>.csv)")
    p.add_argument("--plot", action="store_true", help="also save a PNG next to the CSV (roofline, fumble)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", default="auto", choices=["auto", "off", *COMPILE_MODES],
                   help="decode steps: auto = as the runner (reduce-overhead on CUDA, eager on CPU), off, or a mode")
    p.add_argument("--compile-backend", default="inductor", help="or aot_eager (traces, no code generation)")
    p.add_argument("--compile-attention", default="auto", choices=["auto", "flex", "sdpa"],
                   help="compiled steps' attention (auto: flex on CUDA, sdpa on CPU)")
    g = p.add_argument_group("roofline")
    g.add_argument("--attention", default="sdpa", choices=["sdpa", "flex"], help="eager steps' attention")
    g.add_argument("--steps", type=int, nargs="+", default=None,
                   help=f"tokens per forward (default 1 481; --curve: {' '.join(map(str, CURVE_STEPS))})")
    g.add_argument("--curve", action="store_true",
                   help="measure the cost curve and print each method's tokens per forward and break-even tau")
    g.add_argument("--batch", type=int, nargs="+", default=[1],
                   help="rows per forward (bench.batch_size): the grid for each, batch 1 always included")
    g.add_argument("--cache-slots", type=int, default=None,
                   help="allocate the static cache with at least this many slots (e.g. 16384: a long-context run)")
    g = p.add_argument_group("vs-hf")
    g.add_argument("--prompts", type=int, nargs="+", default=[256, 4096])
    g.add_argument("--new-tokens", type=int, default=128)
    g = p.add_argument_group("fumble")
    g.add_argument("--heads", type=int, default=32, help="query heads H")
    g.add_argument("--kv-heads", type=int, default=8, help="KV heads H_kv (GQA when < heads)")
    g.add_argument("--head-dim", type=int, default=128)
    g.add_argument("--streams", type=int, default=40, help="fumble streams n")
    g.add_argument("--k", type=int, default=6, help="tokens per stream k (query rows = n*k)")
    g.add_argument("--budget", type=int, default=760, help="compressed KV budget F = |C(kv)|")
    g.add_argument("--sink", type=int, default=4, help="StreamingLLM attention-sink tokens (--scatter streaming)")
    g.add_argument("--scatter", nargs="+", choices=SCATTERS, default=["streaming"])
    g.add_argument("--no-compile", action="store_true", help="eager flex_attention / create_block_mask")
    g = p.add_argument_group("host (also --new-tokens, --repeats)")
    g.add_argument("--layers", type=int, nargs="+", default=[32, 64],
                   help="depths; each past the smallest is that model with identity layers appended (same steps)")
    g.add_argument("--methods", nargs="+", default=None, choices=host_work.method_names(), metavar="METHOD",
                   help="method configs (default: all of conf/method)")
    args = p.parse_args(argv)
    contexts, repeats, out = DEFAULTS[args.mode]
    args.contexts = args.contexts or (CURVE_CONTEXTS if args.curve else contexts)
    args.steps = args.steps or (CURVE_STEPS if args.curve else [1, 481])
    args.repeats = args.repeats or repeats
    if any(b < 1 for b in args.batch):
        p.error("--batch sizes must be >= 1")
    args.batch = sorted({1, *args.batch})
    args.out = args.out or Path("results/bench") / out
    args.dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    args.shape = args.shape or default_shape(args)
    if args.compile in WITHOUT_CUDAGRAPHS and not args.device.startswith("cuda"):
        p.error(f"--compile {args.compile} replays CUDA graphs and needs --device cuda")
    for name in ("heads", "kv_heads", "head_dim", "streams", "k", "budget"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.heads % args.kv_heads:
        p.error(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")
    if not 0 <= args.sink <= args.budget:
        p.error("--sink must be in [0, --budget]")
    return args


RUN = {"roofline": (roofline, COLUMNS, roofline_report), "vs-hf": (vs_hf, DECODE_COLUMNS, None),
       "fafo-step": (fafo_step, DECODE_COLUMNS, None), "fumble": (fumble, FUMBLE_COLUMNS, fumble_report),
       "host": (host_work.bench, host_work.COLUMNS, host_work.report)}


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the mode once per ``--threads`` count, write its rows to ``--out`` (CSV), then its summary and plot."""
    args = parse_args(argv)
    run, columns, report = RUN[args.mode]
    torch.manual_seed(args.seed)
    threads, rows = torch.get_num_threads(), []
    try:
        for n in args.threads or [threads]:
            torch.set_num_threads(n)
            rows += run(args)
    finally:
        torch.set_num_threads(threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out} (torch {torch.__version__}, load average {load_average()}, {os.cpu_count()} CPUs)")
    if report is not None:
        report(args, rows)
    return rows


if __name__ == "__main__":
    main()
