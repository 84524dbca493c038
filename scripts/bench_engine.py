"""Engine roofline benchmark: per-forward latency against the memory-bandwidth bound.

A decode step of a 7B model is memory bound: it must read every weight and the KV it attends. For each context
length and each step size (1 token = vanilla; ``1 + m*k + n*k`` = a FAFO step; ``1 + W*(N-1) + G*(N-1)`` = a
Lookahead step...) this script times one engine forward over a cache holding ``context`` entries and reports the
bytes it had to read (weights + the KV of the prefix), the achieved bytes/s and, on a known GPU, the fraction of
the device's peak bandwidth. A vanilla forward far below the peak means speedups measured against it are
inflated; the runner's speedups are only as honest as this number is high.

Examples::

    python scripts/bench_engine.py                                   # tiny model, CPU, CI-size
    python scripts/bench_engine.py --model /ckpts/Llama-2-7b-chat-hf --device cuda --dtype float16 \\
        --contexts 1024 4096 16384 32768 --steps 1 481 106

Writes a CSV (``--out``) and optionally a PNG (``--plot``).

``--curve`` measures the *cost curve* (step sizes 1..512 by powers of two and the FAFO/Lookahead defaults, contexts
256..4096 unless given) and prints, for each method's default and equal-budget settings, its tokens per forward
and break-even tau (the tau at which its step pays for itself on this device, :mod:`fafo.bench.cost_curve`). Pass
the CSV to a run as ``bench.cost_curve=<csv>`` to see the break-even tau beside the measured tau::

    python scripts/bench_engine.py --curve --model /ckpts/Llama-2-7b-chat-hf --out results/bench/curve.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fafo.bench.cost_curve import CostCurve  # noqa: E402
from fafo.engine.attention import causal_plan  # noqa: E402
from fafo.engine.compiled import COMPILE_MODES, CompileOptions, compile_stats  # noqa: E402
from fafo.engine.engine import Engine  # noqa: E402
from fafo.engine.tiny import tiny_checkpoint  # noqa: E402

# Peak HBM bandwidth in bytes/s, matched against torch.cuda.get_device_name().
PEAK_BANDWIDTH = {
    "A100-SXM4-80GB": 2.039e12, "A100-SXM4-40GB": 1.555e12, "A100-PCIE-40GB": 1.555e12, "A100 80GB PCIe": 1.935e12,
    "H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12, "H100 NVL": 3.9e12, "H200": 4.8e12,
}
COLUMNS = ["device", "dtype", "attention", "context", "step_tokens", "median_ms", "min_ms", "bytes_read", "gb_per_s",
           "peak_fraction", "tokens_per_s", "threads", "loadavg", "torch", "device_name"]
CURVE_STEPS = [1, 2, 4, 8, 16, 32, 64, 120, 128, 256, 481, 512]
CURVE_CONTEXTS = [256, 1024, 4096]


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
    print(f"\nbreak-even tau (tau at which a step pays for itself) on {curve.device}:")
    print(f"{'method':<32} {'tokens/forward':>14}" + "".join(f" {'@' + str(c):>9}" for c in contexts))
    for name, steps in method_steps().items():
        print(f"{name:<32} {'+'.join(map(str, steps)):>14}"
              + "".join(f" {curve.break_even_tau(steps, c):9.2f}" for c in contexts))


def peak_bandwidth(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_engine(args) -> Engine:
    path = args.model
    if path is None:  # the embedded tiny model: a smoke test of the script, not a benchmark
        path = str(tiny_checkpoint(dict(family="llama", hidden_size=256, num_hidden_layers=4,
                                        num_attention_heads=8, num_key_value_heads=2, intermediate_size=688,
                                        max_position_embeddings=65536)))
    engine = Engine.from_pretrained(path, device=args.device, dtype=args.dtype, backend=args.attention)
    if args.compile:  # the runner's compiled decode steps; one cache for every context, as in a run
        engine.enable_compile(CompileOptions(mode=args.compile, backend=args.compile_backend))
        engine.cache(max(args.contexts) + max(args.steps))
    if args.cache_slots:  # a run's cache sized for its longest sample (compiled steps are specialised to it)
        engine.cache(args.cache_slots)
    return engine


def time_forward(engine: Engine, cache, context: int, step: int, repeats: int, warmup: int) -> list[float]:
    """Seconds per forward of ``step`` new tokens after ``context`` cached entries (causal within the step)."""
    tokens = torch.randint(3, engine.model.args.vocab_size, (step,), device=engine.device)
    positions = torch.arange(context, context + step, device=engine.device)
    times = []
    for i in range(warmup + repeats):
        sync(engine.device)
        t0 = time.perf_counter()
        engine.forward(cache, tokens, positions, None, causal_plan(context), logits="all")
        sync(engine.device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "cpu"


def load_average() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return ""


def run(args) -> list[dict]:
    engine = load_engine(args)
    device = engine.device
    a = engine.model.args
    kv_bytes_per_token = 2 * a.n_layers * a.n_kv_heads * a.head_dim * engine.model.lm_head.weight.element_size()
    peak = peak_bandwidth(device)
    rows = []
    attention = engine.step_backend + (f"+compile:{args.compile}" if args.compile else "")
    for context in args.contexts:
        cache = engine.cache(context + max(args.steps))
        for buf in cache.keys + cache.values:  # timing only: random entries stand in for a prefill
            buf.normal_()
        for step in args.steps:
            times = time_forward(engine, cache, context, step, args.repeats, args.warmup)
            med = statistics.median(times)
            read = engine.weights_nbytes + context * kv_bytes_per_token
            rows.append({"device": str(device), "dtype": args.dtype, "attention": attention, "context": context,
                         "step_tokens": step,
                         "median_ms": med * 1e3, "min_ms": min(times) * 1e3, "bytes_read": read,
                         "gb_per_s": read / med / 1e9, "peak_fraction": (read / med / peak) if peak else "",
                         "tokens_per_s": step / med, "threads": torch.get_num_threads(),
                         "loadavg": load_average(), "torch": torch.__version__, "device_name": device_name(device)})
            print(f"context {context:>7}  step {step:>4}  {med * 1e3:9.2f} ms  {read / med / 1e9:8.1f} GB/s"
                  + (f"  {read / med / peak:6.1%} of peak" if peak else ""), flush=True)
    return rows


def write(rows: list[dict], out: Path, plot: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for step in sorted({r["step_tokens"] for r in rows}):
            pts = [r for r in rows if r["step_tokens"] == step]
            ax.plot([r["context"] for r in pts], [r["median_ms"] for r in pts], marker="o", label=f"{step} tokens")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (cached tokens)")
        ax.set_ylabel("forward latency (ms)")
        ax.set_title(f"engine forward, {rows[0]['device']}, {rows[0]['dtype']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=120)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="hub id or checkpoint dir (default: an embedded tiny model)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="float32 / float16 / bfloat16 (default: float16 on CUDA)")
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "flex"])
    p.add_argument("--contexts", type=int, nargs="+", default=None,
                   help="default 1024 2048 4096 (--curve: 256 1024 4096)")
    p.add_argument("--steps", type=int, nargs="+", default=None,
                   help="tokens per forward: 1 = vanilla, 481 = FAFO n=40 k=6 m=40 (1 + m*k + n*k); default 1 481 "
                        f"(--curve: {' '.join(map(str, CURVE_STEPS))})")
    p.add_argument("--curve", action="store_true",
                   help="measure the cost curve and print each method's tokens per forward and break-even tau")
    p.add_argument("--compile", default=None, choices=COMPILE_MODES,
                   help="time compiled decode steps (the runner's bench.compile) in this torch.compile mode")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--cache-slots", type=int, default=None,
                   help="allocate the static cache with at least this many slots (e.g. 16384: a long-context run)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=Path("results/bench/engine.csv"))
    p.add_argument("--plot", action="store_true")
    args = p.parse_args(argv)
    args.contexts = args.contexts or (CURVE_CONTEXTS if args.curve else [1024, 2048, 4096])
    args.steps = args.steps or (CURVE_STEPS if args.curve else [1, 481])
    args.dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args)
    if args.compile:
        stats = compile_stats()
        print(f"compiled {stats['graphs']} graphs in {stats['compile_s']:.1f} s (excluded from the timings)")
    write(rows, args.out, args.plot)
    print(f"wrote {args.out} ({torch.get_num_threads()} threads, load average {load_average()}, "
          f"{os.cpu_count()} CPUs)")
    if args.curve:
        print_break_even(args.out, args.contexts)
    return rows


if __name__ == "__main__":
    main()
