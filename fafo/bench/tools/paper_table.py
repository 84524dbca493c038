"""The paper table's model, for ``scripts/make_tables.py`` and ``scripts/plot.py``: the published numbers of a
table (``results/paper/<table>.csv``) and our runs placed in (model, method) x column cells.

Columns are tasks or, for ablations, the values of the table's axis (:data:`fafo.bench.tools.paper.AXES`). One run
is shown per published cell, chosen by rule: a preset's ``paper.match`` names what the paper's run had, a run that
differs goes to a row of its own (:func:`fafo.bench.tools.paper.mismatches`), and among the runs that match the most
complete is shown (finished, most (sample, turn)s) with the others counted. The methods of one model in one column
are then compared on the (sample, turn)s all of them cover (:func:`fafo.bench.tools.report.align`)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from fafo.bench.naming import CONF
from fafo.bench.records import turn_key
from fafo.bench.tools import report
from fafo.bench.tools.paper import AXES, TABLE_AXES, mismatches, preset, titles
from fafo.bench.tools.report import Run, dotted
from fafo.bench.tools.report_format import num
from fafo.bench.tools.tables import Collected, collect, norm_value

PAPER_DIR = CONF.parent / "results" / "paper"  # the published numbers, one CSV per table


# ------------------------------------------------------------------ reading
def load_paper(table: str, paper_dir: str | Path = PAPER_DIR) -> list[dict]:
    """The published rows of ``table`` (one per cell), none where ``paper_dir`` has no CSV for it."""
    path = Path(paper_dir) / f"{table}.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def paper_tables(paper_dir: str | Path = PAPER_DIR) -> list[str]:
    """The tables with published numbers."""
    return sorted(p.stem for p in Path(paper_dir).glob("*.csv"))


def paper_runs(runs: list[Run]) -> list[Run]:
    """The runs made from a paper preset (``experiment=tableN`` writes ``paper.table`` into config.yaml)."""
    return [r for r in runs if dotted(r.config, "paper.table")]


def infer_table(runs: list[Run]) -> str:
    """The one paper table the runs were made for; several or none is an error saying to pass ``--table``."""
    found = sorted({str(dotted(r.config, "paper.table")) for r in runs if dotted(r.config, "paper.table")})
    if len(found) == 1:
        return found[0]
    if not found:
        raise SystemExit("error: the runs' config.yaml name no paper table (they were not run from an "
                         "experiment=tableN preset); pass --table, e.g. --table table2")
    raise SystemExit(f"error: these runs come from several tables ({', '.join(found)}); pass --table")


# ------------------------------------------------------------------ the table model
@dataclass
class Cell:
    ours: Run | None = None
    paper: dict | None = None
    duplicates: int = 0
    run_value: str = ""  # the run's own axis value where it is shown under the paper's key (paper.cell)
    runs: list = field(default_factory=list)  # every run that landed in the cell (the shown one among them)


@dataclass
class Table:
    name: str
    title: str
    axes: list[str]
    rows: list[tuple[str, str]]                      # (model, method)
    cols: list[tuple[str, str, str]]                 # (task, axis, value)
    cells: dict[tuple, Cell]
    row_names: dict[tuple, tuple[str, str]]          # (model, method) -> printed names
    col_names: dict[tuple, str]
    failed: list[tuple[str, str]]
    has_paper_peak: bool
    coverage: list[str] = field(default_factory=list)  # footnotes of the columns compared on common samples
    beside: list[str] = field(default_factory=list)    # other summary speedups shown next to each column's own
    rule: dict = field(default_factory=dict)           # paper.match: what the run beside a published cell had

    def cell(self, row, col) -> Cell:
        return self.cells.get((row, col)) or Cell()


def _run_cols(run: Run, axes: list[str]) -> list[tuple[str, str, str, str]]:
    """(task, axis, the paper's key, the run's own value) of each column the run belongs to."""
    task = str(run.summary.get("task", ""))
    if not axes:
        return [(task, "", "", "")]
    cols = []
    for axis in axes:
        own = norm_value(AXES[axis](run.config)) if axis in AXES else ""
        key = norm_value(dotted(run.config, f"paper.cell.{axis}")) or own
        if key:
            cols.append((task, axis, key, own))
    return cols


def _sort_key(col):
    task, axis, value = col
    x = num(value)
    return (task, axis, x if x is not None else math.inf, value)


def build_table(name: str, collected: Collected, paper: list[dict], only_paper_rows: bool = False) -> Table:
    axes = list(dict.fromkeys(p["axis"] for p in paper if p.get("axis"))) or TABLE_AXES.get(name, [])
    spec = dotted(preset(name), "paper") or {}
    rule, beside = spec.get("match") or {}, list(spec.get("beside") or [])
    rows, cols, cells, row_names, col_names = [], [], {}, {}, {}
    for p in paper:
        row = (p["model"], p["method"])
        col = (p["task"], p.get("axis", ""), norm_value(p.get("value")))
        if row not in row_names:
            rows.append(row)
            row_names[row] = (p.get("paper_model") or p["model"], p.get("paper_method") or p["method"])
        if col not in col_names:
            cols.append(col)
            col_names[col] = p.get("paper_task") or p["task"]
        cells.setdefault((row, col), Cell()).paper = p
    extra_rows, extra_cols = [], []
    for run in sorted(collected.runs, key=lambda r: r.order):
        row = (str(run.summary.get("model", "?")), str(run.summary.get("method", "?")))
        if off := mismatches(run, rule):  # not the paper's setting: a row of its own, never beside its number
            row = (row[0], f"{row[1]} [{', '.join(off)}]")
        if only_paper_rows and row not in row_names:
            continue
        if row not in row_names:
            extra_rows.append(row)
            row_names[row] = row
        for *col, own in _run_cols(run, axes):
            col = tuple(col)
            if col not in col_names:
                extra_cols.append(col)
                col_names[col] = col[0]
            cell = cells.setdefault((row, col), Cell())
            cell.runs.append(run)
            if cell.ours is None:
                cell.ours, cell.run_value = run, own if own != col[2] else ""
                continue
            cell.duplicates += 1  # keep the most complete run: finished, most (sample, turn)s, then the path
            if (run.complete, run.weight, run.rel) > (cell.ours.complete, cell.ours.weight, cell.ours.rel):
                cell.ours, cell.run_value = run, own if own != col[2] else ""
    rows += sorted(extra_rows)
    cols += sorted(extra_cols, key=_sort_key)
    tasks = {c[0] for c in cols}
    for col in cols:  # ablation columns are named by their axis value (and task, when several)
        _, axis, value = col
        if axis == "category":  # Spec-Bench subtasks keep the leaderboard's column names (paper_task)
            col_names[col] = col_names[col] if col_names[col] != col[0] else value
        elif axis:
            label = f"{axis}={value}"
            col_names[col] = f"{col_names[col]} {label}" if len(tasks) > 1 else label
    title = titles().get(name, name)
    has_peak = any(num(p.get("peak_mem_mb")) is not None for p in paper)
    table = Table(name, title, axes, rows, cols, cells, row_names, col_names, collected.failed, has_peak,
                  beside=beside, rule=rule)
    return align_columns(table)


def align_columns(table: Table) -> Table:
    """Each model's methods in one column compared on the (sample, turn)s all of them cover
    (fafo.bench.tools.report)."""
    for col in table.cols:
        for model in dict.fromkeys(row[0] for row in table.rows):
            hits = [table.cells[(row, col)] for row in table.rows
                    if row[0] == model and (row, col) in table.cells and table.cells[(row, col)].ours is not None]
            runs, note = report.align([c.ours for c in hits], label=lambda r: str(r.summary.get("method", r.rel)))
            for c, run in zip(hits, runs):
                c.ours = run
            if note:
                name = next(table.row_names[row][0] for row in table.rows if row[0] == model)
                table.coverage.append(f"† {name}, {table.col_names[col]}: {note}")
    return table


def split_by_category(collected: Collected) -> Collected:
    """One run per (run, sample category) plus its ``overall``, for tables whose axis is ``category`` (Spec-Bench:
    one run covers every subtask; its eight MT-Bench categories form the subtask ``mt_bench``); each part is
    summarised from the run's ``samples.csv`` rows."""
    from tasks.spec_bench import subtask

    out = Collected(failed=collected.failed)
    for run in collected.runs:
        out.runs.append(replace(run, config={**run.config, "_category": "overall"}))
        rows = run.sample_rows() or []
        for cat in dict.fromkeys(subtask(r.get("category", "")) for r in rows):
            part = [r for r in rows if subtask(r.get("category", "")) == cat]
            summary = report.resummarize(run, {turn_key(r) for r in part})
            out.runs.append(replace(run, summary=summary, config={**run.config, "_category": cat}, rows=part))
    return out


def make_table(roots, table: str | None = None, paper_dir=PAPER_DIR, only_paper_rows: bool = False) -> Table:
    """The table ``table`` (default: the one the runs' ``config.yaml`` name) of every run under ``roots`` beside its
    published numbers; a table with neither published numbers nor a preset is an error listing those there are."""
    collected = collect(roots)
    table = table or infer_table(collected.runs)
    paper = load_paper(table, paper_dir)
    if any(p.get("axis") == "category" for p in paper):
        collected = split_by_category(collected)
    if not paper and table not in TABLE_AXES and table not in titles():
        known = ", ".join(paper_tables(paper_dir))
        raise SystemExit(f"error: no published numbers for --table {table} in {paper_dir}; one of: {known}")
    return build_table(table, collected, paper, only_paper_rows)
