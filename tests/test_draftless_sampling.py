"""Sampling (temperature > 0) with the draftless methods: exact in distribution, with the chi-square
harness of tests/test_sampling.py (same model, prompt, law and significance; a biased verifier must fail)."""

import pytest

from baselines.prompt_lookup import PromptLookupDecoder
from baselines.sam_decoding import SAMDecoder
from baselines.suffix_decoding import SuffixDecoder
from baselines.token_recycling import TokenRecyclingDecoder
from baselines.vanilla import VanillaDecoder
from fafo.sampling import Sampling
from fafo.sampling_check import compare, run_many
from tests.test_sampling import BIASED, K, SAMPLES, SAMPLING, _passes, law  # noqa: F401 (law: a fixture)

METHODS = {
    "prompt_lookup": lambda: PromptLookupDecoder(),
    "token_recycling": lambda: TokenRecyclingDecoder(),
    "suffix_decoding": lambda: SuffixDecoder(),
    "sam_decoding": lambda: SAMDecoder(n_predicts=8),
}


def _run(name, law, samples=SAMPLES):
    eng, ids, joint = law("rep2")
    method = METHODS[name]()
    method.setup(eng)
    seqs, tau = run_many(method, eng, ids, SAMPLING, K, samples)
    return seqs, tau, joint


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_matches_vanilla_law(name, law):
    seqs, tau, joint = _run(name, law)
    assert tau > 1.1, f"{name}: too few accepted drafts (tau {tau:.3f}) for the test to mean anything"
    rows = compare(seqs, joint, K)
    assert _passes(rows), rows


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(METHODS))
def test_biased_verifier_fails(name, law, monkeypatch):
    for attr, fn in BIASED.items():
        monkeypatch.setattr(Sampling, attr, staticmethod(fn))
    seqs, tau, joint = _run(name, law)
    assert tau > 1.1 and not _passes(compare(seqs, joint, K))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_limits_equal_greedy(name, law):
    eng, ids, _ = law("rep2")
    ref = VanillaDecoder().generate(eng, ids, 30).tokens
    for sampling in (Sampling(temperature=1e-4, seed=5), Sampling(temperature=1.0, top_k=1, seed=5)):
        method = METHODS[name]()
        method.setup(eng)
        assert method.generate(eng, ids, 30, (), sampling, sampling.generator(0)).tokens == ref
