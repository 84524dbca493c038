"""SuffixDecoding against ArcticInference (``arctic_inference/suffix_decoding/cache.py``, ``csrc/suffix_decoding/
suffix_tree.cc`` at 9d46438): greedy outputs replayed through our drafter give the same drafts, hence the same accept
lengths, as a plain re-implementation of the official cache written here (an uncompressed trie with the official
sibling list, compressed nodes found on the fly, libstdc++'s priority queue, float32); the per-request tree holds
the prompt and the generated tokens; a bounded cache evicts oldest-first; state crosses requests and snapshots."""

import json
import random

import numpy as np
import pytest

from baselines.suffix_decoding import SuffixDecoder
from baselines.suffix_tree import SuffixTree
from baselines.vanilla import VanillaDecoder
from tests.lossless import PROMPTS

F = np.float32


# ---------------------------------------------------------------- the official cache, plainly
class Node:
    def __init__(self):
        self.count, self.kids, self.order = 0, {}, []  # order: the official siblings list (tokens)


class RefTree:
    """suffix_tree.cc as a trie: one node per token; ``order`` moves a child whose count changed to the front of
    its count group and appends new children (``_increment_count`` / ``_decrement_count`` / case 1b)."""

    def __init__(self, depth):
        self.depth, self.root, self.seqs, self.active = depth, Node(), {}, {}

    def _move(self, node, tok):
        child = node.kids[tok]
        node.order.remove(tok)
        at = next((i for i, t in enumerate(node.order) if node.kids[t].count <= child.count), len(node.order))
        node.order.insert(at, tok)

    def extend(self, sid, toks):
        for tok in toks:
            self.seqs.setdefault(sid, []).append(tok)
            active = self.active.setdefault(sid, [])
            active.append(self.root)
            if len(active) > self.depth:
                active.pop(0)
            self.root.count += 1
            for i, node in enumerate(active):
                if tok in node.kids:
                    node.kids[tok].count += 1
                    self._move(node, tok)
                else:
                    node.kids[tok] = Node()
                    node.kids[tok].count = 1
                    node.order.append(tok)
                active[i] = node.kids[tok]

    def remove(self, sid):
        seq = self.seqs.pop(sid)
        self.active.pop(sid)
        for start in range(len(seq)):
            node = self.root
            node.count -= 1
            for tok in seq[start: start + self.depth]:
                child = node.kids[tok]
                if child.count == 1:
                    del node.kids[tok]
                    node.order.remove(tok)
                    break
                child.count -= 1
                self._move(node, tok)
                node = child

    def ends(self, node):  # a compressed node of the official tree ends here
        return len(node.kids) != 1 or node.kids[node.order[0]].count < node.count

    def segment(self, tok, node):  # the compressed node that starts at child ``node``: [(token, trie node)]
        out = [(tok, node)]
        while not self.ends(node):
            tok = node.order[0]
            node = node.kids[tok]
            out.append((tok, node))
        return out

    def speculate(self, ctx, max_tokens, factor, offset, min_prob, tree):
        best = dict(tokens=[], parents=[], score=F(0), match_len=0)
        for m in range(1, len(ctx)):
            node, path = self.root, ctx[len(ctx) - m:]
            for tok in path:
                node = node.kids.get(tok)
                if node is None:
                    return best
            limit = max(min(max_tokens, int(float(F(F(m) * F(factor)) + F(offset)) + 1e-6)), 0)
            draft = (self._tree if tree else self._path)(node, limit, F(min_prob))
            if draft["score"] >= best["score"]:
                best = dict(draft, match_len=m)
        return best

    def _tree(self, node, limit, min_prob):
        tokens, parents, score, heap = [], [], F(0), []
        seg, idx = self._segment(node)
        heap_push(heap, (F(1), seg, idx, -1))
        while len(tokens) < limit and heap:
            prob, seg, idx, parent = heap_pop(heap)
            if idx < len(seg):
                tokens.append(seg[idx][0])
                parents.append(parent)
                score = F(score + prob)
                heap_push(heap, (prob, seg, idx + 1, len(tokens) - 1))
            else:
                end = seg[-1][1]
                for tok in end.order:
                    p = F(F(prob * F(end.kids[tok].count)) / F(end.count))
                    if p < min_prob:
                        break
                    heap_push(heap, (p, self.segment(tok, end.kids[tok]), 0, parent))
        return dict(tokens=tokens, parents=parents, score=score)

    def _path(self, node, limit, min_prob):
        tokens, score, prob = [], F(0), F(1)
        seg, idx = self._segment(node)
        while len(tokens) < limit and prob >= min_prob:
            if idx < len(seg):
                tokens.append(seg[idx][0])
                score = F(score + prob)
                idx += 1
            else:
                end = seg[-1][1]
                if not end.order:
                    break
                prob = F(prob * F(F(end.kids[end.order[0]].count) / F(end.count)))
                seg, idx = self.segment(end.order[0], end.kids[end.order[0]]), 0
        return dict(tokens=tokens, parents=list(range(-1, len(tokens) - 1)), score=score)

    def _segment(self, node):
        """_match_context: the match ends at trie node ``node``, inside a compressed node or at its end."""
        if self.ends(node):
            return [(None, node)], 1
        return self.segment(node.order[0], node.kids[node.order[0]]), 0


def heap_push(c, item):  # std::push_heap, comparing probabilities only
    c.append(item)
    hole = len(c) - 1
    parent = (hole - 1) // 2
    while hole > 0 and c[parent][0] < item[0]:
        c[hole] = c[parent]
        hole, parent = parent, (parent - 1) // 2
    c[hole] = item


def heap_pop(c):  # std::pop_heap (__adjust_heap then __push_heap) and pop_back
    top = c[0]
    if len(c) > 1:
        length, value = len(c) - 1, c[-1]
        c[-1] = top
        hole = second = 0
        while second < (length - 1) // 2:
            second = 2 * (second + 1)
            if c[second][0] < c[second - 1][0]:
                second -= 1
            c[hole], hole = c[second], second
        if length % 2 == 0 and second == (length - 2) // 2:
            second = 2 * (second + 1)
            c[hole], hole = c[second - 1], second - 1
        parent = (hole - 1) // 2
        while hole > 0 and c[parent][0] < value[0]:
            c[hole] = c[parent]
            hole, parent = parent, (parent - 1) // 2
        c[hole] = value
    c.pop()
    return top


class RefCache:
    """cache.py's SuffixDecodingCache: a tree per active request (prompt + response) and a global tree of
    responses, FIFO-evicted beyond ``max_cached``; the request's own draft wins ties."""

    def __init__(self, depth, max_cached, **spec):
        self.depth, self.max_cached, self.spec, self.glob, self.cached = depth, max_cached, spec, RefTree(depth), []

    def start_request(self, rid, prompt):
        self.local = RefTree(self.depth)
        self.local.extend(0, prompt)
        if self.max_cached != 0:
            self.cached.append(rid)
            while self.max_cached > 0 and len(self.cached) > self.max_cached:
                if self.cached[0] in self.glob.seqs:
                    self.glob.remove(self.cached[0])
                self.cached.pop(0)

    def add_active_response(self, rid, toks):
        self.local.extend(0, toks)
        if rid in self.cached:
            self.glob.extend(rid, toks)

    def speculate(self, ctx):
        ctx = ctx[-self.depth:]
        d1 = self.local.speculate(ctx, **self.spec)
        d2 = self.glob.speculate(ctx, **self.spec)
        return d1 if d1["score"] >= d2["score"] else d2


# ---------------------------------------------------------------- replay
def accepted(tokens, parents, truth, root_parent=-1):
    n, node = 0, root_parent
    for t in truth:
        node = next((i for i, (tok, p) in enumerate(zip(tokens, parents)) if p == node and tok == t), None)
        if node is None:
            break
        n += 1
    return n


def replay(requests, depth=64, max_cached=-1, **spec):
    """Each request's greedy output replayed through SuffixDecoder and the reference; returns both accept lengths."""
    ours = SuffixDecoder(max_depth=depth, max_cached_outputs=None if max_cached < 0 else max_cached, **spec)
    ref = RefCache(depth, max_cached, max_tokens=ours.max_spec_tokens, factor=ours.max_spec_factor,
                   offset=ours.max_spec_offset, min_prob=ours.min_token_prob, tree=ours.tree)
    got, want = [], []
    for rid, (prompt, out) in enumerate(requests):
        state = ours.start(None, prompt, ())
        ref.start_request(rid, prompt)
        response = [out[0]]  # the prefill's token
        ref.add_active_response(rid, response)
        while len(response) < len(out):
            tree = state.draft(prompt + response, 10 ** 6)
            truth = out[len(response):]
            a, node = 0, 0
            for t in truth:
                node = tree._children.get((node, t))
                if node is None:
                    break
                a += 1
            d = ref.speculate(prompt + response)
            got.append(a)
            want.append(accepted(d["tokens"], d["parents"], truth))
            assert sorted(zip(tree.tokens[1:], tree.parents[1:])) == sorted(
                zip(d["tokens"], [p + 1 for p in d["parents"]])), f"request {rid}, step {len(got)}"
            new = truth[: a + 1]
            response += new
            ref.add_active_response(rid, new)
        ours.finish(state, prompt, response)
    return got, want


@pytest.fixture(scope="module")
def greedy_requests(engine):
    """Greedy outputs of a repetitive and a varied model; every prompt asked twice (the global tree's case)."""
    out = []
    for name in ("llama_mha_rep", "qwen2_gqa"):
        eng = engine(name)
        for text in PROMPTS + PROMPTS[:2]:
            ids = eng.tokenizer(text).input_ids
            out.append((ids, VanillaDecoder().generate(eng, ids, 48).tokens))
    return out


@pytest.mark.parametrize("tree", [True, False])
def test_replay_of_greedy_outputs_matches_the_official_cache(greedy_requests, tree):
    got, want = replay(greedy_requests, tree=tree)
    assert got == want and sum(got) > len(got)  # drafts are accepted (the cache does work)


@pytest.mark.parametrize("depth,spec", [(8, dict(tree=True)), (6, dict(tree=False, max_spec_factor=2.0)),
                                        (64, dict(tree=True, min_token_prob=0.0, max_spec_offset=1.0))])
def test_replay_of_random_small_vocabulary_text_with_ties(depth, spec):
    """Four tokens: equal counts everywhere, so the sibling order and the queue's order decide the drafts."""
    rng = random.Random(depth)
    requests = [([rng.randrange(4) for _ in range(rng.randrange(2, 30))],
                 [rng.randrange(4) for _ in range(rng.randrange(2, 60))]) for _ in range(12)]
    got, want = replay(requests, depth=depth, **spec)
    assert got == want


@pytest.mark.parametrize("tree", [True, False])
def test_replay_of_repeated_text_with_many_occurrences(tree):
    """A phrase repeated dozens of times, now and then varied: matches with more than 16 occurrences whose node
    has one child (grouped without sorting), and some with two."""
    rng = random.Random(13)
    phrase = [rng.randrange(40) for _ in range(9)]

    def text(n):
        return [rng.randrange(40) if rng.random() < 0.03 else t for _ in range(n) for t in phrase]

    requests = [(text(4), text(6)) for _ in range(6)]
    got, want = replay(requests, depth=16, tree=tree)
    assert got == want and sum(got) > 2 * len(got)


@pytest.mark.parametrize("tree", [True, False])
def test_replay_with_frequent_index_merges(tree, monkeypatch):
    """Tokens merged into the sorted index every 24 appends: the cached children of short matches are rebuilt
    and combined with the newest tokens at every step, and drafts stay the official ones."""
    monkeypatch.setattr("baselines.suffix_index.RECENT", 24)
    rng = random.Random(11)
    requests = [([rng.randrange(5) for _ in range(rng.randrange(2, 20))],
                 [rng.randrange(5) for _ in range(rng.randrange(20, 70))]) for _ in range(10)]
    got, want = replay(requests, depth=10, tree=tree)
    assert got == want


def test_per_request_tree_holds_the_prompt_and_the_generated_tokens():
    dec = SuffixDecoder(max_cached_outputs=0)
    state = dec.start(None, [5, 6, 7], ())
    state.draft([5, 6, 7, 8, 9, 8], 10)
    assert state.local.count([8, 9, 8]) == 1 and state.local.count([6, 7, 8]) == 1 and len(dec.global_tree) == 0


def test_bounded_cache_evicts_oldest_first():
    rng = random.Random(3)
    outs = [[rng.randrange(50) for _ in range(30)] for _ in range(5)]
    dec = SuffixDecoder(max_cached_outputs=3, max_depth=8)
    for i, out in enumerate(outs):
        state = dec.start(None, [1000 + i], ())
        dec.finish(state, [1000 + i], out)
        kept = outs[max(0, i - 2): i + 1]  # the last three, the current one included
        assert list(dec._cached) == list(range(max(0, i - 2), i + 1))
        for sub in ([o[j: j + 3] for o in outs for j in (0, 10, 20)]):
            assert dec.global_tree.count(sub) == sum(
                1 for o in kept for j in range(len(o) - 2) if o[j: j + 3] == sub)
    # the reference evicts the same outputs: equal counts in both
    ref = RefTree(8)
    for i, out in enumerate(outs):
        ref.extend(i, out)
        if i >= 3:
            ref.remove(i - 3)
    assert ref.root.count == len(dec.global_tree)


def test_unbounded_by_default_and_state_crosses_requests_and_snapshots():
    dec = SuffixDecoder()
    assert dec.max_cached_outputs is None and dec.max_spec_tokens == dec.max_depth == 64
    out = list(range(100, 140))
    for i in range(3):
        dec.finish(dec.start(None, [i], ()), [i], out)
    snap = dec.snapshot()
    dec.finish(dec.start(None, [9], ()), [9], list(range(200, 240)))
    assert dec.global_tree.count([200, 201]) == 1 and dec.global_tree.count([100, 101]) == 3
    dec.restore(snap)
    assert dec.global_tree.count([200, 201]) == 0 and dec.global_tree.count([100, 101]) == 3
    state = dec.start(None, [7, 100, 101, 102], ())  # the cache drafts the rest of the cached output
    assert state.draft([7, 100, 101, 102, 103], 64).tokens[1:4] == [104, 105, 106]


def test_compact_storage_survives_merges_and_compaction(monkeypatch):
    monkeypatch.setattr("baselines.suffix_index.RECENT", 16)
    rng = random.Random(5)
    tree, seqs = SuffixTree(6), {}
    for i in range(40):
        seqs[i] = [rng.randrange(5) for _ in range(rng.randrange(1, 30))]
        for j in range(0, len(seqs[i]), 4):
            tree.extend(i, seqs[i][j: j + 4])
        if i % 3 == 0:
            tree.remove(i - 2 if i >= 2 else i)
            seqs.pop(i - 2 if i >= 2 else i)
    for sub in ([0], [1, 2], [3, 3, 4], [0, 1, 0, 1]):
        assert tree.count(sub) == sum(1 for s in seqs.values() for j in range(len(s) - len(sub) + 1)
                                      if s[j: j + len(sub)] == sub)


@pytest.mark.parametrize("min_count", [0, 40, float("inf")])
def test_vectorised_children_agree_with_the_plain_grouping(min_count):
    """Large occurrence sets are grouped with numpy (bincount from 2048 on): same children, order and counts."""
    rng = random.Random(7)
    tree = SuffixTree(8)
    for i in range(40):  # token 1: 40 %, 0: 5 %, 2..60: the rest
        tree.extend(i, [1 if u < 0.4 else 0 if u < 0.45 else rng.randrange(2, 61)
                        for u in (rng.random() for _ in range(200))])
    for token in (1, 0, 50):
        occ = tree._matches([7, token])[0][0]
        fast, n_fast = tree._children(occ, 1, min_count)
        plain, n_plain = tree._children(occ.tolist(), 1, min_count)
        assert n_fast == n_plain and [(c, t, list(ps)) for c, t, ps in fast] == plain
    assert len(tree._matches([7, 1])[0][0]) >= 2048 > len(tree._matches([7, 0])[0][0]) > 16


@pytest.mark.slow  # the CLI in a subprocess: the full tier
def test_cli_runs_the_vllm_settings_and_refuses_a_negative_cache(tmp_path):
    """The real CLI: a bounded cache of single-path drafts (the vLLM hook's behaviour) stays exact; -1 (the official
    spelling of unlimited) is refused with the one-line error naming null."""
    from tests.helpers import run_cli
    from tests.helpers import write_question_jsonl

    data, out = write_question_jsonl(tmp_path / "question.jsonl"), tmp_path / "runs"
    proc = run_cli("method=suffix_decoding", "method.tree=false", "method.max_cached_outputs=2", "task=spec_bench",
                   f"task.data_path={data}", "bench.max_new_tokens=12", f"bench.output_dir={out}",
                   "wandb.mode=disabled", "bench.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (summary,) = out.glob("*/spec_bench/*/*/summary.json")
    assert json.loads(summary.read_text())["exact_match_rate"] == 1.0
    proc = run_cli("method=suffix_decoding", "method.max_cached_outputs=-1", f"bench.output_dir={out}", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        "error: method.max_cached_outputs=-1 must be null"), proc.stderr[-2000:]
