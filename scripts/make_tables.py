"""Paper tables from a results tree: our numbers beside the published ones, in the paper's layout.

    python scripts/make_tables.py results/runs/table2 --table table2
    python scripts/make_tables.py results/runs/table11                # --table read from the runs' config.yaml
    python scripts/make_tables.py results/runs/table1 results/runs/table2 --table table1 --out tables/
    python scripts/make_tables.py results/runs/my_sweep                    # any runs: rows (model, method) x tasks
    python scripts/make_tables.py results/runs/my_sweep --by method.compress.local   # columns: that key's values
    python scripts/make_tables.py results/runs/my_sweep --by method.k,method.n       # columns: pairs of values

Reads every run under the given roots (:func:`fafo.bench.tools.tables.collect`: a run killed or still running is
summarised from its ``samples.csv`` rows and marked partial ``*``) and the published numbers in
``results/paper/<table>.csv``. Rows are (model, method); columns are tasks or, for ablations, the values of the
table's axis (``k``, ``n``, ``budget``, ``guesses``...). Each column shows ours as ``speedup× interval (tau)`` (a
95 % bootstrap interval ``[lo–hi]`` from 10 samples, else the per-sample range ``{lo–hi}``, none for one sample),
our coverage ``n`` (samples[/turns], failed rows, ``‡`` flagged, ``∅`` no decode step), the paper's and ours minus
the paper's (``n/c`` where ours does not measure what the paper's does); a preset's ``paper.beside`` adds columns
of other speedups next to the headline (Table 3: decode-only beside end-to-end); each row ends with our
peak memory (the paper's where it has one), vanilla's own peak, the overhead and our exact-match rate (mismatches
classified in fp32 as tie / divergence); the footnotes define the speedup and tau shown. The methods of one model
in one column are compared on the (sample, turn)s all of them cover (recomputed, marked †, counted in a footnote);
runs whose samples carry categories get a per-category table; a cell without a run prints "—".

One run per published cell, chosen by rule: a preset's ``paper.match`` ({config key: value}) names what the
paper's run had (QuantSpec: ``bench.reference.kv: fp``, the full-precision vanilla its speedups are over); a run
that differs goes to its own row (``quantspec [bench.reference.kv=int8]``), never beside the paper's number. Among
runs that match, the most complete is shown (finished, most (sample, turn)s), and the footnote counts the others.
A run whose own axis value is not the paper's key (QuantSpec's 32k cell runs 32000 prompt tokens) records the
paper's key as ``paper.cell`` ({axis: value}) and is shown there, its own value in the CSV's ``run_value``.

Runs from no paper preset (or ``--by KEY``) get the generic table of ``scripts/generic_table.py``; when runs of one
(model, method, task) differ in config keys (a sweep over them) and no ``--by`` is given, those keys are the
columns (a note on stderr says which), so no cell silently shows one of several settings. Writes
``<table>.csv`` (one line per cell, every number), ``<table>.md`` and ``<table>.tex`` (its notes as ``%`` comments)
to ``--out`` (default ``<first root>/tables``), and ``<table>_by_category.csv`` (one line per cell and category) when
runs carry categories, and prints the Markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from fafo.bench.tools import report  # noqa: E402
from fafo.bench.tools import report_format as rf  # noqa: E402
from fafo.bench.tools import tables  # noqa: E402
from fafo.bench.tools.paper import not_comparable  # noqa: E402
from fafo.bench.tools.paper_table import PAPER_DIR, Cell, Table, make_table, paper_runs  # noqa: E402
from fafo.bench.tools.report import Run  # noqa: E402
from fafo.bench.tools.report_format import DASH, num  # noqa: E402
from fafo.bench.tools.tables import Collected, collect  # noqa: E402


# ------------------------------------------------------------------ formatting
def _pair(p: dict | None) -> tuple:  # (speedup, tau) of a summary or a published row
    return (None, None) if p is None else (p.get("speedup"), p.get("tau"))


def _diff(cell: Cell) -> list:
    """Ours minus the paper's (speedup, tau); None where either is missing or ours is not comparable."""
    ours = _pair(cell.ours.summary if cell.ours is not None else None)
    diff = [None if num(a) is None or num(b) is None else num(a) - num(b) for a, b in zip(ours, _pair(cell.paper))]
    if cell.ours is not None and not_comparable(cell.ours.summary):
        diff[1] = None
    return diff


def fmt_diff(cell: Cell) -> str:
    ds = _diff(cell)
    nc = cell.ours is not None and cell.paper is not None and not_comparable(cell.ours.summary)
    tau = "n/c" if nc else DASH if ds[1] is None else f"{ds[1]:+.2f}"
    if ds[0] is None and tau == DASH:
        return DASH
    return f"{DASH if ds[0] is None else f'{ds[0]:+.2f}'} ({tau})"


def fmt_beside(cell: Cell, key: str) -> str:
    """Another speedup of the cell's run (``paper.beside``) with its interval."""
    return DASH if cell.ours is None else rf.fmt_speedup(cell.ours.summary, key)


def row_runs(table: Table, row) -> list[Run]:
    return [table.cell(row, c).ours for c in table.cols if table.cell(row, c).ours is not None]


def row_stats(table: Table, row) -> dict:
    """A row's numbers over its runs (:func:`fafo.bench.tables.aggregate`) and the paper's peak MB."""
    papers = [num((table.cell(row, c).paper or {}).get("peak_mem_mb")) for c in table.cols]
    return {**tables.aggregate(row_runs(table, row)),
            "paper_peak_mem_mb": max((p for p in papers if p is not None), default=None)}


def row_tokens(table: Table, row) -> str | None:
    """Tokens per forward of a row's runs (the summary's ``tokens_per_forward``), or None if unknown."""
    values = sorted({int(v) for r in row_runs(table, row)
                     if (v := num(r.summary.get("tokens_per_forward"))) is not None})
    return "/".join(map(str, values)) if values else None


def has_tokens(table: Table) -> bool:
    return any(row_tokens(table, row) is not None for row in table.rows)


def header(table: Table) -> list[str]:
    head = ["Model", "Method"] + (["Tokens/fwd"] if has_tokens(table) else [])
    for col in table.cols:
        name = table.col_names[col]
        head += [f"{name} ours", f"{name} n", f"{name} paper", f"{name} Δ"]
        head += [f"{name} {key}" for key in table.beside]
    head += ["Peak MB"] + (["Peak MB paper"] if table.has_paper_peak else []) + ["Vanilla MB", "Overhead MB", "Exact"]
    return head


def body(table: Table) -> list[list[str]]:
    lines, last_model = [], None
    for row in table.rows:
        model, method = table.row_names[row]
        line = [model if model != last_model else "", method]
        if has_tokens(table):
            line.append(row_tokens(table, row) or DASH)
        last_model = model
        for col in table.cols:
            cell = table.cell(row, col)
            n = rf.fmt_n(cell.ours.summary) if cell.ours is not None else DASH
            line += [tables.fmt_run(cell.ours), n, tables.fmt_pair(*_pair(cell.paper)), fmt_diff(cell)]
            line += [fmt_beside(cell, key) for key in table.beside]
        stats = row_stats(table, row)
        line += [rf.fmt(stats["peak_mem_mb"], ".0f")]
        line += [rf.fmt(stats["paper_peak_mem_mb"], ".0f")] if table.has_paper_peak else []
        line += [rf.fmt(stats["ref_peak_mem_mb"], ".0f"), rf.fmt(stats["mem_overhead_mb"], ".0f"), rf.fmt_exact(stats)]
        lines.append(line)
    return lines


def footnotes(table: Table) -> list[str]:
    notes = []
    published = [c for c in table.cells.values() if c.paper is not None]
    n_numbers = sum(1 for c in published if any(num(x) is not None for x in _pair(c.paper)))
    n_both = sum(1 for c in published if c.ours is not None)
    notes.append(f"{n_both} of {len(published)} published cells have a run ({n_numbers} of them have published "
                 "numbers); ours = this harness as speedup× interval (tau), paper = results/paper, Δ = ours - paper "
                 "(speedup, tau); n = samples[/turns] covered (failed rows); Vanilla MB = vanilla's own peak, "
                 "Overhead MB = method peak - vanilla peak; Exact: mismatches classified in fp32 as tie / div.")
    runs = [c.ours.summary for c in table.cells.values() if c.ours is not None]
    notes += report.definitions(runs)
    if table.beside:
        notes.append("beside each column: " + ", ".join(f"{key} ({report.SPEEDUP_DEFS.get(key.split('_', 1)[-1], key)})"
                                                        for key in table.beside))
    if table.rule:
        rule = ", ".join(f"{k}={v}" for k, v in table.rule.items())
        notes.append(f"beside a published cell: the run with {rule} (the paper's setting); runs with another value "
                     "are rows of their own, marked with it")
    moved = sorted({f"{c.ours.rel}: {c.run_value}" for c in table.cells.values() if c.ours is not None and c.run_value})
    if moved:
        notes.append("shown under the paper's key (paper.cell), run at its own value: " + "; ".join(moved))
    nc = sorted({f"{c.ours.summary.get('method')}: {why}" for c in table.cells.values()
                 if c.ours is not None and c.paper is not None and (why := not_comparable(c.ours.summary))})
    notes += [f"n/c = not comparable: {why}" for why in nc]
    ours = [c.ours for c in table.cells.values() if c.ours is not None]
    notes += tables.sampled_note(ours) + tables.prompts_note(ours)
    notes += table.coverage
    partial = sorted(c.ours.rel for c in table.cells.values() if c.ours is not None and not c.ours.complete)
    if partial:
        notes.append("* partial run (no summary.json yet; summarised from samples.csv): " + ", ".join(partial))
    dup = sum(c.duplicates for c in table.cells.values())
    if dup:
        keys = sorted({k for c in table.cells.values() if c.duplicates for k in tables.swept_keys(c.runs)})
        why = (f"; they differ in {', '.join(keys)} (--by {keys[0]} makes its values columns)" if keys else
               ", which no config key tells apart (see the CSV run_dir)")
        notes.append(f"{dup} run(s) not shown: each shares its cell with a more complete run{why}.")
    for rel, msg in table.failed:
        notes.append(f"failed: {rel}: {msg}")
    return notes


def category_entries(table: Table) -> list:
    """[(model, method, column), run] of every cell with a run, for the per-category table (none when the table's
    columns are categories already: Spec-Bench's subtasks)."""
    if "category" in table.axes:
        return []
    return [([*table.row_names[row], table.col_names[col]], table.cell(row, col).ours)
            for row in table.rows for col in table.cols if table.cell(row, col).ours is not None]


def to_markdown(table: Table) -> str:
    md = rf.markdown(header(table), body(table), footnotes(table), table.title)
    split = report.category_markdown(category_entries(table), ["Model", "Method", "Column"],
                                     f"{table.title}: per category", DASH)
    return md + ("\n" + split if split else "")


def to_latex(table: Table) -> str:
    n_tail = 4 + table.has_paper_peak
    lead = ["Model", "Method"] + (["Tokens/fwd"] if has_tokens(table) else [])
    w = 4 + len(table.beside)  # columns per column group
    spec = "l" * len(lead) + "r" * w * len(table.cols) + "r" * n_tail
    top = [""] * len(lead) + [rf"\multicolumn{{{w}}}{{c}}{{{tables.tex(table.col_names[c])}}}" for c in table.cols]
    top += [""] * n_tail
    first = len(lead) + 1
    rules = " ".join(rf"\cmidrule(lr){{{first + w * i}-{first + w - 1 + w * i}}}" for i in range(len(table.cols)))
    sub = lead + (["ours", "n", "paper", r"$\Delta$"] + [tables.tex(k) for k in table.beside]) * len(table.cols)
    sub += ["Peak MB"] + (["Peak MB (paper)"] if table.has_paper_peak else []) + ["Vanilla MB", "Overhead MB", "Exact"]
    return tables.latex(table.title, spec, [" & ".join(top) + r" \\", rules, " & ".join(sub) + r" \\"], body(table),
                        footnotes(table))


LONG_COLUMNS = ["table", "model", "method", "paper_model", "paper_method", "column", "task", "axis", "value",
                "speedup", "tau", "paper_speedup", "paper_tau", "d_speedup", "d_tau", "peak_mem_mb",
                "paper_peak_mem_mb", "exact_match_rate", "n_samples", "n_turns", "status", "run_dir", "paper_note",
                "speedup_kind", "speedup_ci95_lo", "speedup_ci95_hi", "speedup_range_lo", "speedup_range_hi", "tau_all",
                "n_failed", "n_flagged", "n_no_decode", "ref_peak_mem_mb", "mem_overhead_mb", "verify_ms",
                "n_mismatch_tie", "n_mismatch_divergence", "speedup_decode", "speedup_vs_eager", "aa_speedup",
                "projected_speedup", "projection_error", "common_samples", "run_value", "tau_comparable"]


def long_rows(table: Table) -> list[dict]:
    out = []
    for row in table.rows:
        for col in table.cols:
            cell = table.cell(row, col)
            if cell.ours is None and cell.paper is None:
                continue
            s = cell.ours.summary if cell.ours is not None else {}
            p = cell.paper or {}
            diff = _diff(cell)
            status = "missing" if cell.ours is None else "ok" if cell.ours.complete else "partial"
            out.append({
                "table": table.name, "model": row[0], "method": row[1], "paper_model": table.row_names[row][0],
                "paper_method": table.row_names[row][1], "column": table.col_names[col], "task": col[0],
                "axis": col[1], "value": col[2], "speedup": tables.rounded(s.get("speedup")),
                "tau": tables.rounded(s.get("tau")), "paper_speedup": p.get("speedup", ""),
                "paper_tau": p.get("tau", ""),
                "d_speedup": tables.rounded(diff[0]), "d_tau": tables.rounded(diff[1]),
                "peak_mem_mb": tables.rounded(s.get("peak_mem_mb"), 1), "paper_peak_mem_mb": p.get("peak_mem_mb", ""),
                "exact_match_rate": tables.rounded(s.get("exact_match_rate")),
                "n_samples": s.get("n_samples", ""), "n_turns": s.get("n_turns", ""), "status": status,
                "run_dir": cell.ours.rel if cell.ours is not None else "", "paper_note": p.get("note", ""),
                **tables.csv_extras(cell.ours), "run_value": cell.run_value,
                "tau_comparable": "" if cell.ours is None else not not_comparable(s),
            })
    return out


def write_outputs(table: Table, out_dir: str | Path) -> dict[str, Path]:
    frame = pd.DataFrame(long_rows(table), columns=LONG_COLUMNS)
    split = tables.category_frame(category_entries(table), ["model", "method", "column"])
    return tables.write_table(out_dir, table.name, frame, to_markdown(table), to_latex(table), split)


def swept_by(collected: Collected) -> str | None:
    """The columns of a generic table whose runs of one (model, method, task) differ in some config keys (a sweep
    over them): those keys (several joined by commas), said on stderr, so that no cell silently keeps one of them."""
    keys = tables.swept_keys(collected.runs)
    if keys:
        by = ",".join(keys)
        print(f"note: runs of one (model, method, task) differ in {', '.join(keys)}; its values are the columns "
              f"(as --by {by})", file=sys.stderr)
        return by
    return None


def check_by(collected: Collected, by: str, roots) -> None:
    """``--by K1[,K2]``: each key is one some run has (a misspelt key would make a one-column table of dashes)."""
    import generic_table

    for key in by.split(","):
        if all(generic_table.run_value(run, key) is None for run in collected.runs):
            keys = tables.swept_keys(collected.runs) or [k for k in generic_table.differing_keys(
                [r.config for r in collected.runs]) if not k.endswith("_target_")]
            hint = f"they differ in {', '.join(keys[:6])}" if keys else "e.g. --by method.compress.local"
            raise SystemExit(f"error: no run under {', '.join(map(str, roots))} has the config key {key}; pass --by "
                             f"with a key the runs were swept over ({hint})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+", help="results directories (e.g. results/runs/table2)")
    ap.add_argument("--table", help="paper table: table1..table13, figure1, triforce_table2, ... "
                                    "(default: from the runs' config.yaml)")
    ap.add_argument("--paper", default=str(PAPER_DIR), help="directory of published numbers (results/paper)")
    ap.add_argument("--out", help="output directory (default: <first root>/tables)")
    ap.add_argument("--only-paper-rows", action="store_true", help="drop (model, method) rows the paper lacks")
    ap.add_argument("--by", metavar="KEY", help="any runs: columns are this config key's values instead of tasks "
                                                "(e.g. method.compress.local); see scripts/generic_table.py")
    ap.add_argument("--name", help="file name of a --by / non-paper table (default runs, runs_by_<KEY>)")
    args = ap.parse_args(argv)
    if not Path(args.paper).is_dir():  # else every published column would be silently empty
        raise SystemExit(f"error: --paper {args.paper} is not a directory; give the folder of published numbers "
                         f"(default {PAPER_DIR})")
    if args.by or (not args.table and not paper_runs(collect(args.roots).runs)):
        import generic_table as writer  # runs from no paper preset (or --by): one row per (model, method)

        collected = collect(args.roots)
        if args.by:
            check_by(collected, args.by, args.roots)
        by = args.by or swept_by(collected)
        table = writer.build(collected, by, args.name)
    else:
        writer, table = sys.modules[__name__], make_table(args.roots, args.table, args.paper, args.only_paper_rows)
    paths = writer.write_outputs(table, args.out or Path(args.roots[0]) / "tables")
    print(writer.to_markdown(table))
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0

if __name__ == "__main__":
    sys.exit(main())
