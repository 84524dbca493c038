"""The comparison's files (:mod:`fafo.bench.compare`): ``compare.csv``, ``compare.md`` (per category too when samples
carry categories, with ``compare_by_category.csv`` beside it) and ``compare.png``, every method on the (sample, turn)s
all of them completed (:func:`fafo.bench.tools.report.align`); vanilla's row is the A/A line.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from fafo.bench.compare import REFERENCE
from fafo.bench.tools.report import (Run, align, category_markdown, definitions, reference_check, reference_note,
                               reference_throughput)
from fafo.bench.tools.report_format import (SAMPLED_EXACTNESS, fmt, fmt_exact, fmt_hist, fmt_interval, fmt_n,
                                            fmt_prompts, num, sampled_temperature)
from fafo.bench.tools.report_format import markdown as markdown_table
from fafo.bench.tools.tables import category_frame, write_category_csv

INTERVALS = ["speedup", "speedup_e2e", "speedup_decode", "tau", "aa_speedup", "speedup_vs_eager", "latency_p50",
             "latency_p90", "latency_p99", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99", "tau_step"]
LOAD = ["batch_size", "batching", "n_requests", "batch_tokens_per_s", "ref_batch_tokens_per_s", "latency_p50",
        "latency_p90", "latency_p99", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99", "n_steps", "tau_step",
        "rows_per_step"]  # bench.batch_size > 1 (fafo.bench.batch_metrics)
COLUMNS = ["method", "role", "n_samples", "n_turns", "n_failed", "n_flagged", "n_no_decode", "speedup",
           "speedup_kind", "speedup_e2e", "speedup_decode", "aa_speedup", "speedup_vs_eager", "projected_speedup",
           "projection_error", "projection_beyond_curve", "tau", "tau_all", "tau_with_prefill", "tokens_per_s",
           "exact_match_rate", "n_mismatch_tie", "n_mismatch_divergence", "peak_mem_mb", "ref_peak_mem_mb",
           "mem_overhead_mb", "verify_ms", "accept_hist", "new_tokens", "common_samples", "method_backend",
           "ref_tokens_per_s", "ref_vs_median", "ref_outside_aa", *LOAD] + \
    [f"{k}_{kind}" for k in INTERVALS for kind in ("ci95", "range")]
AA_LABEL = "vanilla (A/A noise floor)"


def write_comparison(cfg: DictConfig, run_dir: Path, summaries: dict[str, dict]) -> None:
    """The comparison's files of the methods' ``summaries`` ({method: summary}), on their common samples."""
    aligned, notes = on_common_samples(run_dir, summaries)
    entries = category_entries(run_dir, aligned)
    write_outputs(comparison_table(aligned), run_dir, caption(cfg, aligned, notes),
                  category_markdown(entries, ["method"], dash="-").rstrip(), category_frame(entries, ["method"]))


def _runs(run_dir: Path, summaries: dict[str, dict]):
    return [Run(name, s, {}, True, path=Path(run_dir) / name) for name, s in summaries.items()]


def on_common_samples(run_dir: Path, summaries: dict[str, dict]) -> tuple[dict[str, dict], list[str]]:
    """{method: summary} recomputed on the (sample, turn)s every method completed, and the note saying so."""
    runs, note = align(_runs(run_dir, summaries), label=lambda r: r.rel)
    out = {r.rel: {**r.summary, "common_samples": len(r.coverage.common) if r.coverage else None,
                   "ref_tokens_per_s": reference_throughput(r)} for r in runs}
    return reference_check(out), ([f"† {note}"] if note else [])


def comparison_table(summaries: dict[str, dict]):
    """One row per method: coverage, speedups with intervals, its own A/A floor, tau and tau_all, exactness, memory
    beside vanilla's, time per verification forward, acceptance histogram, the projected decode speedup (pandas
    DataFrame); vanilla's row has role "A/A noise floor"."""
    import pandas as pd

    rows = [{"method": s.get("method", name), **{k: s.get(k) for k in COLUMNS[1:]},
             "role": "A/A noise floor" if REFERENCE in (name, s.get("method")) else "method"}
            for name, s in summaries.items()]
    return pd.DataFrame(rows, columns=COLUMNS)


def caption(cfg: DictConfig, summaries: dict[str, dict], notes: list[str] = ()) -> str:
    """What the numbers came from: model, task, how its prompts were rendered, new tokens, dtype, machine, threads
    and load (start-end)."""
    s = next(iter(summaries.values()))
    params = f"{s['n_params'] / 1e6:.1f}M params, " if s.get("n_params") else ""
    loads = [x.get(k) for x in summaries.values() for k in ("load_start", "load_end") if x.get(k) is not None]
    load = f", load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    prompts = f" (prompts: {formats})" if (formats := fmt_prompts(s)) else ""
    text = (f"{s['model']} ({params}{s['dtype']}), task {s['task']}, {s['n_samples']} samples{prompts}, "
            f"{cfg.bench.get('max_new_tokens') or 'task-default'} new tokens per turn, {decoding(s)}; "
            f"{s.get('device_name', s.get('device'))}, {s.get('threads', '?')} threads{load}; vanilla timed beside "
            f"each method; the {AA_LABEL} row is vanilla against its own interleaved run, and each method's A/A "
            "column is vanilla against a second vanilla timed right after that method: not results, the noise "
            "floor (speedups within them are noise). n = samples[/turns] (failed rows). decode = speedup_decode; "
            + projected_note(summaries.values()) + " "
            + " ".join(f"{line}." for line in definitions(summaries.values(), ("tau", "tau_all"))
                       + reference_note(summaries.values())))
    note = cfg.compare.get("note")
    eager = [f"{name}: {s['timing_note']}." for name, s in summaries.items() if s.get("timing_note")]
    return " ".join([text, *notes, *eager] + ([note] if note else []))


def decoding(summary: dict) -> str:
    """How the tokens were chosen: greedy, or the sampling settings that differ from plain sampling, with why the
    exact-match column is empty then."""
    temperature, sampling = sampled_temperature(summary), summary.get("sampling") or {}
    if temperature is None:
        return "greedy"
    shown = [f"T {temperature:g}"] + [
        f"{label} {sampling[key]:g}" for key, label, plain in (
            ("top_p", "top-p", 1.0), ("top_k", "top-k", 0), ("min_p", "min-p", 0.0),
            ("repetition_penalty", "repetition penalty", 1.0)) if sampling.get(key, plain) != plain]
    return f"sampled ({', '.join(shown)}; exact match -: {SAMPLED_EXACTNESS})"


def projected_note(summaries) -> str:
    """What the projected column means: on the run's own device a check (err = projected / measured decode - 1),
    on another device a prediction (no err)."""
    summaries = list(summaries)
    beyond = " ~ = some forwards priced by the curve's extrapolation (outside its contexts or step sizes)." \
        if any((s.get("projection_beyond_curve") or 0) > 0 for s in summaries) else ""
    other = sorted({s.get("cost_curve_device") or "?" for s in summaries if s.get("projection_cross_device")})
    if other:
        floor = [s.get("method", "?") for s in summaries if "a floor" in (s.get("projection_host") or "")]
        floor_note = (f" Host time per step: each method's own where the curve file has it, else vanilla's, a floor "
                      f"that makes the projection an upper bound ({', '.join(floor)})." if floor else "")
        return (f"projected = the decode speedup this method's own forwards, steps and tau would give on "
                f"{', '.join(other)} (bench.cost_curve: forward latencies and host ms per step measured there, on "
                f"the model that file was measured with; no err: this run was timed on another device).{floor_note}"
                + beyond)
    return ("projected = the decode speedup bench.cost_curve's device gives this method's own forwards, err = "
            "projected / measured decode - 1." + beyond)


def category_entries(run_dir: Path, summaries: dict[str, dict]) -> list:
    """[([method], run)] of the comparison, aligned (per category on the common samples too), each named as in
    compare.csv."""
    runs, _ = align(_runs(run_dir, summaries))
    return [([s.get("method", name)], run) for (name, s), run in zip(summaries.items(), runs)]


def write_outputs(table, run_dir: Path, text: str, by_category: str = "", category_csv=None) -> None:
    """compare.csv, compare.md (the caption ``text`` and the per-category Markdown ``by_category`` under the table),
    compare.png and compare_by_category.csv (:func:`fafo.bench.tools.tables.write_category_csv`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(run_dir / "compare.csv", index=False)
    md = markdown(table)
    extra = f"\n\n{by_category}" if by_category else ""
    (run_dir / "compare.md").write_text(f"{md}\n\n{text}{extra}\n")
    plot(table, run_dir / "compare.png", text)
    written = ["compare.csv", "compare.md", "compare.png"]
    if write_category_csv(run_dir / "compare_by_category.csv", category_csv):
        written.append("compare_by_category.csv")
    print(f"\n== fafo-bench comparison ({run_dir}) ==\n{md}\n{text}{extra}\n"
          f"written: {', '.join(written)}", flush=True)


HEAD = ["method", "n (failed)", "speedup", "A/A", "decode", "projected (err)", "tau", "tau_all", "tokens/s",
        "vanilla tok/s",
        "exact match", "peak MB", "vanilla MB", "overhead MB", "verify ms", "accept hist"]


def _cell(row: dict, key: str, spec: str, unit: str = "", interval: bool = False) -> str:
    """``row[key]`` as ``spec`` with ``unit`` ("-" where it is missing), and its interval (:func:`fmt_interval`)."""
    text = fmt(row.get(key), spec, "-") + (unit if num(row.get(key)) is not None else "")
    return text + (f" {fmt_interval(row, key)}" if interval and fmt_interval(row, key) else "")


def markdown(table) -> str:
    """The table as Markdown: the A/A line first, labelled so, then one line per method; every interval as
    :func:`~fafo.bench.tools.report_format.fmt_interval` writes it (``[..]`` 95 %, ``{..}`` per-sample range)."""
    lines = []
    for row in sorted(table.to_dict("records"), key=lambda r: r["role"] != "A/A noise floor"):
        aa, err = row["role"] == "A/A noise floor", num(row.get("projection_error"))
        mark = "†" if num(row["common_samples"]) is not None else ""
        eager = " (eager)" if row.get("method_backend") == "eager" and num(row.get("speedup_vs_eager")) is not None \
            else ""
        err = f" ({100 * err:+.0f} %)" if err is not None else ""
        projected = _cell(row, "projected_speedup", ".2f", "x") + err + \
            ("~" if (row.get("projection_beyond_curve") or 0) > 0 else "")
        lines.append([AA_LABEL if aa else str(row["method"]) + eager, fmt_n(row, "-"),
                      ("A/A " if aa else "") + _cell(row, "speedup", ".2f", "x", True) + mark,
                      "-" if aa else _cell(row, "aa_speedup", ".2f", "x", True),
                      _cell(row, "speedup_decode", ".2f", "x"),
                      "-" if aa else projected, _cell(row, "tau", ".2f", interval=True), _cell(row, "tau_all", ".2f"),
                      _cell(row, "tokens_per_s", ".1f"),
                      _cell(row, "ref_tokens_per_s", ".1f") + ("!" if row.get("ref_outside_aa") is True else ""),
                      fmt_exact(row, "-"), _cell(row, "peak_mem_mb", ".0f"),
                      _cell(row, "ref_peak_mem_mb", ".0f"), _cell(row, "mem_overhead_mb", ".0f"),
                      _cell(row, "verify_ms", ".2f"), fmt_hist(row["accept_hist"], dash="-")])
    return (markdown_table(HEAD, lines, labels=1).rstrip() + load_markdown(table)).rstrip()


LOAD_HEAD = ["method", "batch", "requests", "batch tok/s", "vanilla batch tok/s", "latency p50 s", "p90 s", "p99 s",
             "TPOT p50 ms", "p99 ms", "tau per step", "rows per step"]


def load_markdown(table) -> str:
    """Under load (``bench.batch_size`` > 1): per method its batch throughput beside vanilla's at the same batch
    size and mode, request latency and time per output token percentiles (p50 with its interval over requests),
    tau per batched step (interval over samples) and active rows per step; "" for batch-1 runs."""
    rows = [r for r in table.to_dict("records") if (num(r.get("batch_size")) or 1) > 1 and r["role"] == "method"]
    if not rows:
        return ""
    lines = [[str(r["method"]), f"{int(num(r['batch_size']))} {r.get('batching') or ''}".strip(),
              fmt(r.get("n_requests"), ".0f", "-"), _cell(r, "batch_tokens_per_s", ".1f"),
              _cell(r, "ref_batch_tokens_per_s", ".1f"), _cell(r, "latency_p50", ".3f", interval=True),
              _cell(r, "latency_p90", ".3f"), _cell(r, "latency_p99", ".3f"),
              _cell(r, "tpot_ms_p50", ".2f", interval=True), _cell(r, "tpot_ms_p99", ".2f"),
              _cell(r, "tau_step", ".2f", interval=True), _cell(r, "rows_per_step", ".2f")] for r in rows]
    return "\n\nUnder load (vanilla at the same batch size and batching mode; the speedups above are throughput " \
        "ratios from each request's share of the batch's time; intervals of latency and TPOT over requests, of tau " \
        "per step over samples, each [lo–hi] = 95 % bootstrap from 10 of them, else {lo–hi} = lowest and highest):" \
        "\n\n" + markdown_table(LOAD_HEAD, lines, labels=1)


def interval_of(row: dict, key: str) -> list[float] | None:
    """[lo, hi] of ``key``'s interval in a table row (95 % bootstrap or per-sample range), None without one."""
    return next(([float(v[0]), float(v[1])] for v in (row.get(f"{key}_ci95"), row.get(f"{key}_range"))
                 if isinstance(v, (list, tuple)) and len(v) == 2 and None not in v), None)


VERDICTS = {"win": "faster: the interval is above 1", "loss": "slower: the interval is below 1",
            "inconclusive": "inconclusive: the interval holds 1 (or there is none)"}
VERDICT_COLORS = {"win": "#4c72b0", "loss": "#c44e52", "inconclusive": "#b0b0b0"}


def verdict(value: float, interval: list[float] | None) -> str:
    """``win`` when the speedup's interval lies above 1, ``loss`` below 1, else ``inconclusive`` (one sample or
    an interval that holds 1: the bar's colour must not claim what the interval does not)."""
    if interval is None or value != value:
        return "inconclusive"
    return "win" if interval[0] > 1.0 else "loss" if interval[1] < 1.0 else "inconclusive"


def plot(table, path: Path, text: str) -> None:
    """Speedup and tau per method with their intervals as error bars (95 % bootstrap from 10 samples, else the
    per-sample range: the axis label says which), each value written right of its error bar; speedup bars coloured
    by :func:`verdict` (win / loss / inconclusive); vanilla's A/A interval as a grey band (the noise floor)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = table[table["role"] != "A/A noise floor"].reset_index(drop=True)
    records = methods.to_dict("records")
    kinds = sorted({str(k) for k in table["speedup_kind"] if isinstance(k, str)})
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * max(len(methods), 1) + 2.7), sharey=True)
    y = list(range(len(methods)))
    bars = ("95% bootstrap CI" if any(r.get("speedup_ci95") is not None for r in records) else
            "range over samples" if any(r.get("speedup_range") is not None for r in records) else "no interval")
    for ax, col, label in ((axes[0], "speedup", f"speedup_{'/'.join(kinds)}" if kinds else "speedup"),
                           (axes[1], "tau", "tau (tokens per verification step, prefill excluded)" if kinds
                            else "tau (new tokens / (forwards + 1))")):
        values = methods[col].astype(float).fillna(0.0)
        ivs = [interval_of(r, col) if v == v else None for v, r in zip(values, records)]
        xerr = [[max(0.0, v - iv[0]) if iv else 0.0 for v, iv in zip(values, ivs)],
                [max(0.0, iv[1] - v) if iv else 0.0 for v, iv in zip(values, ivs)]]
        colors = [VERDICT_COLORS[verdict(v, iv)] for v, iv in zip(values, ivs)] if col == "speedup" \
            else ["#8c8c8c"] * len(values)
        ax.barh(y, values, xerr=xerr, capsize=3, color=colors)
        ax.axvline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xlabel(label + (" vs vanilla (x)" if col == "speedup" else "") + f", bars: {bars}", fontsize=8)
        for i, v, iv in zip(y, values, ivs):  # right of the error bar's end, never under it
            ax.text(max(v, iv[1] if iv else v), i, f"  {v:.2f}", va="center", ha="left", fontsize=8)
        ax.set_xlim(0, max([*values, *(iv[1] for iv in ivs if iv), 1.0]) * 1.25)
    from matplotlib.patches import Patch

    handles = [Patch(color=VERDICT_COLORS[k], label=text) for k, text in VERDICTS.items()]
    for row in table[table["role"] == "A/A noise floor"].to_dict("records"):
        if interval_of(row, "speedup"):
            lo, hi = interval_of(row, "speedup")
            handles.append(axes[0].axvspan(lo, hi, color="grey", alpha=0.25,
                                           label=f"{AA_LABEL} {fmt_interval(row, 'speedup')}"))
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=len(handles))  # below the bars, hiding none
    axes[0].set_yticks(y, [f"{m} (n={fmt_n(r, '-')})" for m, r in zip(methods["method"], records)])
    axes[0].invert_yaxis()
    fig.suptitle(text, fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
