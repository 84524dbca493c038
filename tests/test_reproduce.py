"""Reproducing the paper: every experiment preset composes and its sweep covers the published table, shrunk presets
run end to end through multirun, make_tables matches its golden output, plot.py draws the data, and two sweeps
writing the same experiment at once leave complete, uncorrupted records."""

import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

import fafo.bench  # noqa: F401  (registers the fafo_run_dir resolver used by hydra.run.dir)
from fafo.bench.records import SAMPLE_COLUMNS
from fafo.bench.spec import build, method_node
from fafo.bench.tools import paper, paper_table
from fafo.bench.tools.tables import norm_value
from fafo.decoding import Decoder

from tests.helpers import CONF, PRESETS, REPO, compose_with, import_script, preset_jobs, run_cli
from tests.report_runs import paper_summary, synthetic_table2, synthetic_table11, write_paper_run

PAPER = REPO / "results" / "paper"
GOLDEN = Path(__file__).resolve().parent / "golden"
mt = import_script("make_tables")
plot_script = import_script("plot")
PAPER_ITEMS = [f"table{i}" for i in range(1, 14)] + ["figure1"]
TINY = ["model=tiny_llama", "task=builtin", "bench.max_samples=2", "bench.max_new_tokens=8", "wandb.mode=disabled",
        "bench.progress=false"]


def run_label(cfg) -> tuple[str, str, str, dict]:
    """(model label, method label, task name, resolved config) as the runner would record them."""
    method = build(method_node(cfg.method), "method")
    assert isinstance(method, Decoder)
    compress = getattr(method, "compress", None)
    label = cfg.method.name.format(compress=compress.label) if compress is not None else cfg.method.name
    build(cfg.sampling, "sampling")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra")
    return cfg.model.name, label, cfg.task.name, resolved


# ------------------------------------------------------------------ presets compose and cover the paper
def test_every_paper_table_and_figure_has_a_preset_and_published_numbers():
    assert set(PAPER_ITEMS) <= set(PRESETS), f"missing presets: {set(PAPER_ITEMS) - set(PRESETS)}"
    titles = paper.titles()  # one source: each preset's paper.title; a table without a preset, paper.TITLES
    for preset in PRESETS:
        assert titles[preset] == OmegaConf.load(CONF / "experiment" / f"{preset}.yaml").paper.title
    assert not set(paper.TITLES) & set(PRESETS) and set(paper_table.paper_tables()) <= set(titles)
    assert "LongBench" in titles["table3"] and "Llama-3.1-8B-Instruct" in titles["table3"]
    for item in PAPER_ITEMS:
        rows = paper_table.load_paper(item)
        assert rows or item == "figure1", f"results/paper/{item}.csv is missing"
        for r in rows:
            assert list(r) == list(paper_table.load_paper("table1")[0]), f"{item}.csv has other columns"
            assert r["table"] == item and r["paper"] == "fafo"
            for key in ("speedup", "tau", "peak_mem_mb"):
                assert r[key] == "" or float(r[key]) > 0, (item, r)
            assert r["speedup"] and r["tau"] or r["note"], f"{item}: an empty cell must say why in `note`: {r}"


def fake_run(root: Path, i: int, model: str, method: str, task: str, resolved: dict) -> None:
    """A finished run as the runner leaves it (config.yaml, summary.json, one row per Spec-Bench subtask)."""
    from fafo.bench.metrics import summarize
    from tasks.spec_bench import SUBTASKS

    base = {"model": model, "method": method, "task": task, "turn": 0, "repeat": 0, "status": "ok",
            "prompt_tokens": 20, "new_tokens": 11, "forwards": 5, "target_forwards": 6, "prefill_s": 0.1,
            "decode_s": 0.4, "total_s": 0.5, "ref_new_tokens": 11, "ref_total_s": 1.0, "ref_decode_s": 0.9,
            "ref_source": "interleaved", "exact_match": "True", "first_mismatch": -1, "peak_mem_mb": 1.0}
    cats = list(SUBTASKS) if task == "spec_bench" else ["chat"]
    samples = [{**base, "sample_id": f"q{j}", "category": c} for j, c in enumerate(cats)]
    summary = {"model": model, "method": method, "task": task, **summarize(samples, n_boot=0)}
    write_paper_run(root, f"job{i}", summary, resolved, samples=samples)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_and_its_sweep_covers_the_published_table(preset, tmp_path):
    """Every job composes, every published cell is produced by the sweep, and make_tables puts exactly that run
    beside it (on a fake results tree of the sweep: one finished run per job): the run chosen by the preset's rule
    (QuantSpec: the full-precision reference), at the paper's own key (QuantSpec's 32k/128k cells)."""
    base = compose_with(f"experiment={preset}")
    assert base.paper.table == preset and base.bench.output_dir == f"results/runs/{preset}"
    assert base.bench.reference_dir == "results/runs/_reference"  # one vanilla reference store for every table
    default_excluded = set(OmegaConf.load(CONF / "config.yaml").hydra.job.config.override_dirname.exclude_keys)
    assert default_excluded == set(base.hydra.job.config.override_dirname.exclude_keys)  # one source: config.yaml
    jobs = list(preset_jobs(preset))
    assert jobs, f"{preset} has no hydra.sweeper.params"
    published = paper_table.load_paper(preset)
    axes = list(dict.fromkeys(r["axis"] for r in published)) if published else paper.TABLE_AXES.get(preset, [""])
    got, dirs = {}, set()
    for i, (job, cfg) in enumerate(jobs):
        HydraConfig().set_config(cfg)
        model, method, task, resolved = run_label(cfg)
        dirs.add(cfg.hydra.sweep.subdir)
        fake_run(tmp_path, i, model, method, task, resolved)
        for axis in axes:
            # Spec-Bench's subtasks (axis category) all come from one run, split by make_tables; a run whose own
            # size is not the paper's key records the paper's (paper.cell)
            value = norm_value((resolved.get("paper", {}).get("cell") or {}).get(axis) or paper.AXES[axis](resolved)) \
                if axis and axis != "category" else ""
            got.setdefault((model, method, task, value), resolved)
    assert len(dirs) == len(jobs), f"{preset}: two jobs of the sweep would write the same run directory"
    for row in published:  # every published cell is produced by exactly the sweep's configs
        if "no fafo-bench method" in row["note"]:  # other papers' baselines, shown for reference
            continue
        value = norm_value(row["value"]) if row["axis"] != "category" else ""
        key = (row["model"], row["method"], row["task"], value)
        assert key in got, f"{preset}: no job of the sweep produces the paper's cell {key}"
        if preset == "table4":  # each model samples with its own generation_config.json, as the paper says
            assert got[key]["sampling"]["from_generation_config"] is True and "sampling T=" in row["setting"]
    table = mt.make_table([tmp_path], preset)  # the fake tree, as make_tables reads a real one
    rule = (OmegaConf.to_container(base.paper).get("match") or {})
    for row in published:
        if "no fafo-bench method" in row["note"]:
            continue
        col = (row["task"], row["axis"], norm_value(row["value"]))
        cell = table.cells.get(((row["model"], row["method"]), col))
        assert cell is not None and cell.ours is not None, f"{preset}: the table has no run beside {row}"
        assert not paper.mismatches(cell.ours, rule), (preset, cell.ours.rel, rule)
    if preset == "quantspec_table3":  # both references run; the paper's (fp) is beside it, int8 in its own row
        assert rule == {"bench.reference.kv": "fp"}
        assert ("llama-2-7b-32k-instruct", "quantspec [bench.reference.kv=int8]") in table.rows
        cell = table.cells[(("llama-2-7b-32k-instruct", "quantspec"), ("multi_lexsum", "context", "32768"))]
        assert cell.run_value == "32000" and cell.paper["speedup"] == "2.08"
    if preset == "figure1":
        assert {(k[1], k[3]) for k in got} == {(m, g) for m in ("fafo-stream", "lookahead")
                                               for g in ("5", "10", "15", "20", "30", "40", "60", "80")}
        assert all(r["method"].get("n", r["method"].get("guess_set")) == r["guesses"] for r in got.values())


@pytest.mark.parametrize("launcher,target", [("local", "BasicLauncher"), ("slurm", "SlurmLauncher")])
def test_launchers_compose_without_the_submitit_plugin(launcher, target):
    cfg = compose_with("experiment=table2", f"hydra/launcher={launcher}")
    assert cfg.hydra.launcher._target_.endswith(target)
    if launcher == "slurm":  # every job of a sweep is one SLURM array task with one GPU, logs beside the runs
        assert cfg.hydra.launcher.gpus_per_node == 1
        assert cfg.hydra.launcher.submitit_folder == "results/runs/table2/.submitit/%j"


def test_reproduce_script_runs_each_preset_then_its_table_and_plot(tmp_path):
    """scripts/reproduce.sh TABLE with a stand-in ``python`` on PATH: the commands it would run, in order."""
    script = REPO / "scripts" / "reproduce.sh"
    assert os.access(script, os.X_OK)
    (tmp_path / "python").write_text('#!/bin/sh\necho "python $*" >> "$LOG"\n')
    (tmp_path / "python").chmod(0o755)
    env = {**os.environ, "PYTHON": str(tmp_path / "python"), "LOG": str(tmp_path / "log")}
    for item in PAPER_ITEMS:
        (tmp_path / "log").write_text("")
        proc = subprocess.run([str(script), item, "hydra/launcher=slurm"], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        lines = (tmp_path / "log").read_text().splitlines()
        assert lines[0] == f"python -m fafo.bench -m experiment={item} hydra/launcher=slurm"
        table = f"python scripts/make_tables.py results/runs/{item} --table {item}"
        plot = f"python scripts/plot.py results/runs/{item} --table {item}"
        ablation = item in {"table9", "table10", "table11", "table12", "table13"}
        expected = [plot] if item == "figure1" else [table, plot] if ablation else [table]
        assert lines[1:] == expected, (item, lines)
    for args in ([], ["table99"]):  # no table, an unknown one: one error line, exit status 2, nothing run
        proc = subprocess.run([str(script), *args], env=env, capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.startswith("error: ") and len(proc.stderr.splitlines()) == 1


def test_a_preset_whose_method_is_missing_fails_with_a_clear_message(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "method" / "swift.yaml").unlink()  # as before SWIFT was added
    compose_with("experiment=table1", conf=conf)  # the preset itself still composes ...
    for job in (["method=swift"], ["experiment/rows/table2@_global_=llama2_7b_chat-swift"]):
        preset = "table1" if job[0].startswith("method") else "table2"
        with pytest.raises(Exception, match=r"Could not find 'method/swift'") as err:
            compose_with(f"experiment={preset}", *job, conf=conf)  # ... the job that needs the method names it
        assert "Available options in 'method'" in str(err.value)


def test_table4_without_the_model_default_sampling_config_stops_with_a_clear_message(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "sampling" / "model_default.yaml").unlink(missing_ok=True)  # as before sampling presets were added
    with pytest.raises(Exception, match=r"Could not find 'sampling/model_default'"):
        compose_with("experiment=table4", conf=conf)


# ------------------------------------------------------------------ shrunk presets end to end
def _summaries(root: Path) -> dict[str, dict]:
    return {p.parent.relative_to(root).as_posix(): json.loads(p.read_text())
            for p in root.rglob("summary.json") if "_reference" not in p.parts}


@pytest.mark.slow
def test_shrunk_table2_runs_through_multirun_and_make_tables_reads_it(tmp_path):
    out = tmp_path / "runs"
    proc = run_cli("-m", "experiment=table2", *TINY, f"bench.output_dir={out}",
                   f"bench.reference_dir={tmp_path}/_reference",
                   "experiment/rows/table2@_global_=llama2_7b_chat-fafo_stream,llama3_8b_instruct-lookahead",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = _summaries(out)
    name = "bench.max_new_tokens=8,bench.max_samples=2"  # the row key is excluded from the run directory name
    assert set(runs) == {f"tiny_llama/builtin/{m}/{name}" for m in ("fafo_stream", "lookahead")}, runs.keys()
    assert all(s["exact_match_rate"] == 1.0 and s["n_samples"] == 2 and s["dtype"] == "float32" for s in runs.values())
    assert all(s["attention"] == "flex" for s in runs.values())  # the preset's backend
    table = mt.make_table([out])  # --table inferred from the runs' config.yaml
    assert table.name == "table2" and ("tiny-llama", "fafo-stream") in table.rows
    cell = table.cell(("tiny-llama", "lookahead"), ("builtin", "", ""))
    assert cell.ours.complete and cell.ours.summary["tau"] == runs[f"tiny_llama/builtin/lookahead/{name}"]["tau"]
    assert cell.paper is None and table.cell(("llama2-7b-chat", "fafo-stream"), ("mt_bench", "", "")).ours is None
    mt.main([str(out), "--out", str(tmp_path / "tables")])
    assert {p.name for p in (tmp_path / "tables").iterdir()} == {"table2.csv", "table2.md", "table2.tex"}


@pytest.mark.slow
def test_shrunk_figure1_and_table11_sweeps_plot_their_axes(tmp_path):
    out = tmp_path / "runs"
    proc = run_cli("-m", "experiment=figure1", *TINY, f"bench.output_dir={out}",
                   f"bench.reference_dir={tmp_path}/_reference", "guesses=2,4", "model.attention=sdpa", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = _summaries(out)
    assert len(runs) == 4 and all(s["exact_match_rate"] == 1.0 for s in runs.values())
    assert {(Path(k).parent.name, re.search(r"guesses=(\d+)", k)[1]) for k in runs} == {
        (m, g) for m in ("fafo_stream", "lookahead") for g in ("2", "4")}
    table = mt.make_table([out])
    assert table.name == "figure1" and table.axes == ["guesses"]
    _, data = plot_script.plot_table(table)
    by_label = {d["label"]: d for d in data}
    assert set(by_label) == {"fafo-stream", "lookahead"}
    for d in by_label.values():
        assert [x for x, _ in d["tau"]] == [2.0, 4.0]
        assert [x for x, _ in d["speedup"]] == [2.0, 4.0]

    proc = run_cli("-m", "experiment=table11", *TINY, f"bench.output_dir={tmp_path}/t11",
                   f"bench.reference_dir={tmp_path}/_reference", "method.k=2,3", "method.n=4",
                   "method.compress.local=16", "model.attention=sdpa", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert plot_script.main([f"{tmp_path}/t11", "--out", str(tmp_path / "plots"), "--wandb-mode", "disabled"]) == 0
    assert (tmp_path / "plots" / "table11.png").stat().st_size > 0 and (tmp_path / "plots" / "table11.pdf").exists()


@pytest.mark.slow
def test_two_sweeps_of_one_experiment_at_once_leave_complete_records(tmp_path):
    out = tmp_path / "runs"
    args = ["-m", "experiment=table1", "model=tiny_llama", "task=builtin", "task.ids=[chat-01,multi-01]",
            "bench.max_new_tokens=8", "wandb.mode=disabled", "bench.progress=false", f"bench.output_dir={out}",
            f"bench.reference_dir={out}/_reference", "model.attention=sdpa",
            "method=fafo_stream,lookahead,fafo_2forward"]
    procs = [run_cli(*args, cwd=tmp_path, wait=False) for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    # a sweep that found a job's directory taken by the other one lists it as failed and exits 1
    assert all(p.returncode == 0 or (p.returncode == 1 and "being written by another job" in r[0] + r[1])
               for p, r in zip(procs, results)), [r[1][-2000:] for r in results]
    runs = sorted(out.glob("tiny_llama/builtin/*/*/samples.csv"))
    assert [p.parent.parent.name for p in runs] == ["fafo_2forward", "fafo_stream", "lookahead"]
    for samples in runs:
        d = samples.parent
        text = samples.read_text()
        assert text.endswith("\n")
        rows = list(csv.DictReader(text.splitlines()))
        assert list(rows[0]) == SAMPLE_COLUMNS
        keys = [(r["sample_id"], r["turn"], r["repeat"]) for r in rows]
        assert sorted(keys) == [("chat-01", "0", "0"), ("multi-01", "0", "0"), ("multi-01", "1", "0")], keys
        assert all(r["status"] == "ok" and r["exact_match"] == "True" for r in rows)
        outputs = [json.loads(line) for line in (d / "outputs.jsonl").read_text().splitlines()]
        expected = [("chat-01", 0), ("multi-01", 0), ("multi-01", 1)]
        assert sorted((o["sample_id"], o["turn"]) for o in outputs) == expected
        summary = json.loads((d / "summary.json").read_text())
        assert summary["n_turns"] == 3 and summary["exact_match_rate"] == 1.0
        OmegaConf.load(d / "config.yaml")
        if (d / "error.txt").exists():  # the sweep that found the directory taken says so and goes on
            assert "being written by another job" in (d / "error.txt").read_text()
    refs = list((out / "_reference").rglob("*.json"))
    assert len(refs) == 3 and all(json.loads(p.read_text())["tokens"] for p in refs)
    assert not [p for p in out.rglob("*.tmp")], "a temporary file was left behind"
    table = mt.make_table([out], "table1")
    assert {r[1] for r in table.rows if r[0] == "tiny-llama"} == {"fafo-stream", "lookahead", "fafo-2forward-stream"}
    assert not table.failed and all(c.ours.complete for c in table.cells.values() if c.ours is not None)


# ------------------------------------------------------------------ make_tables golden output, plot.py
@pytest.mark.parametrize("table,builder", [("table2", synthetic_table2), ("table11", synthetic_table11)])
def test_make_tables_on_a_synthetic_tree_matches_the_golden_files(tmp_path, table, builder, capsys):
    """Golden files: tests/golden/<table>.{md,csv,tex}; FAFO_UPDATE_GOLDEN=1 rewrites them (review the diff)."""
    root = builder(tmp_path / "runs")
    assert mt.main([str(root), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    for ext in ("md", "csv", "tex"):
        got = (tmp_path / "out" / f"{table}.{ext}").read_text()
        if os.environ.get("FAFO_UPDATE_GOLDEN"):
            (GOLDEN / f"{table}.{ext}").write_text(got)
        assert got == (GOLDEN / f"{table}.{ext}").read_text(), f"{table}.{ext} differs from tests/golden"
    assert printed.strip() == (GOLDEN / f"{table}.md").read_text().strip()  # the paper layout on stdout


def test_a_cell_of_several_runs_names_the_key_they_differ_in(tmp_path):
    """A paper cell that received more than one run keeps the most complete one and says what set the runs apart
    (a key a sweep varied: --by makes it columns), or that no config key does (repeats)."""
    import copy

    table = mt.make_table([synthetic_table2(tmp_path / "runs")], "table2")
    cell = next(c for c in table.cells.values() if c.duplicates)
    assert len(cell.runs) == cell.duplicates + 1
    assert any("which no config key tells apart" in n for n in mt.footnotes(table))
    other = cell.runs[1]
    other.config = copy.deepcopy(other.config or {})
    other.config.setdefault("bench", {})["max_new_tokens"] = 999
    note = next(n for n in mt.footnotes(table) if "not shown" in n)
    assert "they differ in bench.max_new_tokens (--by bench.max_new_tokens makes its values columns)" in note, note


def test_make_tables_values_beside_the_paper_and_the_difference(tmp_path):
    table = mt.make_table([synthetic_table2(tmp_path / "runs")], "table2")
    rows = {(r["model"], r["method"], r["task"]): r for r in mt.long_rows(table)}
    r = rows[("llama2-7b-chat", "fafo-stream", "mt_bench")]
    assert (r["speedup"], r["paper_speedup"], r["d_speedup"], r["d_tau"]) == (1.8, "1.91", -0.11, -0.04)
    assert r["run_dir"] == "llama2_7b_chat/mt_bench/fafo_stream/default" and r["status"] == "ok"
    partial = rows[("llama3-8b-instruct", "swift", "humaneval")]
    assert partial["status"] == "partial" and partial["speedup"] == round(4.2 / 3.0, 4)
    assert partial["tau"] == round(148 / 64, 4) and partial["n_samples"] == 2  # (new - 1) / verification forwards
    assert rows[("llama3.1-8b-instruct", "swift", "gsm8k")]["status"] == "missing"
    assert table.failed == [("llama31_8b_instruct/gsm8k/swift/default",
                             "error: model.path 'meta-llama/Llama-3.1-8B-Instruct' is not available offline")]
    stats = mt.row_stats(table, ("llama2-7b-chat", "lookahead"))
    assert [stats[k] for k in ("peak_mem_mb", "paper_peak_mem_mb", "exact_match_rate")] == [14100.0, None, 0.9875]
    assert mt.row_stats(table, ("llama2-7b-chat", "fafo-stream"))["exact_match_rate"] == 1.0


def test_plot_draws_the_runs_and_the_paper_values(tmp_path):
    root = synthetic_table11(tmp_path / "runs")
    table = mt.make_table([root])
    fig, _ = plot_script.plot_table(table)
    speed_ax, tau_ax = fig.axes[:2]
    assert speed_ax.get_xlabel() == tau_ax.get_xlabel() == "k (tokens per guess stream)"
    assert "speedup" in speed_ax.get_ylabel() and "τ" in tau_ax.get_ylabel()
    lines = {line.get_label(): line for line in speed_ax.get_lines() if not line.get_label().startswith("_")}
    assert set(lines) == {"FAFO-Stream", "FAFO-Stream (paper)"}
    assert list(lines["FAFO-Stream"].get_xdata()) == [4, 5, 6]
    assert list(lines["FAFO-Stream"].get_ydata()) == [0.95, 1.2, 1.85]
    assert list(lines["FAFO-Stream (paper)"].get_xdata()) == [4, 5, 6, 7, 8, 9]  # every published k
    assert list(lines["FAFO-Stream (paper)"].get_ydata()) == [0.9, 1.03, 1.9, 1.9, 1.75, 1.81]
    taus = {line.get_label(): list(line.get_ydata()) for line in tau_ax.get_lines()}
    assert taus["FAFO-Stream"] == [1.92, 2.0, 2.12]
    assert plot_script.main([str(root), "--out", str(tmp_path / "plots"), "--wandb-mode", "disabled"]) == 0
    import matplotlib.image

    png = matplotlib.image.imread(tmp_path / "plots" / "table11.png")
    assert png.ndim == 3 and png.shape[0] > 100 and png.shape[1] > 100
    assert (tmp_path / "plots" / "table11.pdf").read_bytes().startswith(b"%PDF")


def test_plot_refuses_a_table_without_an_axis(tmp_path):
    table = mt.make_table([synthetic_table2(tmp_path / "runs")])
    with pytest.raises(SystemExit, match="no ablation axis"):
        plot_script.plot_table(table)


def test_make_tables_handles_every_published_table_without_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    for name in paper_table.paper_tables():
        table = mt.make_table([tmp_path / "empty"], name)
        assert table.rows and table.cols
        md = mt.to_markdown(table)
        assert md.count("\n|") == len(table.rows) + 2  # header, rule and one line per row
        tex = mt.to_latex(table)
        assert tex.count(r"\\") >= len(table.rows) + 2
        above = tex.split(r"\begin{tabular}")[0].splitlines()
        assert all(line.startswith("%") for line in above)
        assert sum(line.startswith("% - ") for line in above) == len(mt.footnotes(table)) > 0


def test_table3_heads_with_end_to_end_and_shows_decode_beside_and_triforce_tau_is_marked(tmp_path):
    """Table 3's headline is the paper's one metric (tokens per second, end to end) with decode-only next to it;
    TriForce's tau on prompts its retrieval budget holds whole is not set against the paper's."""
    summary = paper_summary("llama3.1-8b-instruct", "fafo-stream", "longbench_multi_news", 1.4, 2.5, 1.0, 1.0, 12, 12)
    summary |= {"speedup_kind": "e2e", "speedup_e2e": 1.4, "speedup_decode": 1.9, "speedup_decode_ci95": [1.7, 2.1]}
    write_paper_run(tmp_path / "t3", "a", summary, {"paper": {"table": "table3"}})
    table = mt.make_table([tmp_path / "t3"])
    head, line = mt.header(table), mt.body(table)[0]
    row = dict(zip(head, line))
    assert row["Multi-News ours"].startswith("1.40×") and row["Multi-News speedup_decode"] == "1.90× [1.70–2.10]"
    assert "beside each column: speedup_decode" in mt.to_markdown(table)
    tri = paper_summary("llama2-7b-chat", "triforce-official", "mt_bench", 0.3, 6.9, 1.0, 1.0, 80, 160)
    write_paper_run(tmp_path / "t1", "a", {**tri, "flag_counts": {"retrieval_covers_prompt": 160}},
                    {"paper": {"table": "table1"}})
    table = mt.make_table([tmp_path / "t1"])
    row = dict(zip(mt.header(table), next(line for line in mt.body(table) if line[1] == "TriForce")))
    assert row["MT-Bench Δ"] == "+0.09 (n/c)"  # speedup 0.30 - 0.21; tau not comparable
    assert "n/c = not comparable: triforce-official: TriForce's retrieval budget holds the whole prompt in 160" \
        in mt.to_markdown(table)
    (long,) = [r for r in mt.long_rows(table) if r["run_dir"]]
    assert long["d_tau"] == "" and long["tau_comparable"] is False
