"""Stage 3: vanilla decode of the 7B-shaped model against the memory roofline and against transformers.

Per context (512 and 4096 on a GPU): greedy decode per token after the prefill, ours (the engine compiled as the
runner compiles it) and transformers' ``generate`` with its static cache (compiled by transformers itself on
CUDA) on the same weights (:func:`~fafo.bench.tools.random_model.transformers_twin`). The roofline of a token is the
bytes its forward must read (weights, plus the KV at the generation's mean context) over the copy bandwidth of
stage 1. Targets (from gpt-fast, about 69 % of an A100's roofline): >= 70 % at 512, no slower than transformers.
Last, a kernel profile of ours' 1-token forward at the first context says where its time goes
(:mod:`fafo.bench.tools.kernel_profile`).
"""

from __future__ import annotations

import csv
import statistics
import time
from pathlib import Path

from fafo.bench.tools.engine_timing import (bytes_per_forward, fill_cache, forward_step, hf_ms_per_token,
                                            ours_ms_per_token, warm_calls, weight_bytes_read)
from fafo.bench.tools.kernel_profile import profile_forward, profile_rows
from fafo.bench.gpu_check.big_model import random_prompt
from fafo.bench.gpu_check.report import markdown_table
from fafo.bench.tools.random_model import transformers_twin

COLUMNS = ["context", "variant", "ms_per_token", "tokens_per_s", "bytes_per_token", "roofline_ms",
           "roofline_fraction", "warmup_s", "tokens_equal_ours", "compile"]
TARGET_FRACTION = 0.70


def time_variant(fn, prompt, new, rounds: int, warm: int) -> tuple[float, float, list[int]]:
    """(warm-up seconds, median ms per token, tokens): ``warm`` untimed generations, then ``rounds`` timed."""
    t0 = time.perf_counter()
    for _ in range(warm):
        fn(prompt, new)
    warm_s = time.perf_counter() - t0
    runs = [fn(prompt, new) for _ in range(rounds)]
    return warm_s, statistics.median(ms for ms, _ in runs), runs[0][1]


def decode_stage(budget, result, settings, state, out: Path) -> None:
    engine = state.big_engine(settings)
    bandwidth = state.copy_bandwidth(settings.device)
    vocab, new = engine.model.args.vocab_size, settings.decode_new
    hf = None
    ours_tokens: dict[int, list[int]] = {}
    items = [(c, v) for c in settings.decode_contexts for v in ("ours", "transformers")]
    items.append((settings.decode_contexts[0], "kernel profile"))  # why ours is where it is (after the timings)
    profile = []
    try:
        for context, variant in budget.each(items, label=lambda i: f"{i[1]} at {i[0]}"):
            if variant == "kernel profile":
                profile.append(kernel_section(engine, context, settings))
                continue
            prompt = random_prompt(context, vocab, seed=context)
            if variant == "ours":
                fn, compile_label = (lambda p, n: ours_ms_per_token(engine, p, n)), settings.compile_label
                compile_label += ", fused q/k/v and gate/up" if engine.model.fused else ""
            else:
                hf = hf or transformers_twin(engine)
                fn = lambda p, n: hf_ms_per_token(hf, p, n, "static")  # noqa: E731
                compile_label = "transformers CompileConfig (auto on CUDA)" if settings.cuda else "eager"
            warm = 2 if settings.cuda else 1
            warm_s, ms, tokens = time_variant(fn, prompt, new, settings.rounds, warm)
            if variant == "ours":
                ours_tokens[context] = tokens
            read = bytes_per_forward(engine, context + new // 2)
            floor_ms = read / bandwidth * 1e3
            same = ours_tokens.get(context)
            equal = "" if same is None else f"{sum(a == b for a, b in zip(tokens, same))}/{len(same)}"
            state.decode_rows.append({
                "context": context, "variant": variant, "ms_per_token": round(ms, 4),
                "tokens_per_s": round(1e3 / ms, 1), "bytes_per_token": read, "roofline_ms": round(floor_ms, 4),
                "roofline_fraction": round(floor_ms / ms, 4), "warmup_s": round(warm_s, 1), "compile": compile_label,
                "tokens_equal_ours": equal})
            with open(out / "decode.csv", "w", newline="") as f:  # after each row: a later timeout keeps them
                writer = csv.DictWriter(f, fieldnames=COLUMNS)
                writer.writeheader()
                writer.writerows(state.decode_rows)
    finally:  # an interrupted stage still reports the rows it has
        summarize(result, state.decode_rows, settings, bandwidth)
        for section, line in profile:
            result.sections.append(section)
            result.summary += f"; {line}"


def kernel_section(engine, context: int, settings) -> tuple[str, str]:
    """Device time of one compiled 1-token forward at ``context`` by kind of kernel
    (:mod:`fafo.bench.tools.kernel_profile`): a Markdown table, and a line for the summary."""
    cache = engine.cache(0)
    fill_cache(cache)
    step = forward_step(engine, cache, 1, context)
    for _ in range(warm_calls(engine)):
        step()
    calls = 20 if settings.cuda else 3
    rows = profile_rows(profile_forward(step, calls, settings.device), weight_bytes_read(engine))
    line = "per forward: " + ", ".join(f"{r['kind'].split(' (')[0]} {r['ms']:.2f} ms" for r in rows
                                       if isinstance(r["ms"], float))
    return (f"Where a 1-token forward's time goes at {context} context (torch.profiler over {calls} back-to-back "
            "compiled forwards; per forward):\n\n"
            + markdown_table(["kind", "events", "ms", "share", "note"], rows)), line


def summarize(result, rows: list[dict], settings, bandwidth: float) -> None:
    by = {(r["context"], r["variant"]): r for r in rows}
    parts, first = [], settings.decode_contexts[0]
    for context in settings.decode_contexts:
        ours, theirs = by.get((context, "ours")), by.get((context, "transformers"))
        if ours:
            parts.append(f"{context}: {ours['ms_per_token']:.2f} ms/token, {ours['roofline_fraction']:.0%} of roofline"
                         + (f", {theirs['ms_per_token'] / ours['ms_per_token']:.2f}x transformers" if theirs else ""))
    ours, theirs = by.get((first, "ours")), by.get((first, "transformers"))
    if ours and settings.cuda:
        met = ours["roofline_fraction"] >= TARGET_FRACTION and (theirs is None or
                                                                 ours["ms_per_token"] <= theirs["ms_per_token"])
        parts.append(f"targets at {first} (>= {TARGET_FRACTION:.0%}, <= transformers): {'met' if met else 'MISSED'}")
    result.summary = "; ".join(parts) or "nothing measured"
    result.sections.append(
        f"{settings.big_shape}, {settings.dtype}, copy bandwidth {bandwidth / 1e9:.1f} GB/s, "
        f"{settings.decode_new} new tokens, median of {settings.rounds}\n\n"
        + markdown_table(COLUMNS, rows))
