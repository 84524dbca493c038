"""Task loaders of the chat tasks: each public task read from a fixture written in its real release format and
field names (MT-Bench, GSM8K, HumanEval, AIME, Multi-IF; the long-context tasks are in
``test_task_loaders_long.py``).

Each fixture goes through the same code path as a hub id (``DataTask.records`` -> ``load_samples`` ->
``samples`` -> ``prompt_ids``). Prompts are checked against golden strings rendered with the tiny tokenizer's
chat template (``<s><|user|>\\n{content}<|end|>\\n ... <|assistant|>\\n``) or, for raw tasks, against
``tokenizer(text)`` with BOS. Then the runner completes a two-turn MT-Bench fixture on the tiny model, and missing
files / an offline hub id give one ConfigError naming ``task.data_path``.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gzip
import json

import pandas as pd
import pytest

from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.errors import ConfigError
from tasks.aime import AIMETask
from tasks.gsm8k import GSM8KTask
from tasks.humaneval import HumanEvalTask
from tasks.longbench import LongBenchTask
from tasks.mt_bench import MTBenchTask
from tasks.multi_if import MultiIFTask
from tasks.narrativeqa import NarrativeQATriForceTask
from tasks.pg19 import PG19Task
from tasks.scbench import SCBenchTask
from tests.helpers import chat, ids_of, is_raw, make_cfg, read_rows, task_from_conf, write_jsonl

BOOST = "\nPlease reason step by step, and put your final answer within \\boxed{}."


# ---------------------------------------------------------------- MT-Bench

MT_ROWS = [
    {"question_id": 81, "category": "writing",
     "turns": ["Compose an engaging travel blog post about a recent trip to Hawaii.",
               "Rewrite your previous response. Start every sentence with the letter A."]},
    {"question_id": 111, "category": "math",
     "turns": ["The vertices of a triangle are at points (0, 0), (-1, 1), and (3, 3). What is its area?",
               "What's area of the circle circumscribing the triangle?"],
     "reference": ["Area is 3", "5pi"]},
]


def test_mt_bench_fastchat_question_jsonl(tmp_path, tok):
    path = write_jsonl(tmp_path / "mt_bench" / "question.jsonl", MT_ROWS)
    task = task_from_conf("mt_bench", f"task.data_path={path}")
    samples = task.samples()
    assert [s.id for s in samples] == ["81", "111"] and [s.category for s in samples] == ["writing", "math"]
    s = samples[0]
    assert s.chat and s.followup == "own" and s.max_new_tokens == 1024 and len(s.turns) == 2
    assert task.prompt_ids(tok, s, 0, []) == ids_of(tok, chat(MT_ROWS[0]["turns"][0]))
    answer = "Aloha! Hawaii was a dream."
    p1 = task.prompt_ids(tok, s, 1, ["  " + answer + "\n"])  # the model's own answer, stripped
    assert p1 == ids_of(tok, chat(MT_ROWS[0]["turns"][0], answer, MT_ROWS[0]["turns"][1]))
    assert samples[1].references == ["Area is 3", "5pi"]
    # the directory form (FastChat's data/mt_bench/) and selection by id
    by_dir = MTBenchTask(data_path=str(tmp_path), ids=[111]).samples()
    assert [x.id for x in by_dir] == ["111"]


def test_mt_bench_hub_copy_schema_from_parquet_snapshot(tmp_path, tok):
    rows = [{"prompt": r["turns"], "prompt_id": 1000 + i, "category": r["category"],
             "reference": r.get("reference", [])} for i, r in enumerate(MT_ROWS)]
    snap = tmp_path / "mt_bench_prompts" / "data"
    snap.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(snap / "train-00000-of-00001.parquet")
    samples = MTBenchTask(data_path=str(snap.parent)).samples()
    assert [s.id for s in samples] == ["1000", "1001"] and samples[1].turns == MT_ROWS[1]["turns"]


# ---------------------------------------------------------------- GSM8K

GSM_ROWS = [
    {"question": "Janet's ducks lay 16 eggs per day. She eats three for breakfast. How many are left?",
     "answer": "Janet has 16 - 3 = <<16-3=13>>13 eggs left.\n#### 13"},
    {"question": "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total?",
     "answer": "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total is 2+1=<<2+1=3>>3\n#### 3"},
]


def test_gsm8k_test_jsonl_zero_shot_chat(tmp_path, tok):
    path = write_jsonl(tmp_path / "grade_school_math" / "data" / "test.jsonl", GSM_ROWS)
    task = task_from_conf("gsm8k", f"task.data_path={path}")
    samples = task.samples()
    assert [s.id for s in samples] == ["0", "1"] and samples[0].max_new_tokens == 1024
    assert samples[0].references == [GSM_ROWS[0]["answer"]]
    assert task.prompt_ids(tok, samples[1], 0, []) == ids_of(tok, chat(GSM_ROWS[1]["question"]))
    assert [s.id for s in GSM8KTask(data_path=str(tmp_path), limit=1).samples()] == ["0"]  # test.jsonl in a dir


def test_gsm8k_specbench80_selects_question_ids(tmp_path, tok):
    rows = [{"question_id": 1, "category": "writing", "turns": ["Write a haiku."]}]
    rows += [{"question_id": q, "category": "math_reasoning", "turns": [f"Question {q}: what is {q} + 1?"],
              "reference": [f"{q} + 1 = {q + 1}\n#### {q + 1}"]} for q in (401, 402, 480)]
    rows += [{"question_id": 481, "category": "rag", "turns": ["Use the passage."]}]
    path = write_jsonl(tmp_path / "question.jsonl", rows)
    task = task_from_conf("gsm8k_specbench80", f"task.data_path={path}")
    samples = task.samples()
    assert [s.id for s in samples] == ["401", "402", "480"] and {s.category for s in samples} == {"math_reasoning"}
    assert task.prompt_ids(tok, samples[0], 0, []) == ids_of(tok, chat("Question 401: what is 401 + 1?"))
    with pytest.raises(ConfigError, match="task.data_path"):
        task_from_conf("gsm8k_specbench80").samples()  # the ids come from the user's question.jsonl


# ---------------------------------------------------------------- HumanEval

HE_ROWS = [
    {"task_id": "HumanEval/0", "prompt": 'from typing import List\n\n\ndef has_close_elements(numbers: List[float], '
     'threshold: float) -> bool:\n    """ Check if in given list of numbers, are any two numbers closer to each '
     'other than\n    given threshold.\n    """\n', "entry_point": "has_close_elements",
     "canonical_solution": "    for idx, elem in enumerate(numbers):\n        pass\n",
     "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1.0], 0.5) is False\n"},
    {"task_id": "HumanEval/1", "prompt": "def add(x: int, y: int) -> int:\n    " + "# add two numbers\n    " * 200,
     "entry_point": "add", "canonical_solution": "    return x + y\n", "test": "def check(candidate):\n    pass\n"},
]


def test_humaneval_gz_raw_prefix_with_input_cap(tmp_path, tok):
    path = tmp_path / "data" / "HumanEval.jsonl.gz"
    path.parent.mkdir()
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in HE_ROWS))
    task = task_from_conf("humaneval", f"task.data_path={path}", "task.max_input_tokens=128")
    samples = task.samples()
    assert [s.id for s in samples] == ["HumanEval/0", "HumanEval/1"]
    assert not samples[0].chat and samples[0].max_new_tokens == 512
    p0 = task.prompt_ids(tok, samples[0], 0, [])
    assert p0 == ids_of(tok, HE_ROWS[0]["prompt"], special=True) and is_raw(tok, p0)  # no chat template, BOS
    full = ids_of(tok, HE_ROWS[1]["prompt"], special=True)
    assert len(full) > 128 and task.prompt_ids(tok, samples[1], 0, []) == full[:128]  # the 1024-style head cap
    assert HumanEvalTask(data_path=str(tmp_path)).max_input_tokens == 1024  # the default cap; dir form
    eagle = HumanEvalTask(data_path=str(path), chat=True)
    s = eagle.samples()[0]
    want = chat("Complete the code I provided.\n\n" + HE_ROWS[0]["prompt"])
    assert eagle.prompt_ids(tok, s, 0, []) == ids_of(tok, want)


# ---------------------------------------------------------------- AIME

AIME_ROWS = [
    {"id": "60", "problem": "Every morning Aya goes for a $9$-kilometer-long walk. Find $s$.", "solution": "...",
     "answer": "204", "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1"},
    {"id": "61", "problem": "Let $ABC$ be a triangle inscribed in circle $\\omega$. Find $AP$.", "answer": "113",
     "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_10"},
]


def test_aime_reasoning_template(tmp_path, tok):
    path = write_jsonl(tmp_path / "aime24" / "test.jsonl", AIME_ROWS)
    task = task_from_conf("aime24", f"task.data_path={path}")
    samples = task.samples()
    assert [s.id for s in samples] == ["60", "61"] and samples[0].max_new_tokens == 16384
    assert samples[0].references == ["204"]
    assert task.prompt_ids(tok, samples[1], 0, []) == ids_of(tok, chat(AIME_ROWS[1]["problem"] + BOOST))
    qwen = AIMETask(data_path=str(path), instruction_in_system=True)
    assert qwen.prompt_ids(tok, qwen.samples()[0], 0, []) == ids_of(
        tok, chat(AIME_ROWS[0]["problem"], system=BOOST.lstrip("\n")))
    # Maxwell-Jia's field names, from a parquet snapshot
    snap = tmp_path / "maxwell" / "data"
    snap.mkdir(parents=True)
    pd.DataFrame([{"ID": "2024-I-1", "Problem": AIME_ROWS[0]["problem"], "Solution": "...", "Answer": 204}]) \
        .to_parquet(snap / "train-00000-of-00001.parquet")
    (s,) = AIMETask(data_path=str(snap.parent)).samples()
    assert s.id == "2024-I-1" and s.references == ["204"] and s.turns == [AIME_ROWS[0]["problem"] + BOOST]


# ---------------------------------------------------------------- Multi-IF

def multi_if_csv(path):
    def msg(text):
        return json.dumps({"role": "user", "content": text}, ensure_ascii=False)

    rows = [
        {"key": 1001, "language": "English", "turn_index": 1, "turns": "", "responses": "",
         "turn_1_prompt": msg("Write a poem about rivers. Do not use any commas."),
         "turn_2_prompt": msg("Now make it exactly four lines long."),
         "turn_3_prompt": msg("Finally, put the whole poem in capital letters."),
         "turn_1_instruction_id_list": json.dumps(["punctuation:no_comma"]),
         "turn_1_kwargs": json.dumps([json.dumps({})])},
        {"key": 1002, "language": "French", "turn_index": 1, "turns": "", "responses": "",
         "turn_1_prompt": msg("Écris une lettre courte."), "turn_2_prompt": msg("Ajoute un titre."),
         "turn_3_prompt": "", "turn_1_instruction_id_list": "[]", "turn_1_kwargs": "[]"},
    ]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_multi_if_csv_three_turns_replay_own_answers(tmp_path, tok):
    path = multi_if_csv(tmp_path / "multiIF_20241018.csv")
    task = task_from_conf("multi_if", f"task.data_path={path}")
    samples = task.samples()
    assert [s.id for s in samples] == ["1001", "1002"] and [len(s.turns) for s in samples] == [3, 2]
    assert samples[0].category == "English" and samples[0].followup == "own" and samples[0].max_new_tokens == 1024
    s = samples[0]
    a1, a2 = "Rivers run and rivers bend", "Rivers run\nrivers bend\nthey flow\nthey end"
    assert task.prompt_ids(tok, s, 2, [a1 + "\n", " " + a2]) == ids_of(tok, chat(*s.turns[:1], a1, s.turns[1], a2,
                                                                                  s.turns[2]))
    assert s.turns[2] == "Finally, put the whole poem in capital letters."
    assert [x.id for x in MultiIFTask(data_path=str(tmp_path), languages=["French"]).samples()] == ["1002"]


# ---------------------------------------------------------------- errors and selection

@pytest.mark.parametrize("cls,kwargs", [
    (MTBenchTask, {}), (GSM8KTask, {}), (HumanEvalTask, {}), (LongBenchTask, {"subset": "trec"}),
    (SCBenchTask, {"subset": "mf"}), (AIMETask, {}), (PG19Task, {}), (MultiIFTask, {}), (NarrativeQATriForceTask, {}),
])
def test_missing_data_file_is_one_clear_error(tmp_path, cls, kwargs):
    with pytest.raises(ConfigError) as err:
        cls(data_path=str(tmp_path / "nope.jsonl"), **kwargs).samples()
    msg = str(err.value)
    assert "task.data_path=" in msg and "does not exist" in msg and "\n" not in msg


def test_offline_hub_id_is_one_clear_error():
    with pytest.raises(ConfigError) as err:
        MTBenchTask(hub_id="fafo-bench-tests/no-such-dataset").samples()
    msg = str(err.value)
    assert "task.data_path" in msg and "question.jsonl" in msg and "\n" not in msg
    with pytest.raises(ConfigError) as err:  # script-based upstream: the error names the mirror and the release file
        LongBenchTask(subset="trec", hub_id="fafo-bench-tests/no-such-dataset").samples()
    assert "task.data_path" in str(err.value) and "script-based" in str(err.value) and "data.zip" in str(err.value)


def test_directory_without_a_release_file_and_bad_settings(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(ConfigError, match="task.data_path=.*without a file matching data/lcc.jsonl"):
        LongBenchTask(subset="lcc", data_path=str(tmp_path)).samples()
    with pytest.raises(ConfigError, match="^task.subset='vcsum' must be one of narrativeqa, "):  # LongBench's Chinese
        LongBenchTask(subset="vcsum").samples()
    with pytest.raises(ConfigError, match="^task.subset='xx' must be one of mf, repoqa, "):
        SCBenchTask(subset="xx").samples()
    with pytest.raises(ConfigError, match="^task.followup='mine' must be one of own, gold \\(gold: SCBench"):
        SCBenchTask(followup="mine").samples()
    with pytest.raises(ConfigError, match="task.max_input_tokens=100 but task 'mt_bench' does not truncate"):
        MTBenchTask(max_input_tokens=100).samples()
    with pytest.raises(ConfigError, match="task.prefix_tokens"):
        PG19Task(prefix_tokens=0).samples()


def test_limit_and_ids_keep_file_order(tmp_path):
    rows = [dict(MT_ROWS[0], question_id=q) for q in (85, 81, 90, 82)]
    path = write_jsonl(tmp_path / "question.jsonl", rows)
    assert [s.id for s in MTBenchTask(data_path=str(path), ids=["82", "85"]).samples()] == ["85", "82"]
    assert [s.id for s in MTBenchTask(data_path=str(path), limit=2).samples()] == ["85", "81"]
    task = MTBenchTask(data_path=str(path), system="Be brief.")
    assert all(s.system == "Be brief." for s in task.samples())


# ---------------------------------------------------------------- the runner

def test_runner_completes_two_turn_mt_bench(tmp_path, tok):
    path = write_jsonl(tmp_path / "question.jsonl", MT_ROWS)
    run_dir = tmp_path / "run"
    summary = Runner().run(resolve(make_cfg(tmp_path, "bench.warmup=0", "task=mt_bench", f"task.data_path={path}",
                              "bench.max_new_tokens=4"), run_dir))
    rows = read_rows(run_dir)
    assert [(r["sample_id"], r["turn"]) for r in rows] == [("81", "0"), ("81", "1"), ("111", "0"), ("111", "1")]
    assert {r["status"] for r in rows} == {"ok"} and summary["exact_match_rate"] == 1.0
    outputs = [json.loads(line) for line in (run_dir / "outputs.jsonl").read_text().splitlines()]
    first = outputs[0]
    # turn 2's prompt holds turn 1's prompt, the model's answer and the second question
    assert int(rows[1]["prompt_tokens"]) > int(rows[0]["prompt_tokens"]) + len(ids_of(tok, MT_ROWS[0]["turns"][1]))
    assert first["turn"] == 0 and len(first["tokens"]) == int(rows[0]["new_tokens"])
