"""Projected speedups: each method's measured decode steps priced on a cost curve, and checked against measurement.

A run records every decode forward of every generation as the engine ran it (:class:`~fafo.engine.ledger.
ForwardRecord`: kind, tokens carried, cached slots attended, the rows that attend only FAFO's compressed region,
the share of sub-layers run), grouped per generation in ``outputs.jsonl`` (``forward_log``; the reference's in
``ref_forward_log``). Given a cost curve (:class:`~fafo.bench.tools.cost_curve.CostCurve`, ``bench.cost_curve``), each
(sample, turn) is priced as

    method decode time = sum over its decode forwards of  share x latency(tokens, attended)
                         + draft-model forwards x latency(1, context) x draft params / target params
                         + verification steps x host ms per step
    vanilla decode time = sum over its decode forwards of latency(1, prompt + tokens so far)
                         + its steps x its host ms per step

where ``attended`` is the forward's mean attended length over its rows (a fumble row attends its region, a
verification row the whole prefix: ``((tokens - region_rows) x prefix + region_rows x region_len) / tokens``) and
the curve is piecewise linear in context, so a group of forwards priced at its mean prefix costs what the forwards
priced one by one cost wherever the curve is linear over their range. ``projected_speedup`` is then the decode
speedup of the priced times, aggregated as ``speedup_decode`` is (tokens after the first over summed times), over
the same (sample, turn)s; ``projection_measured`` is the measured ``speedup_decode`` over them and
``projection_error`` = projected / measured - 1.

Host time per step (outside the forwards: drafting, tree building, KV moves and commits) comes from the row
(``host_ms_per_step`` / ``ref_host_ms_per_step``, recorded by the runner where it measures them), else from the
curve (``CostCurve.host_ms(method)`` where the curve file carries per-method host times), else it is left out and
``projection_host`` says so. Forwards outside the curve's grid (more tokens than its largest step, a context
outside its range) are priced by the curve's extrapolation and counted in ``projection_beyond_curve``: a
projection is never extrapolated silently. Commits are device copies launched from the host: on the device that
measured the curve they are in the host time per step.

``python -m fafo.bench.tools.projection RUN_DIR --curve CSV [--within 0.2]`` prices finished runs (a comparison's
directory: every method in it) on any curve and prints measured and projected decode speedups per method; with
``--within`` it exits 1 when any method's projection misses by more than that fraction.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from fafo.bench.tools.report_format import num
from fafo.bench.tools.cost_curve import CostCurve

# one group of a generation's forwards: [kind, tokens, region_rows, region_len, share, count, prefix_sum,
# prefix_min, prefix_max]
GROUP = ("kind", "tokens", "region_rows", "region_len", "share", "count", "prefix_sum", "prefix_min", "prefix_max")


def vanilla_log(prompt_tokens: int, new_tokens: int) -> list[list]:
    """Vanilla's decode forwards: one token each, the j-th (j = 1..n-1) after ``prompt + j - 1`` cached slots."""
    steps = new_tokens - 1
    if steps < 1:
        return []
    first = prompt_tokens
    return [["verify", 1, 0, 0, 1.0, steps, steps * first + steps * (steps - 1) // 2, first, first + steps - 1]]


class Pricer:
    """Prices forward groups on one curve and counts the forwards that fall outside its grid."""

    def __init__(self, curve: CostCurve):
        self.curve = curve
        self.contexts = (min(curve.table), max(curve.table))
        self.max_step = min(max(steps) for steps in curve.table.values())  # every context has up to this step
        self.min_rows = curve.smallest_multi_row() or 2  # steps of 2 tokens up to it are priced at its cost
        self.beyond = 0
        self.beyond_example = ""

    def _check(self, tokens: int, low: float, high: float, count: int) -> None:
        lo, hi = self.contexts
        if tokens > self.max_step or 1 < tokens < self.min_rows or low < lo or high > hi:
            self.beyond += count
            self.beyond_example = self.beyond_example or (
                f"{tokens} tokens at context {low:.0f}-{high:.0f} (curve: steps 1 and {self.min_rows}-{self.max_step}, "
                f"contexts {lo}-{hi})")

    def group_ms(self, g: list) -> float:
        _, tokens, region_rows, region_len, share, count, prefix_sum, pmin, pmax = g
        if not count:
            return 0.0
        mean_prefix = prefix_sum / count
        attended = ((tokens - region_rows) * mean_prefix + region_rows * region_len) / tokens
        low = min(pmin, region_len) if region_rows else pmin
        self._check(tokens, low, pmax, count)
        return count * share * self.curve.latency(tokens, attended)

    def draft_model_ms(self, forwards: float, params: float, target_params: float | None, context: float) -> float:
        if not forwards or not params or not target_params:
            return 0.0
        self._check(1, context, context, int(forwards))
        return forwards * self.curve.latency(1, context) * params / target_params


def _host_ms(row: dict, key: str, curve: CostCurve, method: str, cross_device: bool) -> tuple[float, str]:
    """Host ms per step and where it came from. On the curve's own device: the row's measurement, else the
    curve's per-method figure, else 0. Priced on another device (``cross_device``): the curve's figure for the
    method, else the curve's vanilla figure (a floor: every method does at least vanilla's host work), else 0;
    a host time measured beside this run's device says nothing of that device's."""
    lookup = getattr(curve, "host_ms", None)
    on_curve = num(lookup(method)) if callable(lookup) else None
    if cross_device:
        if on_curve is not None:
            return on_curve, f"the method's, from the cost curve ({curve.device})"
        if callable(lookup) and (x := num(lookup("vanilla"))) is not None:
            return x, f"vanilla's from the cost curve ({curve.device}), a floor"
        return 0.0, "not included (the cost curve records none)"
    if (x := num(row.get(key))) is not None:
        return x, "measured in the run"
    if on_curve is not None:
        return on_curve, "from the cost curve"
    return 0.0, "not included (not recorded)"


def priced_turns(rows: list[dict], outputs: dict, curve: CostCurve, target_params: float | None,
                 method: str, reference: str = "vanilla", cross_device: bool = False
                 ) -> tuple[list[dict], Pricer, set[str]]:
    """One dict per timed (sample, turn) with a decode step and a forward log: tokens after the first and measured
    and priced decode times of the method and of the reference (times: medians over repeats)."""
    pricer, hosts = Pricer(curve), set()
    by_turn: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("status") == "ok" and not (num(r.get("compiles")) or 0) > 0:
            by_turn[str(r["sample_id"]), int(float(r["turn"]))].append(r)
    out = []
    for key, reps in by_turn.items():
        first, gen = reps[0], outputs.get(key) or {}
        n, ref_n = num(first.get("new_tokens")), num(first.get("ref_new_tokens"))
        if gen.get("forward_log") is None or n is None or ref_n is None or n <= 1 or ref_n <= 1:
            continue
        prompt, steps = num(first.get("prompt_tokens")) or 0, num(first.get("forwards")) or 0
        host, how = _host_ms(first, "host_ms_per_step", curve, method, cross_device)
        ref_host, ref_how = _host_ms(first, "ref_host_ms_per_step", curve, reference, cross_device)
        hosts |= {how, ref_how}
        ref_log = gen.get("ref_forward_log") or vanilla_log(int(prompt), int(ref_n))
        method_ms = sum(pricer.group_ms(g) for g in gen["forward_log"]) + steps * host + pricer.draft_model_ms(
            num(first.get("draft_model_forwards")) or 0, num(first.get("draft_model_params")) or 0,
            target_params, prompt + n / 2)
        ref_ms = sum(pricer.group_ms(g) for g in ref_log) + (ref_n - 1) * ref_host
        times = {k: [num(r.get(k)) for r in reps] for k in ("decode_s", "ref_decode_s")}
        if any(None in v for v in times.values()):
            continue
        med = {k: statistics.median(v) for k, v in times.items()}  # over repeats, as metrics.per_turn
        out.append({"steps_tokens": n - 1, "ref_steps_tokens": ref_n - 1, "decode_s": med["decode_s"],
                    "ref_decode_s": med["ref_decode_s"], "pred_s": method_ms / 1e3, "ref_pred_s": ref_ms / 1e3,
                    "steps": steps})
    return out, pricer, hosts


def _ratio(turns: list[dict], method: str, ref: str) -> float | None:
    rate = sum(t["steps_tokens"] for t in turns) / sum(t[method] for t in turns)
    den = sum(t["ref_steps_tokens"] for t in turns) / sum(t[ref] for t in turns)
    return rate / den if den > 0 and math.isfinite(rate / den) else None


def project(rows: list[dict], outputs: dict, curve: CostCurve, target_params: float | None = None,
            method: str = "", reference: str = "vanilla", run_device: str | None = None) -> dict:
    """The summary's projection fields for a run's ``rows`` and ``outputs`` ({(sample_id, turn): record}).

    ``run_device``: the device the run was timed on; when the curve was measured on another one the projection
    is a prediction for that device (``projection_cross_device``), with host times from the curve and no
    ``projection_error`` (there is no measurement on that device to hold it against)."""
    cross = bool(run_device and curve.device and run_device.strip().lower() != curve.device.strip().lower())
    turns, pricer, hosts = priced_turns(rows, outputs, curve, target_params, method, reference, cross)
    out = {"cost_curve_device": curve.device, "projection_rows": len(turns), "projection_cross_device": cross}
    if not turns or any(t["pred_s"] <= 0 or t["ref_pred_s"] <= 0 for t in turns):
        return out | {"projected_speedup": None, "projection_note": "no timed (sample, turn) with a forward log"}
    projected, measured = _ratio(turns, "pred_s", "ref_pred_s"), _ratio(turns, "decode_s", "ref_decode_s")
    steps = sum(t["steps"] for t in turns)
    out |= {"projected_speedup": projected, "projection_measured": measured,
            "projection_error": projected / measured - 1 if projected and measured and not cross else None,
            "projected_step_ms": 1e3 * sum(t["pred_s"] for t in turns) / steps if steps else None,
            "break_even_tau_measured": (sum(t["pred_s"] for t in turns) / steps)
            / (sum(t["ref_pred_s"] for t in turns) / sum(t["ref_steps_tokens"] for t in turns)) if steps else None,
            "projection_beyond_curve": pricer.beyond, "projection_host": "; ".join(sorted(hosts))}
    if pricer.beyond:
        out["projection_note"] = (f"{pricer.beyond} forwards priced beyond the curve's grid by extrapolation, e.g. "
                                  f"{pricer.beyond_example}")
    return out


def curve_fields(steps, curve: CostCurve, rows: list[dict], outputs: dict, target_params: float | None = None,
                 method: str = "", run_device: str | None = None) -> dict:
    """A run summary's fields from its cost curve (``bench.cost_curve``): ``break_even_tau`` (the method's declared
    step, ``forward_tokens`` ``steps``, at the run's mean context and its ``bench.batch_size``: the tau at which it
    pays for itself), with a curve of several batch sizes ``projected_speedup_by_batch`` (``{batch: tau /
    break-even tau there}``, :meth:`CostCurve.projected_by_batch`), and the projection of :func:`project`."""
    ok = [r for r in rows if r.get("status") == "ok"]
    if not ok:
        return {}
    out = {}
    if steps:
        context = sum(float(r["prompt_tokens"]) + float(r["new_tokens"]) / 2 for r in ok) / len(ok)
        batch = int(float(ok[0].get("batch_size") or 1))
        if batch in curve.batches:  # the run's own batch size (bench.batch_size), where the curve has it
            out["break_even_tau"] = curve.break_even_tau(steps, int(context), batch)
        tau = _tau(ok)
        if tau is not None and len(curve.batches) > 1:  # what each batch size on file would give this tau
            out["projected_speedup_by_batch"] = {str(b): v for b, v in
                                                 curve.projected_by_batch(tau, steps, int(context)).items()}
    return out | project(rows, outputs, curve, target_params, method, run_device=run_device)


def _tau(ok: list[dict]) -> float | None:
    """Tokens per verification step over ``ok`` rows (first repeat of each (sample, turn)): the summary's tau."""
    first = {}
    for r in ok:
        first.setdefault((r["sample_id"], r["turn"]), r)
    tokens = sum(float(r["new_tokens"]) - 1 for r in first.values())
    forwards = sum(float(r["forwards"]) for r in first.values() if r.get("forwards") not in (None, ""))
    return tokens / forwards if forwards else None


# ------------------------------------------------------------------ the check: python -m fafo.bench.tools.projection
def check(run_dirs: list[Path], curve: CostCurve) -> list[dict]:
    """Every run under ``run_dirs`` priced on ``curve``: method, measured and projected decode speedup, error."""
    from fafo.bench.records import read_outputs, read_rows

    results = []
    for root in run_dirs:
        for summary_path in sorted(Path(root).rglob("summary.json")):
            d = summary_path.parent
            s = json.loads(summary_path.read_text())
            p = project(read_rows(d / "samples.csv"), read_outputs(d / "outputs.jsonl"), curve, s.get("n_params"),
                        s.get("method", ""), run_device=s.get("device_name"))
            results.append({"method": s.get("method", d.name), "run_dir": str(d), **p})
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", type=Path, help="run directories (or a comparison's directory)")
    ap.add_argument("--curve", required=True, help="a cost curve CSV (scripts/bench_engine.py --curve)")
    ap.add_argument("--within", type=float, default=None, help="fail (exit 1) when |projected/measured - 1| > this")
    args = ap.parse_args(argv)
    results = check(args.run_dirs, CostCurve.load(args.curve))
    if not results:
        print(f"error: no summary.json under {', '.join(map(str, args.run_dirs))}", file=sys.stderr)
        return 2
    device = results[0]["cost_curve_device"]
    other = sorted({r["method"] for r in results if r.get("projection_cross_device")})
    if args.within is not None and other:
        print(f"error: --within checks a projection against measurement, but the curve is from {device} and the runs "
              f"of {', '.join(other)} were timed on another device; pass the curve of the runs' own device "
              "(scripts/bench_engine.py --curve on that machine)", file=sys.stderr)
        return 2
    print(f"| method | measured speedup_decode | projected ({device}) | error | beyond curve |")
    print("|---|---:|---:|---:|---:|")
    bad = []
    for r in results:
        err = r.get("projection_error")
        measured, projected = _fmt(r.get("projection_measured"), ".3f"), _fmt(r.get("projected_speedup"), ".3f")
        error = "n/a (timed on another device)" if r.get("projection_cross_device") else \
            f"{_fmt(None if err is None else 100 * err, '+.1f')} %"
        print(f"| {r['method']} | {measured}x | {projected}x | {error} | {r.get('projection_beyond_curve', '-')} |")
        if args.within is not None and (err is None or abs(err) > args.within):
            bad.append(r["method"])
    if bad:
        print(f"projection off by more than {100 * args.within:.0f} % (or not computed) for: {', '.join(bad)}",
              file=sys.stderr)
    return 1 if bad else 0


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    sys.exit(main())
