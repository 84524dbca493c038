"""Memory and per-step speculation time of SuffixDecoding's global cache (``baselines/suffix_tree.py``) at the scale
of ArcticInference's unlimited cache: ``--outputs`` cached outputs of ``--length`` tokens (default 10,000 x 1,000).

Synthetic outputs over a 32k vocabulary: spans copied from earlier outputs (agentic repetition) between Zipf-
Mandelbrot tokens. Held-out requests are then replayed as the paper's simulator does (speculate, accept the
ground-truth prefix plus one token, append): each step's time covers appending the new tokens to both trees and
speculating from both; its thread CPU time is reported beside the wall time (which a shared machine inflates by
whole scheduler slices). CPU only, one thread::

    python scripts/bench_suffix_cache.py --outputs 10000 --length 1000
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def synthetic_outputs(n: int, length: int, vocab: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Outputs mixing copies of earlier outputs' spans (half the time) and Zipf-Mandelbrot tokens (p(k) ~ 1 /
    (k + 2.7): the most frequent token ~3 %, as in English text)."""
    freq = 1.0 / (np.arange(1, vocab + 1) + 2.7)
    freq /= freq.sum()
    outs: list[np.ndarray] = []
    for _ in range(n):
        parts, size = [], 0
        while size < length:
            span = int(rng.integers(8, 120))
            if outs and rng.random() < 0.5:
                src = outs[int(rng.integers(len(outs)))]
                at = int(rng.integers(max(len(src) - span, 1)))
                part = src[at: at + span]
            else:
                part = rng.choice(vocab, span, p=freq)
            parts.append(part.astype(np.int32))
            size += len(part)
        outs.append(np.concatenate(parts)[:length])
    return outs


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outputs", type=int, default=10_000)
    ap.add_argument("--length", type=int, default=1_000)
    ap.add_argument("--requests", type=int, default=20, help="held-out requests replayed")
    ap.add_argument("--prompt", type=int, default=200, help="prompt tokens of a held-out request")
    ap.add_argument("--tree", type=int, default=1, help="1: speculation tree (paper), 0: path")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from baselines.suffix_decoding import SuffixDecoder

    rng = np.random.default_rng(args.seed)
    outs = synthetic_outputs(args.outputs + args.requests, args.length, 32_000, rng)
    cached, held_out = outs[: args.outputs], outs[args.outputs:]
    dec = SuffixDecoder(tree=bool(args.tree))
    rss0, t0 = rss_mb(), time.perf_counter()
    for out in cached:  # as finished requests: each output appended, then the next request starts
        dec.finish(dec.start(None, [], ()), [], out)
    fill_s, rss1 = time.perf_counter() - t0, rss_mb()

    steps, cpu, accepted = [], [], []
    for out in held_out:
        out = out.tolist()
        prompt = [int(t) for t in rng.integers(0, 32_000, args.prompt)]
        state = dec.start(None, prompt, ())
        response = out[:1]
        while len(response) < len(out):
            t, c = time.perf_counter(), time.thread_time()
            tree = state.draft(prompt + response, 10**6)
            steps.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
            n, node = 0, 0
            for tok in out[len(response):]:
                node = tree._children.get((node, tok))
                if node is None:
                    break
                n += 1
            accepted.append(n)
            response += out[len(response): len(response) + n + 1]
        dec.finish(state, prompt, response)
    ms, cpu_ms = np.array(steps) * 1e3, np.array(cpu) * 1e3

    def stats(x):
        return {q: round(float(np.percentile(x, p)), 3) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))} | {
            "mean": round(float(x.mean()), 3), "max": round(float(x.max()), 3)}

    print(json.dumps({
        "cached_outputs": args.outputs, "tokens_cached": len(dec.global_tree), "tree": bool(args.tree),
        "fill_s": round(fill_s, 1), "index_mb": round(dec.global_tree.nbytes() / 2**20, 1),
        "rss_growth_mb": round(rss1 - rss0, 1), "steps": len(ms), "mean_accepted": round(float(np.mean(accepted)), 2),
        "step_cpu_ms": stats(cpu_ms), "step_wall_ms": stats(ms),
    }, indent=1))


if __name__ == "__main__":
    main()
