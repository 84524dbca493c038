"""A comparison table of any runs or sweep (no paper preset needed): ``scripts/make_tables.py DIR [--by KEY]``.

Rows are (model, method); one column group per task, or with ``--by KEY`` (any config key, e.g.
``method.compress.local`` or ``bench.max_new_tokens``; else a summary key such as ``dtype``) per value of that key
(per task and value when the runs cover several tasks). Each cell is ``speedup× interval (tau/tau_all)`` (the
interval as :func:`fafo.bench.tools.report_format.fmt_interval` writes it: 95 % bootstrap or per-sample range); each
row ends with its coverage (samples/turns and failed rows), exact-match rate (over its (sample, turn)s, mismatches
classified as fp32 tie / divergence), peak memory (max over its runs) beside vanilla's own and the overhead,
tokens/s (its new tokens over its total time), time per verification forward and acceptance histogram. The methods
of one model in one column are compared on the (sample, turn)s all of them cover (:func:`fafo.bench.tools.report.align`,
marked †); runs whose samples carry categories get a second, per-category table. Written as ``<name>.csv`` (long
form: one line per cell with every number and its run directory), ``<name>.md`` and ``<name>.tex`` like the paper
tables, and the per-category table as ``<name>_by_category.csv`` (one line per cell and category). Runs are read
by :func:`fafo.bench.tools.tables.collect` and aggregated with pandas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fafo.bench.tools import report
from fafo.bench.tools import report_format as rf
from fafo.bench.tools import tables
from fafo.bench.tools.report import Run
from fafo.bench.tools.tables import Collected

CELL_KEYS = ["speedup", "tau", "exact_match_rate", "peak_mem_mb", "tokens_per_s", "n_samples", "n_turns"]
LONG_COLUMNS = ["table", "model", "method", "column", "task", "by", "value", "speedup", "tau", "exact_match_rate",
                "peak_mem_mb", "tokens_per_s", "n_samples", "n_turns", "status", "run_dir", "checkpoint", "n_params",
                "speedup_kind", "speedup_ci95_lo", "speedup_ci95_hi", "speedup_range_lo", "speedup_range_hi",
                "tau_all", "n_failed", "n_flagged", "n_no_decode", "ref_peak_mem_mb", "mem_overhead_mb", "verify_ms",
                "n_mismatch_tie", "n_mismatch_divergence", "speedup_decode", "speedup_vs_eager", "aa_speedup",
                "projected_speedup", "projection_error", "accept_hist", "common_samples"]
TAIL = ["n (failed)", "Exact", "Peak MB", "Vanilla MB", "Overhead MB", "tok/s", "verify ms", "Accept hist"]


def run_value(run: Run, key: str):
    """A dotted config key's value in a run's config.yaml, else the summary's (``dtype``, ``device_name``...);
    ``None`` where the run has neither. Keys joined by commas: ``k1=v1, k2=v2``."""
    if "," in key:
        return ", ".join(f"{k}={tables.norm_value(run_value(run, k)) or rf.DASH}" for k in key.split(","))
    value = report.dotted(run.config, key)
    return run.summary.get(key) if value is None or isinstance(value, (dict, list)) else value


def runs_frame(runs: list[Run], by: str | None = None) -> pd.DataFrame:
    """One line per run: its (model, method, task, by-value), its summary numbers and where it lives."""
    records = []
    for run in runs:
        s = run.summary
        value = tables.norm_value(run_value(run, by)) if by else ""
        records.append({"model": str(s.get("model", "?")), "method": str(s.get("method", "?")),
                        "task": str(s.get("task", "?")), "value": value or (rf.DASH if by else ""),
                        **{k: rf.num(s.get(k)) for k in CELL_KEYS}, "complete": run.complete,
                        "weight": run.weight, "run_dir": run.rel, "checkpoint": s.get("checkpoint", ""),
                        "n_params": s.get("n_params", ""), "config": run.config, "run": run})
    columns = ["model", "method", "task", "value", *CELL_KEYS, "complete", "weight", "run_dir", "checkpoint",
               "n_params", "config", "run"]
    # float columns even where every run lacks a number (a sampled run's exact-match rate): NaN, not None
    return pd.DataFrame.from_records(records, columns=columns).astype({k: float for k in CELL_KEYS})


def align_cells(cells: pd.DataFrame, by: str | None) -> tuple[pd.DataFrame, list[str]]:
    """Each model's runs in one column recomputed on the (sample, turn)s all of them cover; the footnotes."""
    runs, notes = [], []
    for (model, task, value), g in cells.groupby(["model", "task", "value"], sort=False):
        aligned, note = report.align(list(g["run"]), label=lambda r: str(r.summary.get("method", r.rel)))
        runs += aligned
        if note:
            notes.append(f"† {model}, {task}{f' {by}={value}' if by else ''}: {note}")
    return runs_frame(runs, by).sort_values(["model", "method"], kind="stable"), notes


def _flat(config, prefix="") -> dict:
    if not isinstance(config, dict):
        return {prefix: repr(config)}
    out = {}
    for k, v in config.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": repr(v)})
    return out


def differing_keys(configs) -> list[str]:
    """The config keys whose values differ between runs (what a ``--by`` could separate)."""
    flats = [_flat(c or {}) for c in configs]
    keys = set().union(*flats) if flats else set()
    skip = ("bench.output_dir", "bench.reference_dir", "bench.progress", "wandb.")
    return sorted(k for k in keys if len({f.get(k) for f in flats}) > 1 and not k.startswith(skip))


def hidden_runs_note(runs: pd.DataFrame, group: list[str], place: str, fix: str) -> list[str]:
    """Where several runs fill one cell (or point: ``group``'s values alike), the most complete is shown: how many
    are not, and the config keys they differ in."""
    dup = runs[runs.duplicated(group, keep=False)]
    if dup.empty:
        return []
    keys = sorted(set().union(*(differing_keys(g["config"]) for _, g in dup.groupby(group))))
    hint = f"; they differ in {', '.join(keys[:6])} ({fix})" if keys else ""
    return [f"{len(dup) - dup.groupby(group).ngroups} run(s) not shown: each shares its {place} with a more complete "
            f"run{hint}."]


@dataclass
class GenericTable:
    name: str
    title: str
    by: str | None
    cells: pd.DataFrame      # one line per (model, method, column): the run shown there
    rows: pd.DataFrame       # one line per (model, method): exact, peak, tokens/s
    cols: list[tuple]        # (task, value) in display order
    col_names: dict
    notes: list[str]


def _col_key(task, value):
    x = rf.num(value)
    return (task, x if x is not None else float("inf"), value)


def build(collected: Collected, by: str | None = None, name: str | None = None,
          title: str | None = None) -> GenericTable:
    """The table of every run in ``collected``: one column per task (or ``by`` value), one row per (model, method)."""
    runs = runs_frame(sorted(collected.runs, key=lambda r: r.order), by)
    if runs.empty:
        raise SystemExit("error: no finished or partial runs (summary.json / samples.csv) under the given "
                         "directories")
    # a cell keeps its most complete run: finished, most (sample, turn)s, then the path (as the paper tables)
    runs = runs.sort_values(["complete", "weight", "run_dir"], ascending=False)
    group = ["model", "method", "task", "value"]
    cells, notes = align_cells(runs.drop_duplicates(group).sort_values(["model", "method"]), by)
    notes += hidden_runs_note(runs, group, "cell", "separate them with --by KEY")
    rows = pd.DataFrame([{"model": model, "method": method, **tables.aggregate(list(g["run"]))}
                         for (model, method), g in cells.groupby(["model", "method"], sort=True)])
    cols = sorted({(t, v) for t, v in zip(cells["task"], cells["value"])}, key=lambda c: _col_key(*c))
    several_tasks = len({t for t, _ in cols}) > 1
    label = {(t, v): v if by and "," in by else f"{by}={v}" for t, v in cols}  # k1=v1, k2=v2 names itself
    col_names = {c: (f"{c[0]} {label[c]}" if several_tasks else label[c]) if by else c[0] for c in cols}
    partial = sorted(cells.loc[~cells["complete"], "run_dir"])
    if partial:
        notes.append("* partial run (no summary.json yet; summarised from samples.csv): " + ", ".join(partial))
    notes += [f"failed: {rel}: {msg}" for rel, msg in collected.failed]
    name = name or (f"runs_by_{by}" if by else "runs")
    title = title or (f"speedup× (tau) by {by}" if by else "speedup× (tau) by task")
    return GenericTable(name, title, by, cells, rows, cols, col_names, notes)


# ------------------------------------------------------------------ formatting
def _cell_text(table: GenericTable, model, method, col) -> str:
    hit = table.cells[(table.cells["model"] == model) & (table.cells["method"] == method)
                      & (table.cells["task"] == col[0]) & (table.cells["value"] == col[1])]
    return rf.DASH if hit.empty else tables.fmt_run(hit.iloc[0]["run"], tau_all=True)


def header(table: GenericTable) -> list[str]:
    return ["Model", "Method"] + [table.col_names[c] for c in table.cols] + TAIL


def body(table: GenericTable) -> list[list[str]]:
    lines, last_model = [], None
    for r in table.rows.to_dict("records"):
        line = [r["model"] if r["model"] != last_model else "", r["method"]]
        last_model = r["model"]
        line += [_cell_text(table, r["model"], r["method"], c) for c in table.cols]
        line += [rf.fmt_n(r), rf.fmt_exact(r), rf.fmt(rf.num(r["peak_mem_mb"]), ".1f"),
                 rf.fmt(rf.num(r["ref_peak_mem_mb"]), ".1f"), rf.fmt(rf.num(r["mem_overhead_mb"]), ".1f"),
                 rf.fmt(rf.num(r["tokens_per_s"]), ".1f"), rf.fmt(rf.num(r["verify_ms"]), ".2f"),
                 rf.fmt_hist(r["accept_hist"])]
        lines.append(line)
    return lines


def notes(table: GenericTable) -> list[str]:
    """What the table's numbers mean: its columns' definitions, the prompt formats and sampling, its own notes."""
    return ["cells: speedup over vanilla × interval (tau/tau_all; tau_all where recorded); n: samples[/turns] of "
            "the row's runs (failed rows, ‡ flagged, ∅ no decode step); Exact: exact-match rate over the row's "
            "(sample, turn)s (mismatches classified in fp32 as tie / div); Peak MB: max over the row's runs, "
            "Vanilla MB: vanilla's own peak, Overhead MB: method - vanilla; tok/s: the row's new tokens / total "
            "time; verify ms: time per verification forward; Accept hist: steps that committed 1, 2, 3... tokens.",
            *report.definitions([r.summary for r in table.cells["run"]], ("tau", "tau_all")),
            *tables.sampled_note(table.cells["run"]), *tables.prompts_note(table.cells["run"]), *table.notes]


def category_entries(table: GenericTable) -> list:
    """[(model, method, column), run] of every cell, for the per-category table."""
    return [([r.model, r.method, table.col_names[(r.task, r.value)]], r.run)
            for r in table.cells.itertuples(index=False)]


def to_markdown(table: GenericTable) -> str:
    split = report.category_markdown(category_entries(table), ["Model", "Method", "Column"],
                                     f"{table.title}: per category", rf.DASH)
    return rf.markdown(header(table), body(table), notes(table), table.title) + ("\n" + split if split else "")


def to_latex(table: GenericTable) -> str:
    head = header(table)
    return tables.latex(table.title, "ll" + "r" * (len(head) - 2), [" & ".join(tables.tex(h) for h in head) + r" \\"],
                        body(table), notes(table))


def long_frame(table: GenericTable) -> pd.DataFrame:
    """The CSV: one line per (model, method, column) with every number."""
    c = table.cells
    out = pd.DataFrame({
        "table": table.name, "model": c["model"], "method": c["method"],
        "column": [table.col_names[(t, v)] for t, v in zip(c["task"], c["value"])], "task": c["task"],
        "by": table.by or "", "value": c["value"], **{k: c[k].round(4) for k in
                                                        ("speedup", "tau", "exact_match_rate", "tokens_per_s")},
        "peak_mem_mb": c["peak_mem_mb"].round(1), "n_samples": c["n_samples"].astype("Int64"),
        "n_turns": c["n_turns"].astype("Int64"), "status": c["complete"].map({True: "ok", False: "partial"}),
        "run_dir": c["run_dir"], "checkpoint": c["checkpoint"], "n_params": c["n_params"],
        **{k: [tables.csv_extras(run)[k] for run in c["run"]] for k in tables.csv_extras(None)},
        "accept_hist": [json.dumps(run.summary.get("accept_hist")) if run.summary.get("accept_hist") else ""
                        for run in c["run"]],
    })
    order = {col: i for i, col in enumerate(table.cols)}
    out = out.assign(_o=[order[(t, v)] for t, v in zip(c["task"], c["value"])])
    return out.sort_values(["model", "method", "_o"]).drop(columns="_o")[LONG_COLUMNS]


def write_outputs(table: GenericTable, out_dir: str | Path) -> dict[str, Path]:
    split = tables.category_frame(category_entries(table), ["model", "method", "column"])
    return tables.write_table(out_dir, table.name, long_frame(table), to_markdown(table), to_latex(table), split)
