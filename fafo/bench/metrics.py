"""Summary metrics over a run's rows, with the definitions of DESIGN.md.

* ``tau`` = new tokens / (target decode forwards + 1 for prefill), step-weighted: sums over all (sample, turn)
  before dividing. ``tau_request`` is the mean of the per-(sample, turn) values. Vanilla is exactly 1.0.
* ``speedup`` = sum of vanilla ``total_s`` / sum of method ``total_s`` over the same (sample, turn)s (primary);
  ``speedup_mean`` = mean of the per-(sample, turn) ratios.
* With ``bench.repeats`` > 1, times are the median over repeats per (sample, turn); the spread across repeats is
  reported as ``speedup_min`` / ``speedup_max`` (speedup of each repeat index over all samples) and
  ``total_s_iqr`` (median over samples of each one's inter-quartile range of total_s relative to its median).
* ``speedup_ci95``: bootstrap 95 % confidence interval of ``speedup`` over samples (``bench.bootstrap``
  resamples of the samples with replacement, a sample's turns kept together; percentile interval, seeded).
* ``flagged``: (sample, turn)s whose repeats disagree by more than ``bench.max_spread`` (max/min of the method's
  or the interleaved reference's ``total_s``); ``ref_sources`` counts rows per ``ref_source``.
* ``exact_match_rate``: share of (sample, turn)s whose tokens equal vanilla greedy's on the same engine and dtype.
"""

from __future__ import annotations

import numpy as np
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


def bootstrap_ci(ref: np.ndarray, method: np.ndarray, n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap interval of sum(ref) / sum(method), resampling the paired entries (samples)."""
    if len(ref) < 2 or n_boot < 1:
        value = float(ref.sum() / method.sum())
        return value, value
    idx = np.random.default_rng(seed).integers(0, len(ref), size=(n_boot, len(ref)))  # [n_boot, n_samples]
    ratios = ref[idx].sum(axis=1) / method[idx].sum(axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def _spread(s: pd.Series) -> float:
    s = s.dropna()
    return float(s.max() / s.min()) if len(s) > 1 and s.min() > 0 else 1.0


def summarize(rows: list[dict], max_spread: float = 1.5, n_boot: int = 1000) -> dict:
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
        spread=("total_s", _spread),
    )
    interleaved = ok[ok["ref_source"] == "interleaved"] if "ref_source" in ok else ok.iloc[:0]
    ref_spread = interleaved.groupby(["sample_id", "turn"], sort=False)["ref_total_s"].agg(_spread)
    spread = pd.concat([per["spread"], ref_spread], axis=1).max(axis=1)
    flagged = [f"{sid}/{int(turn)}" for (sid, turn), v in spread.items() if v > max_spread]
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
        "flagged": flagged,
        "n_flagged": len(flagged),
        "ref_sources": {str(k): int(v) for k, v in ok["ref_source"].value_counts().items()}
        if "ref_source" in ok else {},
    }
    if not timed.empty:
        ratios = timed["ref_total_s"] / timed["total_s"]
        by_repeat = ok.dropna(subset=["ref_total_s"]).groupby("repeat")
        repeat_speedups = by_repeat["ref_total_s"].sum() / by_repeat["total_s"].sum()
        by_sample = timed.groupby(level="sample_id", sort=False)[["ref_total_s", "total_s"]].sum()
        lo, hi = bootstrap_ci(by_sample["ref_total_s"].to_numpy(), by_sample["total_s"].to_numpy(), n_boot)
        out |= {
            "speedup": float(timed["ref_total_s"].sum() / timed["total_s"].sum()),
            "speedup_ci95": [lo, hi],
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


def draft_acceptance(extras) -> float | None:
    """Per-token draft acceptance alpha = accepted / drafted tokens over all generations (QuantSpec's "acceptance
    rate"), from each generation's ``extras`` (an iterable of dicts); None when no method reports drafts."""
    drafted = accepted = 0
    for x in extras:
        if x and x.get("drafted") is not None and x.get("accepted") is not None:
            drafted, accepted = drafted + int(x["drafted"]), accepted + int(x["accepted"])
    return accepted / drafted if drafted else None
