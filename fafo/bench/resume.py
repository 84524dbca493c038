"""What a rerun resumes: a run directory's rows on record, said before the run so a resumed job is never mistaken
for a fresh one (records.RecordWriter keeps them; the runner fills only the (sample, turn, repeat)s missing)."""

from __future__ import annotations

from pathlib import Path

from fafo.bench.records import read_rows


def recorded(run_dir: str | Path) -> dict[str, list[dict]]:
    """{run: its rows on record} of a run directory and of the runs below it (a comparison's methods)."""
    root = Path(run_dir)
    out = {}
    for path in sorted(root.rglob("samples.csv")) if root.is_dir() else []:
        if "_reference" not in path.relative_to(root).parts and (rows := read_rows(path)):
            out[path.parent.relative_to(root).as_posix()] = rows
    return out


def resume_note(run_dir: str | Path, expected: int | None = None) -> str | None:
    """``resuming DIR: ...``: how many rows are on record (ok, failed), skipped, and what is left to run; None for
    a fresh run. ``expected``: the (sample, turn, repeat)s the run has in all (one run, not a comparison)."""
    runs = recorded(run_dir)
    if not runs:
        return None
    rows = [r for rs in runs.values() for r in rs]
    failed = sum(r.get("status") != "ok" for r in rows)
    kept = f"{len(rows)} (sample, turn, repeat)s on record ({len(rows) - failed} ok, {failed} failed, not retried)"
    if len(runs) > 1 or "." not in runs:
        kept += " in " + ", ".join(f"{name} {len(rs)}" for name, rs in runs.items())
    left = ""
    if expected is not None:
        left = "; nothing left to run, the summary is recomputed" if len(rows) >= expected else \
            f"; {expected - len(rows)} of {expected} left to run"
    return f"resuming {run_dir}: {kept} are skipped{left}"
