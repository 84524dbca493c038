"""The shared tree helper (fafo/tree.py): masks, acceptance, KV compaction, and a tree-drafting loop on it that is
token-identical to vanilla greedy."""

import random

import pytest
import torch

from baselines.vanilla import VanillaDecoder
from fafo.engine.attention import AttentionPlan
from fafo.engine.static_shapes import pad_step
from fafo.tree import DraftTree, greedy_tree_step, verify_tree


def test_trie_dedupes_and_masks_ancestors():
    tree = DraftTree.from_paths(7, [[1, 2, 3], [1, 2, 4], [5]])
    assert tree.tokens == [7, 1, 2, 3, 4, 5] and tree.parents == [-1, 0, 1, 2, 2, 0]
    assert tree.depths == [0, 1, 2, 3, 3, 1]
    m = tree.mask()
    assert m[4].tolist() == [True, True, True, False, True, False]  # ancestors + itself
    tokens, positions, mask = tree.inputs(10)
    assert positions == [10, 11, 12, 13, 13, 11] and tokens == tree.tokens and torch.equal(mask, m)
    tokens, positions, slots, plan, n_real = pad_step(tokens, positions, range(10, 16),
                                                      AttentionPlan(prefix=10, step_mask=mask), 8)
    pm = plan.step_mask  # the engine's static-shape padding: each padding node sees only itself
    assert n_real == 6 and pm[6].tolist() == [False] * 6 + [True, False] and not pm[:6, 6:].any()
    assert tokens[6:] == [5, 5] and positions[6:] == [11, 11] and slots == list(range(10, 18))
    assert tree.accept_greedy([1, 2, 4, 0, 0, 0]) == [1, 2, 4]
    assert tree.accept_greedy([5, 0, 0, 0, 0, 9]) == [5]
    assert tree.accept_greedy([3, 0, 0, 0, 0, 0]) == []
    capped = DraftTree.from_paths(7, [[1, 2, 3], [1, 2, 4], [5]], max_nodes=4)
    assert capped.tokens == [7, 1, 2, 3]


def test_a_tree_from_arrays_is_the_tree_add_builds_and_its_mask_holds_every_ancestor():
    rng = random.Random(0)
    for n in (1, 2, 9, 81):
        tree = DraftTree.root(5)
        while len(tree) < n:  # random parents, siblings with distinct tokens
            tree.add(rng.randrange(len(tree)), rng.randrange(50))
        same = DraftTree.from_arrays(list(tree.tokens), list(tree.parents))
        assert same.tokens == tree.tokens and same._children == tree._children
        mask = same.mask()
        for i in range(n):
            ancestors, node = {i}, i
            while tree.parents[node] >= 0:
                node = tree.parents[node]
                ancestors.add(node)
            assert set(torch.nonzero(mask[i]).flatten().tolist()) == ancestors
    with pytest.raises(ValueError, match="same token"):
        DraftTree.from_arrays([5, 1, 1], [-1, 0, 0])


@pytest.mark.parametrize("name", ["llama_mha", "qwen2_gqa"])
def test_tree_logits_equal_sequential_decoding(engine, name, monkeypatch):
    """A node's logits equal those of decoding its root path token by token (prefix + tree attention exact)."""
    eng = engine(name)
    monkeypatch.setattr(eng, "static_shapes", True)  # the engine pads the tree to size=9
    ids = eng.tokenizer("The quick brown fox").input_ids
    tree = DraftTree.from_paths(ids[-1], [[11, 12, 13], [11, 14], [15, 16]])
    cache = eng.cache(len(ids) + 16)
    eng.prefill(cache, ids[:-1])
    got = verify_tree(eng, cache, tree, len(ids) - 1, size=9)
    assert got.shape[0] == len(tree)
    for node, path in ((3, [11, 12, 13]), (4, [11, 14]), (6, [15, 16])):
        seq = ids + path
        c2 = eng.cache(len(seq) + 16)
        want = eng.prefill(c2, seq, logits="all")[0, -1]
        torch.testing.assert_close(got[node], want, rtol=1e-5, atol=1e-5)


def _oracle_tree_generate(eng, ids, max_new, truth, rng):
    """Trees mixing the true continuation (cut at a random depth) with random distractor branches."""
    cache = eng.cache(len(ids) + max_new + 64)
    last = eng.prefill(cache, ids)[0, -1]
    out, N = [int(last.argmax())], len(ids)
    while len(out) < max_new:
        pos = len(out)
        good = truth[pos: pos + rng.randint(0, 5)]
        paths = [[rng.randrange(eng.model.args.vocab_size) for _ in range(3)] for _ in range(3)]
        paths.insert(rng.randrange(4), good)
        tree = DraftTree.from_paths(out[-1], paths)
        _, new = greedy_tree_step(eng, cache, tree, N, size=len(tree) + rng.randint(0, 3))
        N += len(new)
        out += new
    return out[:max_new]


@pytest.mark.parametrize("static_shapes", [False, True])
@pytest.mark.parametrize("name", ["llama_mha", "llama_gqa", "qwen2_gqa"])
def test_tree_steps_are_lossless_and_compact_kv(engine, name, static_shapes, monkeypatch):
    eng = engine(name)
    rng = random.Random(0)
    for text in ("Once upon a time", "def f(x):\n    return"):
        ids = eng.tokenizer(text).input_ids
        ref = VanillaDecoder().generate(eng, ids, 30).tokens
        monkeypatch.setattr(eng, "static_shapes", static_shapes)  # True: the engine pads each tree step
        assert _oracle_tree_generate(eng, ids, 30, ref, rng) == ref
        monkeypatch.setattr(eng, "static_shapes", False)
