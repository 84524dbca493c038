"""Any run or sweep makes a table (scripts/make_tables.py DIR [--by KEY]) and a plot (plot.py --x KEY);
paper presets keep their own layout."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import generic_table  # noqa: E402
import make_tables as mt  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
QUICK = ["bench.max_samples=1", "bench.progress=false", "wandb.mode=disabled"]


def run(*args, cwd):
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def md_table(text: str) -> list[list[str]]:
    """The Markdown table's lines as cells (header first, the |---| line dropped)."""
    lines = [line for line in text.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


@pytest.mark.slow
def test_three_method_sweep_gives_a_three_row_table(tmp_path):
    run("-m", "fafo.bench", "-m", "method=vanilla,fafo_stream,lookahead", "bench.max_new_tokens=4",
        f"bench.output_dir={tmp_path}", *QUICK, cwd=tmp_path)
    proc = run(str(REPO / "scripts" / "make_tables.py"), str(tmp_path), cwd=tmp_path)
    head, *rows = md_table(proc.stdout)
    assert head == ["Model", "Method", "builtin", *generic_table.TAIL] and head[4] == "Exact"
    assert [r[1] for r in rows] == ["fafo-stream", "lookahead", "vanilla"] and rows[0][0] == "tiny-llama"
    assert all(r[2].endswith(")") and "×" in r[2] and r[4] == "1.000" for r in rows)
    assert all(r[3].endswith("(0)") for r in rows)  # coverage: samples (failed rows)
    with open(tmp_path / "tables" / "runs.csv", newline="") as f:
        cells = list(csv.DictReader(f))
    assert len(cells) == 3 and {c["checkpoint"] for c in cells} != {""} and all(int(c["n_params"]) for c in cells)
    tex = (tmp_path / "tables" / "runs.tex").read_text()
    assert tex.count(r"\\") == 4  # header + three rows
    above, _ = tex.split(r"\begin{tabular}")  # the notes ride above the tabular as comments, so it \input's anywhere
    assert all(line.startswith("%") for line in above.splitlines()) and "% - cells: speedup over vanilla" in above


@pytest.mark.slow
def test_by_on_a_two_value_sweep_gives_two_columns_and_a_plot(tmp_path):
    run("-m", "fafo.bench", "-m", "bench.max_new_tokens=3,5", f"bench.output_dir={tmp_path}", *QUICK, cwd=tmp_path)
    proc = run(str(REPO / "scripts" / "make_tables.py"), str(tmp_path), "--by", "bench.max_new_tokens",
               cwd=tmp_path)
    head, *rows = md_table(proc.stdout)
    assert head[2:4] == ["bench.max_new_tokens=3", "bench.max_new_tokens=5"]
    assert len(head) == 4 + len(generic_table.TAIL)
    assert len(rows) == 1 and rows[0][:2] == ["tiny-llama", "vanilla"]
    # without --by the two runs never share one cell: the key they differ in is the columns, and stderr says so
    proc = run(str(REPO / "scripts" / "make_tables.py"), str(tmp_path), cwd=tmp_path)
    assert "differ in bench.max_new_tokens; its values are the columns" in proc.stderr
    assert md_table(proc.stdout)[0][2:4] == ["bench.max_new_tokens=3", "bench.max_new_tokens=5"]
    run(str(REPO / "scripts" / "plot.py"), str(tmp_path), "--x", "bench.max_new_tokens", "--wandb-mode", "disabled",
        cwd=tmp_path)
    assert (tmp_path / "plots" / "runs_by_bench.max_new_tokens.png").stat().st_size > 0
    import plot

    (series,) = plot.sweep_series([tmp_path], "bench.max_new_tokens")
    assert series["label"] == "vanilla" and [x for x, _ in series["tau"]] == [3, 5]


# ------------------------------------------------------------------ synthetic trees (fast)
def write_run(root: Path, rel: str, summary: dict, config: dict) -> None:
    d = root / rel
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "config.yaml").write_text(yaml.safe_dump(config))


def summary(model, method, task, speedup, tau, exact=1.0, n_turns=2, peak=10.0, new_tokens=100, total_s=2.0):
    return {"model": model, "method": method, "task": task, "speedup": speedup, "tau": tau,
            "exact_match_rate": exact, "n_turns": n_turns, "n_samples": n_turns, "peak_mem_mb": peak,
            "new_tokens": new_tokens, "total_s": total_s, "tokens_per_s": new_tokens / total_s,
            "checkpoint": f"/ckpt/{model}", "n_params": 1000}


def test_generic_table_rows_columns_and_row_statistics(tmp_path):
    cfg = {"method": {"compress": {"local": 16}}, "bench": {"max_new_tokens": 8}}
    write_run(tmp_path, "m/gsm8k/fafo/a", summary("m", "fafo", "gsm8k", 1.5, 2.0, exact=1.0, n_turns=3, peak=10,
                                                  new_tokens=90, total_s=1.0), cfg)
    write_run(tmp_path, "m/mt_bench/fafo/a", summary("m", "fafo", "mt_bench", 1.2, 1.8, exact=0.0, n_turns=1,
                                                     peak=30, new_tokens=10, total_s=1.0), cfg)
    write_run(tmp_path, "m/gsm8k/vanilla/a", summary("m", "vanilla", "gsm8k", 1.0, 1.0), cfg)
    (tmp_path / "m/x/y/z").mkdir(parents=True)
    (tmp_path / "m/x/y/z/error.txt").write_text("error: bench.dtype='float64' is not supported\n")
    table = generic_table.build(mt.collect([tmp_path]))
    assert generic_table.header(table) == ["Model", "Method", "gsm8k", "mt_bench", "n (failed)", "Exact", "Peak MB",
                                           "Vanilla MB", "Overhead MB", "tok/s", "verify ms", "Accept hist"]
    # summaries without the newer keys (failed rows, vanilla's peak, verify time, histogram) show a dash
    assert generic_table.body(table) == [
        ["m", "fafo", "1.50× (2.00)", "1.20× (1.80)", "4 (—)", "0.750", "30.0", "—", "—", "50.0", "—", "—"],
        ["", "vanilla", "1.00× (1.00)", "—", "2 (—)", "1.000", "10.0", "—", "—", "50.0", "—", "—"]]
    md = generic_table.to_markdown(table)
    assert "failed: m/x/y/z: error: bench.dtype='float64'" in md
    long = generic_table.long_frame(table)
    assert list(long.columns) == generic_table.LONG_COLUMNS and len(long) == 3
    assert set(long["checkpoint"]) == {"/ckpt/m"}


def test_by_key_with_several_tasks_names_task_and_value(tmp_path):
    for task in ("gsm8k", "mt_bench"):
        for local in (16, 32):
            write_run(tmp_path, f"m/{task}/fafo/l{local}", summary("m", "fafo", task, local / 16, 2.0),
                      {"method": {"compress": {"local": local}}})
    table = generic_table.build(mt.collect([tmp_path]), by="method.compress.local")
    assert generic_table.header(table)[2:6] == ["gsm8k method.compress.local=16", "gsm8k method.compress.local=32",
                                                "mt_bench method.compress.local=16",
                                                "mt_bench method.compress.local=32"]
    assert generic_table.body(table)[0][2:6] == ["1.00× (2.00)", "2.00× (2.00)"] * 2
    assert table.name == "runs_by_method.compress.local" and not table.notes


def test_a_boolean_axis_is_spelt_as_typed(tmp_path):
    """bench.compile=true beside auto: the column says true, not float(True)'s 1."""
    for value in (True, False, "auto"):
        write_run(tmp_path, f"m/gsm8k/vanilla/{value}", summary("m", "vanilla", "gsm8k", 1.0, 1.0),
                  {"bench": {"compile": value}})
    table = generic_table.build(mt.collect([tmp_path]), by="bench.compile")
    assert generic_table.header(table)[2:5] == ["bench.compile=auto", "bench.compile=false", "bench.compile=true"]


def test_paper_preset_runs_keep_the_paper_layout(tmp_path, capsys):
    write_run(tmp_path, "llama2_7b_chat/mt_bench/fafo_stream/default",
              summary("llama2-7b-chat", "fafo-stream", "mt_bench", 1.8, 2.2), {"paper": {"table": "table2"}})
    assert mt.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### Table 2") and "MT-Bench paper" in out and (tmp_path / "tables" / "table2.md").exists()
    assert mt.main([str(tmp_path), "--by", "paper.table"]) == 0  # --by: the generic table even for preset runs
    assert "| paper.table=table2 |" in capsys.readouterr().out
    assert mt.main([str(tmp_path), "--by", "task"]) == 0  # not a scalar config key: the summary's value
    assert "| task=mt_bench |" in capsys.readouterr().out


def test_by_a_key_no_run_has_is_an_error_naming_the_keys_they_differ_in(tmp_path, capsys):
    """A misspelt ``--by`` would give a one-column table of dashes; it is one error line, and nothing is written."""
    for local in (16, 32):
        write_run(tmp_path, f"m/gsm8k/fafo/l{local}", summary("m", "fafo", "gsm8k", local / 16, 2.0),
                  {"method": {"compress": {"local": local}}})
    for by in ("method.compress.lcoal", "method.compress.local,nope"):
        with pytest.raises(SystemExit, match=r"^error: no run under .* has the config key "
                                             r"(method\.compress\.lcoal|nope); pass --by with a key the runs were "
                                             r"swept over \(they differ in method\.compress\.local\)$"):
            mt.main([str(tmp_path), "--by", by])
    assert not (tmp_path / "tables").exists()
    assert mt.main([str(tmp_path), "--by", "method.compress.local"]) == 0
