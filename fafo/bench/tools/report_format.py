"""Cell texts shared by every table: speedup with its interval, coverage, exactness, acceptance histogram.

A key a summary lacks (an old run directory, a method that drafts nothing) prints as ``dash`` (default "—").
"""

from __future__ import annotations

import math

DASH = "—"


def num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


SAMPLED_EXACTNESS = "lossless in distribution, not token by token"  # why a sampled run has no exact-match rate


def sampled_temperature(summary: dict) -> float | None:
    """A run's sampling temperature when it sampled (T > 0: its rows are not compared token by token), else None."""
    t = num((summary.get("sampling") or {}).get("temperature"))
    return t if t and t > 0 else None


def fmt(v, spec: str, dash: str = DASH) -> str:
    x = num(v)
    return dash if x is None else format(x, spec)


def fmt_ci(ci, spec: str = ".2f") -> str | None:
    """``[lo–hi]`` of a ``*_ci95`` value, None when there is none."""
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or num(ci[0]) is None or num(ci[1]) is None:
        return None
    return f"[{num(ci[0]):{spec}}–{num(ci[1]):{spec}}]"


def fmt_range(r, spec: str = ".2f") -> str | None:
    """``{lo–hi}`` of a ``*_range`` value (the lowest and highest per-sample value), None when there is none."""
    text = fmt_ci(r, spec)
    return None if text is None else "{" + text[1:-1] + "}"


def fmt_interval(s: dict, key: str, spec: str = ".2f") -> str | None:
    """The interval a summary holds for ``key``: ``[lo–hi]`` (``<key>_ci95``, a 95 % bootstrap interval, 10 or
    more samples), ``{lo–hi}`` (``<key>_range``, the per-sample range, 2-9 samples), None (one sample, or none)."""
    return fmt_ci(s.get(f"{key}_ci95"), spec) or fmt_range(s.get(f"{key}_range"), spec)


def interval_label(s: dict, key: str) -> str | None:
    """The interval of ``key`` spelled out with what it is (the run's printed summary): over samples, or for the
    metrics under load (:mod:`fafo.bench.batch_metrics`) over requests."""
    n, unit = s.get("n_samples"), "sample"
    if key.startswith(("latency_", "tpot_ms_")):
        n, unit = s.get("n_requests"), "request"
    if fmt_ci(s.get(f"{key}_ci95"), ".3f"):
        lo, hi = s[f"{key}_ci95"]
        return f"[{lo:.3f}, {hi:.3f}] (95 %, bootstrap over {n} {unit}s)"
    if fmt_ci(s.get(f"{key}_range"), ".3f"):
        lo, hi = s[f"{key}_range"]
        return f"{{{lo:.3f}, {hi:.3f}}} (lowest and highest of the {n} per-{unit} values; under 10 {unit}s no " \
               "bootstrap interval is a 95 % one)"
    return None


INTERVAL_NOTE = {  # what each bracket means, for captions (only the kinds a table shows are named)
    "ci95": "[lo–hi] = 95 % percentile bootstrap interval over samples (10 or more samples; a sample's turns kept "
            "together)",
    "range": "{lo–hi} = lowest and highest per-sample value, shown instead of an interval below 10 samples (at n = 3 "
             "a bootstrap interval is exactly this range and covers the median only about 75 % of the time); "
             "a one-sample cell has none",
}


def interval_notes(summaries) -> list[str]:
    """Caption lines for the interval kinds ``summaries`` show (none for one-sample cells)."""
    kinds = set()
    for s in summaries:
        for key in ("speedup", "tau"):
            kinds |= {k for k in ("ci95", "range") if fmt_ci(s.get(f"{key}_{k}"))}
    return [INTERVAL_NOTE[k] for k in ("ci95", "range") if k in kinds]


def fmt_n(s: dict, dash: str = DASH) -> str:
    """Coverage: ``samples[/turns] (failed rows)``, e.g. ``80/160 (2)``; then ``‡k`` when k (sample, turn)s are
    flagged (their repeats disagree by more than ``bench.max_spread``) and ``∅k`` when k had no decode step (one
    token or none: left out of the speedups)."""
    n, turns, failed = num(s.get("n_samples")), num(s.get("n_turns")), num(s.get("n_failed"))
    if n is None:
        return dash
    text = f"{n:.0f}" + (f"/{turns:.0f}" if turns is not None and turns != n else "")
    text += f" ({fmt(failed, '.0f', dash)})"
    flagged, short = num(s.get("n_flagged")), num(s.get("n_no_decode"))
    return text + (f" ‡{flagged:.0f}" if flagged else "") + (f" ∅{short:.0f}" if short else "")


MARKS_NOTE = ("‡k = k (sample, turn)s flagged: their repeats (method or vanilla) disagree by more than "
              "bench.max_spread; ∅k = k (sample, turn)s with no decode step (an answer of one token), left out of the "
              "speedups")


def fmt_exact(s: dict, dash: str = DASH) -> str:
    """Exact-match rate, with the fp32 classification of the mismatches (``tie`` / ``div``) when below 1."""
    rate = num(s.get("exact_match_rate"))
    if rate is None:
        return dash
    text = f"{rate:.3f}"
    tie, div = num(s.get("n_mismatch_tie")), num(s.get("n_mismatch_divergence"))
    if rate < 1 and (tie is not None or div is not None):
        text += f" (tie {fmt(tie, '.0f', dash)}, div {fmt(div, '.0f', dash)})"
    return text


def fmt_prompts(s: dict) -> str | None:
    """How the run's samples were rendered (``prompt_formats``: Task.prompt_format counts) as ``chat template`` or
    ``chat template 2, raw text 1``; None for a summary that predates the field or has no sample."""
    formats = s.get("prompt_formats")
    if not isinstance(formats, dict) or not formats:
        return None
    if len(formats) == 1:
        return next(iter(formats))
    return ", ".join(f"{name} {n}" for name, n in sorted(formats.items(), key=lambda kv: (-kv[1], kv[0])))


def fmt_hist(hist, most: int = 8, dash: str = DASH) -> str:
    """An acceptance histogram ``{tokens committed: steps}`` as ``1:40 2:12 3:5`` (longer ones summed as ``9+``)."""
    if not isinstance(hist, dict) or not hist:
        return dash
    counts: dict[int, int] = {}
    for k, v in hist.items():
        counts[int(k)] = counts.get(int(k), 0) + int(v)
    parts = [f"{k}:{v}" for k, v in sorted(counts.items()) if k <= most]
    tail = sum(v for k, v in counts.items() if k > most)
    return " ".join(parts + ([f"{most + 1}+:{tail}"] if tail else []))


def fmt_speedup(s: dict, key: str = "speedup", dash: str = DASH) -> str:
    """``1.50× [1.20–1.80]`` (95 % interval) or ``1.50× {1.20–1.80}`` (per-sample range): :func:`fmt_interval`."""
    x = num(s.get(key))
    if x is None:
        return dash
    ci = fmt_interval(s, key)
    return f"{x:.2f}×" + (f" {ci}" if ci else "")


def fmt_cell(s: dict, dash: str = DASH) -> str:
    """A compact ``speedup× [lo–hi] (tau) n=N`` for per-category tables."""
    if num(s.get("speedup")) is None and num(s.get("tau")) is None:
        return dash
    return f"{fmt_speedup(s, dash=dash)} ({fmt(s.get('tau'), '.2f', dash)}) n={fmt(s.get('n_turns'), '.0f', dash)}"


# ------------------------------------------------------------------ the one Markdown writer
def markdown(head: list[str], lines, notes=(), title: str | None = None, labels: int = 2) -> str:
    """A Markdown table (``### title`` above it when given): ``labels`` left-aligned label columns, the rest
    right-aligned, then one bullet per note."""
    out = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(head) + " |",
                                                      "|" + "|".join("---" if i < labels else "---:"
                                                                     for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out + ([""] + [f"- {n}" for n in notes] if notes or title else [])) + "\n"
