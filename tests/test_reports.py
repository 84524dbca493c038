"""Tables and plots show coverage and uncertainty, compare methods on common samples, break results down per
category, show vanilla as the A/A noise floor in the main job, and still read run directories written before the
forward ledger (docs/metrics.md, "Metric definitions")."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import generic_table  # noqa: E402
import make_tables as mt  # noqa: E402
import plot as plot_script  # noqa: E402
import report_runs  # noqa: E402
from report_runs import write_run  # noqa: E402

from fafo.bench.tools import compare_table, report, tables  # noqa: E402
from fafo.bench.metrics import summarize  # noqa: E402
from fafo.bench.tools.report import read_rows  # noqa: E402
from fafo.bench.tools.report_format import fmt_interval  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}


def md_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def speed_text(s: dict) -> str:
    """A speedup cell: the 95 % interval from 10 samples, the per-sample range {lo–hi} below, none for one."""
    interval = fmt_interval(s, "speedup")
    return f"{s['speedup']:.2f}×" + (f" {interval}" if interval else "")


def common_summary(rows, keys) -> dict:
    return summarize([r for r in rows if (r["sample_id"], int(r["turn"])) in keys], n_boot=200)


def test_generic_table_shows_coverage_interval_memory_verify_time_and_definitions(tmp_path):
    d, _ = write_run(tmp_path, "m/builtin/lookahead/default", "m", "lookahead", seed=1)
    write_run(tmp_path, "m/builtin/vanilla/default", "m", "vanilla", seed=2)
    s = json.loads((d / "summary.json").read_text())
    table = generic_table.build(mt.collect([tmp_path]))
    head, *lines = md_rows(generic_table.to_markdown(table).split("per category")[0])
    row = dict(zip(head, next(line for line in lines if line[1] == "lookahead")))
    assert row["builtin"] == f"{speed_text(s)} ({s['tau']:.2f}/{s['tau_all']:.2f})"
    assert row["n (failed)"] == f"{s['n_samples']} (0)" and s["n_samples"] == 4
    assert row["Vanilla MB"] == f"{s['ref_peak_mem_mb']:.1f}" and row["Overhead MB"] == f"{s['mem_overhead_mb']:.1f}"
    assert row["verify ms"] == f"{s['verify_ms']:.2f}" and row["Exact"] == "1.000"
    hist = {int(k): v for k, v in s["accept_hist"].items()}
    assert row["Accept hist"] == " ".join(f"{k}:{v}" for k, v in sorted(hist.items()) if k <= 8) + \
        (f" 9+:{sum(v for k, v in hist.items() if k > 8)}" if max(hist) > 8 else "")
    md = generic_table.to_markdown(table)
    assert "speedup_e2e = (method new tokens / method total time)" in md  # the headline, named and defined
    assert "tau = tokens committed per verification step, prefill excluded" in md and "tau_all = " in md
    above = generic_table.to_latex(table).split(r"\begin{tabular}")[0]  # the .tex carries the same definitions
    unwrapped = " ".join(line[4:] for line in above.splitlines()[1:])
    assert "speedup_e2e = (method new tokens / method total time)" in unwrapped
    assert all(len(line) <= 120 for line in above.splitlines())
    long = generic_table.long_frame(table).set_index("method")
    assert long.loc["lookahead", "n_failed"] == 0 and long.loc["lookahead", "speedup_kind"] == "e2e"
    assert long.loc["lookahead", "speedup_range_lo"] == round(s["speedup_range"][0], 4)  # 4 samples: a range
    assert long.loc["lookahead", "speedup_ci95_lo"] == "" and "speedup_ci95" not in s


def test_a_latex_note_stays_a_comment_whatever_it_holds():
    text = tables.comment("first line 50 % off\nsecond " + "word " * 40 + "x" * 130)
    lines = text.splitlines()
    assert lines[0] == "% - first line 50 % off" and all(line.startswith("%   ") for line in lines[1:])
    assert len(lines) == 4 and lines[-1] == "%   " + "x" * 130  # a word longer than a line is kept whole


def test_a_method_that_failed_a_sample_is_compared_on_the_common_samples(tmp_path):
    _, full = write_run(tmp_path, "m/builtin/fafo/default", "m", "fafo", seed=3)
    write_run(tmp_path, "m/builtin/lookahead/default", "m", "lookahead", seed=4, fail={"s2"})
    common = {("s0", 0), ("s1", 0), ("s3", 0)}
    expected = common_summary(full, common)
    assert expected["speedup"] != summarize(full, n_boot=200)["speedup"]  # the failed sample changes the number
    table = generic_table.build(mt.collect([tmp_path]))
    md = generic_table.to_markdown(table)
    head, *lines = md_rows(md.split("per category")[0])
    rows = {line[1]: dict(zip(head, line)) for line in lines}
    assert rows["fafo"]["builtin"].startswith(speed_text(expected)) and rows["fafo"]["builtin"].endswith("†")
    assert rows["fafo"]["n (failed)"] == "3 (0)" and rows["lookahead"]["n (failed)"] == "3 (1)"
    assert rows["lookahead"]["builtin"].endswith("†")
    assert "computed on the 3 (sample, turn)s common to its 2 runs (of 4): lookahead lacks 1 (1 failed" in md
    assert "e.g. s2/0" in md
    # the paper tables: same cell mark, note and numbers
    cfg = {"paper": {"table": "table2"}}
    root = tmp_path / "paper"
    _, full = write_run(root, "a", "llama2-7b-chat", "fafo-stream", "mt_bench", seed=3, config=cfg)
    write_run(root, "b", "llama2-7b-chat", "lookahead", "mt_bench", seed=4, fail={"s2"}, config=cfg)
    paper = mt.make_table([root], "table2")
    cells = {r["method"]: r for r in mt.long_rows(paper) if r["task"] == "mt_bench" and r["run_dir"]}
    assert cells["fafo-stream"]["speedup"] == round(common_summary(full, common)["speedup"], 4)
    assert cells["fafo-stream"]["common_samples"] == 3 and cells["lookahead"]["n_failed"] == 1
    text = mt.to_markdown(paper)
    assert "† Llama-2-7b-chat, MT-Bench: computed on the 3 (sample, turn)s" in text
    paths = mt.write_outputs(paper, tmp_path / "tables")
    split = pd.read_csv(paths["by_category"])
    assert split[["model", "method", "column"]].drop_duplicates().values.tolist() == [
        ["Llama-2-7b-chat", "FAFO-Stream", "MT-Bench"], ["Llama-2-7b-chat", "Lookahead", "MT-Bench"]]
    assert split["category"].tolist() == ["chat", "code"] * 2 and split["n_turns"].tolist() == [2, 1, 2, 1]
    assert (tmp_path / "tables" / "table2_by_category.csv").read_text().splitlines()[1].split(",")[4:6] == ["2", "2"]
    assert "(1)" in dict(zip(*[md_rows(text)[0], md_rows(text)[3]]))["MT-Bench n"]  # Lookahead: 3 (1 failed)


def test_per_category_table_recomputed_from_the_samples(tmp_path):
    _, rows = write_run(tmp_path, "m/builtin/fafo/default", "m", "fafo", seed=5)
    md = generic_table.to_markdown(generic_table.build(mt.collect([tmp_path])))
    second = md.split("per category")[1]
    head, line = md_rows(second)
    assert head == ["Model", "Method", "Column", "chat", "code"]
    for cat, text in zip(("chat", "code"), line[3:]):
        s = summarize([r for r in rows if r["category"] == cat], n_boot=200)
        assert text == f"{speed_text(s)} ({s['tau']:.2f}) n=2"


def test_a_table_without_categories_removes_the_per_category_csv_of_an_earlier_one(tmp_path, monkeypatch):
    write_run(tmp_path / "runs", "m/builtin/fafo/default", "m", "fafo", seed=5)
    paths = generic_table.write_outputs(generic_table.build(mt.collect([tmp_path / "runs"])), tmp_path / "tables")
    assert paths["by_category"] == tmp_path / "tables" / "runs_by_category.csv" and paths["by_category"].exists()
    monkeypatch.setattr(report_runs, "SAMPLES", [(sid, "") for sid, _ in report_runs.SAMPLES])  # no categories
    d, _ = write_run(tmp_path / "plain", "m/builtin/fafo/default", "m", "fafo", seed=5)
    assert len(read_rows(d / "samples.csv")) == 4 and "by_category" not in json.loads((d / "summary.json").read_text())
    paths = generic_table.write_outputs(generic_table.build(mt.collect([tmp_path / "plain"])), tmp_path / "tables")
    assert "by_category" not in paths and not (tmp_path / "tables" / "runs_by_category.csv").exists()
    assert "per category" not in paths["md"].read_text()


def test_old_run_directories_still_load_with_dashes(tmp_path):
    cfg = {"paper": {"table": "table2"}}
    write_run(tmp_path / "paper", "a", "llama2-7b-chat", "fafo-stream", "mt_bench", seed=6, old=True, config=cfg)
    write_run(tmp_path / "paper", "b", "llama2-7b-chat", "lookahead", "mt_bench", seed=7, old=True, config=cfg,
              fail={"s1"}, summary=False)  # killed before its summary: summarised from old-format rows
    head, *lines = md_rows(mt.to_markdown(mt.make_table([tmp_path / "paper"], "table2")))
    row = dict(zip(head, next(line for line in lines if line[1] == "FAFO-Stream")))
    assert row["Vanilla MB"] == row["Overhead MB"] == "—" and row["MT-Bench ours"].endswith("†")
    assert row["MT-Bench n"] == "3 (0)" and row["Exact"] == "1.000"
    write_run(tmp_path / "sweep", "x/vanilla", "m", "vanilla", seed=8, old=True)
    table = generic_table.build(mt.collect([tmp_path / "sweep"]))
    row = dict(zip(generic_table.header(table), generic_table.body(table)[0]))
    assert [row[k] for k in ("Vanilla MB", "Overhead MB", "Accept hist")] == ["—"] * 3
    assert float(row["verify ms"]) > 0  # derivable from old rows: decode_s / forwards
    assert float(row["tok/s"]) > 0 and row["n (failed)"] == "4 (0)" and "(" in row["builtin"]
    # recomputed from its rows by today's summarize: the token-normalised e2e speedup, named as such
    assert "speedup_e2e = (method new tokens" in generic_table.to_markdown(table)
    fig, data = plot_script.plot_sweep([tmp_path / "sweep"], "bench.bootstrap")
    assert data[0]["speedup"] and fig.axes[0].get_lines()
    summaries = {"vanilla": json.loads((tmp_path / "sweep/x/vanilla/summary.json").read_text())}
    line = compare_table.markdown(compare_table.comparison_table(summaries)).splitlines()[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    # old rows: no vanilla peak, no overhead, no histogram (verify ms is derivable: decode_s / forwards)
    assert line.startswith("| vanilla (A/A noise floor) | 4 (0) | A/A ") and cells[-4:-2] == ["-", "-"]
    assert cells[-1] == "-" and float(cells[-2]) > 0


def test_main_job_table_shows_vanilla_as_the_a_a_noise_floor(tmp_path):
    names = {"vanilla": 9, "lookahead": 10}
    for name, seed in names.items():
        write_run(tmp_path, name, "m", name, seed=seed, fail={"s3"} if name == "lookahead" else ())
    summaries = {n: json.loads((tmp_path / n / "summary.json").read_text()) for n in names}
    aligned, notes = compare_table.on_common_samples(tmp_path, summaries)
    table = compare_table.comparison_table(aligned)
    assert list(table["method"]) == ["vanilla", "lookahead"] and list(table["role"]) == ["A/A noise floor", "method"]
    md = compare_table.markdown(table)
    aa = md_rows(md)[1]
    assert aa[0] == "vanilla (A/A noise floor)" and aa[2].startswith("A/A ")
    common = {(s, 0) for s in ("s0", "s1", "s2")}
    expected = common_summary(read_rows(tmp_path / "vanilla" / "samples.csv"), common)
    assert aa[2] == f"A/A {expected['speedup']:.2f}x {{{expected['speedup_range'][0]:.2f}–" \
                    f"{expected['speedup_range'][1]:.2f}}}†"  # 3 samples: their range, not a "95 %" interval
    text = compare_table.caption(OmegaConf.create({"bench": {}, "compare": {}}),
                           {n: {"dtype": "float32", **s} for n, s in aligned.items()})
    assert "95 %" not in md and "{lo–hi} = lowest and highest per-sample value" in text
    assert "[lo–hi] = 95 %" not in text  # no cell has a bootstrap interval, so none is defined
    assert notes and "lookahead lacks 1 (1 failed" in notes[0]
    entries = compare_table.category_entries(tmp_path, aligned)
    categories = report.category_markdown(entries, ["method"], dash="-")
    compare_table.write_outputs(table, tmp_path, "caption " + " ".join(notes), categories,
                                tables.category_frame(entries, ["method"]))
    written = (tmp_path / "compare.md").read_text()
    assert "| vanilla (A/A noise floor) |" in written and "| method | chat | code |" in written
    code = [line for line in md_rows(written) if line[0] == "vanilla"][0][2]  # s2 only: s3 is not common
    vanilla = read_rows(tmp_path / "vanilla" / "samples.csv")
    s2 = common_summary(vanilla, {("s2", 0)})
    assert code == f"{speed_text(s2)} (1.00) n=1"
    split = pd.read_csv(tmp_path / "compare_by_category.csv").set_index(["method", "category"])
    assert list(split.index) == [(m, c) for m in names for c in ("chat", "code")]  # the same common samples
    assert split.loc[("vanilla", "code"), "speedup"] == round(s2["speedup"], 4)
    assert split.loc[("vanilla", "code"), "n_turns"] == 1 and split.loc[("lookahead", "chat"), "n_turns"] == 2
    chat = common_summary(vanilla, {("s0", 0), ("s1", 0)})
    assert split.loc[("vanilla", "chat"), "speedup_range_hi"] == round(chat["speedup_range"][1], 4)
    assert (tmp_path / "compare.png").stat().st_size > 1000
    assert pd.read_csv(tmp_path / "compare.csv")["n_failed"].tolist() == [0, 1]


def test_comparison_caption_names_the_sampling_it_ran_with():
    cfg, base = OmegaConf.create({"bench": {}, "compare": {}}), {"model": "m", "dtype": "float32", "task": "t",
                                                                   "n_samples": 3}
    greedy = compare_table.caption(cfg, {"vanilla": base | {"sampling": {"temperature": 0.0, "top_p": 0.9}}})
    assert "new tokens per turn, greedy;" in greedy
    sampled = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.05}
    text = compare_table.caption(cfg, {"vanilla": base | {"sampling": sampled}})
    assert "greedy" not in text
    assert "sampled (T 0.7, top-p 0.8, top-k 20, repetition penalty 1.05; exact match -: lossless in " \
           "distribution, not token by token)" in text


def test_comparison_caption_names_how_the_prompts_were_rendered():
    cfg, base = OmegaConf.create({"bench": {}, "compare": {}}), {"model": "m", "dtype": "float32", "task": "t",
                                                                   "n_samples": 3}
    mixed = compare_table.caption(cfg, {"vanilla": base | {"prompt_formats": {"raw text": 1, "chat template": 2}}})
    assert "task t, 3 samples (prompts: chat template 2, raw text 1), " in mixed
    one = compare_table.caption(cfg, {"vanilla": base | {"prompt_formats": {"### fallback (no chat template)": 3}}})
    assert "3 samples (prompts: ### fallback (no chat template)), " in one
    assert "task t, 3 samples, " in compare_table.caption(cfg, {"vanilla": base})  # a summary from before the field


@pytest.mark.slow
def test_make_tables_cli_on_a_sweep_with_a_failed_sample(tmp_path):
    write_run(tmp_path, "m/builtin/fafo/default", "m", "fafo", seed=11)
    write_run(tmp_path, "m/builtin/lookahead/default", "m", "lookahead", seed=12, fail={"s0"})
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "make_tables.py"), str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, *lines = md_rows(proc.stdout.split("per category")[0])
    assert head[:4] == ["Model", "Method", "builtin", "n (failed)"]
    assert [line[3] for line in lines] == ["3 (0)", "3 (1)"] and all(line[2].endswith("†") for line in lines)
    assert "computed on the 3 (sample, turn)s common" in proc.stdout and "| chat | code |" in proc.stdout
    split = pd.read_csv(tmp_path / "tables" / "runs_by_category.csv").set_index(["method", "category"])
    fafo_rows = read_rows(tmp_path / "m/builtin/fafo/default/samples.csv")
    chat = common_summary(fafo_rows, {("s1", 0)})  # lookahead failed s0: the common chat sample is s1
    assert split.loc[("fafo", "chat"), "speedup"] == round(chat["speedup"], 4)
    assert split.loc[("fafo", "chat"), "tau"] == round(chat["tau"], 4) and split["n_turns"].tolist() == [1, 2, 1, 2]
    assert set(split["run_dir"]) == {"m/builtin/fafo/default", "m/builtin/lookahead/default"}
    assert "runs_by_category.csv" in proc.stderr  # said among the files written
    long = pd.read_csv(tmp_path / "tables" / "runs.csv")
    assert long["common_samples"].tolist() == [3, 3] and long["n_failed"].tolist() == [0, 1]
    assert (tmp_path / "tables" / "runs.tex").read_text().count("$^\\dagger$") == 2


@pytest.mark.slow
def test_make_tables_cli_on_sampled_runs_says_why_exact_is_empty(tmp_path):
    for root, config, model, task in ((tmp_path / "any", None, "m", "builtin"),
                                      (tmp_path / "table4", {"paper": {"table": "table4"}}, "llama2-7b-chat",
                                       "mt_bench")):
        for method, seed in (("fafo-stream", 15), ("lookahead", 16)):
            d, _ = write_run(root, f"{method}/sampled", model, method, task, seed=seed, sampled=True, config=config)
            s = json.loads((d / "summary.json").read_text())
            (d / "summary.json").write_text(json.dumps({**s, "sampling": {"temperature": 0.7, "top_p": 0.8}}))
    script = [sys.executable, str(REPO / "scripts" / "make_tables.py")]
    for root in ("any", "table4"):  # a generic table (every exact-match rate None: was a TypeError) and a paper one
        proc = subprocess.run(script + [str(tmp_path / root)], capture_output=True, text=True, cwd=tmp_path, env=ENV,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        head, *lines = md_rows(proc.stdout.split("per category")[0])
        assert {dict(zip(head, line))["Exact"] for line in lines} == {"—"}
        assert "Exact — for sampled runs (T > 0: fafo-stream, lookahead): lossless in distribution" in proc.stdout
    assert pd.read_csv(tmp_path / "any" / "tables" / "runs.csv")["exact_match_rate"].isna().all()
    proc = subprocess.run(script + [str(tmp_path), "--table", "table2", "--paper", str(tmp_path / "nowhere")],
                          capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(
        f"error: --paper {tmp_path / 'nowhere'} is not a directory")


def test_plot_says_when_no_run_is_a_point_of_the_table_and_refuses_a_missing_paper_dir(tmp_path, capsys):
    write_run(tmp_path, "m/builtin/fafo/default", "m", "fafo", seed=17)
    args = [str(tmp_path), "--table", "table11", "--wandb-mode", "disabled"]
    assert plot_script.main(args) == 0  # the published curve alone, said so
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"note: no run under {tmp_path} is a point of table11 along k; the figure shows the published points only"
    with pytest.raises(SystemExit) as stop:
        plot_script.main(args + ["--paper", str(tmp_path / "nowhere")])
    assert stop.value.code == 2 and f"--paper {tmp_path / 'nowhere'} is not a directory" in capsys.readouterr().err


def test_plots_draw_95_intervals_and_coverage(tmp_path, capsys):
    for local, seed in ((16, 13), (32, 14)):
        d, _ = write_run(tmp_path, f"m/builtin/fafo/l{local}", "m", "fafo", seed=seed,
                         config={"method": {"compress": {"local": local}}})
        s = json.loads((d / "summary.json").read_text())
        (d / "summary.json").write_text(json.dumps({**s, "tokens_per_forward": local}))
    fig, (entry,) = plot_script.plot_sweep([tmp_path], "method.compress.local")
    speed_ax = fig.axes[0]
    bars = [c for c in speed_ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert bars, "no error bars on the speedup panel"
    segments = bars[0].lines[2][0].get_segments()  # one vertical segment per point: (x, lo) -> (x, hi)
    cis = [json.loads((tmp_path / f"m/builtin/fafo/l{k}/summary.json").read_text())["speedup_range"] for k in (16, 32)]
    assert [(seg[0][1], seg[1][1]) for seg in segments] == [tuple(pytest.approx(v) for v in ci) for ci in cis]
    assert [t.get_text() for t in speed_ax.texts] == ["n=4 (0)", "n=4 (0)"]
    assert "speedup_e2e = " in " ".join(t.get_text() for t in fig.texts)
    # the equal-budget sweep: against tokens per forward, its points printed as a table
    assert plot_script.main([str(tmp_path), "--x", "tokens_per_forward", "--logx", "--out", str(tmp_path / "eq"),
                             "--wandb-mode", "disabled"]) == 0
    text = capsys.readouterr().out
    assert "| {" + f"{cis[0][0]:.2f}–{cis[0][1]:.2f}" + "} | e2e |" in text and "| 4 (0) |" in text
    assert (tmp_path / "eq" / "runs_by_tokens_per_forward.png").stat().st_size
    # a third run at local=16 that differs in another key: one point shows one run, the table says which is hidden
    write_run(tmp_path, "m/builtin/fafo/l16_short", "m", "fafo", seed=18, fail={"s0"},
              config={"method": {"compress": {"local": 16}}, "bench": {"bootstrap": 200, "max_new_tokens": 8}})
    _, (entry,) = plot_script.plot_sweep([tmp_path], "method.compress.local")
    assert [value for value, _ in entry["runs"]] == ["16", "32"]
    assert entry["runs"][0][1].rel == "m/builtin/fafo/l16"  # the more complete run
    assert "1 run(s) not shown: each shares its point with a more complete run; they differ in " \
           "bench.max_new_tokens" in plot_script.sweep_table([entry], "method.compress.local")


def test_runs_with_no_common_sample_are_marked_not_comparable(tmp_path):
    from fafo.bench.tools.report import align
    from fafo.bench.tools.tables import collect

    write_run(tmp_path, "a", "m", "fafo", seed=15, fail={"s0", "s1"})
    write_run(tmp_path, "b", "m", "lookahead", seed=16, fail={"s2", "s3"})
    runs = collect([tmp_path]).runs
    aligned, note = align(runs, label=lambda r: r.summary["method"])
    assert note.startswith("NOT comparable: no (sample, turn) is covered by all 2 runs")
    assert [r.summary for r in aligned] == [r.summary for r in runs]  # each keeps its own numbers
    assert all(r.coverage is not None and len(r.coverage.common) == 2 for r in aligned)


def test_per_category_table_from_the_summary_when_the_rows_are_gone(tmp_path):
    d, _ = write_run(tmp_path, "m/mt_bench/fafo/default", "m", "fafo", seed=17)
    by = {"writing": {"n_samples": 2, "n_turns": 4, "tau": 2.5, "tau_all": 2.1, "speedup_e2e": 1.3,
                      "speedup_decode": 1.61, "exact_match_rate": 1.0},
          "coding": {"n_samples": 1, "n_turns": 2, "tau": 3.25, "tau_all": 2.8, "speedup_e2e": 1.5,
                     "speedup_decode": 1.87, "exact_match_rate": 1.0}}
    s = json.loads((d / "summary.json").read_text())
    (d / "summary.json").write_text(json.dumps({**s, "speedup_kind": "decode", "by_category": by}))
    (d / "samples.csv").unlink()
    md = generic_table.to_markdown(generic_table.build(mt.collect([tmp_path])))
    head, line = md_rows(md.split("per category")[1])
    assert head[3:] == ["writing", "coding"]  # the headline kind (decode) per category
    assert line[3:] == ["1.61× (2.50) n=4", "1.87× (3.25) n=2"]
    assert "speedup_decode = (method tokens after the first / method decode time)" in md
