"""The chi-square harness of the sampling tests: repetitive tiny models, the exact law of vanilla sampling of their
first K tokens, and deliberately biased verifiers that must fail (tests/test_sampling.py and the methods' own
sampling tests)."""

from baselines.vanilla import VanillaDecoder
from fafo.engine.engine import Engine
from fafo.engine.tiny import tiny_checkpoint
from fafo.sampling import Sampling
from fafo.sampling_check import exact_joint
from tests.conftest import MODEL_SPECS

ALPHA = 0.001
K = 3  # tokens whose joint law is tested
SAMPLING = Sampling(temperature=0.1, top_k=4, seed=11)
MODELS = {  # repetitive tiny models (their greedy output loops); SWIFT needs > 2 layers to skip any
    "rep2": MODEL_SPECS["llama_mha_rep"],
    "rep4": dict(MODEL_SPECS["llama_mha_rep"], num_hidden_layers=4),
}
SAMPLES = 1000
_HONEST = Sampling.accept_deterministic
_HONEST_SPEC = Sampling.speculative_accept
_HONEST_SIB = Sampling.accept_siblings
PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


def exact_laws(ckpt_root):
    """law(model) -> (engine, prompt ids, exact joint law of the first K sampled tokens), cached (the ``law``
    fixture of tests/conftest.py)."""
    cache = {}

    def get(model: str):
        if model not in cache:
            eng = Engine.from_pretrained(str(tiny_checkpoint(MODELS[model], cache_dir=ckpt_root)))
            ids = eng.tokenizer(PROMPT).input_ids
            ids = ids + VanillaDecoder().generate(eng, ids, 40).tokens  # the model's own loop: n-grams accepted
            cache[model] = eng, ids, exact_joint(eng, ids, SAMPLING, K)
        return cache[model]

    return get


def biased_accept(p, candidates, generator):
    """A wrong verifier: any candidate among the target's top 2 is accepted outright."""
    top2 = set(p.topk(2).indices.tolist())
    for t in dict.fromkeys(int(c) for c in candidates):
        if t in top2 and p[t] > 0:
            return t, True
    return _HONEST(p, candidates, generator)


def biased_speculative(p, q, token, generator):
    """A wrong speculative verifier: a proposal among the target's top 2 is accepted outright."""
    if int(token) in set(p.topk(2).indices.tolist()) and p[token] > 0:
        return int(token), True
    return _HONEST_SPEC(p, q, token, generator)


def biased_siblings(p, q, siblings, generator):
    top2 = set(p.topk(2).indices.tolist())
    for i, t in enumerate(int(x) for x in siblings):
        if t in top2 and p[t] > 0:
            return t, i
    return _HONEST_SIB(p, q, siblings, generator)


BIASED = {"accept_deterministic": biased_accept, "speculative_accept": biased_speculative,
          "accept_siblings": biased_siblings}


def passes(rows) -> bool:
    return min(r["pvalue"] for r in rows) > ALPHA
