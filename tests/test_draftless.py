"""The draftless methods (Prompt Lookup, Token Recycling, SuffixDecoding, SAM-Decoding): token-identical
to vanilla greedy, each draft source doing the work (tau > 2 only through it), Prompt Lookup's tau equal to
transformers' own ``generate(prompt_lookup_num_tokens=10)``, and their data structures checked against brute force.
Sampling (exact in distribution) is in tests/test_sampling.py, FlexAttention in tests/test_method_matrix.py."""

import random

import pytest
import torch

from baselines.prompt_lookup import NgramIndex, PromptLookupDecoder
from baselines.sam_decoding import SAMDecoder
from baselines.suffix_decoding import SuffixDecoder
from baselines.suffix_tree import SuffixTree
from baselines.token_recycling import TEMPLATES, TokenRecyclingDecoder
from baselines.vanilla import VanillaDecoder
from fafo.errors import ConfigError
from tests.conftest import LOSSLESS_MODELS
from tests.lossless import PROMPTS, assert_lossless
from tests.methods import DRAFTLESS, variants

METHODS = variants(DRAFTLESS)  # tests/methods.py: each draftless method's small instances


def _make(name, eng):
    method = METHODS[name]()
    method.setup(eng)
    return method


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("name", LOSSLESS_MODELS)
def test_token_identical_to_vanilla_greedy(name, method, engine):
    """MHA/GQA, Llama/Qwen2, varied (acceptance near 0) and repetitive (high) models; EOS and max_new_tokens cuts."""
    assert_lossless(_make(method, engine(name)), engine(name))


@pytest.mark.parametrize("method", ["prompt_lookup", "token_recycling", "suffix_decoding", "sam_decoding"])
def test_static_shapes_padding_is_token_identical(method, engine, monkeypatch):
    """Under engine.static_shapes every tree is padded to max_tree() nodes (compiled steps), and a step that drafted
    nothing is vanilla's 1-token step (its graph, not a padded tree): same tokens, two shapes at most."""
    eng = engine("llama_gqa")
    monkeypatch.setattr(eng, "static_shapes", True)
    m = _make(method, eng)
    assert_lossless(m, eng, max_new=24, prompts=PROMPTS[:2])
    calls = []
    original = eng.model.forward
    monkeypatch.setattr(eng.model, "forward",
                        lambda tok, *a, **kw: calls.append(tok.shape[1]) or original(tok, *a, **kw))
    gen = m.generate(eng, eng.tokenizer(PROMPTS[2]).input_ids, 24)
    assert len(calls) == gen.n_forwards + 1 and m.max_tree() in calls[1:] and set(calls[1:]) <= {1, m.max_tree()}
    drafted_nothing = sum(1 for n in gen.accept_lengths if n == 1)  # a 1-token step commits exactly one token
    assert calls[1:].count(1) <= drafted_nothing
    assert m.extra_slots(24) >= m.max_tree()


@pytest.mark.parametrize("method", ["prompt_lookup", "token_recycling", "suffix_decoding", "sam_decoding"])
def test_warm_shapes_runs_every_step_shape(method, engine, monkeypatch):
    """A warm-up generation may take only some of the step shapes (nothing drafted; a shallow or a deep tree): the
    runner's warm-up then calls warm_shapes, one forward of each, so no timed sample compiles a graph."""
    eng = engine("llama_gqa")
    m = _make(method, eng)
    m.generate(eng, eng.tokenizer(PROMPTS[0]).input_ids, 4)  # the shared cache exists
    calls = []
    original = eng.model.forward
    monkeypatch.setattr(eng.model, "forward",
                        lambda tok, *a, **kw: calls.append(tok.shape[1]) or original(tok, *a, **kw))
    m.warm_shapes(eng)
    assert calls == []  # without static shapes every step runs as it comes: nothing to warm
    monkeypatch.setattr(eng, "static_shapes", True)
    m.warm_shapes(eng)
    assert calls == [1, m.max_tree(), m.max_tree()]


def _self_loop(eng, text=PROMPTS[0], n=60):
    """A prompt followed by the model's own greedy continuation: asking the model to go on repeating it."""
    ids = eng.tokenizer(text).input_ids
    return ids + VanillaDecoder().generate(eng, ids, n).tokens


# ------------------------------------------------------------------ each method's draft source does the work
def test_prompt_lookup_copies_prompt_ngrams(engine, monkeypatch):
    eng = engine("llama_mha_rep")
    ids = _self_loop(eng)
    ref = VanillaDecoder().generate(eng, ids, 60).tokens
    gen = PromptLookupDecoder().generate(eng, ids, 60)
    assert gen.tokens == ref and gen.tau > 2
    monkeypatch.setattr(NgramIndex, "lookup", lambda self, *a, **kw: [])  # no n-gram source: vanilla steps
    assert PromptLookupDecoder().generate(eng, ids, 60).tau == pytest.approx(60 / 60)


def test_token_recycling_adjacency_supplies_the_tree(engine, monkeypatch):
    eng = engine("llama_mha_rep")
    ids = eng.tokenizer(PROMPTS[1]).input_ids
    ref = VanillaDecoder().generate(eng, ids, 60).tokens
    m = _make("token_recycling", eng)
    gen = m.generate(eng, ids, 60)
    assert gen.tokens == ref and gen.tau > 2
    # the matrix row of the last tokens is the target's top-8 after them (recycled from verification forwards)
    t = ref[-2]
    ctx = ids + ref[:-1]
    logits = eng.prefill(eng.cache(len(ctx)), ctx)[0, -1]
    assert m.adjacency[t, :4].tolist() == logits.topk(4).indices.tolist()  # (near-ties further down)
    # the matrix persists across samples (official); a frozen all-zero matrix drafts only token 0: no speed-up
    assert m.generate(eng, ids, 60).tau >= gen.tau
    frozen = _make("token_recycling", eng)
    monkeypatch.setattr("baselines.token_recycling._TRState.observe", lambda *a: None)
    assert frozen.generate(eng, ids, 60).tau < 1.2


def test_token_recycling_template_is_official():
    tpl = TEMPLATES["2.2.2"]
    assert len(tpl) == 80 and max(map(len, tpl)) == 6 and TokenRecyclingDecoder().max_tree() == 81
    assert all(p[:-1] in tpl or len(p) == 1 for p in tpl)  # every parent is in the template


def test_suffix_decoding_prompt_tree_and_output_cache(engine):
    eng = engine("llama_mha_rep")
    ids = _self_loop(eng, n=120)
    ref = VanillaDecoder().generate(eng, ids, 60).tokens
    gen = _make("suffix_decoding", eng).generate(eng, ids, 60)
    assert gen.tokens == ref and gen.tau > 2  # from the prompt's suffix tree
    # the global tree of earlier outputs: a varied model, a prompt without repeats, asked twice
    eng = engine("qwen2_gqa")
    ids = eng.tokenizer(PROMPTS[1]).input_ids
    ref = VanillaDecoder().generate(eng, ids, 40).tokens
    m = _make("suffix_decoding", eng)
    first, second = m.generate(eng, ids, 40), m.generate(eng, ids, 40)
    assert first.tokens == second.tokens == ref
    assert first.tau < 1.5 and second.tau > 2
    m0 = SuffixDecoder(max_cached_outputs=0)
    m0.generate(eng, ids, 40)
    assert m0.generate(eng, ids, 40).tau < 1.5 and len(m0.global_tree) == 0  # nothing cached


def test_sam_decoding_automaton_and_static_corpus(engine, tmp_path):
    eng = engine("llama_mha_rep")
    ids = _self_loop(eng, PROMPTS[1], n=150)
    ref = VanillaDecoder().generate(eng, ids, 60).tokens
    gen = SAMDecoder(n_predicts=16).generate(eng, ids, 60)
    assert gen.tokens == ref and gen.tau > 2
    assert SAMDecoder(n_predicts=16, alpha=1e-9).generate(eng, ids, 60).tau == 1  # no draft: vanilla steps
    # the static corpus automaton: a varied model whose continuation is only in the corpus
    eng = engine("qwen2_gqa")
    ids = eng.tokenizer(PROMPTS[1]).input_ids
    ref = VanillaDecoder().generate(eng, ids, 60).tokens
    assert SAMDecoder().generate(eng, ids, 60).tau < 1.5
    more = VanillaDecoder().generate(eng, ids, 100).tokens  # n_predicts = 40 tokens of room past the 60th
    text = eng.tokenizer.decode(ids + more, skip_special_tokens=True)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": %s}\n' % __import__("json").dumps(text))
    m = SAMDecoder(corpus_path=str(corpus), len_bias=0)
    m.setup(eng)
    gen = m.generate(eng, ids, 60)
    assert gen.tokens == ref and gen.tau > 2


# ------------------------------------------------------------------ against transformers and brute force
def test_prompt_lookup_tau_matches_transformers(checkpoint, engine):
    """transformers' own prompt lookup (assisted decoding, forwards counted) on the same model and prompts."""
    from transformers import AutoModelForCausalLM

    name = "llama_mha_rep"
    eng = engine(name)
    hf = AutoModelForCausalLM.from_pretrained(str(checkpoint(name)), dtype=torch.float32).eval()
    calls = []
    hf.register_forward_hook(lambda *a: calls.append(1))
    ours_new = ours_fw = hf_new = hf_fw = 0
    for text in (PROMPTS[0], PROMPTS[2], PROMPTS[0] + " " + PROMPTS[1]):
        ids = _self_loop(eng, text, 30)
        gen = PromptLookupDecoder(num_tokens=10, max_ngram=3).generate(eng, ids, 80)
        calls.clear()
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              prompt_lookup_num_tokens=10, max_matching_ngram_size=3, max_new_tokens=80,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
        new = out[0, len(ids):].tolist()
        assert new == gen.tokens
        ours_new, ours_fw = ours_new + len(gen.tokens), ours_fw + gen.n_forwards + 1
        hf_new, hf_fw = hf_new + len(new), hf_fw + len(calls)
    ours, theirs = ours_new / ours_fw, hf_new / hf_fw
    assert theirs > 1.5 and abs(ours - theirs) / theirs < 0.05, (ours, theirs)


def test_ngram_index_equals_a_scan():
    rng = random.Random(0)
    for _ in range(200):
        toks = [rng.randrange(4) for _ in range(rng.randrange(2, 30))]
        idx = NgramIndex(1, 3)
        idx.extend(toks)
        want = []
        for n in range(min(3, len(toks) - 1), 0, -1):  # transformers' loop
            starts = [i for i in range(len(toks) - n + 1) if toks[i:i + n] == toks[-n:] and i + n < len(toks)]
            if starts:
                want = toks[starts[0] + n: starts[0] + n + 5]
                break
        assert idx.lookup(5) == want


def test_suffix_tree_counts_and_removal():
    rng = random.Random(1)
    seqs = {i: [rng.randrange(3) for _ in range(rng.randrange(1, 25))] for i in range(5)}
    tree = SuffixTree(max_depth=4)
    for i, s in seqs.items():
        for j in range(0, len(s), 3):
            tree.extend(i, s[j:j + 3])  # in pieces, as outputs grow
    tree.remove(2)

    def occurrences(sub):
        return sum(1 for k, s in seqs.items() if k != 2
                   for i in range(len(s) - len(sub) + 1) if s[i:i + len(sub)] == sub)

    for sub in ([0], [1, 2], [2, 2, 0], [0, 1, 0, 1], [1]):
        assert tree.count(sub) == occurrences(sub)
    d = tree.speculate([0, 1], max_spec_tokens=6, max_spec_factor=10, min_token_prob=0.0)
    assert 0 < len(d.tokens) <= 6 and d.score == pytest.approx(sum(d.probs))
    assert all(p < i for i, p in enumerate(d.parents)) and d.probs == sorted(d.probs, reverse=True)


@pytest.mark.parametrize("bad", [
    lambda: PromptLookupDecoder(num_tokens=0), lambda: PromptLookupDecoder(min_ngram=4, max_ngram=3),
    lambda: TokenRecyclingDecoder(topk=4), lambda: TokenRecyclingDecoder(tree="9"),
    lambda: SuffixDecoder(min_token_prob=2.0), lambda: SuffixDecoder(max_depth=1),
    lambda: SAMDecoder(alpha=0), lambda: SAMDecoder(corpus_path="/nonexistent/corpus.jsonl"),
])
def test_bad_hyperparameters_fail_early(bad):
    with pytest.raises(ConfigError, match=r"method\."):
        bad()
