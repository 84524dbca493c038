"""The paper and generic tables' readers and writers (``scripts/make_tables.py``, ``scripts/generic_table.py``,
``scripts/plot.py``): the runs under some roots (:func:`collect`), a table row's numbers over its runs, the cells
with their marks, the long CSV's extra columns, and LaTeX (booktabs) beside the Markdown of
:func:`fafo.bench.tools.report_format.markdown`."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from fafo.bench.metrics import histogram
from fafo.bench.tools.report import Run, category_summaries, load_yaml, speedup_kind, summarize_rows
from fafo.bench.tools.report_format import DASH, SAMPLED_EXACTNESS, fmt_ci, fmt_interval, num, sampled_temperature

SKIP_DIRS = {"_reference", ".submitit", "wandb", ".hydra", "tables", "plots"}


@dataclass
class Collected:
    runs: list[Run] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (run dir, first line of error.txt)


def collect(roots: list[str | Path]) -> Collected:
    """Every run under ``roots``: finished ones (``summary.json``), partial ones (``samples.csv`` rows without a
    summary: killed or running, summarised from the rows) and failed ones (``error.txt`` alone)."""
    out = Collected()
    for i, root in enumerate(map(Path, roots)):
        if not root.exists():
            raise SystemExit(f"error: results directory {root} does not exist")
        dirs = set()
        for name in ("summary.json", "samples.csv", "error.txt"):
            dirs.update(p.parent for p in root.rglob(name) if not SKIP_DIRS & set(p.relative_to(root).parts))
        for d in sorted(dirs):
            rel = d.relative_to(root).as_posix()
            rel = rel if len(roots) == 1 else f"{root.as_posix()}/{rel}"
            config = load_yaml(d / "config.yaml") or load_yaml(d / ".hydra" / "config.yaml")
            run = Run(rel, {}, config, True, (i, rel), path=d)
            if (d / "summary.json").exists():
                try:
                    run.summary = json.loads((d / "summary.json").read_text())
                except json.JSONDecodeError:
                    pass
            if not run.summary and run.sample_rows():
                rows = run.sample_rows()
                run.summary = {**{k: rows[0].get(k) for k in ("model", "method", "task")},
                               **summarize_rows(rows, config, speedup_kind({}, config))}
                run.complete = False
            if not run.summary:
                if (d / "error.txt").exists():
                    out.failed.append((rel, (d / "error.txt").read_text().strip().splitlines()[0]))
                continue
            out.runs.append(run)
    return out


NOISE = ("bench.output_dir", "bench.reference_dir", "bench.progress", "bench.plan", "wandb.")  # not measured


def flat_config(config, prefix: str = "") -> dict[str, str]:
    """A run's config as {dotted key: repr(value)}."""
    if not isinstance(config, dict):
        return {prefix.rstrip("."): repr(config)}
    out = {}
    for k, v in config.items():
        out.update(flat_config(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": repr(v)})
    return out


def swept_keys(runs: list[Run]) -> list[str]:
    """The config keys in which runs of one (model, method, task) differ: what a sweep varied within a table cell,
    which a table must show as columns (``--by``) rather than keep one run of."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        s = run.summary
        groups.setdefault((s.get("model"), s.get("method"), s.get("task")), []).append(flat_config(run.config or {}))
    keys = set()
    for flats in (g for g in groups.values() if len(g) > 1):
        for key in set().union(*flats):
            if not key.startswith(NOISE) and len({f.get(key) for f in flats}) > 1:
                keys.add(key)
    return sorted(keys)


def aggregate(runs: list[Run]) -> dict:
    """A table row's numbers over its runs (one per column): coverage and mismatch counts summed; its peak, vanilla's
    peak and the overhead the max; exact-match rate and time per verification forward weighted by (sample, turn)s;
    tokens/s = new tokens / total time; acceptance histograms summed. None where no run has the key."""
    def given(key):  # (weight, value) of the runs that have the key
        return [(run.weight, x) for run in runs if (x := num(run.summary.get(key))) is not None]

    def mean(key, weights=True):  # weighted by (sample, turn)s; plain where no run has a weight
        pairs = given(key)
        total = sum(w for w, _ in pairs) if weights else 0
        return sum(w * x for w, x in pairs) / total if total > 0 else sum(x for _, x in pairs) / len(pairs) \
            if pairs else None

    out = {key: sum(x for _, x in given(key)) if given(key) else None
           for key in ("n_samples", "n_turns", "n_failed", "n_mismatch_tie", "n_mismatch_divergence", "n_flagged",
                       "n_no_decode")}
    out |= {key: max((x for _, x in given(key)), default=None)
            for key in ("peak_mem_mb", "ref_peak_mem_mb", "mem_overhead_mb")}
    out["exact_match_rate"] = mean("exact_match_rate") if any(w > 0 for w, _ in given("exact_match_rate")) else None
    out["verify_ms"] = mean("verify_ms")
    timed = [(num(r.summary.get("new_tokens")), num(r.summary.get("total_s"))) for r in runs]
    timed = [(n, t) for n, t in timed if n is not None and t is not None]
    out["tokens_per_s"] = sum(n for n, _ in timed) / sum(t for _, t in timed) \
        if timed and sum(t for _, t in timed) > 0 else mean("tokens_per_s", weights=False)
    out["accept_hist"] = histogram(run.summary.get("accept_hist") for run in runs) or None
    return out


def norm_value(v) -> str:
    """One spelling per axis value, so 3072, 3072.0 and "3072" match (and 0.6 stays 0.6); a boolean is spelt as on
    the command line (``true``, not float's ``1``)."""
    if v is None or v == "":
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    try:
        return format(float(v), "g")
    except (TypeError, ValueError):
        return str(v)


def fmt_pair(speedup, tau, ci=None, dash: str = DASH) -> str:
    """``speedup× [lo–hi] (tau)``; ``ci``: the interval's text (:func:`fmt_interval`), or a ``speedup_ci95``."""
    s, t = num(speedup), num(tau)
    if s is None and t is None:
        return dash
    ci = ci if isinstance(ci, str) else fmt_ci(ci)
    if s is not None and ci:
        return f"{s:.2f}× {ci}" + ("" if t is None else f" ({t:.2f})")
    return f"{s:.2f}×" if t is None else f"{s:.2f}× ({t:.2f})" if s is not None else f"{dash} ({t:.2f})"


def sampled_note(runs) -> list[str]:
    """Why a sampled row's Exact is a dash: at T > 0 a lossless method matches vanilla in distribution only."""
    sampled = sorted({str(run.summary.get("method", run.rel)) for run in runs if sampled_temperature(run.summary)})
    return [f"Exact {DASH} for sampled runs (T > 0: {', '.join(sampled)}): {SAMPLED_EXACTNESS} "
            "(scripts/check_distribution.py tests it)."] if sampled else []


def prompts_note(runs) -> list[str]:
    """Which models' runs rendered chat samples without a chat template (the plain ``### User:`` fallback of
    ``tasks.base``), read from each summary's ``prompt_formats``."""
    from tasks.base import FALLBACK_FORMAT

    plain = sorted({str(run.summary.get("model")) for run in runs
                    if FALLBACK_FORMAT in (run.summary.get("prompt_formats") or {})})
    return [f"Chat prompts of {', '.join(plain)}: plain '### User:' / '### Assistant:' blocks, the tokenizer having "
            "no chat template."] if plain else []


def fmt_run(run, tau_all: bool = False, dash: str = DASH) -> str:
    """A run's cell: ``speedup× [lo–hi] (tau)`` (``(tau/tau_all)`` with ``tau_all``), ``*`` for a partial run,
    ``†`` when its numbers are computed on the samples common to its column
    (:func:`fafo.bench.tools.report.align`)."""
    s = run.summary if run is not None else {}
    text = fmt_pair(s.get("speedup"), s.get("tau"), fmt_interval(s, "speedup"), dash)
    if tau_all and num(s.get("tau_all")) is not None and text.endswith(")"):
        text = text[:-1] + f"/{num(s['tau_all']):.2f})"
    marks = ("*" if not run.complete else "") + ("†" if run.coverage is not None else "") if run else ""
    return text if text == dash else text + marks


def rounded(x, digits: int = 4):
    """A CSV number rounded to ``digits`` (an integer for 0 digits: a count; "" where there is none)."""
    x = num(x)
    return "" if x is None else int(round(x)) if digits == 0 else round(x, digits)


def interval_columns(s: dict) -> dict:
    """A summary's speedup kind and interval bounds as CSV columns ("" where there is none)."""
    ci = s.get("speedup_ci95") if isinstance(s.get("speedup_ci95"), (list, tuple)) else ("", "")
    rng = s.get("speedup_range") if isinstance(s.get("speedup_range"), (list, tuple)) else ("", "")
    return {"speedup_kind": s.get("speedup_kind") or "", "speedup_ci95_lo": rounded(ci[0]),
            "speedup_ci95_hi": rounded(ci[1]), "speedup_range_lo": rounded(rng[0]),
            "speedup_range_hi": rounded(rng[1])}


def csv_extras(run) -> dict:
    """A long CSV's coverage, interval, tau_all, memory and exactness columns of a run ("" where unknown)."""
    s = run.summary if run is not None else {}
    out = {**interval_columns(s),
           "common_samples": len(run.coverage.common) if run is not None and run.coverage is not None else ""}
    for key, digits in (("tau_all", 4), ("n_failed", 0), ("ref_peak_mem_mb", 1), ("mem_overhead_mb", 1),
                        ("verify_ms", 3), ("n_mismatch_tie", 0), ("n_mismatch_divergence", 0), ("n_flagged", 0),
                        ("n_no_decode", 0), ("speedup_decode", 4), ("speedup_vs_eager", 4), ("aa_speedup", 4),
                        ("projected_speedup", 4), ("projection_error", 4)):
        out[key] = rounded(s.get(key), digits)
    return out


CATEGORY_NUMBERS = (("n_samples", 0), ("n_turns", 0), ("speedup", 4), ("tau", 4), ("tau_all", 4),
                    ("exact_match_rate", 4), ("n_mismatch_tie", 0), ("n_mismatch_divergence", 0))
CATEGORY_COLUMNS = ["category", *(k for k, _ in CATEGORY_NUMBERS), *interval_columns({}), "run_dir"]


def category_frame(entries, labels: list[str]):
    """The per-category table as a long CSV (pandas DataFrame): one line per (row, category) of ``entries`` =
    [(row labels, run)] under the label columns ``labels``, with the numbers of the Markdown's cells
    (:func:`fafo.bench.tools.report.category_table`) and the interval bounds, tau_all and exactness beside them; no
    line for a run without two or more categories."""
    import pandas as pd

    lines = []
    for values, run in entries:
        for cat, s in (category_summaries(run) if run is not None else {}).items():
            s = {"speedup_kind": run.summary.get("speedup_kind"), **s}
            lines.append({**dict(zip(labels, values)), "category": cat,
                          **{k: rounded(s.get(k), digits) for k, digits in CATEGORY_NUMBERS},
                          **interval_columns(s), "run_dir": run.rel})
    return pd.DataFrame(lines, columns=[*labels, *CATEGORY_COLUMNS])


def latex(title: str, spec: str, head: list[str], lines, notes=()) -> str:
    """A booktabs ``tabular``: ``% title`` and the table's ``notes`` (its definitions, n, intervals, failures) as
    comment lines above it, so that the fragment can be ``\\input`` anywhere (a float, a ``\\resizebox``) and still
    carries what its numbers mean; then the ``head`` lines (LaTeX already) and one line per row with its cells escaped
    by :func:`tex`, a rule before each row that starts a group (a non-empty first cell)."""
    out = [f"% {title} (scripts/make_tables.py)"] + [comment(note) for note in notes]
    out += [r"\begin{tabular}{" + spec + "}", r"\toprule", *head, r"\midrule"]
    for i, line in enumerate(lines):
        if i and line[0]:
            out.append(r"\midrule")
        out.append(" & ".join(tex(x) for x in line) + r" \\")
    return "\n".join(out + [r"\bottomrule", r"\end{tabular}"]) + "\n"


def comment(note: str, width: int = 118) -> str:
    """A note as LaTeX comment lines (``% - `` then ``%   `` on each wrapped line); its own line breaks kept."""
    wrapped = [part for para in str(note).splitlines() or [""]
               for part in textwrap.wrap(para, width - 4, break_long_words=False, break_on_hyphens=False) or [""]]
    return "\n".join(("% - " if i == 0 else "%   ") + part for i, part in enumerate(wrapped))


def write_table(out_dir, name: str, frame, md: str, latex_text: str, by_category=None) -> dict[str, Path]:
    """``<name>.csv`` (the DataFrame ``frame``), ``<name>.md`` and ``<name>.tex`` in ``out_dir``, by extension, and
    ``<name>_by_category.csv`` (:func:`write_category_csv`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {ext: out / f"{name}.{ext}" for ext in ("csv", "md", "tex")}
    frame.to_csv(paths["csv"], index=False, lineterminator="\n")
    paths["md"].write_text(md)
    paths["tex"].write_text(latex_text)
    if write_category_csv(out / f"{name}_by_category.csv", by_category):
        paths["by_category"] = out / f"{name}_by_category.csv"
    return paths


def write_category_csv(path: Path, frame) -> bool:
    """Write :func:`category_frame`'s ``frame`` to ``path`` when it has lines (True); else remove an older file
    there, so that a folder never pairs a table with another run's categories (False)."""
    if frame is not None and len(frame):
        frame.to_csv(path, index=False, lineterminator="\n")
        return True
    Path(path).unlink(missing_ok=True)
    return False


def tex(s: str, dash: str = DASH) -> str:
    """A cell's text for LaTeX: specials escaped, ×, Δ, dashes and the partial / common-sample marks typeset."""
    s = s.replace("\\", "\0")
    for a, b in (("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("$", r"\$"), ("{", r"\{"), ("}", r"\}")):
        s = s.replace(a, b)
    s = s.replace("\0", r"\textbackslash{}")
    s = s.replace("×", r"$\times$").replace("Δ", r"$\Delta$").replace(dash, "--").replace("*", r"$^*$")
    s = s.replace("–", "--").replace("†", r"$^\dagger$").replace("‡", r"$^\ddagger$")
    return s.replace("∅", r"$\emptyset$")
