"""Lookahead Decoding (method configs lookahead*): lossless, one forward per step, and doing what the official
code (hao-ai-lab/LookaheadDecoding, lade/decoding.py + lade/models/modeling_llama.py) does."""

import pytest
import torch

from baselines.lookahead import LookaheadDecoder, LookaheadState, NgramPool, lookahead_step_mask
from baselines.vanilla import VanillaDecoder
from fafo.engine.cache import KVCache
from fafo.errors import ConfigError
from fafo.sampling import Sampling
from tests.conftest import LOSSLESS_MODELS
from tests.lossless import PROMPTS, assert_lossless

SETTINGS = [(3, 2, 2, False), (3, 4, 3, True), (5, 3, 3, False), (5, 7, 7, True)]  # (N, W, G, bonus)


@pytest.mark.parametrize("n,w,g,bonus", SETTINGS, ids=[f"N{n}W{w}G{g}b{int(b)}" for n, w, g, b in SETTINGS])
@pytest.mark.parametrize("name", LOSSLESS_MODELS)
def test_lookahead_is_token_identical_to_vanilla_greedy(name, n, w, g, bonus, engine):
    assert_lossless(LookaheadDecoder(level=n, window=w, guess_set=g, bonus_token=bonus), engine(name))


@pytest.mark.parametrize("kw", [{"pool_from_prompt": True}, {"guess_set": 0}, {"level": 4, "window": 1}])
def test_other_knobs_are_token_identical(kw, engine):
    method = LookaheadDecoder(**{"level": 3, "window": 3, "guess_set": 3, **kw})
    assert_lossless(method, engine("qwen2_gqa_rep"))


@pytest.mark.parametrize("name", ["llama_mha_rep", "qwen2_gqa_rep"])
def test_tau_above_1_5_on_repetitive_text_with_the_n_minus_1_cap(name, engine):
    eng = engine(name)
    ids = eng.tokenizer(PROMPTS[2]).input_ids
    ref = VanillaDecoder().generate(eng, ids, 120).tokens
    gen = LookaheadDecoder(level=5, window=7, guess_set=7).generate(eng, ids, 120)
    assert gen.tokens == ref and gen.tau > 1.5
    assert max(gen.accept_lengths) == 4  # N-1: no bonus token after a full match (official max_hit)
    bonus = LookaheadDecoder(level=5, window=7, guess_set=7, bonus_token=True).generate(eng, ids, 120)
    assert bonus.tokens == ref and max(bonus.accept_lengths) == 5 and bonus.tau >= gen.tau


def test_one_forward_per_step(engine, monkeypatch):
    eng = engine("llama_mha_rep")
    calls = []
    original = eng.model.forward
    monkeypatch.setattr(eng.model, "forward",
                        lambda tok, *a, **kw: calls.append(tok.shape[1]) or original(tok, *a, **kw))
    method = LookaheadDecoder(level=5, window=4, guess_set=4)
    ids = eng.tokenizer(PROMPTS[2]).input_ids
    gen = method.generate(eng, ids, 40)
    assert gen.n_forwards > 0 and len(calls) == 1 + gen.n_forwards  # + the prefill (which also runs level 0)
    assert calls[0] == len(ids) + 4 + 5 - 3  # prompt + level 0 (W+N-3 tokens)
    assert calls[1:3] == [2 * 6, 3 * 5] and gen.accept_lengths[:2] == [1, 1]  # 2 warm-up forwards: 1 token
    assert all((q - 16) % 4 == 0 and 16 <= q <= 32 for q in calls[3:])  # (N-1)*W window + 0..G guesses of N-1
    assert max(calls[1:]) <= method.step_tokens()


def test_flex_block_masks_are_built_once_per_step_shape(engine, monkeypatch):
    from fafo.engine import block_masks

    eng = engine("qwen2_gqa_rep", "flex")
    calls = []
    original = block_masks._partial  # every step mask is built through it
    monkeypatch.setattr(block_masks, "_partial", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    ids = eng.tokenizer(PROMPTS[2]).input_ids
    gen = LookaheadDecoder(level=4, window=3, guess_set=2).generate(eng, ids, 40)
    # one warm-up shape, then at most one per guess count (0, 1, 2)
    assert gen.n_forwards > 10 and len(calls) <= 1 + 3


@pytest.fixture
def static(engine):
    """static(name, backend) -> the cached engine with ``static_shapes`` on, switched off again afterwards."""
    used = []

    def get(name: str, backend: str = "sdpa"):
        eng = engine(name, backend)
        used.append(eng)
        eng.static_shapes = True
        return eng

    yield get
    for eng in used:
        eng.static_shapes = False


STATIC = [(3, 2, 2, False), (5, 3, 3, False), (5, 7, 7, True)]  # (N, W, G, bonus)


@pytest.mark.parametrize("n,w,g,bonus", STATIC, ids=[f"N{n}W{w}G{g}b{int(b)}" for n, w, g, b in STATIC])
@pytest.mark.parametrize("name", ["llama_mha", "llama_mha_rep", "qwen2_gqa_rep"])
def test_static_shapes_are_token_identical_to_vanilla_with_the_same_steps(name, n, w, g, bonus, static):
    eng = static(name)
    method = LookaheadDecoder(level=n, window=w, guess_set=g, bonus_token=bonus, pool_from_prompt=True)
    assert_lossless(method, eng)
    for text in PROMPTS:  # the padding changes nothing but the shapes: same tokens AND the same accepts
        ids = eng.tokenizer(text).input_ids
        padded = method.generate(eng, ids, 40)
        eng.static_shapes = False
        plain = method.generate(eng, ids, 40)
        eng.static_shapes = True
        assert padded.tokens == plain.tokens and padded.accept_lengths == plain.accept_lengths
        assert padded.extras["guesses_verified"] == plain.extras["guesses_verified"]  # real guesses only


def test_static_shapes_flex_backend_is_token_identical(static):
    method = LookaheadDecoder(level=4, window=3, guess_set=2)
    assert_lossless(method, static("qwen2_gqa_rep", "flex"), max_new=16, prompts=PROMPTS[2:])


def test_static_shapes_sampling_draws_the_same_tokens(static):
    eng = static("llama_mha_rep")
    sampling = Sampling(temperature=0.7, top_k=8, seed=3)
    method = LookaheadDecoder(level=4, window=3, guess_set=4, pool_from_prompt=True, bonus_token=True)
    for text in PROMPTS:
        ids = eng.tokenizer(text).input_ids
        for i in range(3):
            eng.static_shapes = True
            padded = method.generate(eng, ids, 30, (), sampling, sampling.generator(i))
            eng.static_shapes = False
            plain = method.generate(eng, ids, 30, (), sampling, sampling.generator(i))
            assert padded.tokens == plain.tokens and padded.accept_lengths == plain.accept_lengths
    assert max(padded.accept_lengths) > 1  # guesses were accepted


def _step_shapes(eng, method, text, max_new=60):
    """(tokens, slots, logits rows) of every decode-step forward (plan.prefix > 0) of one generation."""
    shapes = []
    original = eng.forward

    def record(cache, tokens, positions, slots, plan, logits="all", **kw):
        if plan.prefix > 0:
            shapes.append((len(tokens), len(slots), len(logits)))
        return original(cache, tokens, positions, slots, plan, logits=logits, **kw)

    eng.forward = record  # on the instance only
    try:
        gen = method.generate(eng, eng.tokenizer(text).input_ids, max_new)
    finally:
        del eng.forward
    assert len(shapes) == gen.n_forwards
    return shapes, gen


def test_static_shapes_give_one_step_shape_after_the_warm_up(engine):
    n, w, g = 5, 4, 3
    method = LookaheadDecoder(level=n, window=w, guess_set=g)
    eng = engine("llama_mha_rep")
    texts = [PROMPTS[2], PROMPTS[0]]  # different lengths; the repetitive one fills the pool and accepts a lot
    plain = [_step_shapes(eng, method, t)[0] for t in texts]
    assert len({s[0] for s in plain[0][n - 3 :]}) > 1  # without the padding the guess count changes the shape
    eng.static_shapes = True
    try:
        runs = [_step_shapes(eng, method, t) for t in texts]
    finally:
        eng.static_shapes = False
    (a, gen_a), (b, gen_b) = runs
    assert gen_a.tau > 1.5 and gen_a.tau != gen_b.tau and len(a) != len(b)
    warm = [((f + 1) * (w + n - 2 - f),) * 2 + (1 + w + n - 2 - f,) for f in range(1, n - 2)]  # N-3 warm-ups
    q = (n - 1) * w + g * (n - 1)  # the window, then G guesses of N-1 tokens
    assert a[: n - 3] == b[: n - 3] == warm
    assert set(a[n - 3 :]) == set(b[n - 3 :]) == {(q, q, 1 + w + g * (n - 1))}
    assert q == method.step_tokens()


def test_step_mask_equals_the_official_mask():
    # N=3, W=2, G=2: [current, level-0 token | level 1 col 0, col 1 | guess 0 (2 tokens) | guess 1 (2 tokens)]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0, 0],
        [1, 0, 0, 0, 1, 0, 0, 0],
        [1, 0, 0, 0, 1, 1, 0, 0],
        [1, 0, 0, 0, 0, 0, 1, 0],
        [1, 0, 0, 0, 0, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(lookahead_step_mask(columns=2, levels=2, n_guesses=2, guess_len=2), expected)
    # N=4, W=2: level 2 column 1 (row 5) sees level 0 columns 0-1 and column 1 of levels 1-2
    assert lookahead_step_mask(2, 3, 0, 3)[5].nonzero().flatten().tolist() == [0, 1, 3, 5]


def test_pool_update_rule_matches_the_official_update_token_map():
    """N=4, W=3, G=2, worked by hand from update_token_map / fill_pool_with_prompt."""
    pool = NgramPool(cap=2)
    pool.add_text([1, 2, 3, 4, 1, 2, 3], n=4)  # 1->(2,3,4), 2->(3,4,1), 3->(4,1,2), 4->(1,2,3)
    # columns: (cur=1 | 5, 6) over levels [7, 8, 9], [10, 11, 12], predictions [13, 14, 15]
    pool.add_window(1, [[5, 6], [7, 8, 9], [10, 11, 12]], [13, 14, 15])
    pool.add_window(1, [[5, 2], [7, 8, 4], [10, 11, 1]], [13, 14, 2])  # 1: refresh; 5: refresh; 2: 2nd entry
    pool.add_window(1, [[9, 2], [2, 3, 5], [3, 4, 5]], [4, 5, 5])  # 1: evict LRU (2,3,4); 2: evict (3,4,1)
    assert {k: list(v) for k, v in pool.table.items()} == {
        1: [(7, 10, 13), (2, 3, 4)],
        2: [(4, 1, 2), (5, 5, 5)],
        3: [(4, 1, 2)],
        4: [(1, 2, 3)],
        5: [(8, 11, 14)],
        6: [(9, 12, 15)],
        9: [(3, 4, 5)],
    }
    assert pool.get(2) == [(4, 1, 2), (5, 5, 5)] and pool.get(7) == []


class PositionModel:
    """A stand-in engine whose greedy prediction at position p is token 100 + p + 1, whatever the context."""

    backend, step_backend, device, static_shapes = "sdpa", "sdpa", torch.device("cpu"), False

    def __init__(self):
        self.calls = []

    def cache(self, min_len):
        return KVCache(1, 1, 1, min_len, 1, torch.float32, "cpu")

    def forward(self, cache, tokens, positions, slots, plan, logits="all", kind="verify", pad_to=None):
        pos = torch.as_tensor(positions)[torch.as_tensor(logits)]
        self.calls.append((list(tokens), torch.as_tensor(positions).tolist()))
        return torch.nn.functional.one_hot(100 + pos + 1, 200).float()[None]


def test_window_warm_up_advance_and_acceptance_follow_the_official_loop():
    """N=4, W=2, G=2 from window [7, 8, 9] after prompt [1, 2, 3], worked by hand from the official
    jacobi_greedy_search_multilevel: prefill with level 0, one warm-up forward, then one column per step even
    after a multi-token accept. Each step: ((tokens, positions) of its forward, committed, levels after)."""
    eng = PositionModel()
    state = LookaheadState(LookaheadDecoder(level=4, window=2, guess_set=2), eng, [1, 2, 3], 20)
    state.levels = [[7, 8, 9]]
    assert state.prefill() == 103 and state.levels == [[8, 9], [104, 105, 106]]
    assert eng.calls[0] == ([1, 2, 3, 7, 8, 9], [0, 1, 2, 3, 4, 5])
    steps = []
    for _ in range(5):
        step = state.step(20)
        steps.append((eng.calls[-1], step.tokens, [lv[:] for lv in state.levels]))
        state.commit(step)
    assert steps[0] == (([103, 8, 9, 104, 105, 106], [3, 4, 5, 4, 5, 6]), [104],
                        [[9], [105, 106], [106, 107]])
    assert steps[1] == (([104, 9, 105, 106, 106, 107], [4, 5, 5, 6, 6, 7]), [105],
                        [[106], [106, 107], [107, 108]])
    assert steps[2][1:] == ([106], [[107], [107, 108], [108, 109]])
    # key 106 -> (107, 108, 109) fully matches, but only N-1 = 3 tokens are committed (not the 4th, 110)
    assert steps[3] == (([106, 107, 107, 108, 108, 109, 107, 108, 109], [6, 7, 7, 8, 8, 9, 7, 8, 9]),
                        [107, 108, 109], [[108], [108, 109], [109, 110]])
    # the window moved one column although three tokens were accepted: it is re-based at position 9
    assert steps[4] == (([109, 108, 108, 109, 109, 110], [9, 10, 10, 11, 11, 12]), [110],
                        [[109], [109, 110], [112, 113]])
    assert {k: list(v) for k, v in state.pool.table.items()} == {
        104: [(105, 106, 107)], 9: [(106, 107, 108)], 105: [(106, 107, 108)], 106: [(107, 108, 109)],
        107: [(108, 109, 110)], 109: [(108, 109, 112)], 108: [(109, 110, 113)],
    }


def test_bad_hyperparameters_and_sampling_are_refused():
    for kw in ({"level": 1}, {"level": 2}, {"window": 0}, {"guess_set": -1}, {"level": 2.5},
               {"bonus_token": "yes"}, {"seed": None}):
        field = next(iter(kw))
        with pytest.raises(ConfigError, match=f"method.{field}="):
            LookaheadDecoder(**kw)
    LookaheadDecoder().check_sampling(Sampling(temperature=0.7))  # sampling is supported (tests/test_sampling.py)
    assert LookaheadDecoder(level=5, window=15, guess_set=15).extra_slots(100) == 4 * 15 + 15 * 4
