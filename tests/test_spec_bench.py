"""task=spec_bench (Spec-Bench's question.jsonl in its released format), per-subtask tables, experiment=specbench,
and the draftless methods through the real CLI."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fafo.engine.tiny_tokenizer import build_tiny_tokenizer
from fafo.errors import ConfigError
from tasks.spec_bench import CATEGORIES, SUBTASKS, SpecBenchTask, subtask, vicuna_prompt
from tests.helpers import ENV, make_cfg, run_cli, write_question_jsonl

MT = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]
# hemingkx/Spec-Bench data/spec_bench/question.jsonl at fd2c1cd: its categories in file order, and how many rows each
RELEASE_CATEGORIES = {**{c: 10 for c in MT}, "translation": 80, "summarization": 80, "qa": 80, "math_reasoning": 80,
                      "rag": 80}


def test_loads_release_format_with_the_release_categories(tmp_path):
    """A sample's category is the file's own, as speed.py selects by it; the subtasks group them."""
    assert list(CATEGORIES) == list(RELEASE_CATEGORIES) and sum(RELEASE_CATEGORIES.values()) == 480
    assert [subtask(c) for c in CATEGORIES] == ["mt_bench"] * 8 + list(SUBTASKS[1:])
    data = write_question_jsonl(tmp_path / "question.jsonl", per_category=2)
    samples = SpecBenchTask(data_path=str(tmp_path)).samples()  # a directory holding question.jsonl works too
    cats = [s.category for s in samples]
    assert cats == ["writing", "roleplay"] * 2 + [c for c in SUBTASKS[1:] for _ in range(2)]
    assert samples[0].id == "81" and len(samples[0].turns) == 2 and samples[0].followup == "own"
    assert [s.category for s in SpecBenchTask(data_path=str(data), categories=["rag", "qa"]).samples()] == \
        ["qa", "qa", "rag", "rag"]
    assert [s.category for s in SpecBenchTask(data_path=str(data), categories=["mt_bench"]).samples()] == \
        ["writing", "roleplay"] * 2
    assert [s.id for s in SpecBenchTask(data_path=str(data), categories="roleplay").samples()] == ["82", "84"]


def test_prompts_model_template_and_vicuna(tmp_path):
    tok = build_tiny_tokenizer()
    data = write_question_jsonl(tmp_path / "question.jsonl")
    task = SpecBenchTask(data_path=str(data))
    s = task.samples()[0]
    turn2 = tok.decode(task.prompt_ids(tok, s, 1, ["  my answer "]))
    assert "Write about writing 0." in turn2 and "my answer" in turn2 and turn2.count("Now shorter.") == 1
    vic = SpecBenchTask(data_path=str(data), template="vicuna")
    text = tok.decode(vic.prompt_ids(tok, s, 1, [" my answer "]))
    assert text.endswith("USER: Write about writing 0. ASSISTANT: my answer</s>USER: Now shorter. ASSISTANT:")
    assert (task.prompt_format(tok, s), vic.prompt_format(tok, s)) == ("chat template", "Vicuna v1.1 template")
    assert vicuna_prompt([{"role": "user", "content": "hi"}]).startswith("A chat between a curious user")


@pytest.mark.parametrize("kwargs,match", [
    ({}, "task.data_path"), ({"categories": ["poetry"]}, "task.categories"),
    ({"categories": ["mt_bench"], "bad_row": "mt_bench"}, "has category 'mt_bench', not one of Spec-Bench's"),
    ({"template": "llama"}, "^task.template='llama' must be one of model, vicuna"),
])
def test_bad_settings_are_one_clear_error(tmp_path, kwargs, match):
    data, kwargs = write_question_jsonl(tmp_path / "question.jsonl"), dict(kwargs)
    if bad := kwargs.pop("bad_row", None):  # a file that names the subtask, not the release's category
        data.write_text(data.read_text() + json.dumps({"question_id": 999, "category": bad, "turns": ["q"]}) + "\n")
    kwargs = {"data_path": str(data), **kwargs} if match != "task.data_path" else kwargs
    with pytest.raises(ConfigError, match=match):
        SpecBenchTask(**kwargs).samples()


def test_specbench_experiment_composes(tmp_path):
    cfg = make_cfg(tmp_path, "experiment=specbench")
    assert cfg.model.name == "vicuna-7b-v1.3" and cfg.task.name == "spec_bench" and cfg.task.template == "vicuna"
    assert cfg.paper.table == "specbench"
    rows = list(csv.DictReader(open(Path(__file__).resolve().parents[1] / "results/paper/specbench.csv")))
    assert {r["value"] for r in rows} == {*SUBTASKS, "overall"}
    recycling = {r["value"]: r for r in rows if r["method"] == "token-recycling"}
    assert (recycling["overall"]["speedup"], recycling["overall"]["tau"]) == ("2.22", "2.73")


@pytest.mark.slow
def test_cli_runs_every_draftless_method_on_spec_bench_with_per_subtask_table(tmp_path):
    """The real CLI: a 4-method sweep over a Spec-Bench file on the tiny model; exact, rows per category, the
    prompt and vanilla's answer in every output line, make_tables splits the runs per subtask beside the
    leaderboard, and the export of one run (its own tokenizer found from its config) is what speed.py reads."""
    from fafo.bench.records import prompt_hash
    from tests.test_specbench_export import speed

    data = write_question_jsonl(tmp_path / "question.jsonl")
    out = tmp_path / "runs"
    proc = run_cli("-m", "method=prompt_lookup,token_recycling,suffix_decoding,sam_decoding", "task=spec_bench",
                   f"task.data_path={data}", "bench.max_new_tokens=12",
                   f"bench.output_dir={out}", "wandb.mode=disabled", "bench.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = sorted(out.glob("*/spec_bench/*/*/summary.json"))
    assert len(summaries) == 4
    for s in summaries:
        summary = json.loads(s.read_text())
        assert summary["exact_match_rate"] == 1.0 and summary["n_samples"] == 6
        with open(s.parent / "samples.csv", newline="") as f:
            assert {r["category"] for r in csv.DictReader(f)} == {"writing", *SUBTASKS[1:]}
        for line in (s.parent / "outputs.jsonl").read_text().splitlines():
            o = json.loads(line)
            assert o["ref_tokens"] == o["tokens"] and o["ref_text"] == o["text"]  # exact: vanilla's answer beside
            assert len(o["prompt_ids"]) == o["prompt_tokens"] and prompt_hash(o["prompt_ids"]) == o["prompt_sha256"]
            text = o["prompt_head"] + o["prompt_tail"]  # the whole prompt at these lengths
            assert text.startswith("<s><|user|>") and text.endswith("<|assistant|>\n")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from make_tables import make_table, to_markdown

    table = make_table([out], "specbench")
    md = to_markdown(table)
    assert "Translation ours" in md and "Retrieval-aug. Generation ours" in md and "2.22" in md
    ours = [c for (row, col), c in table.cells.items() if c.ours is not None]
    assert {col[2] for (row, col), c in table.cells.items() if c.ours is not None} == {*SUBTASKS, "overall"}
    assert len(ours) == 4 * 7

    run_dir = next(s.parent for s in summaries if "prompt_lookup" in str(s))
    proc = subprocess.run([sys.executable, "-m", "fafo.bench.tools.specbench_export", str(run_dir)],
                          capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = json.loads((run_dir / "specbench" / "specbench_export.json").read_text())
    assert done["tokenizer_adds_bos"] and done["questions"] == 6 and "tiny" in done["tokenizer_source"]
    for task, part in done["subtasks"].items():  # every subtask, MT-Bench's row included
        ratio = speed(done["method_file"], done["baseline_file"], done["tokenizer_path"], task)[2]
        assert ratio == pytest.approx(part["speed_py"], rel=1e-12) and np.isfinite(ratio)
    assert set(done["subtasks"]) == {*SUBTASKS, "overall"}
    assert done["subtasks"]["overall"]["speedup_specbench"] == pytest.approx(
        json.loads((run_dir / "summary.json").read_text())["speedup_specbench"], rel=1e-12)
