"""Shared losslessness check: a method's tokens equal vanilla greedy's, across EOS and max_new_tokens boundaries."""

from baselines.vanilla import VanillaDecoder
from fafo.decoding import Decoder
from fafo.engine.engine import Engine

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15",
]
LONG_PROMPTS = [p * 4 for p in PROMPTS]  # 86-141 tokens: longer than the small retrieval budgets of the tests


def assert_lossless(method: Decoder, engine: Engine, max_new: int = 40, prompts=PROMPTS) -> list[float]:
    """For each prompt: equal tokens with no EOS, with an EOS that occurs mid-generation (so an accepted run
    can cross it), and with small max_new_tokens (so it cuts inside an accepted run). Returns the taus."""
    taus = []
    for text in prompts:
        ids = engine.tokenizer(text).input_ids
        ref = VanillaDecoder().generate(engine, ids, max_new).tokens
        gen = method.generate(engine, ids, max_new)
        assert gen.tokens == ref, f"diverged on {text!r} at {first_diff(gen.tokens, ref)}"
        assert gen.n_forwards == len(gen.accept_lengths) and sum(gen.accept_lengths) == len(ref) - 1
        taus.append(gen.tau)
        for eos_at in (3, len(ref) // 2):
            eos = ref[eos_at]
            want = ref[: ref.index(eos) + 1]
            assert method.generate(engine, ids, max_new, eos_ids=(eos,)).tokens == want, f"EOS {eos} on {text!r}"
        for cut in (1, 2, 7):
            assert method.generate(engine, ids, cut).tokens == ref[:cut], f"max_new_tokens={cut} on {text!r}"
    return taus


def first_diff(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
