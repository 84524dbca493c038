"""Engine benchmarks, one mode each; a CSV per run (``--out``), medians with the thread count and load beside them.

* ``roofline`` (default): one engine forward of ``--steps`` new tokens (1 = vanilla, 481 = a FAFO step n=m=40, k=6:
  ``1 + m*k + n*k``) over a cache of each ``--contexts`` length: the bytes it must read (weights + prefix KV), GB/s
  and, on a known GPU, the fraction of peak bandwidth (a vanilla far below the peak inflates every speedup).
  ``--compile MODE`` times the runner's compiled steps, ``--cache-slots N`` sizes the cache as a long run would.
  ``--curve``: the cost curve (steps 1..512, contexts 256..4096) and each method setting's tokens per forward and
  break-even tau (:mod:`fafo.bench.cost_curve`; give the CSV to a run as ``bench.cost_curve=<csv>``).
* ``vs-hf``: vanilla greedy decode per token, ours vs transformers ``generate`` (sdpa; dynamic and static cache) on
  a random Llama of 156M parameters at ``--prompts`` lengths, prefill excluded alike (from the first token's logits).
* ``fafo-step``: one FAFO step fused vs FAFO-2forward's two forwards after a ``--contexts`` prompt, and the share
  of the step inside ``attend``, on ``dense`` (reference maths) and ``sdpa`` (fast paths).
* ``fumble``: FAFO's fumble queries (n*k rows) over a compressed KV budget F under compiled FlexAttention, the
  fixed region at the head of the cache (FAFO paper section 4.4 and App. H: one static block mask over
  ``ceil(F / 128)`` KV blocks) vs the same F entries scattered (``--scatter streaming``: sink at the start and window
  at the end of a plain cache; ``random``: Quest-like picks anywhere): active KV blocks, BlockMask build time (a
  scattered mask would be rebuilt every step), first call (compilation) apart; both layouts are checked against
  dense SDPA. On CPU, eager ``flex_attention`` ignores block sparsity: only compiled numbers speak to the layout.
* ``host``: each method config's work per decoding step outside its model forwards (ops, host-to-device copies,
  device reads, host ms; :mod:`fafo.bench.host_work`) on narrow random models of ``--layers`` layers.

Variants are interleaved over ``--repeats`` rounds::

    python scripts/bench_engine.py --model /ckpts/Llama-2-7b-chat-hf --device cuda --contexts 1024 16384 --plot
    python scripts/bench_engine.py --curve --model /ckpts/Llama-2-7b-chat-hf --out results/bench/curve.csv
    python scripts/bench_engine.py vs-hf --threads 1 2 --rounds 3
    python scripts/bench_engine.py fafo-step --threads 2 --context 1024
    python scripts/bench_engine.py fumble --scatter streaming random --plot
    python scripts/bench_engine.py host --layers 32 64 --new-tokens 64 --threads 1
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F_nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fafo.engine.model as model_module  # noqa: E402
from fafo.bench import host_work  # noqa: E402
from fafo.bench.cost_curve import CostCurve  # noqa: E402
from fafo.bench.timing import SyncClock, load_average, sync  # noqa: E402
from fafo.engine.attention import causal_plan  # noqa: E402
from fafo.engine.compiled import COMPILE_MODES, CompileOptions, compile_stats  # noqa: E402
from fafo.engine.engine import Engine  # noqa: E402
from fafo.engine.tiny import default_cache_dir  # noqa: E402
from fafo.engine.tiny_tokenizer import build_tiny_tokenizer  # noqa: E402

MODES = ("roofline", "vs-hf", "fafo-step", "fumble", "host")
DEFAULTS = {  # per mode: (contexts, repeats, out)
    "roofline": ([1024, 2048, 4096], 5, "engine.csv"), "vs-hf": ([1024], 3, "decode.csv"),
    "fafo-step": ([1024], 3, "decode.csv"), "fumble": ([1024, 2048, 4096, 8192, 16384, 32768], 5,
                                                      "fumble_attention.csv"), "host": ([], 5, "host.csv")}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Peak HBM bandwidth in bytes/s, matched against torch.cuda.get_device_name().
PEAK_BANDWIDTH = {
    "A100-SXM4-80GB": 2.039e12, "A100-SXM4-40GB": 1.555e12, "A100-PCIE-40GB": 1.555e12, "A100 80GB PCIe": 1.935e12,
    "H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12, "H100 NVL": 3.9e12, "H200": 4.8e12,
}
COLUMNS = ["device", "dtype", "attention", "context", "step_tokens", "median_ms", "min_ms", "bytes_read", "gb_per_s",
           "peak_fraction", "tokens_per_s", "threads", "loadavg", "torch", "device_name"]
DECODE_COLUMNS = ["bench", "threads", "context", "variant", "median_ms", "ratio_vs_ours", "attention_share",
                  "loadavg", "note"]
FUMBLE_COLUMNS = [
    "context", "layout", "scatter", "budget", "heads", "kv_heads", "head_dim", "streams", "k", "q_rows", "dtype",
    "device", "compiled", "median_ms", "min_ms", "first_call_ms", "active_kv_blocks", "total_kv_tiles",
    "block_density", "block_size", "mask_build_eager_ms", "mask_build_compiled_ms", "check_max_abs_diff",
    "threads", "torch",
]
CURVE_STEPS = [1, 2, 4, 8, 16, 32, 64, 120, 128, 256, 481, 512]
CURVE_CONTEXTS = [256, 1024, 4096]
SCATTERS = ("streaming", "random")
# The model of a run without --model: a random Llama (a smoke test of the script, not a benchmark); vs-hf and
# fafo-step use one of 156M parameters.
MODEL_156M = dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, intermediate_size=2816, max_position_embeddings=8192)
EMBEDDED = dict(vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                intermediate_size=688, max_position_embeddings=65536)


# ----------------------------------------------------------------------------------------------- shared
def timed(fn, repeats: int, warmup: int, device: torch.device) -> tuple[float, float, float]:
    """(first call ms, median ms, min ms): the first call (compilation) apart, then warmup, then repeats."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(max(0, warmup - 1)):
        fn()
    sync(device)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(times), min(times)


def model_path(args) -> str:
    """``--model``, else a random Llama of the mode's size (fp32, seed 0; ``--spec`` overrides its config) with the
    embedded tokenizer (ids are random), built once under ``$FAFO_CACHE/bench``."""
    if args.model:
        return args.model
    import transformers

    spec = {**(EMBEDDED if args.mode in ("roofline", "fumble") else MODEL_156M), **json.loads(args.spec or "{}")}
    out = default_cache_dir() / "bench" / hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    if not (out / "config.json").is_file():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(**spec, initializer_range=0.02, eos_token_id=None, bos_token_id=None)
        transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
        build_tiny_tokenizer().save_pretrained(out)
    return str(out)


def load_engine(args, backend: str | None = None) -> Engine:
    engine = Engine.from_pretrained(model_path(args), device=args.device, dtype=args.dtype,
                                    backend=backend or args.attention)
    if args.compile:  # the runner's compiled decode steps; one cache for every context, as in a run
        engine.enable_compile(CompileOptions(mode=args.compile, backend=args.compile_backend))
        engine.cache(max(args.contexts) + max(args.steps))
    if args.cache_slots:  # a run's cache sized for its longest sample (compiled steps are specialised to it)
        engine.cache(args.cache_slots)
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
    print(f"\nbreak-even tau (tau at which a step pays for itself) on {curve.device}:")
    print(f"{'method':<32} {'tokens/forward':>14}" + "".join(f" {'@' + str(c):>9}" for c in contexts))
    for name, steps in method_steps().items():
        print(f"{name:<32} {'+'.join(map(str, steps)):>14}"
              + "".join(f" {curve.break_even_tau(steps, c):9.2f}" for c in contexts))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "cpu"


def roofline(args) -> list[dict]:
    engine = load_engine(args)
    device, a = engine.device, engine.model.args
    kv_bytes_per_token = 2 * a.n_layers * a.n_kv_heads * a.head_dim * engine.model.lm_head.weight.element_size()
    peak = next((bw for key, bw in PEAK_BANDWIDTH.items() if key in device_name(device)), None) \
        if device.type == "cuda" else None
    rows = []
    attention = engine.step_backend + (f"+compile:{args.compile}" if args.compile else "")
    for context in args.contexts:
        cache = engine.cache(context + max(args.steps))
        for buf in cache.keys + cache.values:  # timing only: random entries stand in for a prefill
            buf.normal_()
        for step in args.steps:
            tokens = torch.randint(3, a.vocab_size, (step,), device=device)
            positions = torch.arange(context, context + step, device=device)
            _, med, low = timed(lambda: engine.forward(cache, tokens, positions, None, causal_plan(context),
                                                       logits="all"), args.repeats, args.warmup, device)
            med, read = med / 1e3, engine.weights_nbytes + context * kv_bytes_per_token
            rows.append({"device": str(device), "dtype": args.dtype, "attention": attention, "context": context,
                         "step_tokens": step, "median_ms": med * 1e3, "min_ms": low, "bytes_read": read,
                         "gb_per_s": read / med / 1e9, "peak_fraction": (read / med / peak) if peak else None,
                         "tokens_per_s": step / med, "threads": torch.get_num_threads(),
                         "loadavg": load_average(), "torch": torch.__version__, "device_name": device_name(device)})
            print(f"context {context:>7}  step {step:>4}  {med * 1e3:9.2f} ms  {read / med / 1e9:8.1f} GB/s"
                  + (f"  {read / med / peak:6.1%} of peak" if peak else ""), flush=True)
    if args.compile:
        stats = compile_stats()
        print(f"compiled {stats['graphs']} graphs in {stats['compile_s']:.1f} s (excluded from the timings)")
    return rows


def roofline_report(args, rows: list[dict]) -> None:
    """The latency plot (``--plot``) and, with ``--curve``, each method setting's break-even tau."""
    if args.plot:
        first = [r for r in rows if r["threads"] == rows[0]["threads"]]  # the first --threads count
        series = {f"{s} tokens": ([r["context"] for r in first if r["step_tokens"] == s],
                                  [r["median_ms"] for r in first if r["step_tokens"] == s]) for s in args.steps}
        save_plot([("engine forward", series, "forward latency (ms)", False)], args.out,
                  f"engine forward, {rows[0]['device']}, {rows[0]['dtype']}")
    if args.curve:
        print_break_even(args.out, args.contexts)


# ----------------------------------------------------------------------------------------------- vs-hf, fafo-step
class FirstCall:
    """A transformers logits processor noting when it is first called (the prefill's logits are ready)."""

    at = None

    def __call__(self, input_ids, scores):
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def decode_row(bench, context, variant, med, ratio, note="", share=None) -> dict:
    return {"bench": bench, "threads": torch.get_num_threads(), "context": context, "variant": variant,
            "median_ms": med, "ratio_vs_ours": ratio, "attention_share": share, "loadavg": load_average(),
            "note": note}


def vs_hf(args) -> list[dict]:
    import transformers

    from baselines.vanilla import VanillaDecoder

    engine = load_engine(args)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_path(args), dtype=DTYPES[args.dtype],
                                                           attn_implementation="sdpa").to(engine.device).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    rows, same = [], None
    for prompt_len in args.prompts:
        ids = torch.randint(5, engine.model.args.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(1))

        def ours(k):  # decode seconds per token after the first (the prefill ends at the clock's mark)
            clock = SyncClock(engine.device)
            tokens = VanillaDecoder().generate(engine, ids.tolist(), k, clock=clock)
            return tokens.tokens, (time.perf_counter() - clock.marks["prefill"]) / (k - 1)

        def theirs(k, cache):
            kw = {"cache_implementation": "static"} if cache == "static" else {}
            first = FirstCall()  # called once per new token: its first call ends the prefill
            with torch.inference_mode():
                out = hf.generate(ids[None].to(engine.device), max_new_tokens=k, min_new_tokens=k, do_sample=False,
                                  logits_processor=transformers.LogitsProcessorList([first]), **kw)
            return out[0, prompt_len:].tolist(), (time.perf_counter() - first.at) / (k - 1)

        variants = {"ours": ours, "hf-dynamic": lambda k: theirs(k, "dynamic"),
                    "hf-static": lambda k: theirs(k, "static")}
        if prompt_len == args.prompts[0]:  # once: equal tokens, and a warm-up (static cache allocation, kernels)
            same = ours(16)[0] == theirs(16, "dynamic")[0]
            for fn in variants.values():
                fn(4)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.repeats):
            for name, fn in variants.items():
                times[name].append(fn(args.new_tokens)[1])
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        for name in variants:
            rows.append(decode_row("vs-hf", prompt_len, name, med[name], med[name] / med["ours"],
                                   f"tokens equal to HF: {same}"))
            print(f"threads {torch.get_num_threads()} prompt {prompt_len:>5} {name:<10} {med[name]:8.2f} ms/token "
                  f"(ours is {med[name] / med['ours']:.2f}x faster than this)  load {load_average()}", flush=True)
    return rows


class AttentionTimer:
    """Wraps the model's ``attend`` and sums the wall time spent in it (CPU: ops run in order)."""

    def __init__(self):
        self.seconds, self._orig = 0.0, model_module.attend

    def __enter__(self):
        def timed_attend(*a, **kw):
            t0 = time.perf_counter()
            out = self._orig(*a, **kw)
            self.seconds += time.perf_counter() - t0
            return out

        model_module.attend = timed_attend
        return self

    def __exit__(self, *exc):
        model_module.attend = self._orig


def fafo_step(args) -> list[dict]:
    from fafo.fafo import FAFODecoder, FAFOState

    rows, context = [], args.contexts[0]
    for backend in ("dense", "sdpa"):
        engine = load_engine(args, backend)
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
    return rows


# ----------------------------------------------------------------------------------------------- fumble
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
    p.add_argument("--model", default=None, help="hub id or checkpoint dir (default: a random Llama, see --spec)")
    p.add_argument("--spec", default=None, help="JSON overriding the default model's config, e.g. a smaller one")
    p.add_argument("--contexts", "--context", type=int, nargs="+", default=None,
                   help="cache lengths; roofline 1024 2048 4096 (--curve 256 1024 4096), fafo-step 1024 (the "
                        "prompt), fumble 1024..32768")
    p.add_argument("--repeats", "--rounds", type=int, default=None, help="timed rounds (median): 5, decode modes 3")
    p.add_argument("--warmup", type=int, default=2, help="calls before timing (the first one compiles)")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="torch.set_num_threads; the mode runs once per count (default: torch's)")
    p.add_argument("--out", type=Path, default=None, help="CSV (default results/bench/<mode's name>.csv)")
    p.add_argument("--plot", action="store_true", help="also save a PNG next to the CSV (roofline, fumble)")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("roofline")
    g.add_argument("--attention", default="sdpa", choices=["sdpa", "flex"])
    g.add_argument("--steps", type=int, nargs="+", default=None,
                   help=f"tokens per forward (default 1 481; --curve: {' '.join(map(str, CURVE_STEPS))})")
    g.add_argument("--curve", action="store_true",
                   help="measure the cost curve and print each method's tokens per forward and break-even tau")
    g.add_argument("--compile", default=None, choices=COMPILE_MODES,
                   help="time compiled decode steps (the runner's bench.compile) in this torch.compile mode")
    g.add_argument("--compile-backend", default="inductor")
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
    g = p.add_argument_group("host (fafo/bench/host_work.py; --new-tokens, --repeats)")
    g.add_argument("--layers", type=int, nargs="+", default=[32, 64])
    g.add_argument("--methods", nargs="+", default=None, help="method configs (default: all of conf/method)")
    args = p.parse_args(argv)
    contexts, repeats, out = DEFAULTS[args.mode]
    args.contexts = args.contexts or (CURVE_CONTEXTS if args.curve else contexts)
    args.steps = args.steps or (CURVE_STEPS if args.curve else [1, 481])
    args.repeats = args.repeats or repeats
    args.out = args.out or Path("results/bench") / out
    args.dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
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
