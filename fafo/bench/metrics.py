"""Summary metrics over a run's rows, with the definitions of DESIGN.md.

* ``tau`` = new tokens / (target decode forwards + 1 for prefill), step-weighted: sums over all (sample, turn)
  before dividing. ``tau_request`` is the mean of the per-(sample, turn) values. Vanilla is exactly 1.0.
* ``speedup`` = sum of vanilla ``total_s`` / sum of method ``total_s`` over the same (sample, turn)s (primary);
  ``speedup_mean`` = mean of the per-(sample, turn) ratios.
* With ``bench.repeats`` > 1, times are the median over repeats per (sample, turn); the spread across repeats is
  reported as ``speedup_min`` / ``speedup_max`` (speedup of each repeat index over all samples) and
  ``total_s_iqr`` (median over samples of each one's inter-quartile range of total_s relative to its median).
* ``exact_match_rate``: share of (sample, turn)s whose tokens equal vanilla greedy's on the same engine and dtype.
"""

from __future__ import annotations

import pandas as pd

NUMERIC = ["turn", "repeat", "prompt_tokens", "new_tokens", "forwards", "tau", "prefill_s", "decode_s", "total_s",
           "tokens_per_s", "peak_mem_mb", "ref_total_s", "ref_decode_s", "speedup", "first_mismatch"]


def frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for col in NUMERIC:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if "exact_match" in df:
        df["exact_match"] = df["exact_match"].map(
            lambda v: {"True": 1.0, "False": 0.0, True: 1.0, False: 0.0}.get(v, float("nan")))
    return df


def summarize(rows: list[dict]) -> dict:
    """Aggregate a run's rows (dicts with :data:`fafo.bench.records.SAMPLE_COLUMNS`)."""
    df = frame(rows)
    n_rows = len(df)
    ok = df[df["status"] == "ok"] if n_rows else df
    out = {"n_rows": n_rows, "n_failed": int(n_rows - len(ok))}
    if ok.empty:
        return out | {"n_samples": 0}
    per = ok.groupby(["sample_id", "turn"], sort=False).agg(
        new_tokens=("new_tokens", "first"), forwards=("forwards", "first"), tau=("tau", "first"),
        prefill_s=("prefill_s", "median"), decode_s=("decode_s", "median"), total_s=("total_s", "median"),
        ref_total_s=("ref_total_s", "median"), peak_mem_mb=("peak_mem_mb", "max"),
        exact_match=("exact_match", "first"),
        total_lo=("total_s", lambda s: s.quantile(0.25)), total_hi=("total_s", lambda s: s.quantile(0.75)),
    )
    timed = per.dropna(subset=["ref_total_s"])
    out |= {
        "n_samples": int(ok["sample_id"].nunique()),
        "n_turns": len(per),
        "new_tokens": int(per["new_tokens"].sum()),
        "tau": float(per["new_tokens"].sum() / (per["forwards"] + 1).sum()),
        "tau_request": float(per["tau"].mean()),
        "prefill_s": float(per["prefill_s"].sum()),
        "decode_s": float(per["decode_s"].sum()),
        "total_s": float(per["total_s"].sum()),
        "tokens_per_s": float(per["new_tokens"].sum() / per["total_s"].sum()),
        "peak_mem_mb": float(per["peak_mem_mb"].max()),
        "exact_match_rate": float(per["exact_match"].mean()) if per["exact_match"].notna().any() else None,
        "total_s_iqr": float(((per["total_hi"] - per["total_lo"]) / per["total_s"]).median()),
    }
    if not timed.empty:
        ratios = timed["ref_total_s"] / timed["total_s"]
        by_repeat = ok.dropna(subset=["ref_total_s"]).groupby("repeat")
        repeat_speedups = by_repeat["ref_total_s"].sum() / by_repeat["total_s"].sum()
        out |= {
            "speedup": float(timed["ref_total_s"].sum() / timed["total_s"].sum()),
            "speedup_mean": float(ratios.mean()),
            "speedup_min": float(repeat_speedups.min()),
            "speedup_max": float(repeat_speedups.max()),
            "ref_total_s": float(timed["ref_total_s"].sum()),
        }
    return out


def accept_histogram(accept_lengths) -> dict[int, int]:
    """How many decode forwards committed 1, 2, 3... tokens, over all generations (an iterable of lists)."""
    hist: dict[int, int] = {}
    for lengths in accept_lengths:
        for n in lengths:
            hist[int(n)] = hist.get(int(n), 0) + 1
    return dict(sorted(hist.items()))
