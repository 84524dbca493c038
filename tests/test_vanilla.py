"""Vanilla greedy equals transformers' generate(do_sample=False); sampling is seeded and matches HF's warpers."""

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from baselines.vanilla import VanillaDecoder
from fafo.decoding import truncate_at_stop
from fafo.errors import ConfigError
from fafo.sampling import Sampling
from tests.conftest import DECODING_MODELS, MODEL_SPECS

PROMPTS = ["The quick brown fox", "def fibonacci(n):\n    ", "Q: What is 12 + 30?\nA:"]


def hf_greedy(path, ids, max_new, eos_id=None):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new, eos_token_id=eos_id,
                         pad_token_id=0, min_new_tokens=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("name", list(MODEL_SPECS))
def test_greedy_equals_hf_generate(name, checkpoint, engine):
    eng = engine(name)
    for text in PROMPTS:
        ids = eng.tokenizer(text).input_ids
        ours = VanillaDecoder().generate(eng, ids, 24, eos_ids=eng.eos_ids).tokens
        assert ours == hf_greedy(checkpoint(name), ids, 24)  # HF stops at the config's eos too


@pytest.mark.parametrize("name", DECODING_MODELS)
def test_greedy_stops_at_eos_like_hf(name, checkpoint, engine):
    eng = engine(name)
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    free = VanillaDecoder().generate(eng, ids, 20).tokens
    eos = free[5]  # a token that really occurs: generation must end right after its first occurrence
    gen = VanillaDecoder().generate(eng, ids, 20, eos_ids=(eos,))
    assert gen.tokens == hf_greedy(checkpoint(name), ids, 20, eos_id=eos)
    assert gen.tokens[-1] == eos and eos not in gen.tokens[:-1]
    assert gen.n_forwards == len(gen.tokens) - 1 and gen.tau == 1.0


def test_max_new_tokens_and_accounting(engine):
    eng = engine("llama_gqa")
    gen = VanillaDecoder().generate(eng, eng.tokenizer(PROMPTS[1]).input_ids, 7)
    assert len(gen.tokens) == 7 and gen.n_forwards == 6 and gen.accept_lengths == [1] * 6 and gen.tau == 1.0


def test_truncate_at_stop():
    assert truncate_at_stop([1, 2, 3, 4], 10, (3,)) == ([1, 2, 3], True)
    assert truncate_at_stop([1, 2, 3, 4], 2, (3,)) == ([1, 2], True)
    assert truncate_at_stop([1, 2], 5, ()) == ([1, 2], False)


def test_sampling_is_seeded_and_varies(engine):
    eng = engine("llama_gqa")
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    s = Sampling(temperature=1.0, seed=3)
    a = VanillaDecoder().generate(eng, ids, 16, sampling=s, generator=s.generator(0)).tokens
    b = VanillaDecoder().generate(eng, ids, 16, sampling=s, generator=s.generator(0)).tokens
    c = VanillaDecoder().generate(eng, ids, 16, sampling=s, generator=s.generator(1)).tokens
    assert a == b and a != c
    greedy = VanillaDecoder().generate(eng, ids, 16).tokens
    top1 = Sampling(temperature=1.0, top_k=1)
    assert VanillaDecoder().generate(eng, ids, 16, sampling=top1, generator=top1.generator(0)).tokens == greedy


@pytest.mark.parametrize("t,k,p", [(0.7, 0, 0.9), (1.3, 20, 1.0), (0.6, 5, 0.8)])
def test_sampling_probs_match_hf_warpers(t, k, p):
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(0)) * 3
    ref = TemperatureLogitsWarper(t)(None, logits.clone())
    if k:
        ref = TopKLogitsWarper(k)(None, ref)
    if p < 1:
        ref = TopPLogitsWarper(p)(None, ref)
    torch.testing.assert_close(Sampling(temperature=t, top_k=k, top_p=p).probs(logits), torch.softmax(ref, -1))


def test_bad_sampling_values_are_refused():
    for kw in (dict(temperature=-1), dict(top_p=0.0), dict(top_k=-2)):
        with pytest.raises(ConfigError, match="sampling."):
            Sampling(**kw)
