"""Speedup and throughput against batch size, per method (``experiment=batch_sweep``; ``scripts/plot.py --batch``).

Each point is one run at ``bench.batch_size`` B (1 where the config has none): its headline speedup against vanilla
at the same B and batching mode with its interval (:mod:`fafo.bench.metrics`: at B > 1 a throughput ratio from each
request's share of the batch's time, :mod:`fafo.bench.batch_run`), and the throughput of the method and of its own
vanilla (tokens over the summed request times: at B = 1 one request after another, at B > 1 the batch's). The
break-even batch of a method is where its speedup first falls to 1 between two measured batch sizes (linear in log2
B between them), "< B" when it is already below 1 at the smallest, "> B" when it stays above 1 at the largest.
"""

from __future__ import annotations

import math
from pathlib import Path

from fafo.bench.tools import report
from fafo.bench.tools import report_format as rf
from fafo.bench.tools import tables


def batch_of(run) -> int:
    return int(rf.num(report.dotted(run.config, "bench.batch_size")) or 1)


def series(roots) -> list[dict]:
    """Per (model, method, task, batching): ``label`` and ``points``, one per batch size (the most complete run),
    each ``{"batch", "speedup", "interval", "tokens_per_s", "ref_tokens_per_s", "n", "kind"}``."""
    runs = [r for r in tables.collect(roots).runs if r.summary]
    groups: dict[tuple, dict[int, list]] = {}
    for run in sorted(runs, key=lambda r: (not r.complete, -r.weight, r.rel)):
        s = run.summary
        key = (str(s.get("model", "?")), str(s.get("method", "?")), str(s.get("task", "?")),
               str(report.dotted(run.config, "bench.batching") or "static"))
        groups.setdefault(key, {}).setdefault(batch_of(run), []).append(run)
    several = {i: len({k[i] for k in groups}) > 1 for i in range(4)}
    out = []
    for key, by_batch in sorted(groups.items()):
        label = " / ".join(part for i, part in enumerate(key) if i == 1 or several[i])
        points = []
        for batch, runs_here in sorted(by_batch.items()):
            run = runs_here[0]  # the most complete (sorted above)
            s = run.summary
            points.append({"batch": batch, "speedup": rf.num(s.get("speedup")),
                           "interval": _interval(s), "tokens_per_s": rf.num(s.get("tokens_per_s")),
                           "ref_tokens_per_s": report.reference_throughput(run), "n": rf.fmt_n(s),
                           "kind": s.get("speedup_kind")})
        hidden = [rs for rs in by_batch.values() if len(rs) > 1]  # one point, several runs: the most complete shown
        out.append({"label": label, "points": points, "break_even": break_even(points),
                    "hidden": sum(len(rs) - 1 for rs in hidden),
                    "hidden_keys": sorted({k for rs in hidden for k in tables.swept_keys(rs)})})
    return out


def _interval(s: dict) -> tuple[float, float, str] | None:
    """(lo, hi, kind) of the speedup's interval: ``ci95`` (95 % bootstrap) or ``range`` (per-sample range)."""
    for kind in ("ci95", "range"):
        ci = s.get(f"speedup_{kind}")
        if rf.fmt_ci(ci):
            return float(ci[0]), float(ci[1]), kind
    return None


def break_even(points: list[dict]) -> tuple[float | None, str]:
    """(the batch size where the speedup first crosses 1 downwards, or None; its text: "4.6", "< 1", "> 8")."""
    pts = [(p["batch"], p["speedup"]) for p in points if p["speedup"] is not None]
    if not pts:
        return None, rf.DASH
    if pts[0][1] < 1.0:
        return None, f"< {pts[0][0]}"
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if s0 >= 1.0 > s1:
            f = (s0 - 1.0) / (s0 - s1)
            b = 2 ** (math.log2(b0) + f * (math.log2(b1) - math.log2(b0)))
            return b, f"{b:.1f}"
    return None, f"> {pts[-1][0]}"


def table(data: list[dict]) -> str:
    """The points as Markdown: per series and batch size, speedup with its interval, throughputs, n."""
    lines = [[entry["label"], str(p["batch"]), rf.fmt(p["speedup"], ".2f"),
              _fmt_interval(p["interval"]), rf.fmt(p["tokens_per_s"], ".1f"), rf.fmt(p["ref_tokens_per_s"], ".1f"),
              p["n"], entry["break_even"][1]] for entry in data for p in entry["points"]]
    head = ["method", "batch", "speedup", "interval", "tokens/s", "vanilla tokens/s", "n (failed)", "break-even batch"]
    kinds = sorted({str(p["kind"]) for e in data for p in e["points"] if p["kind"]})
    notes = [f"speedup = speedup_{'/'.join(kinds) or 'e2e'} against vanilla at the same batch size and batching mode; "
             "tokens/s over each request's share of the batch's time (at batch 1 one request after another)",
             "interval: [lo–hi] 95 % bootstrap over samples (10 or more), {lo–hi} the per-sample range below"]
    hidden = sum(e["hidden"] for e in data)
    if hidden:
        keys = sorted({k for e in data for k in e["hidden_keys"]})
        differ = f"; they differ in {', '.join(keys[:6])}" if keys else ""
        notes.append(f"{hidden} run(s) not shown: each shares its (method, batch size) with a more complete run, "
                     f"shown instead{differ}; plot them apart (one results directory per setting, or scripts/plot.py "
                     "--x KEY)")
    return rf.markdown(head, lines, notes, labels=1)


def _fmt_interval(iv) -> str:
    if iv is None:
        return rf.DASH
    return f"[{iv[0]:.2f}–{iv[1]:.2f}]" if iv[2] == "ci95" else f"{{{iv[0]:.2f}–{iv[1]:.2f}}}"


def figure(data: list[dict], title: str = "speedup and throughput vs batch size"):
    """Two panels against batch size (log2): speedup with its interval and the break-even batch marked (a dotted
    vertical line per method), throughput of each method (solid) and of its vanilla (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, entry in enumerate(data):
        color, pts = colors[i % len(colors)], entry["points"]
        xs = [p["batch"] for p in pts if p["speedup"] is not None]
        ys = [p["speedup"] for p in pts if p["speedup"] is not None]
        ax_s.plot(xs, ys, "o-", color=color, label=f"{entry['label']} (break-even {entry['break_even'][1]})")
        bars = [p for p in pts if p["speedup"] is not None and p["interval"]]
        if bars:
            ax_s.errorbar([p["batch"] for p in bars], [p["speedup"] for p in bars], fmt="none", ecolor=color,
                          capsize=3, yerr=[[max(0.0, p["speedup"] - p["interval"][0]) for p in bars],
                                           [max(0.0, p["interval"][1] - p["speedup"]) for p in bars]])
        for p in pts:
            if p["speedup"] is not None:
                ax_s.annotate(f"n={p['n']}", (p["batch"], p["speedup"]), textcoords="offset points",
                              xytext=(3, -10), fontsize=6, color=color)
        if entry["break_even"][0] is not None:
            ax_s.axvline(entry["break_even"][0], color=color, linestyle=":", linewidth=1)
        for key, style, suffix in (("tokens_per_s", "o-", ""), ("ref_tokens_per_s", "x--", " vanilla")):
            tp = [(p["batch"], p[key]) for p in pts if p[key] is not None]
            if tp:
                ax_t.plot(*zip(*tp), style, color=color, label=entry["label"] + suffix)
    ax_s.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax_s.set(xlabel="batch size (bench.batch_size)", ylabel="speedup vs vanilla at the same batch size (×)")
    ax_t.set(xlabel="batch size (bench.batch_size)", ylabel="throughput (tokens/s, all requests)")
    batches = sorted({p["batch"] for e in data for p in e["points"]})
    for ax in (ax_s, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title + "; dotted: break-even batch (speedup 1)", fontsize=9)
    fig.tight_layout()
    return fig


def write(roots, out: str | Path | None = None) -> tuple[str, list[Path]]:
    """The table (printed by the caller) and ``batch_sweep.png`` / ``.pdf`` under ``out`` (default
    ``<first root>/plots``)."""
    data = series(roots)
    where = ", ".join(map(str, roots))
    if not data:
        raise SystemExit(f"error: no finished run under {where}; run python -m fafo.bench -m experiment=batch_sweep "
                         "first")
    if all(len(e["points"]) < 2 for e in data):
        sizes = sorted({p["batch"] for e in data for p in e["points"]})
        raise SystemExit(f"error: the runs under {where} have one batch size per method (bench.batch_size="
                         f"{','.join(map(str, sizes))}), so there is no curve to plot against it; sweep it (python -m "
                         "fafo.bench -m experiment=batch_sweep) or plot against another key with --x KEY")
    out = Path(out or Path(roots[0]) / "plots")
    out.mkdir(parents=True, exist_ok=True)
    fig = figure(data)
    paths = [out / "batch_sweep.png", out / "batch_sweep.pdf"]
    for path in paths:
        fig.savefig(path, dpi=150)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return table(data), paths
