"""Task loaders: every public task read from a fixture written in its real release format and field names.

Each fixture goes through the same code path as a hub id (``DataTask.records`` -> ``load_samples`` ->
``samples`` -> ``prompt_ids``). Prompts are checked against golden strings rendered with the tiny tokenizer's
chat template (``<s><|user|>\\n{content}<|end|>\\n ... <|assistant|>\\n``) or, for raw tasks, against
``tokenizer(text)`` with BOS. Then the runner completes a two-turn MT-Bench fixture and a PG-19 fixture on the
tiny model, and missing files / an offline hub id give one ConfigError naming ``task.data_path``.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import gzip
import json
import zipfile

import pandas as pd
import pytest

from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.engine.tiny_tokenizer import CHAT_MARKERS, build_tiny_tokenizer
from fafo.errors import ConfigError
from tasks.aime import AIMETask
from tasks.base import head_token_ids, truncate_middle
from tasks.gsm8k import GSM8KTask
from tasks.humaneval import HumanEvalTask
from tasks.longbench import LongBenchTask
from tasks.mt_bench import MTBenchTask
from tasks.multi_if import MultiIFTask
from tasks.narrativeqa import NarrativeQATriForceTask
from tasks.pg19 import PG19Task
from tasks.scbench import SCBenchTask
from tests.helpers import make_cfg, read_rows, task_from_conf, write_jsonl

BOOST = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def chat(*turns, system=None):
    """The tiny template's rendering of alternating user/assistant turns, ending with the generation prompt."""
    out = "<s>" + (f"<|system|>\n{system}<|end|>\n" if system is not None else "")
    for i, content in enumerate(turns):
        out += f"<|{'user' if i % 2 == 0 else 'assistant'}|>\n{content}<|end|>\n"
    return out + "<|assistant|>\n"


def ids_of(tok, text, special=False):
    return tok(text, add_special_tokens=special).input_ids


def is_raw(tok, ids):
    return ids[0] == tok.bos_token_id and not set(tok.convert_tokens_to_ids(list(CHAT_MARKERS))) & set(ids)


def words(n, seed=0):
    vocab = ["river", "bridge", "garden", "letter", "window", "summer", "market", "lantern", "harbour", "meadow"]
    return " ".join(vocab[(i * 7 + seed) % len(vocab)] + ("." if i % 9 == 8 else "") for i in range(n))


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


# ---------------------------------------------------------------- LongBench

LB_CONTEXT = {
    "narrativeqa": "Once upon a time a lighthouse keeper found a letter in a bottle.",
    "qasper": "We present a model for parsing. Our results improve on the baseline.",
    "2wikimqa": "Passage 1:\nAlice was born in Paris.\nPassage 2:\nParis is in France.",
    "multi_news": "Story one about the floods. ||||| Story two about the rescue.",
    "trec": "Question: What is the capital of Peru ?\nType: City\nQuestion: Who wrote Hamlet ?\nType: Individual",
    "lcc": "import os\n\ndef list_files(path):\n    for name in sorted(os.listdir(path)):\n",
}
LB_INPUT = {"narrativeqa": "Who found the letter?", "qasper": "What is improved?",
            "2wikimqa": "In which country was Alice born?", "multi_news": "",
            "trec": "Question: Where is Rome ?\nType:",
            "lcc": ""}
# LongBench/config/dataset2prompt.json with the fixture values filled in (golden strings, written out in full).
LB_GOLDEN = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
    "question asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: "
    "Once upon a time a lighthouse keeper found a letter in a bottle.\n\nNow, answer the question based on the story "
    "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nQuestion: Who "
    "found the letter?\n\nAnswer:",
    "qasper": "You are given a scientific article and a question. Answer the question as concisely as you can, using "
    "a single phrase or sentence if possible. If the question cannot be answered based on the information in the "
    "article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable"
    "\". Do not provide any explanation.\n\nArticle: We present a model for parsing. Our results improve on the "
    "baseline.\n\n Answer the question based on the above article as concisely as you can, using a single phrase or "
    "sentence if possible. If the question cannot be answered based on the information in the article, write "
    "\"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not "
    "provide any explanation.\n\nQuestion: What is improved?\n\nAnswer:",
    "2wikimqa": "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages.\nPassage 1:\nAlice was born in Paris.\nPassage 2:\nParis is in "
    "France.\n\nAnswer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nQuestion: In which country was Alice born?\nAnswer:",
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\nStory one "
    "about the floods. ||||| Story two about the rescue.\n\nNow, write a one-page summary of all the news.\n\nSummary:",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\nQuestion: What "
    "is the capital of Peru ?\nType: City\nQuestion: Who wrote Hamlet ?\nType: Individual\nQuestion: Where is Rome "
    "?\nType:",
    "lcc": "Please complete the code given below. \nimport os\n\ndef list_files(path):\n    for name in "
    "sorted(os.listdir(path)):\nNext line of code:\n",
}
LB_MAXLEN = {"narrativeqa": 128, "qasper": 128, "2wikimqa": 32, "multi_news": 512, "trec": 64, "lcc": 64}


def lb_record(subset, i, context=None):
    return {"input": LB_INPUT[subset], "context": LB_CONTEXT[subset] if context is None else context,
            "answers": ["an answer"], "length": 100 + i, "dataset": subset, "language": "en",
            "all_classes": ["City", "Individual"] if subset == "trec" else None, "_id": f"{subset}-{i:04d}"}


@pytest.fixture(scope="module")
def longbench_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("longbench")
    long_context = words(600, seed=3)
    for subset in LB_GOLDEN:
        write_jsonl(root / "data" / f"{subset}.jsonl", [lb_record(subset, 0), lb_record(subset, 1, long_context)])
    with zipfile.ZipFile(root / "data.zip", "w") as zf:
        for subset in LB_GOLDEN:
            zf.write(root / "data" / f"{subset}.jsonl", f"data/{subset}.jsonl")
    return root


@pytest.mark.parametrize("subset", list(LB_GOLDEN))
def test_longbench_templates_and_chat_rule(longbench_dir, tok, subset):
    task = task_from_conf(f"longbench_{subset}", f"task.data_path={longbench_dir / 'data' / (subset + '.jsonl')}")
    samples = task.samples()
    assert [s.id for s in samples] == [f"{subset}-0000", f"{subset}-0001"]
    assert task.max_new_tokens == LB_MAXLEN[subset] and samples[0].max_new_tokens == LB_MAXLEN[subset]
    ids = task.prompt_ids(tok, samples[0], 0, [])
    if subset in ("trec", "lcc"):  # few-shot / code subsets stay raw
        assert ids == ids_of(tok, LB_GOLDEN[subset], special=True) and is_raw(tok, ids)
    else:
        assert ids == ids_of(tok, chat(LB_GOLDEN[subset]))
    # the release zip and the data/ directory give the same samples
    assert LongBenchTask(subset=subset, data_path=str(longbench_dir / "data.zip")).samples() == samples
    assert LongBenchTask(subset=subset, data_path=str(longbench_dir)).samples() == samples


@pytest.mark.parametrize("subset", ["qasper", "trec"])
def test_longbench_middle_truncation_in_tokens(longbench_dir, tok, subset):
    plain = LongBenchTask(subset=subset, data_path=str(longbench_dir))
    limit = len(ids_of(tok, plain.samples()[0].turns[0], special=True)) // 2 * 2 + 40  # the short prompt fits
    task = LongBenchTask(subset=subset, data_path=str(longbench_dir), max_input_tokens=limit)
    short, long_ = task.samples()
    assert task.prompt_ids(tok, short, 0, []) == plain.prompt_ids(tok, short, 0, [])  # short prompts are untouched
    full = ids_of(tok, long_.turns[0], special=True)  # pred.py counts with special tokens
    assert len(full) > limit
    head = tok.decode(full[:limit // 2], skip_special_tokens=True)
    tail = tok.decode(full[-(limit // 2):], skip_special_tokens=True)
    assert long_.turns[0].startswith(head) and long_.turns[0].endswith(tail)
    got = task.prompt_ids(tok, long_, 0, [])
    expected_text = head + tail
    if subset == "trec":
        assert got == ids_of(tok, expected_text, special=True)
    else:
        assert got == ids_of(tok, chat(expected_text))  # truncated first, then the chat template
        assert len(ids_of(tok, expected_text)) <= limit + 2


# ---------------------------------------------------------------- SCBench

MF_TURNS = [
    {"input": "You should answer with only one number, no other words. The largest number of the list is: ",
     "answer": 99},
    {"input": "You should answer with only one number, no other words. The smallest number of the list is: ",
     "answer": 1},
    {"input": "You should answer with only one number, no other words. The median of the list is: ", "answer": 50},
]


@pytest.fixture(scope="module")
def scbench_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("scbench") / "data"
    write_jsonl(root / "scbench_mf.jsonl", [
        {"id": 0, "context": [17, 99, 1, 50, 42], "multi_turns": MF_TURNS},
        {"id": 1, "context": list(range(400)), "multi_turns": MF_TURNS[:2]},
    ])
    book = words(500, seed=1)
    write_jsonl(root / "scbench_qa_eng.jsonl", [{"id": 7, "context": book, "multi_turns": [
        {"input": "Who keeps the lantern?", "answer": "The harbour master"},
        {"input": "Where is the meadow?", "answer": "Beyond the bridge"}]}])
    for subset, prefix in (("repoqa", "Function description: opens a file."), ("many_shot", "Label: positive"),
                           ("vt", "Find all variables that are assigned the value 12345.")):
        record = {"id": 3, "context": f"{subset} context " + words(50), "multi_turns": [
            {"input": prefix, "answer": "first answer"}, {"input": prefix + " Again.", "answer": "second answer"}]}
        if subset == "many_shot":
            record["task"] = "banking77"
        write_jsonl(root / f"scbench_{subset}.jsonl", [record])
    return root


def test_scbench_mf_int_context_gold_followups(scbench_dir, tok):
    task = task_from_conf("scbench_mf", f"task.data_path={scbench_dir.parent}")
    samples = task.samples()
    assert [s.id for s in samples] == ["0", "1"] and samples[0].followup == "gold" and samples[0].max_new_tokens == 5
    s = samples[0]
    first = ("What is the largest number of the list?\n\n[17, 99, 1, 50, 42]\n\nYou should answer with only one number,"
             " no other words. The largest number of the list is: ")
    assert s.turns[0] == first and s.references == ["99", "1", "50"]
    p0 = task.prompt_ids(tok, s, 0, [])
    assert p0 == ids_of(tok, chat(first))
    piece1 = ("99<|end|>\n<|user|>\nWhat is the smallest number of the list?\n\nYou should answer with only one "
              "number, no other words. The smallest number of the list is: <|end|>\n<|assistant|>\n")
    piece2 = ("1<|end|>\n<|user|>\nWhat is the median of the list?\n\nYou should answer with only one number, no other"
              " words. The median of the list is: <|end|>\n<|assistant|>\n")
    ignored = ["model text that gold mode must not use"] * 2
    assert task.prompt_ids(tok, s, 1, ignored) == p0 + ids_of(tok, piece1)
    assert task.prompt_ids(tok, s, 2, ignored) == p0 + ids_of(tok, piece1) + ids_of(tok, piece2)
    # the flag for the model's own answers
    own = SCBenchTask(subset="mf", data_path=str(scbench_dir), followup="own")
    s_own = own.samples()[0]
    assert own.prompt_ids(tok, s_own, 1, [" 98 \n"]) == p0 + ids_of(tok, "98" + piece1[2:])


def test_scbench_middle_truncation_keeps_head_and_tail_tokens(scbench_dir, tok):
    turns_reserved = 3  # from the first record, as run_scbench.py does
    task = SCBenchTask(subset="mf", data_path=str(scbench_dir), max_seq_length=200 + 5 * turns_reserved)
    s = task.samples()[1]
    full = ids_of(tok, chat(s.turns[0]))
    assert len(full) > 200
    p0 = task.prompt_ids(tok, s, 0, [])
    assert p0 == full[:100] + full[-100:] == truncate_middle(full, 200)
    assert task.prompt_ids(tok, s, 1, [])[:200] == p0  # follow-ups extend the truncated first turn
    capped = SCBenchTask(subset="mf", data_path=str(scbench_dir), max_input_tokens=51)
    assert capped.prompt_ids(tok, capped.samples()[1], 0, []) == full[:25] + full[-25:]


@pytest.mark.parametrize("subset", ["qa_eng", "repoqa", "many_shot", "vt"])
def test_scbench_templates(scbench_dir, tok, subset):
    task = task_from_conf(f"scbench_{subset}", f"task.data_path={scbench_dir / f'scbench_{subset}.jsonl'}")
    (s,) = task.samples()
    record = json.loads((scbench_dir / f"scbench_{subset}.jsonl").read_text())
    ctx, turns = record["context"], record["multi_turns"]
    golden = {
        "qa_eng": ((f"Read the book and answer the question. Be very concise in your answer.\n\n{ctx}\n\nQuestion: "
                    "Who keeps the lantern?\nAnswer:"), "Question: Where is the meadow?\nAnswer:"),
        "repoqa": (("Based on the function description and code context, please retrieve and repeat the exact "
                    f"described function from the code context in a code block wrapped by ```:\n\n{ctx}\n\n"
                    f"{turns[0]['input']}"), turns[1]["input"]),
        "many_shot": (f"{ctx}\n\n{turns[0]['input']}", turns[1]["input"]),
        "vt": (f"{ctx}\n\n{turns[0]['input']}", turns[1]["input"]),
    }[subset]
    assert s.turns == list(golden)
    p0 = task.prompt_ids(tok, s, 0, [])
    assert p0 == ids_of(tok, chat(golden[0]))
    piece = f"{turns[0]['answer']}<|end|>\n<|user|>\n{golden[1]}<|end|>\n<|assistant|>\n"
    assert task.prompt_ids(tok, s, 1, []) == p0 + ids_of(tok, piece)
    if subset == "qa_eng":  # without --use_chat_template: raw text with BOS, "{answer}\n\n{input}" follow-ups
        raw = SCBenchTask(subset=subset, data_path=str(scbench_dir), use_chat_template=False)
        r0 = raw.prompt_ids(tok, s, 0, [])
        assert r0 == ids_of(tok, golden[0], special=True) and is_raw(tok, r0)
        assert raw.prompt_ids(tok, s, 1, []) == r0 + ids_of(tok, f"{turns[0]['answer']}\n\n{golden[1]}")


LLAMA2_STYLE_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set msgs = messages[1:] %}"
    "{% else %}{% set msgs = messages %}{% endif %}"
    "{% for m in msgs %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
)


def test_scbench_follow_up_with_a_template_that_rejects_a_leading_assistant(scbench_dir, tok):
    strict = copy.deepcopy(tok)
    strict.chat_template = LLAMA2_STYLE_TEMPLATE
    task = SCBenchTask(subset="vt", data_path=str(scbench_dir))
    (s,) = task.samples()
    p0 = task.prompt_ids(strict, s, 0, [])
    assert p0 == ids_of(strict, f"<s>[INST] {s.turns[0]} [/INST]")
    piece = f" first answer </s><s>[INST] {s.turns[1]} [/INST]"  # the suffix the next turn's rendering adds
    assert task.prompt_ids(strict, s, 1, []) == p0 + ids_of(strict, piece)


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


# ---------------------------------------------------------------- PG-19

def pg19_frame():
    return pd.DataFrame([
        {"short_book_title": "The Long Book", "publication_date": 1890, "url": "http://x/1", "text": words(400)},
        {"short_book_title": "A Pamphlet", "publication_date": 1901, "url": "http://x/2", "text": "Too short."},
        {"short_book_title": "Another Book", "publication_date": 1911, "url": "http://x/3", "text": words(300, 5)},
        # enough bytes to pass the load-time filter, too few tokens for a 64-token prefix
        {"short_book_title": "Repetitive", "publication_date": 1920, "url": "http://x/4", "text": "the " * 30},
    ])


def test_pg19_parquet_raw_token_prefix(tmp_path, tok):
    path = tmp_path / "pg19" / "data" / "test-00000-of-00001.parquet"
    path.parent.mkdir(parents=True)
    pg19_frame().to_parquet(path)
    task = task_from_conf("pg19", f"task.data_path={path.parent.parent}", "task.prefix_tokens=64")
    samples = task.samples()
    assert [s.id for s in samples] == ["0", "2", "3"]  # "Too short." is dropped at load (fewer bytes than tokens)
    assert samples[0].max_new_tokens == 256 and not samples[0].chat
    p = task.prompt_ids(tok, samples[0], 0, [])
    assert p == ids_of(tok, samples[0].turns[0], special=True)[:64] and is_raw(tok, p)  # encode(text)[:prefill]
    assert [s.id for s in task.samples(tok)] == ["0", "2"]  # with the tokenizer, short books are skipped exactly
    with pytest.raises(ConfigError, match="fewer than task.prefix_tokens=64"):
        task.prompt_ids(tok, samples[2], 0, [])
    assert PG19Task(data_path=str(path), prefix_tokens=64, limit=1).samples(tok)[0].id == "0"


def test_pg19_triforce_json_dir_is_read_in_sorted_order(tmp_path, tok):
    d = tmp_path / "data" / "pg19"
    d.mkdir(parents=True)
    (d / "pg19-train.json").write_text(json.dumps({"text": "train book " + words(200, 2)}) + "\n")
    (d / "pg19-test.json").write_text(json.dumps({"text": "test book " + words(200, 4)}) + "\n")
    samples = PG19Task(data_path=str(d), prefix_tokens=32).samples()
    assert [s.turns[0].split()[0] for s in samples] == ["test", "train"]  # sorted names, not os.listdir order


def test_head_token_ids_matches_full_tokenization(tok):
    text = words(12000, seed=6)  # far beyond the first 16k-character window
    full = ids_of(tok, text, special=True)
    for n in (10, 3000, len(full)):
        assert head_token_ids(tok, text, n) == (full[:n], True)
    assert head_token_ids(tok, text, len(full) + 1) == (full, False)


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


# ---------------------------------------------------------------- NarrativeQA (TriForce)

def test_narrativeqa_triforce_book_prefix_prompt(tmp_path, tok):
    snap = tmp_path / "narrativeqa" / "data"
    snap.mkdir(parents=True)

    def row(i, n_words):
        return {"document": {"id": f"doc{i}", "kind": "gutenberg", "url": "http://x", "file_size": 1, "word_count": 1,
                             "start": "", "end": "", "summary": {"text": "s", "tokens": ["s"], "url": "", "title": "t"},
                             "text": "\ufeff  " + words(n_words, i)},
                "question": {"text": "Who?", "tokens": ["Who", "?"]}, "answers": [{"text": "Him", "tokens": ["Him"]}]}
    # two shards, read in sorted order so row indices match the hub's
    pd.DataFrame([row(2, 400), row(3, 10)]).to_parquet(snap / "train-00001-of-00002.parquet")
    pd.DataFrame([row(0, 400), row(1, 400)]).to_parquet(snap / "train-00000-of-00002.parquet")
    task = task_from_conf("narrativeqa_triforce", f"task.data_path={snap.parent}", "task.indices=[0,2,3]",
                          "task.input_tokens=150", "task.template_tokens=60")
    samples = task.samples()
    assert [s.id for s in samples] == ["0", "2", "3"] and samples[0].max_new_tokens == 256 and not samples[0].chat
    assert samples[1].turns[0].startswith(words(400, 2)[:20])  # document.text[3:]
    book = ids_of(tok, samples[1].turns[0], special=True)[:90]
    golden = ("You are a helpful assistant. USER: Please read a part of the book below, and then give me the summary."
              "\n[start of the book]\n" + tok.decode(book, skip_special_tokens=True) + "\n[end of the book]\n\nNow you"
              " have read it. Please summarize it for me. First, tell me the title and the author, and then tell the "
              "story in 500 words.\n\nASSISTANT: ")
    p = task.prompt_ids(tok, samples[1], 0, [])
    assert p == ids_of(tok, golden, special=True) and is_raw(tok, p)
    assert [s.id for s in task.samples(tok)] == ["0", "2"]  # row 3's book is shorter than 90 tokens
    with pytest.raises(ConfigError, match="task.input_tokens=150"):
        task.prompt_ids(tok, samples[2], 0, [])
    with pytest.raises(ConfigError, match="task.indices has rows"):
        NarrativeQATriForceTask(data_path=str(snap.parent), indices=[0, 4]).samples()


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

def test_runner_completes_two_turn_mt_bench(tmp_path):
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
    assert int(rows[1]["prompt_tokens"]) > int(rows[0]["prompt_tokens"]) + len(ids_of(build_tiny_tokenizer(),
                                                                                       MT_ROWS[0]["turns"][1]))
    assert first["turn"] == 0 and len(first["tokens"]) == int(rows[0]["new_tokens"])


def test_runner_completes_pg19(tmp_path):
    path = tmp_path / "test-00000-of-00001.parquet"
    pg19_frame().iloc[[0, 2]].to_parquet(path)
    run_dir = tmp_path / "run"
    summary = Runner().run(resolve(make_cfg(tmp_path, "bench.warmup=0", "task=pg19", f"task.data_path={path}",
                              "task.prefix_tokens=48", "bench.max_new_tokens=4"), run_dir))
    rows = read_rows(run_dir)
    assert [r["sample_id"] for r in rows] == ["0", "1"] and {r["prompt_tokens"] for r in rows} == {"48"}
    assert {r["status"] for r in rows} == {"ok"} and summary["exact_match_rate"] == 1.0
