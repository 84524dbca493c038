"""Cell texts shared by every table: speedup with its interval, coverage, exactness, acceptance histogram.

A key a summary lacks (an old run directory, a method that drafts nothing) prints as ``dash`` (default "—").
"""

from __future__ import annotations

import math
from pathlib import Path

DASH = "—"


def num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def fmt(v, spec: str, dash: str = DASH) -> str:
    x = num(v)
    return dash if x is None else format(x, spec)


def fmt_ci(ci, spec: str = ".2f") -> str | None:
    """``[lo–hi]`` of a ``*_ci95`` value, None when there is none."""
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or num(ci[0]) is None or num(ci[1]) is None:
        return None
    return f"[{num(ci[0]):{spec}}–{num(ci[1]):{spec}}]"


def fmt_speedup(s: dict, key: str = "speedup", dash: str = DASH) -> str:
    """``1.50× [1.20–1.80]`` (the interval when the summary has ``<key>_ci95``)."""
    x = num(s.get(key))
    if x is None:
        return dash
    ci = fmt_ci(s.get(f"{key}_ci95"))
    return f"{x:.2f}×" + (f" {ci}" if ci else "")


def fmt_n(s: dict, dash: str = DASH) -> str:
    """Coverage: ``samples[/turns] (failed rows)``, e.g. ``80/160 (2)``."""
    n, turns, failed = num(s.get("n_samples")), num(s.get("n_turns")), num(s.get("n_failed"))
    if n is None:
        return dash
    text = f"{n:.0f}" + (f"/{turns:.0f}" if turns is not None and turns != n else "")
    return text + f" ({fmt(failed, '.0f', dash)})"


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


def merge_hists(hists) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in hists:
        for k, v in (h or {}).items() if isinstance(h, dict) else ():
            out[int(k)] = out.get(int(k), 0) + int(v)
    return dict(sorted(out.items()))


def fmt_cell(s: dict, dash: str = DASH) -> str:
    """A compact ``speedup× [lo–hi] (tau) n=N`` for per-category tables."""
    if num(s.get("speedup")) is None and num(s.get("tau")) is None:
        return dash
    return f"{fmt_speedup(s, dash=dash)} ({fmt(s.get('tau'), '.2f', dash)}) n={fmt(s.get('n_turns'), '.0f', dash)}"


def norm_value(v) -> str:
    """One spelling per axis value, so 3072, 3072.0 and "3072" match (and 0.6 stays 0.6)."""
    if v is None or v == "":
        return ""
    try:
        return format(float(v), "g")
    except (TypeError, ValueError):
        return str(v)


def fmt_pair(speedup, tau, ci=None, dash: str = DASH) -> str:
    """``speedup× [lo–hi] (tau)``; the interval when ``ci`` (a ``speedup_ci95``) is given."""
    s, t = num(speedup), num(tau)
    if s is None and t is None:
        return dash
    if s is not None and fmt_ci(ci):
        return f"{s:.2f}× {fmt_ci(ci)}" + ("" if t is None else f" ({t:.2f})")
    return f"{s:.2f}×" if t is None else f"{s:.2f}× ({t:.2f})" if s is not None else f"{dash} ({t:.2f})"


def fmt_run(run, tau_all: bool = False, dash: str = DASH) -> str:
    """A run's cell: ``speedup× [lo–hi] (tau)`` (``(tau/tau_all)`` with ``tau_all``), ``*`` for a partial run,
    ``†`` when its numbers are computed on the samples common to its column (:func:`fafo.bench.report.align`)."""
    s = run.summary if run is not None else {}
    text = fmt_pair(s.get("speedup"), s.get("tau"), s.get("speedup_ci95"), dash)
    if tau_all and num(s.get("tau_all")) is not None and text.endswith(")"):
        text = text[:-1] + f"/{num(s['tau_all']):.2f})"
    marks = ("*" if not run.complete else "") + ("†" if run.coverage is not None else "") if run else ""
    return text if text == dash else text + marks


def rounded(x, digits: int = 4):
    """A CSV number rounded to ``digits`` ("" where there is none)."""
    x = num(x)
    return "" if x is None else round(x, digits)


def csv_extras(run) -> dict:
    """A long CSV's coverage, interval, tau_all, memory and exactness columns of a run ("" where unknown)."""
    s = run.summary if run is not None else {}
    ci = s.get("speedup_ci95") if isinstance(s.get("speedup_ci95"), (list, tuple)) else ("", "")
    out = {"speedup_kind": s.get("speedup_kind") or "", "speedup_ci95_lo": rounded(ci[0]),
           "speedup_ci95_hi": rounded(ci[1]),
           "common_samples": len(run.coverage.common) if run is not None and run.coverage is not None else ""}
    for key, digits in (("tau_all", 4), ("n_failed", 0), ("ref_peak_mem_mb", 1), ("mem_overhead_mb", 1),
                        ("verify_ms", 3), ("n_mismatch_tie", 0), ("n_mismatch_divergence", 0)):
        out[key] = rounded(s.get(key), digits)
    return out


# ------------------------------------------------------------------ the one Markdown and LaTeX writer
def markdown(head: list[str], lines, notes=(), title: str | None = None, labels: int = 2) -> str:
    """A Markdown table (``### title`` above it when given): ``labels`` left-aligned label columns, the rest
    right-aligned, then one bullet per note."""
    out = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(head) + " |",
                                                      "|" + "|".join("---" if i < labels else "---:"
                                                                     for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out + ([""] + [f"- {n}" for n in notes] if notes or title else [])) + "\n"


def latex(title: str, spec: str, head: list[str], lines) -> str:
    """A booktabs ``tabular`` (``% title`` above it): the ``head`` lines (LaTeX already), then one line per row with
    its cells escaped by :func:`tex`, a rule before each row that starts a group (a non-empty first cell)."""
    out = [f"% {title} (scripts/make_tables.py)", r"\begin{tabular}{" + spec + "}", r"\toprule", *head, r"\midrule"]
    for i, line in enumerate(lines):
        if i and line[0]:
            out.append(r"\midrule")
        out.append(" & ".join(tex(x) for x in line) + r" \\")
    return "\n".join(out + [r"\bottomrule", r"\end{tabular}"]) + "\n"


def write_table(out_dir, name: str, frame, md: str, latex_text: str) -> dict[str, Path]:
    """``<name>.csv`` (the DataFrame ``frame``), ``<name>.md`` and ``<name>.tex`` in ``out_dir``, by extension."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {ext: out / f"{name}.{ext}" for ext in ("csv", "md", "tex")}
    frame.to_csv(paths["csv"], index=False, lineterminator="\n")
    paths["md"].write_text(md)
    paths["tex"].write_text(latex_text)
    return paths


def tex(s: str, dash: str = DASH) -> str:
    """A cell's text for LaTeX: specials escaped, ×, Δ, dashes and the partial / common-sample marks typeset."""
    s = s.replace("\\", r"\textbackslash{}")
    for a, b in (("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("$", r"\$")):
        s = s.replace(a, b)
    s = s.replace("×", r"$\times$").replace("Δ", r"$\Delta$").replace(dash, "--").replace("*", r"$^*$")
    return s.replace("–", "--").replace("†", r"$^\dagger$")
