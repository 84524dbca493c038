"""SAM-Decoding against the official automaton-only rule (hyx1999/SAM-Decoding ``samd_sam_only``, commit 18c41f05):
greedy outputs replayed through our drafter give the same drafts and accept lengths as a brute-force
re-implementation written here from the official description, for the dynamic automaton (the longest suffix of
``text + [token]`` with an earlier occurrence, the continuation of its first occurrence, no back-off) and for the
corpus automaton (the best-first top-K tree over corpus counts); the real decode commits what the replay predicts.
Also: token-identical to vanilla and exact in distribution with corpus trees, the corpus builder and the published
preset through the CLI."""

import heapq
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from baselines.sam_decoding import SAMDecoder, tokenizer_fingerprint
from baselines.suffix_automaton import DynamicAutomaton
from baselines.vanilla import VanillaDecoder
from fafo.errors import ConfigError
from fafo.sampling import Sampling
from fafo.sampling_check import compare, run_many
from tests.lossless import PROMPTS, assert_lossless
from tests.sampling_law import BIASED, K, SAMPLES, SAMPLING, passes

REPO = Path(__file__).resolve().parents[1]
GIFTS = ["a partridge in a pear tree", "two turtle doves", "three French hens", "four calling birds",
         "five gold rings", "six geese a-laying", "seven swans a-swimming", "eight maids a-milking",
         "nine ladies dancing", "ten lords a-leaping", "eleven pipers piping", "twelve drummers drumming"]
DAYS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth", "eleventh",
        "twelfth"]


def twelve_days(first: int = 0, last: int = 12) -> str:
    """Verses of the traditional carol (a real, highly repetitive text)."""
    verses = []
    for d in range(first, last):
        gifts = [GIFTS[g] for g in range(d, -1, -1)]
        if d:
            gifts[-1] = "and " + gifts[-1]
        verses.append(f"On the {DAYS[d]} day of Christmas my true love sent to me: " + ", ".join(gifts) + ".")
    return "\n".join(verses)


# ------------------------------------------------------------------ the official rule, by brute force
def _s(tokens) -> str:
    return "".join(chr(0x100 + t) for t in tokens)


def _longest_suffix_in(haystack: str, seq: list[int]) -> tuple[int, int]:
    """(m, end): the longest suffix of ``seq`` occurring in ``haystack``, the end of its first occurrence."""
    lo, hi, end = 0, len(seq), 0  # occurrence is monotone in the suffix length: binary search
    while lo < hi:
        mid = (lo + hi + 1) // 2
        at = haystack.find(_s(seq[-mid:]))
        if at >= 0:
            lo, end = mid, at + mid
        else:
            hi = mid - 1
    return lo, end


def official_dynamic(text, token, max_predicts, alpha):
    """``DynSAM.lookup`` + ``gen_draft``: (match, draft tokens after the current one)."""
    m, end = _longest_suffix_in(_s(text), text + [token])
    n = min(max_predicts, 1 + int(m * alpha))
    return m, (text[end:end + n - 1] if m else [])


class OfficialCorpus:
    """``StaticSAM`` by brute force over the corpus text: counts are occurrence counts, children are ordered by
    count then by first occurrence (the automaton's transition insertion order), the tree is ``gen_draft``'s."""

    def __init__(self, docs, eos):
        text = []
        for d in docs:
            text += d + ([eos] if not d or d[-1] != eos else [])
        self.text, self.s = text, _s(text)

    def ends(self, seq):
        out, at, key = [], self.s.find(_s(seq)), _s(seq)
        while at >= 0:
            out.append(at + len(seq))
            at = self.s.find(key, at + 1)
        return out

    def children(self, seq, k):
        firsts = {}
        for e in self.ends(seq):
            if e < len(self.text):
                firsts.setdefault(self.text[e], e)
        ordered = sorted(firsts, key=firsts.get)
        counts = {c: len(self.ends(seq + [c])) for c in ordered}
        return sorted(ordered, key=lambda c: -counts[c])[:k], counts

    def tree(self, context, token, match, max_predicts, alpha, k):
        """Paths of the official top-K tree after the longest corpus match of ``context + [token]``."""

        class Item:
            def __init__(self, prob, seq, path, depth):
                self.prob, self.seq, self.path, self.depth = prob, seq, path, depth

            def __lt__(self, other):
                return self.prob < other.prob

        m, _ = _longest_suffix_in(self.s, context + [token])
        n = min(max_predicts, 1 + int(match * alpha))
        heap, paths, per_depth = [Item(-1.0, (context + [token])[-m:], (), 0)], [], {}
        while len(paths) != n and heap:
            item = heapq.heappop(heap)
            if per_depth.get(item.depth, 0) + 1 > k:
                continue
            per_depth[item.depth] = per_depth.get(item.depth, 0) + 1
            paths.append(item.path)
            if len(paths) == n:
                break
            total = len(self.ends(item.seq))
            kids, counts = self.children(item.seq, k)
            for c in kids:
                heapq.heappush(heap, Item(item.prob * (counts[c] / total), item.seq + [c], item.path + (c,),
                                          item.depth + 1))
        return paths


def official_draft(context, corpus, max_predicts=40, alpha=4.0, len_bias=5, k=8):
    """``DraftModel.lookup``: (the root-to-node paths of the official draft for the current token ``context[-1]``,
    whether the corpus drafted it)."""
    text, token = context[:-1], context[-1]
    m, chain = official_dynamic(text, token, max_predicts, alpha)
    if corpus is not None:
        sm, _ = _longest_suffix_in(corpus.s, context)
        if sm - len_bias > m:
            return corpus.tree(text, token, sm - len_bias, max_predicts, alpha, k), True
    return [tuple(chain[:i]) for i in range(len(chain) + 1)], False


def _paths(tree):
    out = []
    for i in range(len(tree)):
        path, node = [], i
        while node:
            path.append(tree.tokens[node])
            node = tree.parents[node]
        out.append(tuple(reversed(path)))
    return out


def _accepted(paths, future) -> int:
    return max(len(p) for p in paths if list(p) == future[:len(p)])


def replay(method, eng, prompt, out, corpus, **official):
    """Replay a greedy output through our drafter and the official rule (the same drafts at every step); returns
    (tokens committed per step, {"corpus": steps drafted from the corpus, "branched": drafts with branches,
    "accepted_from_corpus": tokens accepted from corpus drafts})."""
    state = method.start(eng, prompt, ())
    context, i, accepts = prompt + out[:1], 1, []
    seen = {"corpus": 0, "branched": 0, "accepted_from_corpus": 0}
    while i < len(out):
        ours = _paths(state.draft(context, len(out) - i - 1))
        theirs, from_corpus = official_draft(context, corpus, **official)
        theirs = [p for p in theirs if len(p) <= len(out) - i - 1]
        assert sorted(ours) == sorted(theirs), f"step at output token {i}"
        acc = _accepted(ours, out[i:])
        assert acc == _accepted(theirs, out[i:])
        seen["corpus"] += from_corpus
        seen["accepted_from_corpus"] += acc * from_corpus
        seen["branched"] += len(ours) > 1 + max(len(p) for p in ours)
        accepts.append(min(acc + 1, len(out) - i))
        context += out[i:i + acc + 1]
        i += acc + 1
    return accepts, seen


# ------------------------------------------------------------------ replays
@pytest.mark.parametrize("name,text", [("llama_mha_rep", PROMPTS[1]), ("qwen2_gqa", PROMPTS[1]),
                                       ("qwen2_gqa_rep", PROMPTS[2])])
def test_dynamic_automaton_replays_greedy_outputs_as_the_official_rule(engine, name, text):
    eng = engine(name)
    prompt = eng.tokenizer(text).input_ids
    out = VanillaDecoder().generate(eng, prompt, 120).tokens
    method = SAMDecoder()
    accepts, seen = replay(method, eng, prompt, out, None)
    assert seen["corpus"] == 0 and sum(accepts) == len(out) - 1
    assert method.generate(eng, prompt, 120).accept_lengths == accepts  # the real decode commits the replay's steps
    if name.endswith("_rep"):
        assert (len(out) - 1) / len(accepts) > 1.5  # loops: the automaton does the work (at most a period a step)


def test_dynamic_automaton_on_a_real_repetitive_text(engine):
    eng = engine("llama_mha")
    ids = eng.tokenizer(twelve_days()).input_ids
    prompt, out = ids[:20], ids[20:]
    accepts, _ = replay(SAMDecoder(), eng, prompt, out, None)
    assert (len(out) - 1) / len(accepts) > 4  # verses repeat with variation: long continuations accepted
    replay(SAMDecoder(n_predicts=60), eng, prompt, out, None, max_predicts=60)


def test_corpus_tree_replays_as_the_official_top_k_tree(engine, tmp_path):
    """The published setting (60 nodes, len_bias 0, vocabulary added) over a corpus of the model's own answers
    (one of them the first 30 tokens of the replayed output) and of a real text's first verses."""
    eng = engine("llama_mha_rep")
    docs = []
    for text, n in ((PROMPTS[0], 80), (PROMPTS[1], 30)):
        ids = eng.tokenizer(text).input_ids
        docs.append(ids + VanillaDecoder().generate(eng, ids, n).tokens)
    docs.append(eng.tokenizer(twelve_days(0, 6)).input_ids)
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"ids": d}) + "\n" for d in docs))
    method = SAMDecoder(n_predicts=60, len_bias=0, corpus_path=str(path), add_vocabulary=True)
    method.setup(eng)
    corpus = OfficialCorpus(docs + [[i] for i in range(len(eng.tokenizer))], eng.tokenizer.eos_token_id)
    official = dict(max_predicts=60, len_bias=0)
    prompt = eng.tokenizer(PROMPTS[1]).input_ids
    out = VanillaDecoder().generate(eng, prompt, 120).tokens
    accepts, seen = replay(method, eng, prompt, out, corpus, **official)
    assert seen["corpus"] > 5 and seen["accepted_from_corpus"] > 20, seen
    assert method.generate(eng, prompt, 120).accept_lengths == accepts  # the real decode commits the replay's steps
    later = eng.tokenizer(twelve_days(6, 12)).input_ids  # later verses: the corpus knows the gifts, not the lines
    accepts, seen = replay(method, eng, later[:12], later[12:], corpus, **official)
    assert seen["branched"] > 3 and seen["accepted_from_corpus"] > 20, seen
    # len_bias: the corpus must beat the dynamic match by this much
    biased = SAMDecoder(n_predicts=60, len_bias=3, corpus_path=str(path), add_vocabulary=True)
    biased.setup(eng)
    _, seen = replay(biased, eng, later[:12], later[12:], corpus, max_predicts=60, len_bias=3)
    assert seen["corpus"] > 0, seen


def test_automaton_cursor_equals_brute_force_on_random_texts():
    import random

    rng = random.Random(0)
    for _ in range(200):
        text = [rng.randrange(3) for _ in range(rng.randrange(1, 40))]
        sam = DynamicAutomaton()
        for cut in sorted(rng.randrange(len(text) + 1) for _ in range(3)):  # committed in pieces, as decoding does
            sam.extend(text[len(sam):cut])
        sam.extend(text[len(sam):])
        token = rng.randrange(3)
        state, match = sam.lookup(token)
        want, draft = official_dynamic(text, token, 8, 4.0)
        assert match == want and sam.continuation(state, min(8, 1 + 4 * match) - 1) == draft


# ------------------------------------------------------------------ lossless, exact, refused
def _answers_corpus(eng, tmp_path) -> str:
    ids = []
    for text in PROMPTS:
        p = eng.tokenizer(text).input_ids
        ids.append(p + VanillaDecoder().generate(eng, p, 60).tokens)
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"ids": d, "tokenizer": tokenizer_fingerprint(eng.tokenizer)}) + "\n"
                            for d in ids))
    return str(path)


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_gqa_rep"])
def test_corpus_trees_are_token_identical_to_vanilla(engine, tmp_path, name, monkeypatch):
    eng = engine(name)
    method = SAMDecoder(n_predicts=60, len_bias=0, corpus_path=_answers_corpus(eng, tmp_path), add_vocabulary=True)
    method.setup(eng)
    taus = assert_lossless(method, eng)
    assert max(taus) > 2  # the corpus holds these continuations
    monkeypatch.setattr(eng, "static_shapes", True)
    assert_lossless(method, eng, max_new=24, prompts=PROMPTS[:2])


def _sampled(law, tmp_path):
    eng, ids, joint = law("rep2")
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"ids": ids + VanillaDecoder().generate(eng, ids, 40).tokens}) + "\n")
    method = SAMDecoder(n_predicts=60, len_bias=0, corpus_path=str(path), add_vocabulary=True)
    method.setup(eng)
    seqs, tau = run_many(method, eng, ids, SAMPLING, K, SAMPLES)
    assert tau > 1.1
    return passes(compare(seqs, joint, K))


def test_corpus_trees_are_exact_in_distribution(law, tmp_path):
    assert _sampled(law, tmp_path)


@pytest.mark.slow
def test_corpus_trees_with_a_biased_verifier_fail(law, tmp_path, monkeypatch):
    for attr, fn in BIASED.items():
        monkeypatch.setattr(Sampling, attr, staticmethod(fn))
    assert not _sampled(law, tmp_path)


def test_a_corpus_of_another_tokenizer_or_none_is_refused(engine, tmp_path):
    eng = engine("llama_gqa")
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"ids": [1, 2, 3], "tokenizer": "0123456789abcdef", "model": "other"}) + "\n")
    with pytest.raises(ConfigError, match=r"^method.corpus_path=.*another tokenizer"):
        SAMDecoder(corpus_path=str(path)).check_target(None, eng.tokenizer)
    path.write_text(json.dumps({"ids": [1, 10 ** 6]}) + "\n")
    with pytest.raises(ConfigError, match=r"beyond the target's vocabulary"):
        SAMDecoder(corpus_path=str(path)).check_target(None, eng.tokenizer)
    path.write_text(json.dumps({"ids": [1, "x"]}) + "\n")
    with pytest.raises(ConfigError, match=r"ids must be a list of token ids"):
        SAMDecoder(corpus_path=str(path))
    with pytest.raises(ConfigError, match=r"^method.corpus_path is required"):
        SAMDecoder(corpus_required=True).check_target(None, eng.tokenizer)


# ------------------------------------------------------------------ the corpus builder and the preset, through the CLI
def _run(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # the CLI in a subprocess: the full tier
def test_published_preset_with_a_built_corpus_through_the_cli(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    build = _run("scripts/build_sam_corpus.py", "task.ids=[chat-01,code-01,struct-01]", "bench.max_new_tokens=48",
                 "--out", str(corpus))
    assert build.returncode == 0, build.stderr
    records = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert [r["sample_id"] for r in records] == ["chat-01", "code-01", "struct-01"]
    assert all(len(r["ids"]) > r["n_prompt"] for r in records) and records[0]["model"] == "tiny-llama"
    common = ["-m", "fafo.bench", "method=sam_decoding_published", "task.ids=[chat-01,code-01]",
              "bench.max_new_tokens=48", f"bench.output_dir={tmp_path / 'runs'}", "bench.progress=false",
              "bench.warmup=0"]
    missing = _run(*common)
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].startswith(
        "error: method.corpus_path is required by this preset")
    run = _run(*common, f"method.corpus_path={corpus}")
    assert run.returncode == 0, run.stderr
    summary = json.loads(next((tmp_path / "runs").rglob("summary.json")).read_text())
    assert summary["exact_match_rate"] == 1.0
    assert summary["tau"] > 3  # the corpus holds these very answers (a leak on purpose: the tree does the work)
    config = next((tmp_path / "runs").rglob("config.yaml")).read_text()
    for line in ("n_predicts: 60", "len_bias: 0", "alpha: 4.0", "topk: 8", "add_vocabulary: true"):
        assert line in config, line
    # the same corpus from the run's recorded answers (no generation): the task's prompts + the recorded tokens
    again = tmp_path / "again.jsonl"
    outputs = next((tmp_path / "runs").rglob("outputs.jsonl"))
    build = _run("scripts/build_sam_corpus.py", "task.ids=[chat-01,code-01,struct-01]", "--answers", str(outputs),
                 "--out", str(again))
    assert build.returncode == 0, build.stderr
    assert [json.loads(line)["ids"] for line in again.read_text().splitlines()] == [r["ids"] for r in records[:2]]


def test_corpus_builder_reads_the_official_prompt_response_records(tmp_path):
    """The official ``sam_dialogues`` records: prompt + response tokenised together, special tokens included."""
    sys.path.insert(0, str(REPO / "scripts"))
    from build_sam_corpus import main

    answers = tmp_path / "dialogues.jsonl"
    answers.write_text(json.dumps({"prompt": "USER: hi\nASSISTANT:", "response": " hello there"}) + "\n")
    assert main(["--answers", str(answers), "--out", str(tmp_path / "c.jsonl")]) == 0
    record = json.loads((tmp_path / "c.jsonl").read_text())
    from fafo.bench.naming import checkpoint
    from tests.helpers import make_cfg

    tok = checkpoint(make_cfg(tmp_path).model).tokenizer
    assert record["ids"] == tok("USER: hi\nASSISTANT: hello there").input_ids
    assert record["tokenizer"] == tokenizer_fingerprint(tok)
    assert main(["--answers", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "d.jsonl")]) == 2
