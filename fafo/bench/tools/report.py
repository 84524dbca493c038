"""Runs compared on the samples they all cover, for every table (the comparison's, ``scripts/``): :func:`align`
recomputes a table's runs on the (sample, turn)s all of them cover when they differ (a method failed or skipped a
sample), each with a :class:`Coverage` footnote; :func:`category_summaries` gives a run's numbers per category;
:func:`definitions` names in a caption which speedup and tau a table shows. Missing keys print as a dash.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

from fafo.bench.batch_metrics import batch_summary, read_steps
from fafo.bench.metrics import histogram, summarize
from fafo.bench.records import read_outputs, read_rows, turn_key

# Summary keys that depend on which (sample, turn)s were summarised: dropped before a recomputation on a subset, so
# a key the recomputation does not produce reads as missing rather than as the whole run's value.
METRIC_KEYS = {
    "n_rows", "n_samples", "n_turns", "new_tokens", "tau", "tau_ci95", "tau_request", "tau_with_prefill",
    "tau_with_prefill_ci95", "tau_all", "tau_all_ci95", "prefill_s", "decode_s", "total_s", "tokens_per_s",
    "peak_mem_mb", "exact_match_rate", "total_s_iqr", "flagged", "n_flagged", "ref_sources", "speedup",
    "speedup_ci95", "speedup_mean", "speedup_min", "speedup_max", "ref_total_s", "speedup_e2e", "speedup_e2e_ci95",
    "speedup_decode", "speedup_decode_ci95", "speedup_specbench", "speedup_specbench_ci95", "prefill_forwards",
    "verify_forwards", "draft_forwards", "aux_forwards", "target_forwards", "draft_model_forwards",
    "draft_model_share", "drafted", "accepted", "accept_rate", "ref_peak_mem_mb", "mem_overhead_mb", "verify_ms",
    "n_mismatch_tie", "n_mismatch_divergence", "by_category", "accept_hist", "alpha", "flag_counts",
    "n_mismatch_unchecked", "n_no_decode", "no_decode", "n_compiled", "compiled", "interval", "interval_timed",
    "speedup_vs_eager", "aa_speedup",
}


def metric_key(key: str) -> bool:
    """Whether a summary key depends on which (sample, turn)s were summarised (:data:`METRIC_KEYS`, intervals)."""
    return key in METRIC_KEYS or key.endswith(("_ci95", "_range"))


def dotted(cfg: dict, key: str):
    """``cfg["a"]["b"]`` for ``key`` = "a.b"; None where a part is missing."""
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


@dataclass
class Coverage:
    """Where a run's numbers come from when the runs of its table cover different (sample, turn)s."""

    common: frozenset        # the (sample_id, turn)s every run of the group covers
    n_own: int               # the (sample, turn)s this run covers (status ok)
    note: str                # the group's footnote: the common count and what each run lacks


@dataclass
class Run:
    rel: str                  # run directory relative to its root
    summary: dict
    config: dict
    complete: bool            # summary.json written (False: summarised from samples.csv)
    order: tuple = ()
    path: Path | None = None  # the run directory on disk
    rows: list | None = None  # its samples.csv rows (read on demand; a subset for one category)
    coverage: Coverage | None = None

    @property
    def weight(self) -> int:
        return int(self.summary.get("n_turns") or self.summary.get("n_samples") or 0)

    def sample_rows(self) -> list[dict] | None:
        """The run's ``samples.csv`` rows (None when it has none on disk)."""
        if self.rows is None and self.path is not None and (self.path / "samples.csv").exists():
            self.rows = read_rows(self.path / "samples.csv")
        return self.rows


def load_yaml(path: Path) -> dict:
    if not path.exists():
        return {}
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    except Exception:  # noqa: BLE001 - a damaged config.yaml only loses the axis value
        return {}


def speedup_kind(summary: dict, config: dict | None = None) -> str | None:
    """The headline speedup's kind: the summary's, else the config's (a partial run); None for an old run."""
    kind = summary.get("speedup_kind")
    for key in ("bench.speedup_kind", "paper.speedup_kind", "speedup_kind"):
        kind = kind or dotted(config or {}, key)
    return kind


def summarize_rows(rows: list[dict], config: dict | None = None, kind: str | None = None) -> dict:
    """:func:`fafo.bench.metrics.summarize` of ``rows`` with the run's bootstrap and spread settings."""

    config, boot = config or {}, dotted(config or {}, "bench.bootstrap")
    return summarize(rows, dotted(config, "bench.max_spread") or 1.5, 1000 if boot is None else boot, kind or "e2e")


# ------------------------------------------------------------------ the same samples for every run of a table
def ok_keys(rows: list[dict]) -> set[tuple[str, int]]:
    return {turn_key(r) for r in rows if r.get("status") == "ok"}


def resummarize(run: Run, keys) -> dict:
    """The run's summary recomputed on the (sample, turn)s ``keys`` (its own failures stay in ``n_failed``)."""
    rows = [r for r in run.sample_rows() or [] if turn_key(r) in keys]
    fresh = summarize_rows(rows, run.config, speedup_kind(run.summary, run.config))
    kept = {k: v for k, v in run.summary.items() if not metric_key(k)}
    out = {**kept, **fresh, "n_failed": run.summary.get("n_failed", fresh.get("n_failed"))}
    if "failed" in run.summary:  # the run's own failures, as n_failed
        out["failed"] = run.summary["failed"]
    hist = accept_hist(run.path, keys) if run.path is not None else None
    if run.path is not None and any(r.get("batch_size") not in (None, "", "1") for r in rows[:1]):
        boot = dotted(run.config, "bench.bootstrap")  # metrics under load on the same requests
        out |= batch_summary(rows, read_steps(run.path), 1000 if boot is None else boot)
    return out | ({"accept_hist": hist} if hist else {})


def accept_hist(run_dir: Path, keys) -> dict[int, int] | None:
    """How many steps committed 1, 2, 3... tokens over the (sample, turn)s ``keys`` (``outputs.jsonl``)."""
    outputs = read_outputs(Path(run_dir) / "outputs.jsonl")
    return histogram(o.get("accept_lengths") for k, o in outputs.items() if k in keys) or None


def align(runs: list[Run], label=lambda run: run.rel) -> tuple[list[Run], str | None]:
    """The runs of one comparison on their common (sample, turn)s, and the footnote saying so (None: same sets).

    Runs without ``samples.csv`` rows are left as they are (their coverage cannot be checked)."""
    covered = {i: ok_keys(run.sample_rows()) for i, run in enumerate(runs) if run.sample_rows()}
    sets = list(covered.values())
    if len(sets) < 2 or all(s == sets[0] for s in sets):
        return list(runs), None
    common, union = frozenset(set.intersection(*sets)), set.union(*sets)
    lacks = []
    for i, keys in covered.items():
        missing = union - keys
        if missing:
            failed = {turn_key(r) for r in runs[i].sample_rows() if r.get("status") != "ok"} & missing
            example = "/".join(map(str, min(missing)))
            lacks.append(f"{label(runs[i])} lacks {len(missing)} ({len(failed)} failed, {len(missing) - len(failed)}"
                         f" not run; e.g. {example})")
    if not common:  # nothing to compare on: each run keeps its own numbers, and the note says they do not compare
        note = (f"NOT comparable: no (sample, turn) is covered by all {len(sets)} runs; each is shown on its own "
                "samples: " + "; ".join(lacks))
        out = list(runs)
        for i, keys in covered.items():
            out[i] = replace(runs[i], coverage=Coverage(frozenset(keys), len(keys), note))
        return out, note
    note = (f"computed on the {len(common)} (sample, turn)s common to its {len(sets)} runs (of {len(union)}): "
            + "; ".join(lacks))
    out = list(runs)
    for i, keys in covered.items():
        summary = resummarize(runs[i], common) if keys != common else runs[i].summary
        out[i] = replace(runs[i], summary=summary, coverage=Coverage(common, len(keys), note))
    return out, note


# ------------------------------------------------------------------ each method's own vanilla
def reference_throughput(run: Run) -> float | None:
    """The run's own vanilla reference throughput in tokens/s: vanilla's new tokens over its total time (the
    median of a (sample, turn)'s repeats), over the run's timed (sample, turn)s (its common ones when aligned)."""
    from fafo.bench.tools.report_format import num

    allowed = run.coverage.common if run.coverage is not None else None
    per: dict[tuple, tuple[float, list[float]]] = {}
    for r in run.sample_rows() or []:
        tokens, seconds = num(r.get("ref_new_tokens")), num(r.get("ref_total_s"))
        if r.get("status") != "ok" or tokens is None or not seconds or (allowed is not None and
                                                                          turn_key(r) not in allowed):
            continue
        per.setdefault(turn_key(r), (tokens, []))[1].append(seconds)
    if not per:
        return None
    return sum(tokens for tokens, _ in per.values()) / sum(median(ts) for _, ts in per.values())


def aa_band(summaries) -> tuple[float, float] | None:
    """How far apart two timings of the same vanilla land in this job (the A/A band, as a ratio): the span of all
    its A/A intervals together, the vanilla row's (vanilla against its own interleaved run) and each method's
    (``aa_speedup``: vanilla again right after that method), widened to hold 1. None without any."""
    summaries = list(summaries)
    lows, highs = [], []
    for s in summaries:
        own = s.get("method") == "vanilla" or s.get("role") == "A/A noise floor"
        for key in ("speedup", "aa_speedup") if own else ("aa_speedup",):
            iv = next((v for v in (s.get(f"{key}_ci95"), s.get(f"{key}_range"))
                       if isinstance(v, (list, tuple)) and len(v) == 2 and None not in v), None)
            if iv is not None:
                lows.append(float(iv[0]))
                highs.append(float(iv[1]))
    return (min(min(lows), 1.0), max(max(highs), 1.0)) if lows else None


def reference_check(summaries: dict[str, dict]) -> dict[str, dict]:
    """Each method's own vanilla throughput (``ref_tokens_per_s``, from :func:`reference_throughput` put in the
    summaries beforehand) against the median over the methods: ``ref_vs_median`` (the ratio) and
    ``ref_outside_aa`` (True where the ratio falls outside the :func:`aa_band`: the machine ran the same vanilla at
    another speed while that method ran, by more than the A/A noise of this job)."""
    refs = sorted(v for s in summaries.values() if (v := s.get("ref_tokens_per_s")))
    band = aa_band(summaries.values())
    if not refs:
        return summaries
    mid = median(refs)
    out = {}
    for name, s in summaries.items():
        ratio = s["ref_tokens_per_s"] / mid if s.get("ref_tokens_per_s") else None
        outside = None if ratio is None or band is None else not band[0] <= ratio <= band[1]
        out[name] = {**s, "ref_vs_median": ratio, "ref_outside_aa": outside}
    return out


def reference_note(summaries) -> list[str]:
    """Caption lines: what the vanilla tok/s column is and, when references disagree beyond the A/A band, which."""
    summaries = list(summaries)
    refs = [s["ref_tokens_per_s"] for s in summaries if s.get("ref_tokens_per_s")]
    if not refs:
        return []
    lines = ["vanilla tok/s = each method's own vanilla reference (vanilla's new tokens / total time, timed beside "
             "that method on the same samples): every speedup is against it"]
    off = [s for s in summaries if s.get("ref_outside_aa")]
    if off:
        lo, hi = aa_band(summaries)
        lines.append(f"! references disagree: vanilla ran at {min(refs):.1f}-{max(refs):.1f} tokens/s across the "
                     f"methods, and for {', '.join(str(s.get('method')) for s in off)} its speed differs from the "
                     f"median by more than the A/A band ({lo:.2f}x-{hi:.2f}x): the machine's speed changed during "
                     "the job, so compare those rows' speedups with care (each is still against its own vanilla); "
                     "rerun on an idle machine")
    return lines


# ------------------------------------------------------------------ per category
def categories(rows: list[dict]) -> list[str]:
    return [c for c in dict.fromkeys(r.get("category") or "" for r in rows) if c]


def category_summaries(run: Run) -> dict[str, dict]:
    """{category: summary} of a run whose samples carry two or more categories (else {}): recomputed from its rows
    (on the common (sample, turn)s when it was aligned), else the summary's ``by_category``."""
    rows = run.sample_rows()
    if rows:
        cats = categories(rows)
        if len(cats) < 2:
            return {}
        allowed = run.coverage.common if run.coverage is not None else None
        out = {}
        for cat in cats:
            keys = {turn_key(r) for r in rows if (r.get("category") or "") == cat}
            out[cat] = resummarize(run, keys & allowed if allowed is not None else keys)
        return out
    by = run.summary.get("by_category") or {}
    kind = speedup_kind(run.summary, run.config)
    return {c: {**v, "speedup": v.get(f"speedup_{kind}", v.get("speedup"))} for c, v in by.items()} \
        if len(by) >= 2 else {}


# ------------------------------------------------------------------ what the numbers mean
SPEEDUP_DEFS = {
    "e2e": "speedup_e2e = (method new tokens / method total time) / (vanilla new tokens / vanilla total time), "
           "prefill included",
    "decode": "speedup_decode = (method tokens after the first / method decode time) / (the same for vanilla), "
              "prefill excluded",
    "specbench": "speedup_specbench = mean over questions of method tokens/s / mean over questions of vanilla "
                 "tokens/s (Spec-Bench evaluation/speed.py; a question's turns summed)",
    None: "speedup (run recorded before speedup_kind) = summed vanilla total time / summed method total time",
}
TAU_DEFS = {
    "tau": "tau = tokens committed per verification step, prefill excluded: sum of (new tokens - 1) / "
           "verification forwards of the target (the FAFO paper's)",
    "tau_all": "tau_all = new tokens / every forward that reads the target's weights (prefill, verify, self-draft, "
               "aux): the cost-aware figure",
    "tau_with_prefill": "tau_with_prefill = new tokens / (verification forwards + 1) (the prefill's token counted "
                        "as a step, as Spec-Bench's vanilla and Prompt Lookup scripts count)",
    None: "tau (run recorded before tau_all) = new tokens / (forwards + 1), the prefill counted as a step",
}


def definitions(summaries, taus=("tau",)) -> list[str]:
    """Caption lines naming the speedup(s) and tau(s) that ``summaries`` show, with their definitions, what their
    brackets are (only the interval kinds shown: :func:`fafo.bench.tools.report_format.interval_notes`), the coverage
    marks, and which vanilla every speedup is against (:func:`baseline_note`)."""
    from fafo.bench.tools.report_format import MARKS_NOTE, interval_notes

    summaries = list(summaries)
    kinds = list(dict.fromkeys(s.get("speedup_kind") for s in summaries)) or [None]
    lines = ["speedup shown: " + "; ".join(SPEEDUP_DEFS.get(k, f"speedup_{k}") for k in kinds)]
    lines += interval_notes(summaries)
    new = any("speedup_kind" in s or "tau_all" in s for s in summaries)
    old = any(not ("speedup_kind" in s or "tau_all" in s) for s in summaries) or not summaries
    lines.append("tau shown: " + "; ".join([TAU_DEFS[t] for t in taus if new] + ([TAU_DEFS[None]] if old else [])))
    if any(s.get("n_flagged") or s.get("n_no_decode") for s in summaries):
        lines.append(MARKS_NOTE)
    return lines + baseline_note(summaries)


def baseline_note(summaries) -> list[str]:
    """Which vanilla the speedups are against: one line when the runs' baselines are all of one backend, naming
    the methods that ran eagerly against a compiled vanilla (their speedup against an eager vanilla beside)."""
    summaries = list(summaries)
    backends = {s.get("reference_backend") for s in summaries if s.get("reference_backend")}
    if not backends:
        return []
    eager = [s for s in summaries if s.get("method_backend") == "eager" and s.get("reference_backend") == "compiled"]
    if len(backends) > 1:
        return ["NOT one baseline: some speedups are against a compiled vanilla, others against an eager one "
                "(runs of different bench.compile settings)"]
    line = f"every speedup is against the same {backends.pop()} vanilla (one baseline per table)"
    if eager:
        line += "; " + ", ".join(
            f"{s.get('method')} ran eagerly (x{s['speedup_vs_eager']:.2f} against an eager vanilla timed beside it)"
            if s.get("speedup_vs_eager") is not None else f"{s.get('method')} ran eagerly" for s in eager)
    return [line]


def category_table(entries, dash: str = "—") -> tuple[list[str], list[list[str]]] | None:
    """The per-category table of ``entries`` = [(row labels, run)]: (categories, one line per run with a category
    split: its labels then ``speedup× [lo–hi] (tau) n=N`` per category); None when no run has categories."""
    from fafo.bench.tools.report_format import fmt_cell

    split = [(labels, category_summaries(run)) for labels, run in entries]
    split = [(labels, cats) for labels, cats in split if cats]
    if not split:
        return None
    cats = list(dict.fromkeys(c for _, per in split for c in per))
    return cats, [list(labels) + [fmt_cell(per[c], dash) if c in per else dash for c in cats] for labels, per in split]


def category_markdown(entries, head: list[str], title: str | None = None, dash: str = "—") -> str:
    """The per-category Markdown table of ``entries`` = [(row labels, run)] under the label columns ``head``
    ("" when no run has categories)."""
    from fafo.bench.tools.report_format import markdown

    split = category_table(entries, dash)
    if split is None:
        return ""
    cats, lines = split
    from fafo.bench.tools.report_format import interval_notes

    summaries = [s for _, run in entries if run is not None for s in category_summaries(run).values()]
    return markdown([*head, *cats], lines, ["cells: speedup× interval (tau) n=(sample, turn)s of the category; "
                                            "recomputed from samples.csv.", *interval_notes(summaries)],
                    title, labels=len(head))
