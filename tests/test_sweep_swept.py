"""A 2 x 2 sweep through the real command line: each job's line shows its swept values with a sweep-level counter,
elapsed time and estimate; a rerun says that it resumes and what it skips; ``make_tables`` shows both values of each
swept key (methods as rows, the other swept key as columns); ``plot.py`` without ``--x`` names ``--x``."""

import re
import subprocess
import sys

import pytest

from tests.helpers import ENV, REPO, run_cli

SWEEP = ["-m", "method=vanilla,prompt_lookup", "bench.max_new_tokens=4,6", "bench.max_samples=1", "bench.warmup=0",
         "bench.progress=false"]
JOBS = [("vanilla", "4"), ("vanilla", "6"), ("prompt_lookup", "4"), ("prompt_lookup", "6")]


def script(name, *args, cwd):
    return subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_a_2x2_sweep_shows_what_it_swept(tmp_path):
    out = tmp_path / "runs"
    first = run_cli(*SWEEP, f"bench.output_dir={out}", cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "== fafo-bench sweep: 4 jobs over method, bench.max_new_tokens" in first.stderr
    progress = [line for line in first.stdout.splitlines() if line.startswith("[job ")]
    assert len(progress) == 4, first.stdout[-3000:]
    for i, (line, (method, tokens)) in enumerate(zip(progress, JOBS), 1):
        assert re.match(rf"\[job {i} of 4, \d+:\d\d elapsed, about \d+:\d\d left\] ok +"
                        rf"\[method={method} bench.max_new_tokens={tokens}\] ", line), line
    end = first.stdout[first.stdout.index("== fafo-bench sweep: 4 jobs, 0 failed"):].splitlines()
    assert sorted(line.split("]")[0] for line in end[1:5]) == sorted(
        f"ok      [method={m} bench.max_new_tokens={t}" for m, t in JOBS), end
    assert "resuming" not in first.stderr

    again = run_cli(*SWEEP, f"bench.output_dir={out}", cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = [line for line in again.stderr.splitlines() if line.startswith("resuming ")]
    assert len(resumed) == 4 and all("1 (sample, turn, repeat)s on record (1 ok, 0 failed, not retried) are "
                                     "skipped; nothing left to run" in line for line in resumed), resumed
    assert "== fafo-bench sweep: 4 jobs, 0 failed == (4 resumed from their records, " in again.stdout

    table = script("make_tables.py", str(out), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "differ in bench.max_new_tokens; its values are the columns" in table.stderr
    head = next(line for line in table.stdout.splitlines() if line.startswith("| Model"))
    assert "| bench.max_new_tokens=4 | bench.max_new_tokens=6 |" in head, head
    rows = {line.split("|")[2].strip(): line for line in table.stdout.splitlines() if line.startswith("| ")}
    for method in ("vanilla", "prompt-lookup"):
        cells = [c.strip() for c in rows[method].split("|")[3:5]]
        assert all(c.endswith(")") and "×" in c for c in cells), rows[method]  # a run in each column
    assert "not shown" not in table.stdout

    plot = script("plot.py", str(out), "--wandb-mode", "disabled", cwd=tmp_path)
    assert plot.returncode == 2 and "--x KEY" in plot.stderr and "--x bench.max_new_tokens" in plot.stderr, \
        plot.stderr
    assert "--table" not in plot.stderr
