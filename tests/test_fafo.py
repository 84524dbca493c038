"""FAFO-Stream and FAFO-2forward (method configs fafo_stream, fafo_2forward): lossless and doing what the paper does."""

import pytest
import torch

from baselines.vanilla import VanillaDecoder
from fafo.compress.stream import StreamingLLM
from fafo.errors import ConfigError
from fafo.fafo import FAFODecoder, FAFOState, fafo_step_mask
from fafo.pool import CandidatePool
from fafo.sampling import Sampling
from tests.conftest import LOSSLESS_MODELS
from tests.helpers import assert_cache_is_permuted_prefill, track_region_after_commits
from tests.lossless import PROMPTS, assert_lossless

SMALL = StreamingLLM(sink=2, local=6)  # budget 8: far smaller than every prompt
LARGE = StreamingLLM(sink=4, local=756)  # larger than prompt + generation: C(kv) is the whole cache
STREAMS = [(1, 1, None), (8, 2, None), (40, 6, None), (8, 6, 3)]  # (n, k, m)


@pytest.mark.parametrize("n,k,m", STREAMS, ids=[f"n{n}-k{k}-m{m}" for n, k, m in STREAMS])
@pytest.mark.parametrize("budget", [SMALL, LARGE], ids=["budget<prompt", "budget>prompt"])
@pytest.mark.parametrize("name", LOSSLESS_MODELS)
def test_fafo_stream_is_token_identical_to_vanilla_greedy(name, budget, n, k, m, engine):
    assert_lossless(FAFODecoder(compress=budget, n=n, k=k, m=m), engine(name))


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_gqa_rep"])
def test_fafo_2forward_is_token_identical_and_matches_fused(name, engine):
    eng = engine(name)
    assert_lossless(FAFODecoder(compress=SMALL, n=8, k=3, fused=False), eng)
    for text in PROMPTS:
        ids = eng.tokenizer(text).input_ids
        one = FAFODecoder(compress=SMALL, n=8, k=3).generate(eng, ids, 40)
        two = FAFODecoder(compress=SMALL, n=8, k=3, fused=False).generate(eng, ids, 40)
        assert one.accept_lengths == two.accept_lengths and one.extras["pool_entries"] == two.extras["pool_entries"]


@pytest.mark.parametrize("option", [dict(pool_from_prompt=True), dict(stagger=0), dict(see_current=False)],
                         ids=["pool_from_prompt", "stagger0", "no_current"])
def test_fafo_options_stay_token_identical(option, engine):
    taus = assert_lossless(FAFODecoder(compress=SMALL, n=8, k=3, **option), engine("qwen2_gqa_rep"))
    assert max(taus) > 1.0


def test_tau_above_1_5_on_repetitive_text(engine):
    eng = engine("llama_mha_rep")
    ids = eng.tokenizer(PROMPTS[2]).input_ids
    gen = FAFODecoder(compress=LARGE, n=40, k=6).generate(eng, ids, 120)
    assert gen.tokens == VanillaDecoder().generate(eng, ids, 120).tokens
    assert gen.tau > 1.5 and max(gen.accept_lengths) == 7  # a whole k-token candidate + the bonus


def test_pool_caches_under_every_discard_suffix_with_lru_cap():
    pool = CandidatePool(k=3, cap=2)
    pool.add_stream([7, 8, 9], (1, 2, 3))  # Alg. 2: keys (9,), (8, 9), (7, 8, 9)
    assert {key: list(v) for key, v in pool.table.items()} == {(9,): [(1, 2, 3)], (8, 9): [(1, 2, 3)],
                                                               (7, 8, 9): [(1, 2, 3)]}
    pool.add_stream([5, 9], (4, 5, 6))
    pool.add_stream([9], (1, 2, 3))  # refreshed: now most recent under (9,)
    pool.add_stream([9], (0, 0, 0))  # cap 2: the least recently used (4, 5, 6) is evicted under (9,)
    assert list(pool.table[(9,)]) == [(1, 2, 3), (0, 0, 0)]
    assert list(pool.table[(5, 9)]) == [(4, 5, 6)]
    # Alg. 3: the longest matching suffix first, most recent first within a key, distinct, at most m
    assert pool.retrieve([1, 7, 8, 9], m=2) == [(1, 2, 3), (0, 0, 0)]
    assert pool.retrieve([5, 9], m=5) == [(4, 5, 6), (0, 0, 0), (1, 2, 3)]
    assert pool.retrieve([4, 4], m=5) == []


def test_pool_matches_algorithms_2_and_3_written_plainly():
    """The trie pool against Alg. 2-3 as written (a dict of suffix tuples, LRU buckets): the same buckets in the
    same LRU order and the same retrievals, over steps full of repeated streams, refreshes and evictions."""
    import random
    from collections import OrderedDict

    k, cap = 3, 2
    plain: dict = {}

    def plain_add(buf, state):
        for length in range(1, len(buf[-k:]) + 1):
            bucket = plain.setdefault(tuple(buf[-length:]), OrderedDict())
            bucket.pop(tuple(state), None)
            bucket[tuple(state)] = None
            if len(bucket) > cap:
                bucket.popitem(last=False)

    def plain_retrieve(context, m):
        found = {}
        for length in range(min(k, len(context)), 0, -1):
            for value in reversed(plain.get(tuple(context[-length:]), {})):
                found.setdefault(value, None)
                if len(found) == m:
                    return list(found)
        return list(found)

    rng = random.Random(0)
    pool = CandidatePool(k=k, cap=cap)
    retrieved = 0
    for _ in range(200):
        kinds = [([rng.randrange(3) for _ in range(rng.randrange(0, 5))], [rng.randrange(3) for _ in range(3)])
                 for _ in range(5)]
        streams = [rng.choice(kinds) for _ in range(8)]  # converged streams repeat one another
        for buf, state in streams:
            plain_add(buf, state)
        pool.add_streams([b for b, _ in streams], [s for _, s in streams])
        assert pool.table == {key: list(v) for key, v in plain.items()} and len(pool) == sum(map(len, plain.values()))
        context, m = [rng.randrange(4) for _ in range(rng.randrange(0, 5))], rng.randrange(1, 6)
        assert pool.retrieve(context, m) == plain_retrieve(context, m)
        retrieved += len(plain_retrieve(context, m))
    assert retrieved > 200 and max(len(v) for v in plain.values()) == cap  # retrievals and full buckets met


def test_the_pool_holds_nothing_the_garbage_collector_tracks():
    """A pool of thousands of keys adds no object to CPython's cyclic collections (a tracked dict per key made
    them a third or more of the pool's time) where the interpreter untracks a dict of atomic values (CPython before
    3.14; 3.14 tracks every dict, gh-127010: there a pool tracks a dict per key, as it did before)."""
    import gc
    import random

    rng = random.Random(0)
    pool = CandidatePool(k=6, cap=4)
    for _ in range(50):
        pool.add_streams([[rng.randrange(50) for _ in range(6)] for _ in range(8)],
                         [[rng.randrange(50) for _ in range(6)] for _ in range(8)])
    gc.collect()
    containers = [pool._child, pool._ids, *pool._buckets]
    untracks_dicts = not gc.is_tracked({0: None})
    tracked = sum(gc.is_tracked(c) for c in containers)
    assert len(pool._buckets) > 1000 and tracked == (0 if untracks_dicts else len(containers))
    assert not any(gc.is_tracked(v) for v in pool._values)  # tuples of ints, untracked by a collection


def test_pool_seeding_from_text():
    pool = CandidatePool(k=2, cap=4)
    pool.add_text([1, 2, 3, 4])
    assert pool.retrieve([1], m=3) == [(2, 3)] and pool.retrieve([1, 2], m=3) == [(3, 4)]


def test_step_mask_layout():
    mask = fafo_step_mask(m=2, k=2, n=3)
    assert mask.shape == (11, 11) and mask.diagonal().all()
    # candidate 1 token 1 (row 4) sees the current token and candidate 1 token 0 (row 3) only
    assert mask[4].nonzero().flatten().tolist() == [0, 3, 4]
    # stream 2 row 1 (index 5 + 1*3 + 2 = 10) sees the current token and stream 2 row 0 (index 7)
    assert mask[10].nonzero().flatten().tolist() == [0, 7, 10]
    assert not fafo_step_mask(1, 1, 2, see_current=False)[2, 0]


def _state(eng, n=4, k=2, max_new=8, see_current=True):
    ids = eng.tokenizer(PROMPTS[0] * 2).input_ids
    state = FAFOState(FAFODecoder(compress=SMALL, n=n, k=k, see_current=see_current), eng, ids, max_new)
    state.prefill()
    for _ in range(3):  # a few steps so the region has swapped and the tail holds evicted entries
        state.commit(state.step(max_new))
    return state


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_fumble_reads_only_the_fixed_region(backend, engine):
    """Poison R(kv): the fumble rows do not change, the verification rows do.

    With ``see_current=False`` the streams depend on nothing but C(kv) and their own tokens. (With the default
    ``see_current=True`` they also attend the current token, whose deeper-layer KV is computed from the full
    cache in the same forward, as in the paper's mask, so the tail reaches them through that one token.)
    """
    eng = engine("llama_gqa", backend)
    state = _state(eng, see_current=False)
    cands, _ = state.candidates()
    cands[0] = torch.tensor([5, 6])
    before = state.forward_logits(cands).clone()
    budget, n = state.layout.region_len, state.layout.n
    assert n > budget
    for values in state.cache.values:  # poison R(kv): everything outside the fixed region
        values[:, :, budget:n] += 50.0
    after = state.forward_logits(cands)
    v = state.v_len
    torch.testing.assert_close(after[v:], before[v:], atol=0, rtol=0)  # fumble rows: bit-identical
    assert not torch.allclose(after[:v], before[:v])  # verification rows read the full cache


def test_fixed_region_holds_the_selection_and_committed_kv_is_exact(engine, monkeypatch):
    eng = engine("qwen2_gqa_rep")
    checks = track_region_after_commits(monkeypatch)
    ids = eng.tokenizer(PROMPTS[2]).input_ids
    state = FAFOState(FAFODecoder(compress=SMALL, n=8, k=3), eng, ids, 40)
    state.prefill()
    while len(state.history) < len(ids) + 30:
        state.commit(state.step(40))
    assert checks and all(checks)
    assert_cache_is_permuted_prefill(eng, state.layout, state.history)


@pytest.mark.parametrize("fused,per_step", [(True, 1), (False, 2)])
def test_forwards_per_step(fused, per_step, engine, monkeypatch):
    eng = engine("llama_mha_rep")
    calls = []
    original = eng.model.forward
    monkeypatch.setattr(eng.model, "forward", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    gen = FAFODecoder(compress=SMALL, n=8, k=3, fused=fused).generate(eng, eng.tokenizer(PROMPTS[2]).input_ids, 30)
    assert gen.n_forwards > 0 and len(calls) == 1 + per_step * gen.n_forwards  # + the prefill
    assert gen.forwards.draft == (0 if fused else gen.n_forwards)  # FAFO-2forward's fumble pass: a self-draft
    assert gen.forwards.prefill == 1 and gen.forwards.total == len(calls)


def test_block_masks_are_built_once_per_generation(engine, monkeypatch):
    from fafo.engine import block_masks

    eng = engine("llama_gqa", "flex")
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    counts = []
    for max_new in (4, 9):
        calls = []
        original = block_masks._partial  # every mask but the prefill's causal one is built through it
        monkeypatch.setattr(block_masks, "_partial", lambda *a, **kw: calls.append(1) or original(*a, **kw))
        eng._flex = None  # the engine's mask cache (fafo.engine.flex_masks), emptied: count one generation's
        gen = FAFODecoder(compress=SMALL, n=2, k=2).generate(eng, ids, max_new)
        monkeypatch.setattr(block_masks, "_partial", original)
        assert gen.n_forwards >= max_new // 2
        counts.append(len(calls))
    # the region and step masks, however many steps
    assert counts == [2, 2]


def test_bad_hyperparameters_and_sampling_are_refused():
    for kw in (dict(n=0), dict(k=-1), dict(m=0), dict(stagger=-1)):
        with pytest.raises(ConfigError, match="method."):
            FAFODecoder(**kw)
    with pytest.raises(ConfigError, match="method.compress"):
        StreamingLLM(sink=2, local=0)
    FAFODecoder().check_sampling(Sampling(temperature=0.7))  # sampling is supported (tests/test_sampling.py)


def test_bench_pool_times_the_pool_in_live_and_replayed_generations(tmp_path):
    """``scripts/bench_pool.py`` as run by hand: one row per generation and mode, the same steps in both modes, the
    pool timed once per decoding step (a seeding from the prompt excluded)."""
    import csv
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_pool.py"
    out = tmp_path / "pool.csv"
    run = subprocess.run([sys.executable, str(script), "--layers", "2", "--new-tokens", "12", "--generations", "2",
                          "--out", str(out), "--override", "method.pool_from_prompt=true"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    rows = list(csv.DictReader(open(out)))
    assert [(r["mode"], r["generation"]) for r in rows] == [("live", "0"), ("replayed", "0"), ("live", "1"),
                                                            ("replayed", "1")]
    # one pool update per decoding step: the prompt's seeding (pool_from_prompt) is not a step
    assert {(r["steps"], r["pool_steps"]) for r in rows} == {(rows[0]["steps"], rows[0]["steps"])}
    assert int(rows[0]["steps"]) > 1
    assert all(float(r["pool_us_per_step"]) >= float(r["add_us_per_step"]) > 0 for r in rows)
    assert "fafo_stream replayed: pool" in run.stdout
    wrong = subprocess.run([sys.executable, str(script), "--method", "vanilla"], capture_output=True, text=True,
                           timeout=600)
    assert wrong.returncode == 2 and "--method vanilla has no candidate pool" in wrong.stderr
