"""python -m fafo.bench.tools.diff RUN_A RUN_B: config differences, where two runs' tokens part (both texts), per-metric
differences with a paired interval; a directory that is not a run is one error line."""

import csv
import subprocess
import sys

import numpy as np
import pytest

from fafo.bench.tools import diff
from fafo.bench.metrics import summarize
from fafo.bench.records import SAMPLE_COLUMNS
from tests.helpers import ENV, REPO, run_cli
from tests.report_runs import with_crc


def write_rows(run_dir, rows):
    run_dir.mkdir(parents=True)
    with open(run_dir / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SAMPLE_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(with_crc(rows, SAMPLE_COLUMNS))  # as the runner writes them
    (run_dir / "config.yaml").write_text("bench:\n  repeats: 1\n")


def rows_of(n_samples, seed, time_scale=1.0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_samples):
        n, verify = int(rng.integers(20, 60)), int(rng.integers(5, 19))
        total, ref_total = float(rng.uniform(0.5, 1.5)), float(rng.uniform(1.0, 2.0))
        rows.append({"sample_id": f"q{i}", "turn": 0, "repeat": 0, "status": "ok", "new_tokens": n,
                     "forwards": verify, "target_forwards": verify + 1, "prefill_s": 0.1 * time_scale,
                     "decode_s": (total - 0.1) * time_scale, "total_s": total * time_scale, "ref_new_tokens": n,
                     "ref_total_s": ref_total, "ref_decode_s": ref_total - 0.1, "exact_match": "True",
                     "ref_source": "interleaved", "peak_mem_mb": 1.0})
    return rows


def test_the_difference_is_paired_by_sample(tmp_path):
    """B is A with every method time halved: B's speedup is twice A's on every resample, so B - A is A's own
    speedup, and the interval of the difference is exactly A's own bootstrap interval (the same seeded indices);
    tau did not change: a difference of 0 with the interval [0, 0]."""
    write_rows(tmp_path / "a", rows_of(12, 0))
    write_rows(tmp_path / "b", rows_of(12, 0, time_scale=0.5))
    a, b = diff.load(tmp_path / "a"), diff.load(tmp_path / "b")
    own = summarize(a.rows)
    text = diff.diff(a, b)
    line = next(x for x in text.splitlines() if x.strip().startswith("speedup_e2e"))
    lo, hi = own["speedup_e2e_ci95"]
    assert f"[{lo:+.3f}, {hi:+.3f}] 95 %  (excludes 0)" in line and f"{own['speedup_e2e']:+.3f}" in line
    tau = next(x for x in text.splitlines() if x.strip().startswith("tau "))
    assert "+0.000  [+0.000, +0.000] 95 %" in tau
    assert "on the 12 (sample, turn)s of 12 samples both completed" in text
    assert "config (A -> B):\n  (identical)" in text
    write_rows(tmp_path / "c", rows_of(4, 0)[:3])  # 3 samples: the per-sample range of the difference
    assert "per-sample range" in diff.diff(a, diff.load(tmp_path / "c"))


@pytest.mark.slow
def test_cli_shows_where_two_runs_part_and_refuses_a_directory_that_is_not_a_run(tmp_path):
    out = tmp_path / "runs"
    common = ["method=prompt_lookup", "bench.max_samples=3", "bench.max_new_tokens=24", f"bench.output_dir={out}",
              "wandb.mode=disabled", "bench.progress=false"]
    for seed in (0, 1):  # two random models: their tokens part at once
        proc = run_cli(*common, f"model.tiny.seed={seed}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = sorted(p.parent for p in out.rglob("summary.json"))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "fafo.bench.tools.diff", *map(str, args)], capture_output=True,
                              text=True, env=ENV, cwd=REPO, timeout=300)

    proc = cli(a, b, "--show", 2)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "model.tiny.seed: 0 -> 1" in text
    assert "  method: 0 of 3 (sample, turn)s identical" in text
    assert "  vanilla: 0 of 3 (sample, turn)s identical" in text
    assert text.count("      A: ") == 4 and text.count("      B: ") == 4 and "⟦" in text and "... 1 more" in text
    assert "on the 3 (sample, turn)s of 3 samples both completed" in text and "per-sample range" in text
    proc = cli(out, b)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith(f"error: {out} is not a run directory (no samples.csv); it holds 2 runs: pass one")
    proc = cli(tmp_path / "nowhere", b)
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and "not a directory" in proc.stderr
