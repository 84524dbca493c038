"""Equal-budget presets (experiment=equal_budget): matched tokens per forward, and the cost fields of a run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fafo.bench.spec import build, method_node
from tests.helpers import compose_with, run_cli

REPO = Path(__file__).resolve().parents[1]
ROW_DIR = Path(__file__).resolve().parents[1] / "conf/experiment/rows/equal_budget"
ROWS = sorted(p.stem for p in ROW_DIR.glob("*.yaml"))


@pytest.mark.parametrize("row", ROWS)
def test_each_row_spends_its_budget(row):
    cfg = compose_with("experiment=equal_budget", f"experiment/rows/equal_budget@_global_={row}")
    decoder = build(method_node(cfg.method), "method")
    assert abs(sum(decoder.forward_tokens()) - cfg.budget) <= 2, (row, decoder.forward_tokens())
    assert cfg.method.name.split("-{")[0].replace("-", "_") in row


@pytest.mark.slow
def test_sweep_through_the_cli_reports_tokens_per_forward_and_break_even_tau(tmp_path):
    curve = tmp_path / "curve.csv"  # latency = 10 ms + 0.1 ms per token, at two contexts
    curve.write_text("context,step_tokens,median_ms,device\n" + "".join(
        f"{c},{s},{10 + s / 10},cpu\n" for c in (16, 4096) for s in (1, 2, 64, 512)))  # 2: multi-row steps interpolate
    proc = run_cli("-m", "experiment=equal_budget", "model=tiny_llama", "task=builtin", "bench.max_new_tokens=8",
                   "bench.max_samples=1", "experiment/rows/equal_budget@_global_=fafo_stream-16,lookahead-16",
                   f"bench.cost_curve={curve}", f"bench.output_dir={tmp_path}/runs", "wandb.mode=disabled",
                   "bench.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summaries = {json.loads(p.read_text())["method"]: json.loads(p.read_text())
                 for p in (tmp_path / "runs").glob("**/summary.json")}
    assert summaries["fafo-stream"]["tokens_per_forward"] == 17 and summaries["lookahead"]["tokens_per_forward"] == 16
    assert summaries["fafo-stream"]["break_even_tau"] == pytest.approx((10 + 1.7) / 10.1, rel=1e-6)
    s = summaries["fafo-stream"]  # the curve's device, pricing this run's own forwards (fafo.bench.tools.projection)
    assert s["projected_speedup"] > 0 and s["projection_rows"] == s["n_turns"] and s["projection_measured"] > 0
    assert "break_even_tau" in proc.stdout and "tokens_per_forward" in proc.stdout
    # the equal-budget table and plot read those fields
    plot = subprocess.run([sys.executable, str(REPO / "scripts/plot.py"), str(tmp_path / "runs"), "--x",
                           "tokens_per_forward", "--logx", "--wandb-mode", "disabled"],
                          capture_output=True, text=True, timeout=300)
    assert plot.returncode == 0, plot.stderr[-2000:]
    assert "| lookahead | 16 |" in plot.stdout and "| fafo-stream | 17 |" in plot.stdout
    assert (tmp_path / "runs" / "plots" / "runs_by_tokens_per_forward.png").stat().st_size > 0


@pytest.mark.slow
def test_a_missing_cost_curve_is_one_clear_error(tmp_path):
    proc = run_cli("bench.cost_curve=nowhere.csv", f"bench.output_dir={tmp_path}", "wandb.mode=disabled", cwd=tmp_path)
    assert proc.returncode == 2 and "bench.cost_curve='nowhere.csv' does not exist" in proc.stderr


def test_paper_tables_get_a_tokens_per_forward_column_when_runs_record_it(tmp_path):
    from tests.helpers import import_script
    from tests.report_runs import synthetic_table2

    mt = import_script("make_tables")
    root = synthetic_table2(tmp_path / "runs")
    assert "Tokens/fwd" not in mt.header(mt.make_table([root], "table2"))  # older runs: the layout is unchanged
    summary = root / "llama2_7b_chat/mt_bench/fafo_stream/default/summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "tokens_per_forward": 481}))
    table = mt.make_table([root], "table2")
    head = mt.header(table)
    assert head[:3] == ["Model", "Method", "Tokens/fwd"]
    tokens = [line[2] for line in mt.body(table)]
    assert tokens.count("481") == 1 and mt.DASH in tokens, tokens  # the runs without it print a dash
    assert "Tokens/fwd" in mt.to_latex(table) and mt.to_latex(table).count("&") > 0
