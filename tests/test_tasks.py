"""Tasks (builtin, jsonl prompts), prompt construction, and the embedded tiny tokenizer."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from fafo.engine.tiny_tokenizer import CHAT_MARKERS, build_tiny_tokenizer
from fafo.errors import ConfigError
from tasks.base import CHAT_TEMPLATE, FALLBACK_FORMAT, RAW_TEXT, Sample, Task, n_turns
from tasks.builtin import BuiltinTask
from tasks.prompts import PromptsTask

REPO = Path(__file__).resolve().parents[1]
CATEGORIES = {"chat", "multi-turn", "code", "math", "long", "structured"}


class ListTask(Task):
    """A task over a fixed list, for selection tests."""

    def __init__(self, samples, **kwargs):
        super().__init__(**kwargs)
        self._given = samples

    def load_samples(self):
        return list(self._given)


def _marker_ids(tok):
    return set(tok.convert_tokens_to_ids(list(CHAT_MARKERS)))


# ---------------------------------------------------------------- builtin task


def test_builtin_ids_and_categories():
    samples = BuiltinTask().samples()
    ids = [s.id for s in samples]
    assert len(samples) == 12
    assert len(set(ids)) == 12
    assert {s.category for s in samples} == CATEGORIES
    assert all(s.max_new_tokens == 128 for s in samples)
    assert any(not s.chat for s in samples if s.category == "code")
    assert all(n_turns(s) == 2 for s in samples if s.category == "multi-turn")
    assert ids == [s.id for s in BuiltinTask().samples()]  # deterministic order


def test_two_turn_prompt_replays_own_answer(tok):
    task = BuiltinTask()
    sample = next(s for s in task.samples() if n_turns(s) == 2 and s.followup == "own")
    answer = "Crust and Crumb is my favourite name for the bakery."
    p0 = tok.decode(task.prompt_ids(tok, sample, 0, []))
    p1 = tok.decode(task.prompt_ids(tok, sample, 1, ["  " + answer + "\n"]))
    assert p1.startswith(p0)
    assert answer in p1
    assert sample.turns[1] in p1
    assert p1.index(answer) < p1.index(sample.turns[1])
    with pytest.raises(ValueError):
        task.prompt_ids(tok, sample, 1, [])  # the earlier answer is required
    with pytest.raises(ValueError):
        task.prompt_ids(tok, sample, 2, [answer, answer])


def test_raw_samples_get_bos_and_no_chat_markers(tok):
    task = BuiltinTask()
    raw = [s for s in task.samples() if not s.chat]
    assert raw
    for s in raw:
        ids = task.prompt_ids(tok, s, 0, [])
        assert ids[0] == tok.bos_token_id
        assert ids.count(tok.bos_token_id) == 1
        assert not _marker_ids(tok) & set(ids)
        assert tok.decode(ids, skip_special_tokens=True) == s.turns[0]


def test_chat_samples_get_exactly_one_bos(tok):
    task = BuiltinTask()
    for s in task.samples():
        if not s.chat:
            continue
        answers = ["An answer."] * (n_turns(s) - 1)
        for turn in range(n_turns(s)):
            ids = task.prompt_ids(tok, s, turn, answers)
            assert ids[0] == tok.bos_token_id
            assert ids.count(tok.bos_token_id) == 1
            assert _marker_ids(tok) & set(ids)
    with_system = [s for s in task.samples() if s.system]
    assert with_system and with_system[0].system in tok.decode(task.prompt_ids(tok, with_system[0], 0, []))


def test_gold_followup_uses_references(tok):
    sample = Sample(id="g", turns=["Q one?", "Q two?"], followup="gold", references=["GOLD ANSWER", "R2"])
    task = ListTask([sample])
    text = tok.decode(task.prompt_ids(tok, sample, 1, ["MODEL ANSWER"]))
    assert "GOLD ANSWER" in text and "MODEL ANSWER" not in text
    assert "Q two?" in text
    with pytest.raises(ValueError):
        Sample(id="g", turns=["a", "b"], followup="gold")  # no references


def test_no_chat_template_falls_back_with_one_warning_and_says_so(tok, capsys):
    plain = build_tiny_tokenizer()
    plain.chat_template = None
    plain.name_or_path = "plain-for-test"
    sample, raw = Sample(id="p", turns=["Hello there", "And again"]), Sample(id="r", turns=["def f():"], chat=False)
    task = ListTask([sample, raw])
    ids = task.prompt_ids(plain, sample, 1, ["Hi."])
    task.prompt_ids(plain, sample, 0, [])
    warned = [line for line in capsys.readouterr().err.splitlines() if "has no chat template" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: tokenizer 'plain-for-test'")
    assert ids[0] == plain.bos_token_id and ids.count(plain.bos_token_id) == 1
    text = plain.decode(ids[1:])
    assert text == "### User:\nHello there\n\n### Assistant:\nHi.\n\n### User:\nAnd again\n\n### Assistant:\n"
    # what the run's summary records: the rendering each sample got
    assert [task.prompt_format(t, s) for t in (plain, tok) for s in (sample, raw)] == \
        [FALLBACK_FORMAT, RAW_TEXT, CHAT_TEMPLATE, RAW_TEXT]


def test_long_prompt_is_long(tok):
    task = BuiltinTask()
    long = [s for s in task.samples() if s.category == "long"]
    assert long
    for s in long:
        assert len(task.prompt_ids(tok, s, 0, [])) > 1000


# ---------------------------------------------------------------- selection


def _five():
    return [Sample(id=f"s{i}", turns=[f"question {i}"], max_new_tokens=(7 if i == 3 else None))
            for i in range(5)]


def test_ids_then_limit_keep_task_order():
    task = ListTask(_five(), ids=["s4", "s1", "s3"], limit=2, max_new_tokens=50)
    got = task.samples()
    assert [s.id for s in got] == ["s1", "s3"]
    assert [s.max_new_tokens for s in got] == [50, 7]
    assert [s.id for s in ListTask(_five(), limit=3).samples()] == ["s0", "s1", "s2"]
    assert [s.id for s in ListTask(_five(), ids="s2").samples()] == ["s2"]
    assert [s.id for s in BuiltinTask(ids=["long-01", "chat-01"]).samples()] == ["chat-01", "long-01"]


def test_selection_errors():
    with pytest.raises(ConfigError, match=r"task\.ids.*nope"):
        ListTask(_five(), ids=["s1", "nope"]).samples()
    dup = _five() + [Sample(id="s2", turns=["again"])]
    with pytest.raises(ConfigError, match="s2"):
        ListTask(dup).samples()
    for bad in (0, -1, "3", 2.5):
        with pytest.raises(ConfigError, match=r"task\.limit"):
            ListTask(_five(), limit=bad).samples()
    with pytest.raises(ConfigError, match=r"task\.max_new_tokens"):
        ListTask(_five(), max_new_tokens=0).samples()


def test_samples_are_copies():
    task = BuiltinTask()
    first = task.samples()
    first[0].turns.append("mutated")
    first[0].max_new_tokens = 1
    again = task.samples()[0]
    assert len(again.turns) == 1 and again.max_new_tokens == 128


# ---------------------------------------------------------------- jsonl prompts


def _write(tmp_path, lines, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_prompts_task_reads_text_and_turns(tmp_path, tok):
    lines = [
        json.dumps({"id": "a", "turns": ["Hi?", "More?"], "category": "chat", "system": "Be brief."}),
        "",
        json.dumps({"id": 7, "text": "def f(x):\n", "max_new_tokens": 16}),
        json.dumps({"id": "g", "turns": ["One", "Two"], "followup": "gold", "references": ["R1"], "x": 1}),
    ]
    task = PromptsTask(data_path=_write(tmp_path, lines), max_new_tokens=99)
    samples = task.samples()
    assert [s.id for s in samples] == ["a", "7", "g"]
    a, raw, gold = samples
    assert a.chat and a.turns == ["Hi?", "More?"] and a.category == "chat" and a.system == "Be brief."
    assert a.max_new_tokens == 99
    assert not raw.chat and raw.turns == ["def f(x):\n"] and raw.max_new_tokens == 16
    assert gold.followup == "gold" and gold.references == ["R1"]
    assert task.prompt_ids(tok, raw, 0, [])[0] == tok.bos_token_id
    assert "R1" in tok.decode(task.prompt_ids(tok, gold, 1, []))
    assert [s.id for s in PromptsTask(data_path=task.data_path, ids=[7]).samples()] == ["7"]


GOOD = json.dumps({"id": "ok", "text": "fine"})


@pytest.mark.parametrize(
    "bad_line, pattern",
    [
        ("{not json", "invalid JSON"),
        (json.dumps(["id", "text"]), "JSON object"),
        (json.dumps({"text": "no id"}), "`id`"),
        (json.dumps({"id": "x"}), "neither"),
        (json.dumps({"id": "x", "text": "t", "turns": ["u"]}), "both"),
        (json.dumps({"id": "x", "turns": "not a list"}), "`turns`"),
        (json.dumps({"id": "x", "turns": []}), "`turns`"),
        (json.dumps({"id": "x", "text": "t", "max_new_tokens": 0}), "max_new_tokens"),
        (json.dumps({"id": "x", "text": "t", "system": "s"}), "system"),
        (json.dumps({"id": "x", "turns": ["a", "b"], "followup": "gold"}), "references"),
        (json.dumps({"id": "x", "turns": ["a"], "followup": "mine"}), "followup"),
        (json.dumps({"id": "ok", "text": "again"}), "duplicate"),
    ],
)
def test_prompts_task_malformed_lines(tmp_path, bad_line, pattern):
    path = _write(tmp_path, [GOOD, "", bad_line])
    with pytest.raises(ConfigError, match=pattern) as info:
        PromptsTask(data_path=path).samples()
    message = str(info.value)
    assert f"{path}:3" in message
    assert "\n" not in message


def test_prompts_task_path_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"task\.data_path"):
        PromptsTask().samples()
    with pytest.raises(ConfigError, match=r"task\.data_path.*does not exist"):
        PromptsTask(data_path=str(tmp_path / "missing.jsonl")).samples()
    with pytest.raises(ConfigError, match="no samples"):
        PromptsTask(data_path=_write(tmp_path, [""])).samples()


def test_task_configs_instantiate(tmp_path):
    builtin = instantiate(OmegaConf.load(REPO / "conf/task/builtin.yaml"))
    assert isinstance(builtin, BuiltinTask) and builtin.name == "builtin"
    assert len(builtin.samples()) == 12
    cfg = OmegaConf.load(REPO / "conf/task/prompts.yaml")
    prompts = instantiate(cfg)  # constructing never fails; loading does
    with pytest.raises(ConfigError, match=r"task\.data_path"):
        prompts.samples()
    cfg.data_path = _write(tmp_path, [GOOD])
    cfg.ids = ["ok"]
    assert [s.id for s in instantiate(cfg).samples()] == ["ok"]


# ---------------------------------------------------------------- tiny tokenizer


def _builtin_prompts(tok):
    task = BuiltinTask()
    return [task.prompt_ids(tok, s, t, ["A reply."] * t) for s in task.samples() for t in range(n_turns(s))]


def test_tiny_tokenizer_round_trips(tmp_path, tok):
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.chat_template == tok.chat_template
    assert _builtin_prompts(loaded) == _builtin_prompts(tok)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert len(loaded) == len(tok) <= 1024
    text = "Hello, world! déjà vu 42 * 7 = 294\n\tdef f(): pass"
    assert loaded.decode(loaded(text).input_ids, skip_special_tokens=True) == text


def _vocab_digest(tokenizer) -> str:
    return hashlib.sha256(json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()


@pytest.mark.slow
def test_tiny_tokenizer_is_deterministic(tok):
    assert _vocab_digest(build_tiny_tokenizer()) == _vocab_digest(tok)
    code = (
        "import hashlib, json\n"
        "from fafo.engine.tiny_tokenizer import build_tiny_tokenizer\n"
        "v = build_tiny_tokenizer().get_vocab()\n"
        "print(hashlib.sha256(json.dumps(sorted(v.items())).encode()).hexdigest())\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == _vocab_digest(tok)


def test_tiny_tokenizer_rejects_tiny_vocab():
    with pytest.raises(ConfigError, match="vocab_size"):
        build_tiny_tokenizer(100)
