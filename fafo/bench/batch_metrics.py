"""Metrics under load (``bench.batch_size`` > 1), from a run's rows and its ``batch_steps.jsonl``
(:mod:`fafo.bench.batch_run`). The speedups of :func:`fafo.bench.metrics.summarize` stay what they are: over each
request's share of the batch's time they are ratios of throughput under load, against vanilla at the same batch size
and batching mode, with intervals by sample. Added here:

* ``batch_tokens_per_s`` / ``ref_batch_tokens_per_s``: tokens of every request over the passes' wall time (the
  method's and vanilla's passes);
* ``latency_p50|p90|p99`` (s, admitted to last token) and ``tpot_ms_p50|p90|p99`` (time per output token after
  the first), per request (a (sample, turn), median over repeats), each with its interval over requests
  (``_ci95`` from :data:`~fafo.bench.metrics.MIN_BOOTSTRAP` requests, else ``_range``), and vanilla's beside them
  (``ref_latency_p50`` ...);
* ``tau_step``: tokens committed per active request per batched step (every step of the method's passes), with its
  interval over samples like every other (the steps of one request are not independent draws: a sample's steps are
  resampled together, its turns and repeats with it); ``rows_per_step`` (active requests per step) and
  ``tokens_per_batch_step`` (the batch's tokens per step); ``n_requests`` and ``n_steps`` say what they are over.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from fafo.bench.metrics import interval

PERCENTILES = (50, 90, 99)


def read_steps(run_dir: str | Path) -> list[dict]:
    """The whole lines of a run's ``batch_steps.jsonl`` (none: a batch-1 run or an older one)."""
    path = Path(run_dir) / "batch_steps.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else ():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line of a killed run
    return out


def _percentile(q: float, key: str):
    return lambda a: np.percentile(a[key], q, axis=-1)


def batch_summary(rows: list[dict], steps: list[dict], n_boot: int = 1000) -> dict:
    """The metrics under load of a run (module docstring); {} for a batch-1 run."""
    df = pd.DataFrame(rows)
    if df.empty or "batch_size" not in df:
        return {}
    ok = df[df["status"] == "ok"]
    out = {"batch_size": _first_int(df["batch_size"]), "batching": next(iter(df["batching"].dropna()), None)}
    for name, decoder in (("batch_tokens_per_s", "method"), ("ref_batch_tokens_per_s", "reference")):
        passes = [p for p in steps if p.get("decoder") == decoder]
        wall = sum(p["wall_s"] for p in passes)
        out[name] = sum(p["tokens"] for p in passes) / wall if wall > 0 else None
    if not ok.empty:
        cols = ["latency_s", "tpot_ms", "ref_latency_s", "ref_tpot_ms"]
        per = ok.assign(**{c: pd.to_numeric(ok[c], errors="coerce") for c in cols}) \
            .groupby(["sample_id", "turn"], sort=False)[cols].median()
        out["n_requests"] = len(per)
        for metric, unit in (("latency", "latency_s"), ("tpot_ms", "tpot_ms")):
            for side, col in (("", unit), ("ref_", f"ref_{unit}")):
                values = per[col].dropna().to_numpy(dtype=float)
                for q in PERCENTILES:
                    key = f"{side}{metric}_p{q}"
                    out[key] = float(np.percentile(values, q)) if len(values) else None
                    if not side and len(values) and n_boot:
                        out |= interval(key, _percentile(q, "v"), {"v": values}, n_boot)
    method_steps = [s for p in steps if p.get("decoder") == "method" for s in p["steps"]]
    out["n_steps"] = len(method_steps)
    if method_steps:
        by_sample = {}  # sample_id: [tokens committed in batched steps, steps it was active in]
        for step in method_steps:
            for sid, n in zip(step["rows"], step["new_tokens"]):
                by_sample.setdefault(sid, [0, 0])
                by_sample[sid][0] += n
                by_sample[sid][1] += 1
        arrays = {"tokens": np.array([t for t, _ in by_sample.values()], dtype=float),
                  "rows": np.array([r for _, r in by_sample.values()], dtype=float)}
        stat = lambda a: a["tokens"].sum(-1) / a["rows"].sum(-1)  # noqa: E731
        out["tau_step"] = float(stat(arrays))
        if n_boot:
            out |= interval("tau_step", stat, arrays, n_boot)
        out["rows_per_step"] = sum(len(s["rows"]) for s in method_steps) / len(method_steps)
        out["tokens_per_batch_step"] = sum(sum(s["new_tokens"]) for s in method_steps) / len(method_steps)
    return out


def _first_int(column: pd.Series) -> int | None:
    values = pd.to_numeric(column, errors="coerce").dropna()
    return int(values.iloc[0]) if len(values) else None
