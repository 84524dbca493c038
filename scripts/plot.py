"""Ablation curves: speedup and tau against the table's axis, one line per (model,) method, paper values as markers.

    python scripts/plot.py results/runs/table11 --table table11        # k
    python scripts/plot.py results/runs/table12                        # n (--table from the runs' config.yaml)
    python scripts/plot.py results/runs/figure1 --table figure1        # number of guesses, FAFO vs Lookahead
    python scripts/plot.py results/runs/my_sweep --x method.compress.local   # any runs, against any swept key
    python scripts/plot.py results/runs/equal_budget --x tokens_per_forward --logx   # the equal-budget sweep
    python scripts/plot.py results/runs/batch_sweep --batch            # speedup and throughput vs batch size

Axes: k (Table 11), n (Table 12), Init+Local budget (Table 13), input / prefix length (Tables 9-10), number of
guesses (Figure 1), and the TriForce tables' temperature / output length / gamma. Our runs are solid lines with
filled markers; the published values (results/paper/<table>.csv) are hollow markers of the same colour, where the
paper has them. Writes ``<table>.png`` and ``<table>.pdf`` to ``--out`` (default ``<first root>/plots``) and logs
the figure and its points to Weights & Biases (``--wandb-mode``, default $WANDB_MODE or offline).

``--x KEY`` plots any runs (no paper preset needed) against any config or summary key (``tokens_per_forward``
for the equal-budget sweep): one line per (model, method), and per task when the runs cover several; the x axis is
numeric when every value is a number, else categorical; runs that recorded a ``break_even_tau``
(``bench.cost_curve``) show it dashed on the tau panel (above it a method beats vanilla on the curve's device).
It prints the points as a Markdown table and writes ``runs_by_<KEY>.png`` / ``.pdf``.

``--batch`` plots runs against ``bench.batch_size`` (``experiment=batch_sweep``): speedup against vanilla at the same
batch size with its interval and each method's break-even batch marked, and the throughput of each method and of its
vanilla (:mod:`fafo.bench.tools.batch_curve`); it prints the points and writes ``batch_sweep.png`` / ``.pdf``.

Every point of ours carries its interval as an error bar (a 95 % bootstrap interval from 10 samples, the range of
the per-sample values below, none for one sample; the caption says which) and its coverage ``n`` (samples[/turns],
failed rows) beside it; the figure names the speedup and tau it shows with their
definitions, and the methods of one column are compared on their common samples (see ``fafo/bench/tools/report.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generic_table
from fafo.bench.tools import paper_table as pt
from fafo.bench.tools import report
from fafo.bench.tools import report_format as rf
from fafo.bench.tools import tables
from fafo.bench.tools.paper import AXIS_LABELS
from fafo.extras import available, install_hint

METRICS = [("speedup", "speedup over vanilla (×)"),
           ("tau", "τ (tokens per verification step, prefill excluded)")]


def _point(summary: dict, metric: str, x) -> tuple:
    """(x, y, (lo, hi) or None, n text) of one run's metric: its 95 % interval, else its per-sample range."""
    for kind in ("ci95", "range"):
        ci = summary.get(f"{metric}_{kind}")
        if rf.fmt_ci(ci):
            return x, rf.num(summary.get(metric)), (float(ci[0]), float(ci[1])), rf.fmt_n(summary)
    return x, rf.num(summary.get(metric)), None, rf.fmt_n(summary)


def _draw(ax, points, color, label):
    """Our line, its error bars and each point's coverage."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    ax.plot(xs, ys, "o-", color=color, label=label)
    bars = [(x, y, ci) for x, y, ci, _ in points if ci is not None]
    if bars:
        ax.errorbar([b[0] for b in bars], [b[1] for b in bars], capsize=3, fmt="none", ecolor=color,
                    yerr=[[max(0.0, y - lo) for _, y, (lo, _) in bars], [max(0.0, hi - y) for _, y, (_, hi) in bars]])
    for x, y, _, n in points:
        ax.annotate(f"n={n}", (x, y), textcoords="offset points", xytext=(3, -10), fontsize=6, color=color)


def figure(data: list[dict], xlabel: str, title: str, summaries, notes=(), logx: bool = False):
    """Two panels, speedup and tau against x: per entry our points, the paper's (hollow) and break-even tau
    (dashed)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, entry in enumerate(data):
        color = colors[i % len(colors)]
        for ax, (metric, _) in zip(axes, METRICS):
            if entry[metric]:
                _draw(ax, entry[f"{metric}_points"], color, entry["label"])
            if entry.get(f"paper_{metric}"):
                xs, ys = zip(*entry[f"paper_{metric}"])
                ax.plot(xs, ys, linestyle="none", marker="s", markersize=8, markerfacecolor="none",
                        markeredgecolor=color, color=color, label=f"{entry['label']} (paper)")
        if entry.get("break_even"):
            axes[1].plot(*zip(*entry["break_even"]), linestyle="--", color=color)
    categories = data[0].get("categories") if data else None
    for ax, (metric, ylabel) in zip(axes, METRICS):
        dashed = metric == "tau" and any(entry.get("break_even") for entry in data)
        ax.set(xlabel=xlabel, ylabel=ylabel + ("; dashed: break-even tau" if dashed else ""))
        ax.set_xscale("log" if logx else "linear")
        ax.grid(True, alpha=0.3)
        if categories:
            ax.set_xticks(range(len(categories)), categories)
        if metric == "speedup":
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    lines = report.definitions(summaries) + list(notes)
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=5.5, va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.04 + 0.025 * len(lines), 1, 1))
    return fig


def series(table: pt.Table, axis: str) -> list[dict]:
    """One entry per (model, method) row: its label and the (x, y) points of ours and of the paper, per metric."""
    models = {row[0] for row in table.rows}
    out = []
    for row in table.rows:
        model, method = table.row_names[row]
        entry = {"label": method if len(models) == 1 else f"{model} / {method}"}
        for metric, _ in METRICS:
            ours, paper = [], []
            for col in table.cols:
                x = rf.num(col[2])
                if col[1] != axis or x is None:
                    continue
                cell = table.cell(row, col)
                if cell.ours is not None and rf.num(cell.ours.summary.get(metric)) is not None:
                    ours.append(_point(cell.ours.summary, metric, x))
                if cell.paper is not None and rf.num(cell.paper.get(metric)) is not None:
                    paper.append((x, rf.num(cell.paper.get(metric))))
            entry[f"{metric}_points"] = sorted(ours, key=lambda p: p[0])
            entry[metric] = [p[:2] for p in entry[f"{metric}_points"]]
            entry[f"paper_{metric}"] = sorted(paper)
        if any(entry[m] or entry[f"paper_{m}"] for m, _ in METRICS):
            out.append(entry)
    return out


def plot_table(table: pt.Table, axis: str | None = None, logx: bool = False):
    """The figure (two panels: speedup and tau vs the axis) and the series it shows."""
    if not table.axes:
        raise SystemExit(f"error: {table.name} has no ablation axis to plot; use scripts/make_tables.py for it")
    axis = axis or table.axes[0]
    data = series(table, axis)
    summaries = [c.ours.summary for c in table.cells.values() if c.ours is not None]
    return figure(data, AXIS_LABELS.get(axis, axis), table.title, summaries, table.coverage, logx), data


def sweep_series(roots, key: str) -> list[dict]:
    """Any runs against ``key``: per (model, method[, task]) its label, sorted (x, y) points per metric, break-even
    tau where recorded and its runs."""
    runs = generic_table.runs_frame(sorted(tables.collect(roots).runs, key=lambda r: r.order), by=key)
    runs = runs[runs["value"] != rf.DASH]
    if runs.empty:
        raise SystemExit(f"error: no run under {', '.join(map(str, roots))} has the config key {key}; "
                         f"pass --x with a key the runs were swept over ({swept_hint(roots)})")
    runs = runs.sort_values(["complete", "weight", "run_dir"], ascending=False)
    group = ["model", "method", "task", "value"]
    hidden = generic_table.hidden_runs_note(runs, group, "point", "plot them apart: one results directory each")
    runs, notes = generic_table.align_cells(runs.drop_duplicates(group), key)
    notes += hidden
    numeric = all(rf.num(v) is not None for v in runs["value"])
    categories = sorted(set(runs["value"]), key=lambda v: (rf.num(v) is None, rf.num(v) or 0, v))
    runs = runs.assign(x=[rf.num(v) if numeric else categories.index(v) for v in runs["value"]])
    several = {"model": runs["model"].nunique() > 1, "task": runs["task"].nunique() > 1}
    out = []
    for (model, method, task), g in runs.groupby(["model", "method", "task"], sort=True):
        g = g.sort_values(["complete", "weight"], ascending=False).drop_duplicates("x").sort_values("x")
        label = " / ".join([model] * several["model"] + [method] + [task] * several["task"])
        entry = {"label": label, "categories": None if numeric else categories, "coverage": notes,
                 "runs": list(zip(g["value"], g["run"])),
                 "break_even": [(x, r.summary["break_even_tau"]) for x, r in zip(g["x"], g["run"])
                                if rf.num(r.summary.get("break_even_tau")) is not None]}
        for metric, _ in METRICS:
            pts = g.dropna(subset=[metric])
            entry[metric] = list(zip(pts["x"].tolist(), pts[metric].tolist()))
            entry[f"{metric}_points"] = [_point(r.summary, metric, x) for x, r in zip(pts["x"], pts["run"])]
        out.append(entry)
    return out


def swept_hint(roots) -> str:
    """The keys the runs under ``roots`` were swept over, as a hint for ``--x``."""
    keys = tables.swept_keys(tables.collect(roots).runs)
    return f"they differ in {', '.join(keys)}: e.g. --x {keys[0]}" if keys else "e.g. --x method.compress.local"


def plot_sweep(roots, key: str, logx: bool = False):
    """The figure (speedup and tau vs ``key``) of any runs, and the series it shows."""
    data = sweep_series(roots, key)
    summaries = [run.summary for entry in data for _, run in entry["runs"]]
    return figure(data, key, f"speedup and tau vs {key}", summaries, data[0]["coverage"] if data else (), logx), data


def sweep_table(data: list[dict], key: str) -> str:
    """The points of a sweep, one line per run: tau beside its break-even tau, speedup with its interval and kind."""
    lines = [[entry["label"], value, rf.fmt(s.get("tau"), ".2f"), rf.fmt(s.get("break_even_tau"), ".2f"),
              rf.fmt(s.get("speedup"), ".2f"), rf.fmt_interval(s, "speedup") or rf.DASH,
              s.get("speedup_kind") or rf.DASH, rf.fmt(s.get("tau_all"), ".2f"), rf.fmt_n(s)]
             for entry in data for value, s in ((v, run.summary) for v, run in entry["runs"])]
    head = ["series", key, "tau", "break-even tau", "speedup", "interval", "speedup kind", "tau_all", "n (failed)"]
    summaries = [run.summary for entry in data for _, run in entry["runs"]]
    notes = report.definitions(summaries, ("tau", "tau_all")) + (data[0]["coverage"] if data else [])
    return rf.markdown(head, lines, notes, labels=1)


def log_wandb(fig_path: Path, name: str, data: list[dict], axis: str, mode: str, project: str) -> None:
    if mode == "disabled":
        return
    if not available("wandb"):  # offline without wandb (online was refused before plotting)
        print(f"note: wandb is not installed, so the plot is not logged to W&B; to log: {install_hint('wandb')}",
              file=sys.stderr)
        return
    import wandb

    run = wandb.init(project=project, name=f"plot-{name}", job_type="plots", mode=mode,
                     dir=str(fig_path.parent), config={"table": name, "axis": axis}, reinit="finish_previous")
    points = [[entry["label"], source, metric, x, y] for entry in data for metric, _ in METRICS
              for source, key in (("ours", metric), ("paper", f"paper_{metric}")) for x, y in entry.get(key, [])]
    run.log({f"{name}/figure": wandb.Image(str(fig_path)),
             f"{name}/points": wandb.Table(columns=["series", "source", "metric", axis, "value"], data=points)})
    run.finish()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+", help="results directories (e.g. results/runs/table11)")
    ap.add_argument("--table", help="table11, table12, table13, table9, table10, figure1, triforce_table8, ...")
    ap.add_argument("--axis", help="which axis when the table has several (triforce_table8: gamma1 or gamma2)")
    ap.add_argument("--x", metavar="KEY", help="any runs: plot against this config key (e.g. bench.max_new_tokens)")
    ap.add_argument("--logx", action="store_true", help="a log x axis")
    ap.add_argument("--batch", action="store_true", help="speedup and throughput vs bench.batch_size, the "
                    "break-even batch marked (experiment=batch_sweep)")
    ap.add_argument("--paper", default=str(pt.PAPER_DIR), help="directory of published numbers")
    ap.add_argument("--out", help="output directory (default: <first root>/plots)")
    ap.add_argument("--wandb-mode", default=os.environ.get("WANDB_MODE", "offline"),
                    choices=["offline", "online", "disabled"], help="W&B logging (default $WANDB_MODE or offline)")
    ap.add_argument("--wandb-project", default="fafo-bench")
    args = ap.parse_args(argv)
    if not Path(args.paper).is_dir():  # else the published markers would be silently missing
        ap.error(f"--paper {args.paper} is not a directory; give the folder of published numbers (default "
                 f"{pt.PAPER_DIR})")
    if args.wandb_mode == "online" and not available("wandb"):
        ap.error(f"--wandb-mode online needs the wandb package; {install_hint('wandb')}")
    if args.batch:
        from fafo.bench.tools import batch_curve

        text, paths = batch_curve.write(args.roots, args.out)
        print(text)
        print("wrote " + ", ".join(str(p) for p in paths))
        return 0
    if args.x:
        (fig, data), name, axis = plot_sweep(args.roots, args.x, args.logx), f"runs_by_{args.x}", args.x
        print(sweep_table(data, args.x))
    else:
        if not args.table and not pt.paper_runs(tables.collect(args.roots).runs):
            print(f"error: the runs under {', '.join(args.roots)} come from no paper preset, so there is no table "
                  f"axis to plot; plot them against a config key with --x KEY ({swept_hint(args.roots)})",
                  file=sys.stderr)
            return 2
        table = pt.make_table(args.roots, args.table, args.paper)
        name, axis = table.name, args.axis or (table.axes[0] if table.axes else None)
        fig, data = plot_table(table, axis, args.logx)
        if not any(entry[metric] for entry in data for metric, _ in METRICS):
            print(f"note: no run under {', '.join(args.roots)} is a point of {table.name} along {axis}; the figure "
                  "shows the published points only", file=sys.stderr)
    out = Path(args.out or Path(args.roots[0]) / "plots")
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=150)
    plt.close(fig)
    log_wandb(paths[0], name, data, axis, args.wandb_mode, args.wandb_project)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
