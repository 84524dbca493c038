"""Task loaders of the long-context tasks: LongBench, SCBench, PG-19 and TriForce's NarrativeQA read from fixtures
written in their real release formats and field names, through the same code path as a hub id; prompts checked
against golden strings (LongBench's ``dataset2prompt.json`` templates, SCBench's) or raw token prefixes, middle
truncation in tokens keeping head and tail, and the runner completing a PG-19 fixture on the tiny model.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import copy
import json
import zipfile

import pandas as pd
import pytest

from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.errors import ConfigError
from tasks.base import head_token_ids, truncate_middle
from tasks.longbench import LongBenchTask
from tasks.narrativeqa import NarrativeQATriForceTask
from tasks.pg19 import PG19Task
from tasks.scbench import SCBenchTask
from tests.helpers import chat, ids_of, is_raw, make_cfg, read_rows, task_from_conf, words, write_jsonl


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
        assert (task.prompt_format(tok, s), raw.prompt_format(tok, s)) == ("chat template", "raw text")


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


# ---------------------------------------------------------------- the runner

def test_runner_completes_pg19(tmp_path):
    path = tmp_path / "test-00000-of-00001.parquet"
    pg19_frame().iloc[[0, 2]].to_parquet(path)
    run_dir = tmp_path / "run"
    summary = Runner().run(resolve(make_cfg(tmp_path, "bench.warmup=0", "task=pg19", f"task.data_path={path}",
                              "task.prefix_tokens=48", "bench.max_new_tokens=4"), run_dir))
    rows = read_rows(run_dir)
    assert [r["sample_id"] for r in rows] == ["0", "1"] and {r["prompt_tokens"] for r in rows} == {"48"}
    assert {r["status"] for r in rows} == {"ok"} and summary["exact_match_rate"] == 1.0
