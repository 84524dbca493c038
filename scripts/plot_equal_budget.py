"""Equal-budget plot and table: tau and speedup against tokens per forward, one line per method.

    python -m fafo.bench -m experiment=equal_budget bench.cost_curve=results/bench/curve.csv
    python scripts/plot_equal_budget.py results/runs/equal_budget --out results/runs/equal_budget/equal_budget.png

Reads every ``summary.json`` under the roots (``tokens_per_forward``, ``tau``, ``speedup`` and, when the runs had
``bench.cost_curve``, ``break_even_tau``), prints a Markdown table sorted by method and budget, and draws two
panels: tau (with each point's break-even tau, dashed: above it the method beats vanilla on the curve's device)
and measured speedup with its 95 % bootstrap interval as error bars. The table also gives each run's coverage
(samples, failed rows), tau_all and which speedup it is (``speedup_kind``; definitions in DESIGN.md "Runner and
records"); runs recorded before those keys show a dash.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fafo.bench import report  # noqa: E402
from fafo.bench import report_format as rf  # noqa: E402

KEYS = ("method", "model", "task", "tokens_per_forward", "tau", "break_even_tau", "speedup", "speedup_ci95",
        "speedup_kind", "tau_all", "n_samples", "n_turns", "n_failed")


def collect(roots: list[str]) -> list[dict]:
    """The runs under ``roots`` that record ``tokens_per_forward`` (:func:`fafo.bench.report.collect`)."""
    rows = [{k: run.summary.get(k) for k in KEYS} for run in report.collect(roots).runs]
    return sorted((r for r in rows if r["tokens_per_forward"]), key=lambda r: (r["method"], r["tokens_per_forward"]))


def table(rows: list[dict]) -> str:
    head = ["method", "tokens/forward", "tau", "break-even tau", "speedup", "95% CI", "speedup kind", "tau_all",
            "n (failed)"]
    lines = [[str(r["method"]), str(r["tokens_per_forward"]), rf.fmt(r["tau"], ".2f"),
              rf.fmt(r["break_even_tau"], ".2f"), rf.fmt(r["speedup"], ".2f"),
              rf.fmt_ci(r["speedup_ci95"]) or rf.DASH, r["speedup_kind"] or rf.DASH,
              rf.fmt(r["tau_all"], ".2f"), rf.fmt_n(r)] for r in rows]
    notes = ["tau = tokens committed per verification step, prefill excluded (runs before tau_all: new tokens / "
             "(forwards + 1)); tau_all = new tokens / every forward of the target's weights; speedup kind: e2e "
             "(prefill included), decode (prefill excluded) or specbench (mean of per-question tokens/s ratios)"]
    return rf.markdown(head, lines, notes, labels=1)


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tau, ax_speed) = plt.subplots(1, 2, figsize=(10, 4))
    for method in sorted({r["method"] for r in rows}):
        pts = [r for r in rows if r["method"] == method]
        x = [r["tokens_per_forward"] for r in pts]
        line, = ax_tau.plot(x, [r["tau"] for r in pts], marker="o", label=method)
        if any(r["break_even_tau"] is not None for r in pts):
            ax_tau.plot(x, [r["break_even_tau"] for r in pts], ls="--", color=line.get_color())
        ys = [r["speedup"] for r in pts]
        ax_speed.plot(x, ys, marker="o", label=method, color=line.get_color())
        cis = [r["speedup_ci95"] if isinstance(r["speedup_ci95"], list) else [y, y] for r, y in zip(pts, ys)]
        if None not in ys:
            ax_speed.errorbar(x, ys, yerr=[[max(0.0, y - c[0]) for y, c in zip(ys, cis)],
                                           [max(0.0, c[1] - y) for y, c in zip(ys, cis)]],
                              fmt="none", ecolor=line.get_color(), capsize=3)
    for ax, name in ((ax_tau, "tau (dashed: break-even tau)"), (ax_speed, "speedup vs vanilla, 95% CI")):
        ax.set_xscale("log")
        ax.set_xlabel("tokens per forward")
        ax.set_ylabel(name)
    ax_speed.axhline(1.0, color="grey", lw=0.8)
    ax_tau.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roots", nargs="+")
    p.add_argument("--out", type=Path, default=None, help="PNG path (default: <first root>/equal_budget.png)")
    args = p.parse_args(argv)
    rows = collect(args.roots)
    print(table(rows))
    if rows:
        out = args.out or Path(args.roots[0]) / "equal_budget.png"
        plot(rows, out)
        print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
