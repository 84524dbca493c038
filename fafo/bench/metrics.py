"""Summary metrics over a run's rows: everything recomputable from ``samples.csv`` alone, with the definitions of
docs/metrics.md ("Metric definitions"). Per (sample, turn), counts come from the first repeat (they are
deterministic) and times are the median over repeats. Then ``tau`` = sum of (new tokens - 1) / verification forwards
(the FAFO paper's tokens per decoding step, prefill excluded), ``tau_with_prefill`` = new tokens / (verification
forwards + 1) (Spec-Bench's), ``tau_all`` = new tokens / every forward of the target's weights; ``speedup_e2e`` =
(method tokens / total time) / (vanilla's), ``speedup_decode`` = the same on decode time and the tokens after the
first (TriForce, QuantSpec, LongSpec), ``speedup_specbench`` = mean per-sample tokens/s over vanilla's (Spec-Bench
``evaluation/speed.py``); ``speedup`` is the one ``speedup_kind`` names. Intervals by sample count n (a sample's
turns together): ``<name>_ci95`` (95 % percentile bootstrap, n >= :data:`MIN_BOOTSTRAP`), ``<name>_range`` (the
per-sample range, 2 <= n < 10: at n = 3 a bootstrap interval is that range and covers the median only about 75 % of
the time), none at n = 1. A (sample, turn) without a decode step (one token or none: a prefill timed against a
prefill) or that compiled while timed is left out of every speedup and counted (``n_no_decode``, ``n_compiled``);
mismatches split into numerical ties and divergences (:mod:`fafo.bench.mismatch`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SPEEDUP_KINDS = ("e2e", "decode", "specbench")
NUMERIC = ["turn", "repeat", "prompt_tokens", "new_tokens", "forwards", "prefill_forwards", "draft_forwards",
           "aux_forwards", "target_forwards", "target_tokens", "draft_model_forwards", "draft_model_params",
           "drafted", "accepted", "tau", "prefill_s", "decode_s", "total_s", "tokens_per_s", "peak_mem_mb",
           "ref_peak_mem_mb", "ref_new_tokens", "ref_total_s", "ref_decode_s", "speedup", "first_mismatch",
           "eager_ref_total_s", "eager_ref_decode_s", "aa_total_s", "aa_decode_s"]
_FIRST = ["category", "new_tokens", "forwards", "target_forwards", "draft_model_forwards", "draft_model_params",
          "drafted", "accepted", "ref_new_tokens", "exact_match", "mismatch_kind"]
_MEDIAN = ["prefill_s", "decode_s", "total_s", "ref_total_s", "ref_decode_s", "eager_ref_total_s",
           "eager_ref_decode_s", "aa_total_s", "aa_decode_s"]


def frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for col in NUMERIC:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if "exact_match" in df:
        df["exact_match"] = df["exact_match"].map(
            lambda v: {"True": 1.0, "False": 0.0, True: 1.0, False: 0.0}.get(v, float("nan")))
        if "new_tokens" in df:  # rows written without the reference's length: identical tokens, identical count
            known = df["ref_new_tokens"] if "ref_new_tokens" in df else pd.Series(np.nan, index=df.index)
            df["ref_new_tokens"] = known.fillna(df["new_tokens"].where(df["exact_match"] == 1.0))
    return df


def per_turn(ok: pd.DataFrame) -> pd.DataFrame:
    """One line per (sample, turn): counts of its first repeat, median times, max peaks."""
    for col in _FIRST + _MEDIAN + ["peak_mem_mb", "ref_peak_mem_mb"]:
        if col not in ok:
            ok = ok.assign(**{col: np.nan})
    agg = {c: (c, "first") for c in _FIRST} | {c: (c, "median") for c in _MEDIAN}
    agg |= {"peak_mem_mb": ("peak_mem_mb", "max"), "ref_peak_mem_mb": ("ref_peak_mem_mb", "max"),
            "spread": ("total_s", _spread)}
    return ok.groupby(["sample_id", "turn"], sort=False).agg(**agg)


def _spread(s: pd.Series) -> float:
    s = s.dropna()
    return float(s.max() / s.min()) if len(s) > 1 and s.min() > 0 else 1.0


# ------------------------------------------------------------------ statistics over per-sample sums
# Each statistic takes arrays whose last axis is the samples (a sample's turns summed), so one call evaluates it
# on the data ([n]) or on every bootstrap resample at once ([n_boot, n]).
def _ratio(num: str, den: str):
    return lambda a: a[num].sum(-1) / a[den].sum(-1)


STATS = {
    "tau": _ratio("steps_tokens", "forwards"),
    "tau_with_prefill": _ratio("new_tokens", "forwards_p1"),
    "tau_all": _ratio("new_tokens", "target_forwards"),
    "speedup_e2e": lambda a: (a["new_tokens"].sum(-1) / a["total_s"].sum(-1))
    / (a["ref_new_tokens"].sum(-1) / a["ref_total_s"].sum(-1)),
    "speedup_decode": lambda a: (a["steps_tokens"].sum(-1) / a["decode_s"].sum(-1))
    / (a["ref_steps_tokens"].sum(-1) / a["ref_decode_s"].sum(-1)),
    "speedup_specbench": lambda a: (a["new_tokens"] / a["total_s"]).mean(-1)
    / (a["ref_new_tokens"] / a["ref_total_s"]).mean(-1),
}
_NEEDS = {"tau": ["forwards"], "tau_with_prefill": ["forwards"], "tau_all": ["target_forwards"],
          "speedup_e2e": ["ref_total_s", "ref_new_tokens"], "speedup_decode": ["ref_decode_s", "ref_new_tokens"],
          "speedup_specbench": ["ref_total_s", "ref_new_tokens"]}


def per_sample(per: pd.DataFrame) -> dict[str, np.ndarray]:
    """Sums over each sample's turns of what the statistics read (arrays over samples)."""
    d = per.assign(steps_tokens=per["new_tokens"] - 1, forwards_p1=per["forwards"] + 1,
                   ref_steps_tokens=per["ref_new_tokens"] - 1)
    cols = ["new_tokens", "steps_tokens", "forwards", "forwards_p1", "target_forwards", "total_s", "decode_s",
            "ref_new_tokens", "ref_steps_tokens", "ref_total_s", "ref_decode_s"]
    sums = d.groupby(level="sample_id", sort=False)[cols].sum(min_count=1)
    return {c: sums[c].to_numpy(dtype=float) for c in cols}


def _value(name: str, per: pd.DataFrame, arrays: dict) -> float | None:
    if any(per[c].isna().any() for c in _NEEDS[name]) or not len(per):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        v = float(STATS[name](arrays))
    return v if np.isfinite(v) else None


MIN_BOOTSTRAP = 10  # samples below which a percentile bootstrap interval is reported as the per-sample range


def bootstrap_ci(stat, arrays: dict[str, np.ndarray], n_boot: int = 1000, seed: int = 0) -> list[float] | None:
    """95 % percentile bootstrap interval of ``stat`` over samples resampled with replacement (None below 2
    samples: one sample has no spread to resample)."""
    n = len(next(iter(arrays.values())))
    if n < 2 or n_boot < 1:
        return None
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))  # [n_boot, n_samples]
    with np.errstate(divide="ignore", invalid="ignore"):
        values = stat({k: a[idx] for k, a in arrays.items()})
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]


def sample_range(stat, arrays: dict[str, np.ndarray]) -> list[float] | None:
    """[lowest, highest] of ``stat`` computed on each sample alone (None without two finite values)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        values = stat({k: a[:, None] for k, a in arrays.items()})  # [n_samples]: one "resample" per sample
    values = values[np.isfinite(values)]
    return [float(values.min()), float(values.max())] if len(values) >= 2 else None


def interval_kind(n_samples: int) -> str:
    """Which interval a statistic over ``n_samples`` samples gets: ``ci95``, ``range`` or ``none``."""
    return "ci95" if n_samples >= MIN_BOOTSTRAP else "range" if n_samples >= 2 else "none"


def interval(name: str, stat, arrays: dict, n_boot: int) -> dict:
    """``{<name>_ci95: ...}`` (n >= MIN_BOOTSTRAP), ``{<name>_range: ...}`` (2 <= n < MIN_BOOTSTRAP) or {}."""
    kind = interval_kind(len(next(iter(arrays.values()))))
    if kind == "ci95":
        return {f"{name}_ci95": bootstrap_ci(stat, arrays, n_boot)}
    if kind == "range":
        return {f"{name}_range": sample_range(stat, arrays)}
    return {}


def headline(per: pd.DataFrame, n_boot: int = 0) -> dict:
    """tau, tau_with_prefill, tau_all and the three speedups of a set of (sample, turn)s, with their intervals
    (:func:`interval`) when ``n_boot``."""
    arrays = per_sample(per)
    out = {}
    for name, stat in STATS.items():
        out[name] = _value(name, per, arrays)
        if n_boot and out[name] is not None:
            out |= interval(name, stat, arrays, n_boot)
    return out


def _row_ratio(per: pd.DataFrame, kind: str) -> pd.Series:
    """The headline speedup of each (sample, turn) alone (specbench: its e2e ratio)."""
    if kind == "decode":
        return ((per["new_tokens"] - 1) / per["decode_s"]) / ((per["ref_new_tokens"] - 1) / per["ref_decode_s"])
    return (per["new_tokens"] / per["total_s"]) / (per["ref_new_tokens"] / per["ref_total_s"])


def summarize(rows: list[dict], max_spread: float = 1.5, n_boot: int = 1000, speedup_kind: str = "e2e") -> dict:
    """Aggregate a run's rows (dicts with :data:`fafo.bench.records.SAMPLE_COLUMNS`; older files' missing
    columns give None for what needs them)."""
    df = frame(rows)
    n_rows = len(df)
    ok = df[df["status"] == "ok"] if n_rows else df
    failed = df[df["status"] != "ok"] if n_rows else df
    out = {"n_rows": n_rows, "n_failed": len(failed), "speedup_kind": speedup_kind,
           "failed": [f"{r.sample_id}/{r.turn}: {r.status}" for r in failed.head(20).itertuples()]}
    if ok.empty:
        return out | {"n_samples": 0, "n_turns": 0}
    per = per_turn(ok)
    interleaved = ok[ok["ref_source"] == "interleaved"] if "ref_source" in ok else ok.iloc[:0]
    ref_spread = interleaved.groupby(["sample_id", "turn"], sort=False)["ref_total_s"].agg(_spread)
    spread = pd.concat([per["spread"], ref_spread], axis=1).max(axis=1)
    flagged = [f"{sid}/{int(turn)}" for (sid, turn), v in spread.items() if v > max_spread]
    kinds = per["mismatch_kind"].fillna("").astype(str)
    checked = bool(per["exact_match"].notna().any())
    compiled = _compiled_turns(ok, per)
    short = no_decode(per)
    untimed = per.index.isin(compiled) | short.to_numpy()
    timing = headline(per[~untimed], n_boot) if untimed.any() else None
    n_samples = int(ok["sample_id"].nunique())
    out |= {
        "n_samples": n_samples,
        "n_turns": len(per),
        "new_tokens": int(per["new_tokens"].sum()),
        **headline(per, n_boot),
        "interval": interval_kind(n_samples) if n_boot else "none",
        "n_compiled": len(compiled),
        "compiled": [f"{sid}/{int(turn)}" for sid, turn in compiled[:20]],
        "n_no_decode": int(short.sum()),
        "no_decode": [f"{sid}/{int(turn)}" for sid, turn in per.index[short.to_numpy()][:20]],
        "tau_request": _nan_none(((per["new_tokens"] - 1) / per["forwards"].where(per["forwards"] > 0)).mean()),
        "prefill_s": float(per["prefill_s"].sum()),
        "decode_s": float(per["decode_s"].sum()),
        "total_s": float(per["total_s"].sum()),
        "tokens_per_s": float(per["new_tokens"].sum() / per["total_s"].sum()),
        "verify_ms": _nan_none(1000 * per["decode_s"].sum() / per["forwards"].sum()),
        "peak_mem_mb": float(per["peak_mem_mb"].max()),
        "ref_peak_mem_mb": _nan_none(per["ref_peak_mem_mb"].max()),
        "exact_match_rate": float(per["exact_match"].mean()) if checked else None,
        # sampled (T > 0) rows are not compared token by token: their mismatch counts are unknown, not zero
        **{f"n_mismatch_{kind}": int((kinds == kind).sum()) if checked else None
           for kind in ("tie", "divergence", "unchecked")},
        "total_s_iqr": _nan_none(_iqr(ok).median()),
        "flagged": flagged,
        "n_flagged": len(flagged),
        "ref_sources": {str(k): int(v) for k, v in ok["ref_source"].value_counts().items()}
        if "ref_source" in ok else {},
    }
    if timing is not None:  # every speedup (and its interval) from the timed (sample, turn)s alone
        speedups = [n for n in STATS if n.startswith("speedup")]
        out = {k: v for k, v in out.items() if not any(k == n or k.startswith(f"{n}_") for n in speedups)} | \
            {k: v for k, v in timing.items() if k.startswith("speedup")}
        if timing_samples := per[~untimed].index.get_level_values("sample_id").nunique():
            out["interval_timed"] = interval_kind(timing_samples) if n_boot else "none"
    out["mem_overhead_mb"] = (out["peak_mem_mb"] - out["ref_peak_mem_mb"]) if out["ref_peak_mem_mb"] is not None \
        else None
    out |= _forward_totals(ok, per)
    key = f"speedup_{speedup_kind}"
    out["speedup"] = out.get(key)
    for suffix in ("ci95", "range"):
        if f"{key}_{suffix}" in out:
            out[f"speedup_{suffix}"] = out[f"{key}_{suffix}"]
    timed = per[~untimed].dropna(subset=["ref_total_s", "ref_new_tokens"])
    if not timed.empty:
        keep = ~pd.MultiIndex.from_frame(ok[["sample_id", "turn"]]).isin(list(per.index[untimed]))
        by_repeat = [_value(key, g, per_sample(per_turn(g)))
                     for _, g in ok[keep].dropna(subset=["ref_total_s"]).groupby("repeat")]
        by_repeat = [v for v in by_repeat if v is not None]
        out |= {"speedup_mean": _nan_none(_row_ratio(timed, speedup_kind).mean()),
                "speedup_min": min(by_repeat, default=None), "speedup_max": max(by_repeat, default=None),
                "ref_total_s": float(timed["ref_total_s"].sum())}
    out |= other_baselines(per[~untimed], speedup_kind, n_boot)
    cats = per["category"].fillna("").astype(str)
    if (cats != "").any():
        out["by_category"] = {c: _category(g) for c, g in per.groupby(cats, sort=True) if c}
    return out


def other_baselines(per: pd.DataFrame, kind: str, n_boot: int) -> dict:
    """The headline speedup against the two other vanilla timings a row may carry, with its interval:

    * ``speedup_vs_eager``: against an eager vanilla timed beside a method that cannot run compiled
      (``eager_ref_*``: the same backend as the method; the headline stays against the compiled vanilla that every
      other method of the table races);
    * ``aa_speedup``: the A/A floor of this method's own run, vanilla's first timing against a second one taken
      right after the method (``aa_*``: speedups within its spread are noise, measured beside this method)."""
    out = {}
    for name, total, decode in (("speedup_vs_eager", "eager_ref_total_s", "eager_ref_decode_s"),
                                ("aa_speedup", "aa_total_s", "aa_decode_s")):
        if per.empty or per[total].isna().any():
            continue
        if name == "aa_speedup":  # the second vanilla timing plays the method, the first stays the reference
            alt = per.assign(new_tokens=per["ref_new_tokens"], total_s=per[total], decode_s=per[decode])
        else:
            alt = per.assign(ref_total_s=per[total], ref_decode_s=per[decode])
        h = headline(alt, n_boot)
        key = f"speedup_{kind}"
        out[name] = h.get(key)
        out |= {f"{name}_{suffix}": h[f"{key}_{suffix}"] for suffix in ("ci95", "range") if f"{key}_{suffix}" in h}
    return out


def no_decode(per: pd.DataFrame) -> pd.Series:
    """(sample, turn)s without a decode step to time: the method or the reference generated at most one token."""
    ref = per["ref_new_tokens"] if "ref_new_tokens" in per else pd.Series(np.nan, index=per.index)
    return (per["new_tokens"] <= 1) | (ref <= 1)


def _compiled_turns(ok: pd.DataFrame, per: pd.DataFrame) -> list[tuple]:
    """(sample, turn)s with a row that compiled a graph while timed (``compiles`` > 0): their times include
    compilation (or CUDA-graph recording), so every speedup leaves them out; tau keeps them."""
    if "compiles" not in ok:
        return []
    hit = ok[pd.to_numeric(ok["compiles"], errors="coerce").fillna(0) > 0]
    keys = set(zip(hit["sample_id"], hit["turn"]))
    return [k for k in per.index if k in keys]


def _category(per: pd.DataFrame) -> dict:
    h = headline(per)
    return {"n_samples": int(per.index.get_level_values("sample_id").nunique()), "n_turns": len(per),
            "tau": h["tau"], "tau_all": h["tau_all"], "speedup_e2e": h["speedup_e2e"],
            "speedup_decode": h["speedup_decode"],
            "exact_match_rate": float(per["exact_match"].mean()) if per["exact_match"].notna().any() else None}


def _forward_totals(ok: pd.DataFrame, per: pd.DataFrame) -> dict:
    """Forward counts by kind (first repeat of each (sample, turn)), acceptance and the draft model's share."""
    first = ok.groupby(["sample_id", "turn"], sort=False).first()
    out = {}
    for col, key in (("prefill_forwards", "prefill_forwards"), ("forwards", "verify_forwards"),
                     ("draft_forwards", "draft_forwards"), ("aux_forwards", "aux_forwards"),
                     ("target_forwards", "target_forwards"), ("draft_model_forwards", "draft_model_forwards")):
        out[key] = int(first[col].sum()) if col in first and first[col].notna().all() else None
    params = first["draft_model_params"].max() if "draft_model_params" in first else np.nan
    out["draft_model_params"] = None if pd.isna(params) else int(params)
    dm, tf = out["draft_model_forwards"], out["target_forwards"]
    out["draft_model_share"] = dm / (dm + tf) if dm is not None and tf else None
    drafted = per["drafted"].dropna()
    out["drafted"] = int(drafted.sum()) if len(drafted) else None
    out["accepted"] = int(per["accepted"].dropna().sum()) if len(drafted) else None
    out["accept_rate"] = out["accepted"] / out["drafted"] if out["drafted"] else None
    return out


def _iqr(ok: pd.DataFrame) -> pd.Series:
    """Each (sample, turn)'s inter-quartile range of total_s over repeats, relative to its median."""
    g = ok.groupby(["sample_id", "turn"], sort=False)["total_s"]
    return (g.quantile(0.75) - g.quantile(0.25)) / g.median()


def _nan_none(x) -> float | None:
    return None if x is None or pd.isna(x) or not np.isfinite(x) else float(x)


def histogram(parts) -> dict[int, int]:
    """How many decode steps committed 1, 2, 3... tokens (``{tokens: steps}``) over ``parts``: generations' accept
    lengths (lists, ``outputs.jsonl``) or histograms already counted (dicts, e.g. summaries' ``accept_hist``)."""
    out: dict[int, int] = {}
    for part in parts:
        for n, count in part.items() if isinstance(part, dict) else ((n, 1) for n in part or ()):
            out[int(n)] = out.get(int(n), 0) + int(count)
    return dict(sorted(out.items()))


def flag_counts(outputs) -> dict[str, int]:
    """For each true/false entry of the generations' ``Generation.extras`` (``outputs.jsonl`` records), how many
    (sample, turn) generations had it true, e.g. TriForce's ``retrieval_covers_prompt``: how many prompts the
    retrieval budget held whole (its "retrieval" level then read the entire prompt cache)."""
    counts: dict[str, int] = {}
    for out in outputs:
        for key, value in (out.get("extras") or {}).items():
            if isinstance(value, bool):
                counts[key] = counts.get(key, 0) + value
    return dict(sorted(counts.items()))
