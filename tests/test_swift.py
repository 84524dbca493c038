"""SWIFT (method configs swift, swift_script): lossless, one verification forward per step, and an on-the-fly
layer-set search that does what the official code (hemingkx/SWIFT, model/swift/utils.py) does."""

import contextlib

import pytest
import torch

from baselines.swift import SwiftDecoder, build_tree, tree_widths_for
from baselines.swift_optimizer import LayerSetOptimizer
from baselines.vanilla import VanillaDecoder
from fafo.engine.attention import causal_plan, tree_mask
from fafo.engine.engine import Engine
from fafo.engine.tiny import tiny_checkpoint
from fafo.errors import ConfigError
from fafo.sampling import Sampling
from tests.lossless import PROMPTS, assert_lossless

# 6 layers: layers 1..4 (8 sub-layers) can be skipped, k = int(8 * 0.45) = 3 per candidate
L6 = {"num_hidden_layers": 6, "num_attention_heads": 4}
DEEP = {
    "llama_mha_rep": {**L6, "family": "llama", "num_key_value_heads": 4, "seed": 3,
                      "initializer_range": 0.05},
    "qwen2_gqa_rep": {**L6, "family": "qwen2", "num_key_value_heads": 2, "seed": 3, "initializer_range": 0.05,
                      "tie_word_embeddings": True},
    "llama_gqa": {**L6, "family": "llama", "num_key_value_heads": 2, "seed": 2},
    "llama3_rope": {**L6, "family": "llama", "num_key_value_heads": 2, "seed": 4, "initializer_range": 0.02,
                    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64}},
}
# the search runs within a few samples: small window, frequent BO suggestions, bounded patience
SEARCH = {"context_window": 4, "bayes_interval": 3, "max_tolerance_iter": 12, "max_opt_iter": 40}
DEEP_TREES = {**SEARCH, "stop_threshold": 0.0, "max_step_draft": 6}  # wide, deep trees: KV compaction
SETTINGS = {"off": {"optimization": False}, "search": SEARCH, "search_deep_trees": DEEP_TREES}


@pytest.fixture(scope="module")
def deep(ckpt_root):
    cache = {}

    def get(name: str) -> Engine:
        if name not in cache:
            cache[name] = Engine.from_pretrained(str(tiny_checkpoint(DEEP[name], cache_dir=ckpt_root)))
        return cache[name]

    return get


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", ["llama_mha_rep", "qwen2_gqa_rep", "llama_gqa"])
def test_swift_is_token_identical_to_vanilla_greedy(name, setting, deep):
    method = SwiftDecoder(**SETTINGS[setting])
    assert_lossless(method, deep(name))
    if setting != "off":
        assert method.optimizer.opt_iter > 0, "the search never ran"


def test_llama3_rope_and_a_2_layer_model_are_token_identical(deep, engine):
    assert_lossless(SwiftDecoder(**DEEP_TREES), deep("llama3_rope"), max_new=24)
    two = SwiftDecoder(**SEARCH)  # layers 0 and 1 are first and last: nothing to skip or search
    assert_lossless(two, engine("qwen2_gqa"), max_new=24, prompts=PROMPTS[:1])
    assert two.optimizer.skip == (frozenset(), frozenset()) and two.optimizer.opt_iter == 0


def test_search_changes_the_set_and_keeps_the_best_scoring_one(deep):
    eng = deep("llama_gqa")
    method = SwiftDecoder(**{**SEARCH, "max_tolerance_iter": 300, "max_opt_iter": 30, "max_score": 1.0})
    assert method.optimizer is None
    method.setup(eng)
    opt = method.optimizer
    assert opt.skip == (frozenset({1, 3}), frozenset({1, 3}))  # official start: the odd layers
    sets = []
    for text in PROMPTS:  # one stream: the search state carries over from sample to sample
        gen = method.generate(eng, eng.tokenizer(text).input_ids, 40)
        sets.append(opt.skip)
        assert sets[0] != (frozenset({1, 3}), frozenset({1, 3}))  # changed during the first sample already
        assert gen.extras["skip_attn"] == sorted(opt.attn) and gen.extras["best_score"] == opt.best_score
    hist = opt.history
    assert len(hist) == opt.opt_iter == 31 and not opt.active  # stops once opt_iter > max_opt_iter
    assert {h["kind"] for h in hist} == {"random", "bayes"}
    assert [h["iter"] for h in hist if h["kind"] == "bayes"] == list(range(2, 31, 3))
    assert opt.skip != (frozenset({1, 3}), frozenset({1, 3}))
    best = max(h["score"] for h in hist)
    first = next(h for h in hist if h["score"] == best)  # strict improvement: the first to reach it stays
    assert opt.best_score == best and (sorted(opt.attn), sorted(opt.mlp)) == (first["attn"], first["mlp"])
    running = 0.0
    for h in hist:  # kept exactly when it beat everything before it
        assert h["kept"] == (h["score"] > running)
        running = max(running, h["score"])
        assert len(h["attn"]) + len(h["mlp"]) == 3 and set(h["attn"] + h["mlp"]) <= {1, 2, 3, 4}
    again = SwiftDecoder(**{**SEARCH, "max_tolerance_iter": 300, "max_opt_iter": 30, "max_score": 1.0})
    for text in PROMPTS:  # seeded: the same run searches the same candidates
        again.generate(eng, eng.tokenizer(text).input_ids, 40)
    assert again.optimizer.history == hist


def test_score_is_the_teacher_forced_matchness_of_the_draft(deep):
    eng = deep("qwen2_gqa_rep")
    method = SwiftDecoder(**{**SEARCH, "max_score": 1.0})
    ids = eng.tokenizer(PROMPTS[1]).input_ids
    gen = method.generate(eng, ids, 40)
    window = gen.tokens[:5]
    for h in method.optimizer.history[:4]:
        skip = (frozenset(h["attn"]), frozenset(h["mlp"]))
        cache = eng.model.new_cache(64)  # the draft one token at a time over the full model's prompt KV
        eng.prefill(cache, ids)
        hits = 0
        for i, tok in enumerate(window[:-1]):
            p = len(ids) + i
            out = eng.forward(cache, [tok], [p], [p], causal_plan(p), logits="last", skip=skip)
            hits += int(out[0, -1].argmax()) == window[i + 1]
        assert h["score"] == pytest.approx(hits / 4)


def test_one_verification_forward_per_step_and_never_skipping_first_or_last(deep, monkeypatch):
    eng = deep("llama_mha_rep")
    calls = []
    original = eng.model.forward
    monkeypatch.setattr(eng.model, "forward", lambda tok, *a, **kw: calls.append((tok.shape[1], a[-1])) or
                        original(tok, *a, **kw))
    method = SwiftDecoder(**{**DEEP_TREES, "max_step_draft": 5})
    for text in PROMPTS[1:]:
        calls.clear()
        ids = eng.tokenizer(text).input_ids
        gen = method.generate(eng, ids, 48)
        full = [q for q, skip in calls if not skip or not (skip[0] or skip[1])]
        drafts = [skip for q, skip in calls if skip and (skip[0] or skip[1])]
        assert full[0] == len(ids) and len(full) == 1 + gen.n_forwards == 1 + len(gen.accept_lengths)
        assert len(drafts) == gen.forwards.draft + gen.forwards.aux
        assert all(2 <= q <= method.max_tree() for q in full[1:])  # root + at least one drafted token
        assert all(0 not in a | m and 5 not in a | m for a, m in drafts)
    assert method.optimizer.opt_iter > 0


@pytest.mark.parametrize("name", ["llama_mha_rep", "qwen2_gqa_rep"])
def test_tau_above_1_on_repetitive_text(name, deep):
    eng = deep(name)
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    ref = VanillaDecoder().generate(eng, ids, 80).tokens
    gen = SwiftDecoder().generate(eng, ids, 80)  # official argparse defaults
    assert gen.tokens == ref and gen.tau > 1.4 and max(gen.accept_lengths) >= 2
    deep_gen = SwiftDecoder(stop_threshold=0.0, max_step_draft=8).generate(eng, ids, 80)
    assert deep_gen.tokens == ref and max(deep_gen.accept_lengths) >= 3


def test_reset_per_sample_restarts_the_search(deep):
    eng = deep("llama_gqa")
    method = SwiftDecoder(**{**SEARCH, "reset_per_sample": True, "max_score": 1.0})
    for text in PROMPTS[:2]:
        gen = method.generate(eng, eng.tokenizer(text).input_ids, 24)
        assert method.optimizer.opt_iter == gen.forwards.aux > 0
        assert method.optimizer.history[0]["iter"] == 0


def test_tree_matches_the_official_choices_and_mask():
    conf = [0.99, 0.9, 0.6, 0.1]  # official get_choices_list (greedy): 3, 5, 8, 10 children
    assert tree_widths_for(conf, (3, 5, 8, 10), 10) == [3, 5, 8, 10]
    assert tree_widths_for(conf, (3, 5, 8, 10), 4) == [3, 4, 4, 4]
    draft = [list(range(100 * d, 100 * d + 10)) for d in range(1, 5)]
    tree = build_tree(7, draft, [3, 5, 8, 10])
    assert tree.tokens[:5] == [7, 100, 101, 102, 200] and len(tree.tokens) == 1 + 3 + 5 + 8 + 10
    assert tree.depths == [0] + [1] * 3 + [2] * 5 + [3] * 8 + [4] * 10  # official position ids: N + depth
    parents = [-1] + [0] * 3 + [1] * 5 + [4] * 8 + [9] * 10  # every depth hangs off the previous top-1
    assert tree.parents == parents and torch.equal(tree.mask(device="cpu"), tree_mask(parents))
    preds = [0] * len(tree.tokens)
    preds[0], preds[1], preds[4] = 100, 201, 999  # root -> 100 (chain), 100 -> 201 (a sibling leaf): stop
    assert tree.accept_greedy(preds) == [1, 5]
    preds[1] = 200
    preds[4] = 302  # 200 (chain) -> 302
    assert tree.accept_greedy(preds) == [1, 4, 11]
    assert tree.accept_greedy([5] * len(tree.tokens)) == []


def test_optimizer_candidates_follow_the_official_encoding():
    opt = LayerSetOptimizer(n_layers=8, skip_ratio=0.45, bayes=False, seed=2024)
    assert opt.n_skip == int(12 * 0.45) == 5 and opt.skip == (frozenset({1, 3, 5}), frozenset({1, 3, 5}))
    import numpy as np

    chosen = np.random.RandomState(2024).choice(12, 5, replace=False)  # official np.random.choice, seed 2024
    cand = opt.propose()
    assert cand["attn"] == {int(d) + 1 for d in chosen if d < 6}
    assert cand["mlp"] == {int(d) - 5 for d in chosen if d >= 6}
    assert cand["point"] == {f"x{i}": float(i in chosen) for i in range(12)}


@pytest.mark.parametrize("kw,field", [
    ({"skip_ratio": 1.0}, "skip_ratio"), ({"max_score": 1.5}, "max_score"),
    ({"context_window": 0}, "context_window"),
    ({"opt_interval": 0}, "opt_interval"), ({"bayes_interval": 0}, "bayes_interval"), ({"topk": 0}, "topk"),
    ({"max_step_draft": 0}, "max_step_draft"), ({"stop_threshold": -0.1}, "stop_threshold"),
    ({"tree_widths": [3, 5]}, "tree_widths"), ({"optimization": "yes"}, "optimization"),
    ({"max_tolerance_iter": -1}, "max_tolerance_iter"), ({"attn_skip": [0, 2]}, "attn_skip"),
    ({"seed": 1.5}, "seed"),
])
def test_bad_hyperparameters_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=rf"method\.{field}="):
        SwiftDecoder(**kw)


def test_bad_layers_and_sampling_fail_early(deep):
    with pytest.raises(ConfigError, match=r"method\.mlp_skip .*only 1\.\.4"):
        SwiftDecoder(mlp_skip=[2, 5]).setup(deep("llama_gqa"))
    with pytest.raises(ConfigError, match=r"method\.attn_skip .*only 1\.\.4"):  # before the weights load
        SwiftDecoder(attn_skip=[5]).check_target(deep("llama_gqa").model.hf_config, None)
    SwiftDecoder().check_sampling(Sampling(temperature=0.7))  # sampling is supported (tests/test_sampling.py)
    method = SwiftDecoder(attn_skip=[2], mlp_skip=[], optimization=False)
    method.setup(deep("llama_gqa"))
    assert method.optimizer.skip == (frozenset({2}), frozenset())
    eng = deep("llama_gqa")
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    assert method.generate(eng, ids, 16).tokens == VanillaDecoder().generate(eng, ids, 16).tokens
    assert eng.cache(0).max_len < 1024  # sized from the run (prompt + max_new + tree), not the 8192 positions


# ---------------------------------------------------------------------------- engine.static_shapes
# tiny models' draft confidences are ~0.003 (repetitive) / 0.02-0.2 (llama_gqa): trees of 1 + 10 * depth nodes
# whose depth the data sets, through the remaining budget (the draft stops at it) or the draft's confidence
STATIC_SETTINGS = {"budget_cut": {**SEARCH, "stop_threshold": 0.0, "max_step_draft": 4},
                   "confidence_stopped": {**SEARCH, "stop_threshold": 0.05, "max_step_draft": 4}}
STATIC_SAMPLINGS = [Sampling(temperature=0.3, seed=3),
                    Sampling(temperature=0.9, top_p=0.9, repetition_penalty=1.2, seed=4)]


@contextlib.contextmanager
def static_shapes(eng: Engine):
    """``eng`` with ``static_shapes`` on for the block (the engines are shared by the module's tests)."""
    eng.static_shapes = True
    try:
        yield eng
    finally:
        eng.static_shapes = False


def run_prompts(method: SwiftDecoder, eng: Engine, sampling: Sampling | None = None, max_new: int = 40):
    """(tokens, accept lengths) per prompt, each sample with its own seeded generator; then the search history."""
    out = []
    for i, text in enumerate(PROMPTS):
        gen = method.generate(eng, eng.tokenizer(text).input_ids, max_new, (), sampling,
                              None if sampling is None else sampling.generator(i))
        out.append((gen.tokens, gen.accept_lengths))
    return out, method.optimizer.history


@pytest.mark.parametrize("name,setting", [("llama_mha_rep", "budget_cut"), ("qwen2_gqa_rep", "budget_cut"),
                                          ("llama_mha_rep", "confidence_stopped"),
                                          ("llama_gqa", "confidence_stopped")])
def test_static_shapes_are_token_identical_greedy(name, setting, deep):
    eng, kw = deep(name), STATIC_SETTINGS[setting]
    dynamic = run_prompts(SwiftDecoder(**kw), eng)
    with static_shapes(eng):
        assert_lossless(SwiftDecoder(**kw), eng)  # vs vanilla, across EOS and max_new_tokens cuts
        static = run_prompts(SwiftDecoder(**kw), eng)
    assert static == dynamic  # the same tokens, steps and search (the padding changes nothing)
    assert max(max(acc) for _, acc in static[0]) >= 2, "acceptance never high"


def test_static_shapes_flex_backend_is_token_identical(ckpt_root):
    path = tiny_checkpoint(DEEP["qwen2_gqa_rep"], cache_dir=ckpt_root)
    eng = Engine.from_pretrained(str(path), backend="flex")  # a fresh engine: nothing to restore
    eng.static_shapes = True
    assert_lossless(SwiftDecoder(**STATIC_SETTINGS["budget_cut"]), eng, max_new=16, prompts=PROMPTS[2:])


@pytest.mark.parametrize("sampling", STATIC_SAMPLINGS, ids=["t0.3", "t0.9_top_p_rep"])
@pytest.mark.parametrize("name", ["llama_mha_rep", "qwen2_gqa_rep"])
def test_static_shapes_are_token_identical_sampled(name, sampling, deep):
    eng = deep(name)
    for kw in STATIC_SETTINGS.values():
        dynamic = run_prompts(SwiftDecoder(**kw), eng, sampling)
        with static_shapes(eng):
            static = run_prompts(SwiftDecoder(**kw), eng, sampling)
        assert static == dynamic  # the same generator seed: the same draws, tokens and steps


def record_shapes(eng: Engine, monkeypatch) -> dict[str, set]:
    """Wraps the model's forward (what runs, after the engine's padding): the shapes of the decode-step
    verifications (full model, ``plan.prefix > 0``) as (Q, len(positions), step mask shape, len(slots), logits
    rows), and the token counts of the skipped-layer forwards (the draft's and the search's)."""
    seen = {"verify": set(), "skip": set()}
    original = eng.model.forward

    def forward(tokens, positions, cache, slots, plan, backend, logits="all", skip=None):
        if plan.prefix > 0 and skip is None:
            rows = logits if isinstance(logits, str) else len(logits)
            mask = None if plan.step_mask is None else tuple(plan.step_mask.shape)
            seen["verify"].add((tokens.shape[-1], positions.shape[-1], mask,
                                None if slots is None else len(slots), rows))
        elif plan.prefix > 0:
            seen["skip"].add(tokens.shape[-1])
        return original(tokens, positions, cache, slots, plan, backend, logits, skip)

    monkeypatch.setattr(eng.model, "forward", forward)
    return seen


@pytest.mark.parametrize("sampling", [None, STATIC_SAMPLINGS[0]], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name,setting", [("llama_mha_rep", "budget_cut"), ("llama_gqa", "confidence_stopped")])
def test_static_shapes_give_every_verification_one_shape(name, setting, sampling, deep, monkeypatch):
    eng = deep(name)
    prompts = PROMPTS[:2]  # repetitive (high acceptance) and code, of different lengths
    assert len({len(eng.tokenizer(t).input_ids) for t in prompts}) == 2
    for static in (False, True):
        method = SwiftDecoder(**STATIC_SETTINGS[setting])  # a fresh search: it scores windows in both runs
        T = method.max_tree(sampling is not None)
        seen = record_shapes(eng, monkeypatch)
        with static_shapes(eng) if static else contextlib.nullcontext():
            gens = [method.generate(eng, eng.tokenizer(t).input_ids, 40, (), sampling,
                                    None if sampling is None else sampling.generator(0)) for t in prompts]
        monkeypatch.undo()
        assert gens[0].accept_lengths != gens[1].accept_lengths
        assert seen["skip"] == {1, method.context_window + 1}  # the draft's single tokens, the search's window
        if static:
            assert seen["verify"] == {(T, T, (T, T), T, "all")}
        else:  # the control: unpadded trees vary with the data (so the assertion above has power)
            assert len(seen["verify"]) > 1


@pytest.mark.parametrize("attention", ["flex", "sdpa"])
def test_compiled_drafts_and_verifications_are_token_identical_and_compile_once(attention, deep, ckpt_root,
                                                                                fresh_dynamo, monkeypatch):
    """``bench.compile``: the verification forward runs compiled (one padded tree size), the layer-skipped drafts
    and the search's scoring through the per-sub-layer graphs while the search changes the set (the model's eager
    forward never runs a decode step); tokens equal eager vanilla's, EOS and max_new_tokens cuts included, and
    nothing compiles after the warm-up generation and ``warm_shapes`` (as the runner's warm-up; trees of every
    depth: tests/test_compiled.py), whatever the sets the search tries."""
    from fafo.engine.compiled import CompileOptions, compile_stats
    from tests.compiled_cases import CAPACITY, SAMPLES, WARMUP

    compiled = Engine.from_pretrained(str(tiny_checkpoint(DEEP["llama_gqa"], cache_dir=ckpt_root)))
    compiled.enable_compile(CompileOptions(backend="aot_eager", attention=attention))
    compiled.cache(CAPACITY)
    eager = deep("llama_gqa")
    method = SwiftDecoder(**DEEP_TREES)
    method.setup(compiled)
    sets, eager_steps = set(), []  # the skip sets of compiled forwards; decode steps the eager model ran
    real, model_forward = compiled.compiled.skip_fn, compiled.model.forward

    def skipping(model, tokens, positions, cache, slots, plan, *args):
        sets.add(args[-1])
        return real(model, tokens, positions, cache, slots, plan, *args)

    def eager_forward(tokens, positions, cache, slots, plan, *args, **kwargs):
        eager_steps.extend([plan.prefix] if plan.prefix > 0 else [])
        return model_forward(tokens, positions, cache, slots, plan, *args, **kwargs)

    monkeypatch.setattr(compiled.compiled, "skip_fn", skipping)
    monkeypatch.setattr(compiled.model, "forward", eager_forward)
    ids = compiled.tokenizer(WARMUP).input_ids
    assert method.generate(compiled, ids, 24).tokens == VanillaDecoder().generate(eager, ids, 24).tokens
    method.warm_shapes(compiled)
    warm, n_sets = compile_stats()["graphs"], len(sets)
    assert warm >= 1 and n_sets >= 1
    for text in SAMPLES:
        ids = compiled.tokenizer(text).input_ids
        ref = VanillaDecoder().generate(eager, ids, 24).tokens
        assert method.generate(compiled, ids, 24).tokens == ref, text
        eos = ref[len(ref) // 2]
        assert method.generate(compiled, ids, 24, eos_ids=(eos,)).tokens == ref[: ref.index(eos) + 1]
    assert method.optimizer.opt_iter > 0, "the search never ran"
    assert len(sets) > n_sets, "no new skip set after the warm-up: the recompile check below has no power"
    assert not eager_steps, "a decode step ran eagerly"
    assert compile_stats()["graphs"] == warm, "SWIFT recompiled after its first generation"


def test_a_compiled_run_times_swift_compiled_against_the_same_vanilla(tmp_path):
    """Its verification compiles, so under ``bench.compile`` the runner times SWIFT compiled, as every other
    method, with no eager vanilla beside it and no note."""
    from fafo.bench.spec import resolve
    from tests.helpers import make_cfg

    spec = resolve(make_cfg(tmp_path, "method=swift", "bench.compile=true", "bench.compile_backend=aot_eager",
                            "bench.compile_attention=flex"), tmp_path / "run")
    assert spec.compile is not None and not spec.method_eager and not spec.timing_note
