"""A run's summary (``summary.json``: the metrics of :mod:`fafo.bench.metrics` over its rows, with what they came
from) and what a run prints: the progress bar's running figures and the end-of-run block."""

from __future__ import annotations

import statistics
import sys
from dataclasses import asdict

from fafo.bench.batch_metrics import batch_summary, read_steps
from fafo.bench.metrics import flag_counts, histogram, summarize
from fafo.bench.tools.report_format import SAMPLED_EXACTNESS, fmt_prompts, interval_label, num, sampled_temperature
from fafo.bench.timing import load_average

RANDOM_MODEL_NOTE = "NOTE: a random tiny model - its speed numbers are a smoke test only, not a benchmark."


def run_summary(spec, meter, records, machine: dict, problems: list[str], **timings) -> dict:
    """The summary of a finished run: its names, the metrics over its rows, its settings, the machine and
    environment, its plan's counts, compile and backend facts, its forwards per step (and with ``bench.cost_curve``
    their projection, :mod:`fafo.bench.tools.projection`), acceptance histogram and flag counts."""
    rows, outputs, b, refused = records.rows, records.outputs, spec.bench, meter.references.refused
    summary = {**spec.names, **summarize(rows, b.max_spread, b.bootstrap, b.speedup_kind),
               "tie_margin": meter.judge.margin, "dtype": spec.dtype, **meter.env, "attention": meter.engine.backend,
               "repeats": b.repeats, "warmup_s": timings.pop("warmup_s"), "load_s": timings.pop("load_s"),
               "sampling": asdict(spec.sampling), "ignore_eos": b.ignore_eos, "random_model": spec.ckpt.random,
               "checkpoint": spec.ckpt.source, "n_params": meter.n_params, "run_dir": str(spec.run_dir),
               "host_ms_per_step": _median_of(rows, "host_ms"), **machine, "load_end": load_average(),
               "repaired": records.repairs, "records_check": problems or "ok", "ref_reuse_refused": refused}
    plan = spec.plan  # the samples' fit: counts, never silent
    summary |= {"n_dropped": plan.n_dropped + plan.n_filtered, "n_dropped_unfit": plan.n_dropped,
                "n_dropped_filter": plan.n_filtered, "n_beyond_trained": plan.n_beyond_trained,
                "context_limit": plan.context_limit, "plan_peak_gb": round(plan.peak_gb, 3),
                "prompt_formats": plan.prompt_formats}
    if refused["n"]:
        print(f"note: {refused['n']} stored reference timings were not reused and were timed again beside the "
              f"method ({refused['examples'][0]})", file=sys.stderr, flush=True)
    if summary.get("ref_sources", {}).get("stored"):
        print(f"warning: {summary['ref_sources']['stored']} rows use a stored reference timing "
              "(bench.reuse_reference=true), not one taken beside the method", file=sys.stderr, flush=True)
    summary |= {"compile": asdict(spec.compile) if spec.compile else None, "timing_note": spec.timing_note or None,
                "reference_backend": "compiled" if spec.compile else "eager",
                "method_backend": "compiled" if spec.compile and not spec.method_eager else "eager",
                "step_attention": meter.engine.step_backend, **timings}
    steps = spec.method.forward_tokens()  # declared per step; tokens_per_step is measured
    summary |= {"tokens_per_forward": sum(steps) if steps else None, "forward_tokens": list(steps) if steps else None}
    logs = [o for o in outputs.values() if o.get("forward_log") is not None]
    n_steps = sum((o.get("forwards") or {}).get("verify") or 0 for o in logs)
    if n_steps and any(o["forward_log"] for o in logs):
        summary["tokens_per_step"] = sum(g[1] * g[5] for o in logs for g in o["forward_log"] if g[0] != "prefill") \
            / n_steps
    if spec.cost_curve is not None:
        from fafo.bench.tools.projection import curve_fields

        summary |= curve_fields(steps, spec.cost_curve, rows, outputs, meter.n_params, spec.names["method"],
                                meter.env.get("device_name"))
    if b.batch_size > 1:  # metrics under load (fafo.bench.batch_metrics)
        summary |= batch_summary(rows, read_steps(spec.run_dir), b.bootstrap)
    summary["accept_hist"] = histogram(o["accept_lengths"] for o in outputs.values())
    summary["flag_counts"] = flag_counts(outputs.values())  # e.g. {"retrieval_covers_prompt": 3}
    if meter.judge.note:
        summary["mismatch_check"] = meter.judge.note
    return summary


def _median_of(rows, key: str) -> float | None:
    """The median of a numeric column over the rows that have it (None: none has)."""
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.median(values) if values else None


class RunningTotals:
    """tau and the headline speedup over the rows written so far, kept as running sums (one update per row, never a
    re-summary of every row): the progress bar's postfix. A row without a decode step (a one-token answer) adds to
    neither speedup sum, as in the summary; a row that failed adds nothing."""

    def __init__(self, kind: str = "e2e"):
        self.kind = kind
        self.tokens = self.forwards = 0.0
        self.time = self.ref_time = self.n = self.ref_n = 0.0

    def add(self, row: dict) -> None:
        if row.get("status") != "ok":
            return
        n, ref_n, forwards = num(row.get("new_tokens")), num(row.get("ref_new_tokens")), num(row.get("forwards"))
        if n is not None and forwards is not None:
            self.tokens += n - 1
            self.forwards += forwards
        if n is None or ref_n is None or n <= 1 or ref_n <= 1:
            return
        decode = self.kind == "decode"
        t, ref_t = (num(row.get("decode_s")), num(row.get("ref_decode_s"))) if decode else \
            (num(row.get("total_s")), num(row.get("ref_total_s")))
        if t and ref_t:
            self.time, self.ref_time = self.time + t, self.ref_time + ref_t
            self.n, self.ref_n = self.n + n - decode, self.ref_n + ref_n - decode

    def postfix(self) -> dict[str, str]:
        tau = self.tokens / self.forwards if self.forwards else None
        speedup = (self.n / self.time) / (self.ref_n / self.ref_time) if self.time and self.ref_time else None
        return {"tau": "-" if tau is None else f"{tau:.2f}", "speedup": "-" if speedup is None else f"{speedup:.2f}"}


def format_params(n: int) -> str:
    """A parameter count as people write it: 135.0M, 8.03B (and the exact number)."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit} ({n:,})"
    return str(n)


KEYS = ["model", "checkpoint", "n_params", "dtype", "method", "task", "prompt_formats", "n_samples", "n_turns",
        "n_failed", "n_no_decode", "new_tokens", "tau", "tau_with_prefill", "tau_all", "accept_rate",
        "draft_model_forwards", "tokens_per_forward", "tokens_per_step", "break_even_tau", "tokens_per_s", "verify_ms",
        "speedup_kind", "speedup", "speedup_e2e", "speedup_decode", "speedup_specbench", "speedup_vs_eager",
        "aa_speedup", "projected_speedup", "projection_error", "batch_size", "batching", "n_requests",
        "batch_tokens_per_s", "ref_batch_tokens_per_s", "latency_p50", "latency_p90", "latency_p99", "ref_latency_p50",
        "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99", "ref_tpot_ms_p50", "n_steps", "tau_step", "rows_per_step",
        "speedup_min", "speedup_max", "n_flagged", "n_compiled", "peak_mem_mb", "ref_peak_mem_mb", "mem_overhead_mb",
        "exact_match_rate", "n_mismatch_tie", "n_mismatch_divergence", "n_mismatch_unchecked", "device_name",
        "threads", "load_start", "warmup_s", "compile_s", "timing_note", "projection_note", "run_dir"]


def sampled_exactness_note(summary: dict) -> str | None:
    """Why a sampled run has no exact-match rate: at T > 0 a lossless method matches vanilla's distribution, not its
    tokens (each draws from its own generator), so the rows are not compared token by token."""
    temperature = sampled_temperature(summary)
    if not summary.get("n_turns") or temperature is None:
        return None
    return f"n/a (sampled at T={temperature:g}: {SAMPLED_EXACTNESS}; scripts/check_distribution.py tests it)"


def print_summary(summary: dict, random_model: bool) -> None:
    """The end-of-run block: which checkpoint was loaded (path or hub id, parameter count, dtype), then the
    metrics, each tau and speedup with its interval named by what it is (:func:`interval_label`)."""
    width = max(map(len, KEYS))
    lines = ["", "== fafo-bench summary =="]
    for k in KEYS:
        v = summary.get(k)
        if k == "exact_match_rate" and v is None:
            v = sampled_exactness_note(summary)
        if v is None:
            continue
        if k == "n_params":
            v = format_params(v)
        elif k == "n_compiled" and v:
            v = f"{v} (compiled while timed, left out of the speedups: {', '.join(summary.get('compiled', [])[:5])})"
        elif k == "n_flagged" and v:
            v = f"{v} (repeats disagree by > bench.max_spread: {', '.join(summary.get('flagged', [])[:5])})"
        elif k == "n_no_decode" and v:
            v = f"{v} (one token or none: no decode step, left out of the speedups: " \
                f"{', '.join(summary.get('no_decode', [])[:5])})"
        elif k == "prompt_formats":
            v = fmt_prompts(summary)
            if v is None:
                continue
        elif k == "projection_error":
            v = f"{100 * v:+.1f} % (projected / measured speedup_decode - 1)"
        text = f"{v:.3f}" if isinstance(v, float) else f"{v}"
        interval = interval_label(summary, k)
        lines.append(f"{k:<{width}}  {text}" + (f"  {interval}" if interval else ""))
    if random_model:
        lines.append(RANDOM_MODEL_NOTE)
    print("\n".join(lines), flush=True)
