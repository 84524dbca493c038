"""W&B through the real command line, offline, in temporary directories: a comparison is one W&B run (not one per
method) holding its table and plot, with its summary readable offline (``files/wandb-summary.json``); a rerun
continues the same W&B run (same id); ``WANDB_MODE`` is the default mode and a typed ``wandb.mode`` wins."""

import json
import os

import pytest

from tests.helpers import compose_with, run_cli

COMPARE = ["compare.methods=[vanilla,prompt_lookup]", "bench.max_new_tokens=4", "bench.max_samples=1",
           "bench.warmup=0", "bench.progress=false"]


def offline_runs(root):
    return sorted(p for p in root.rglob("offline-run-*") if p.is_dir())


@pytest.mark.slow
def test_a_comparison_is_one_wandb_run_that_a_rerun_continues(tmp_path):
    env = {"WANDB_MODE": "offline"}
    out = tmp_path / "runs"
    proc = run_cli(*COMPARE, f"bench.output_dir={out}", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (first,) = offline_runs(out)  # one run for the comparison, none per method
    compare_dir = first.parents[1]
    assert (compare_dir / "compare.csv").exists() and not list((compare_dir / "vanilla").rglob("offline-run-*"))
    run_id = json.loads((compare_dir / "wandb-run.json").read_text())["id"]
    assert (first / f"run-{run_id}.wandb").exists()
    summary = json.loads((first / "files" / "wandb-summary.json").read_text())
    for method in ("vanilla", "prompt_lookup"):
        assert summary[f"{method}/n_samples"] == 1 and isinstance(summary[f"{method}/speedup"], float), summary
        assert summary[f"{method}/prompt_formats"] == "chat template"  # the summary's counts as one filterable line
    media = first / "files" / "media"
    table = next(media.glob("table/comparison_*.table.json"))  # the comparison table, one row per method
    assert sorted(row[0] for row in json.loads(table.read_text())["data"]) == ["prompt-lookup", "vanilla"]
    assert list(media.glob("images/comparison_plot_*.png")) and list(media.glob("html/comparison_md_*.html"))
    assert {p.parent.name for p in media.glob("table/*/samples_*.table.json")} == {"vanilla", "prompt_lookup"}

    again = run_cli(*COMPARE, f"bench.output_dir={out}", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    runs = offline_runs(out)
    assert len(runs) == 2 and all((r / f"run-{run_id}.wandb").exists() for r in runs)  # the same W&B run
    assert "resuming" in again.stderr and all((r / "files" / "wandb-summary.json").exists() for r in runs)


@pytest.mark.slow
def test_wandb_mode_disabled_in_the_environment_turns_logging_off(tmp_path):
    out = tmp_path / "runs"
    proc = run_cli(*COMPARE, f"bench.output_dir={out}", cwd=tmp_path, env={"WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (next(out.rglob("compare.csv"))).exists()
    assert not offline_runs(out) and not list(out.rglob("wandb-run.json"))


def test_the_mode_is_the_typed_one_else_the_environment_else_offline(monkeypatch):
    from fafo.bench.tools.wandb_log import check_wandb
    from fafo.errors import ConfigError

    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert check_wandb(compose_with()) == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert check_wandb(compose_with()) == "disabled"
    assert check_wandb(compose_with("wandb.mode=offline")) == "offline"
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # wandb's own older name of offline
    assert check_wandb(compose_with()) == "offline"
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ConfigError, match="WANDB_MODE environment variable"):
        check_wandb(compose_with())
    assert os.environ["WANDB_MODE"] == "sometimes"


@pytest.mark.slow
def test_a_sweep_logs_its_table_of_jobs_beside_its_jobs_runs(tmp_path):
    out = tmp_path / "runs"
    proc = run_cli("-m", "bench.max_new_tokens=3,4", "bench.max_samples=1", "bench.warmup=0", "bench.progress=false",
                   f"bench.output_dir={out}", cwd=tmp_path, env={"WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_id = json.loads((out / "wandb-run.json").read_text())["id"]
    (sweep_run,) = [r for r in offline_runs(out) if (r / f"run-{sweep_id}.wandb").exists()]
    table = json.loads(next((sweep_run / "files" / "media").glob("table/jobs_*.table.json")).read_text())
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert sorted(r["bench.max_new_tokens"] for r in rows) == ["3", "4"] and {r["status"] for r in rows} == {"ok"}
    assert len(offline_runs(out)) == 3  # each job's own run, in the sweep's group, and the sweep's
    assert json.loads((sweep_run / "files" / "wandb-summary.json").read_text())["n_jobs"] == 2
