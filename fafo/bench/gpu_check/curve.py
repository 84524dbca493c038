"""Stage 4: the compiled cost curve of the 7B-shaped model, and each method's step and host time on it.

* curve: one compiled forward of 1..512 tokens at each context (the step sizes in order of value, every context
  per step: a step size is one graph, the context only a tensor value), warmed, median of several calls; then
  forwards of 4 and 16 rows at once (``bench.batch_size``; 1 and 64 tokens per row, first context), the curve
  that prices batched runs;
* methods: each draftless method at its preset's shapes generates after a prompt (a random run repeated, so the
  n-gram methods have matches to draft from; longer than every FAFO preset's budget, so their regions swap),
  compiled as the runner does, warmed, then one generation is split into time inside its forwards and host time
  around them (:func:`~fafo.bench.tools.engine_timing.step_times`). The methods share the engine, its cache and the
  graphs of equal step shapes (vanilla's is the curve's 1-token one).

Both go to ``<gpu>.csv`` (:func:`~fafo.bench.tools.cost_curve.write_device_csv`), which ``bench.cost_curve`` reads.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from fafo.bench.tools.cost_curve import CostCurve, write_device_csv
from fafo.bench.tools.engine_timing import (bytes_per_forward, device_name, device_slug, fill_cache, forward_rows_step,
                                            forward_step, kv_bytes_per_token, step_times, timed, warm_calls)
from fafo.bench.gpu_check.big_model import capacity, random_prompt
from fafo.bench.gpu_check.report import markdown_table
from fafo.bench.gpu_check.methods import build_method, selected, steps_as_the_runner
from fafo.engine.compiled import reset_compiled_state

CURVE_COLUMNS = ["batch", "context", "step_tokens", "median_ms", "min_ms", "first_call_s", "gb_per_s",
                 "roofline_fraction"]
METHOD_COLUMNS = ["method", "layers", "forward_tokens", "steps", "tau", "step_ms", "host_ms", "wall_ms",
                  "forwards_per_step", "max_rows", "first_call_s"]


def curve_stage(budget, result, settings, state, out: Path) -> None:
    engine = state.big_engine(settings)
    bandwidth = state.copy_bandwidth(settings.device)
    cache = engine.cache(0)
    fill_cache(cache)
    repeats = 10 if settings.cuda else settings.rounds
    items = [(s, 1) for s in settings.curve_steps] + [(s, b) for b in settings.curve_batches
                                                      for s in settings.curve_batch_steps]
    try:
        for step, batch in budget.each(items, label=lambda i: f"{i[0]} tokens" + (f" x {i[1]} rows" if i[1] > 1
                                                                                  else "")):
            contexts = settings.curve_contexts if batch == 1 else settings.curve_contexts[:1]
            if batch != cache.batch:  # rows of their own: a cache of B rows just long enough
                cache = engine.cache(contexts[0] + max(settings.curve_batch_steps), batch=batch)
                fill_cache(cache)
            for context in contexts:
                fn = (forward_step(engine, cache, step, context) if batch == 1 else
                      forward_rows_step(engine, cache, step, context, batch))
                first, med, low = timed(fn, repeats, warm_calls(engine), settings.device)
                # the weights once, every row's KV
                read = bytes_per_forward(engine, context) + (batch - 1) * context * kv_bytes_per_token(engine)
                state.curve_rows.append({
                    "batch": batch, "context": context, "step_tokens": step, "median_ms": round(med, 4),
                    "min_ms": round(low, 4), "repeats": repeats, "first_call_s": round(first / 1e3, 2),
                    "bytes_read": read, "gb_per_s": round(read / med / 1e6, 1),
                    "roofline_fraction": round(read / bandwidth * 1e3 / med, 4)})
            write_csv(state, settings, out)  # after each step size: an interrupted stage keeps its points
    finally:
        if cache.batch != 1:  # the methods stage compiles for the one-row cache every process of the check sizes
            engine.cache(capacity(settings))
        if state.curve_rows:
            summarize_curve(result, state, settings, out)


def summarize_curve(result, state, settings, out: Path) -> None:
    path = write_csv(state, settings, out)
    curve = CostCurve.load(path)  # the file reads back as a cost curve
    ctx = settings.curve_contexts[0]
    big = max(s for s in curve.table[ctx])
    result.summary = (f"{len(state.curve_rows)} points in {path.name}; at {ctx}: 1 token {curve.latency(1, ctx):.2f} "
                      f"ms, {big} tokens {curve.latency(big, ctx):.2f} ms "
                      f"({curve.latency(big, ctx) / curve.latency(1, ctx):.2f}x)"
                      + "".join(f"; {b} rows x 1 token {curve.latency(1, ctx, b):.2f} ms" for b in sorted(curve.batches)
                                if b > 1 and ctx in curve.batches[b]))
    result.sections.append(markdown_table(CURVE_COLUMNS, state.curve_rows))


def methods_stage(budget, result, settings, state, out: Path) -> None:
    engine = state.big_engine(settings, settings.method_layers)
    layers = engine.model.args.n_layers
    vocab = engine.model.args.vocab_size
    prompt = random_prompt(settings.method_prompt, vocab, period=64, seed=1)
    new = settings.method_new
    try:
        for name in budget.each(selected(settings.timed_methods or settings.methods)):
            t0 = time.perf_counter()
            method = build_method(name, small=False)
            method.setup(engine)
            with steps_as_the_runner(engine, method):
                for _ in range(2 if settings.cuda else 1):  # compiles, then records CUDA graphs
                    method.generate(engine, prompt, new)
                    method.warm_shapes(engine)
                warm_s = time.perf_counter() - t0
                t = step_times(method, engine, prompt, new)
            steps = method.forward_tokens()
            state.method_rows.append({
                "method": name, "layers": layers,
                "forward_tokens": "+".join(map(str, steps)) if steps else "varies",
                "prompt_tokens": len(prompt), "new_tokens": new, "steps": t.steps, "tau": round(t.tau, 3),
                "step_ms": round(t.step_ms, 4), "host_ms": round(t.host_ms, 4), "wall_ms": round(t.wall_ms, 4),
                "forwards_per_step": round(t.forwards_per_step, 2), "max_rows": t.max_rows,
                "first_call_s": round(warm_s, 1), "compile": settings.compile_label if not method.eager_forwards
                else "eager (" + method.eager_forwards + ")"})
            write_csv(state, settings, out)  # after each method: an interrupted stage keeps its rows
    finally:
        reset_compiled_state()
        state.release()  # the remaining stage needs no big model
        path = write_csv(state, settings, out)
        rows = state.method_rows
        worst = max(rows, key=lambda r: r["host_ms"] / max(r["wall_ms"], 1e-9), default=None)
        shallow = f" (on {layers} layers: host times as on all, step times not)" if settings.method_layers else ""
        result.summary = f"{len(rows)} methods in {path.name}{shallow}" + (
            f"; largest host share {worst['method']} {worst['host_ms']:.2f} of {worst['wall_ms']:.2f} ms per step"
            if worst else "")
        result.sections.append(markdown_table(METHOD_COLUMNS, rows))


def write_csv(state, settings, out: Path) -> Path:
    common = {"device_name": state.versions.get("device") or device_name(settings.device), "dtype": settings.dtype,
              "compile": settings.compile_label, "torch": torch.__version__, "cuda": torch.version.cuda or ""}
    return write_device_csv(out / f"{device_slug(settings.device)}.csv", state.curve_rows, state.method_rows, common)
