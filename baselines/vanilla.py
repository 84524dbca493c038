"""Vanilla autoregressive decoding: one target forward per token. The reference every method is timed against."""

from __future__ import annotations

from dataclasses import dataclass

from fafo.decoding import Clock, Decoder, Generation, NullClock
from fafo.engine.attention import causal_plan
from fafo.engine.engine import Engine
from fafo.sampling import GREEDY, Sampling


@dataclass
class VanillaDecoder(Decoder):
    """Greedy (or sampled) decoding, one token per forward, on the shared static cache."""

    def forward_tokens(self) -> tuple[int, ...]:
        return (1,)

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        sampling = sampling or GREEDY
        clock = clock or NullClock()
        n = len(prompt_ids)
        cache = engine.cache(n + max_new_tokens)
        logits = engine.prefill(cache, prompt_ids)
        token = int(sampling.select(logits[0, -1], generator, list(prompt_ids) if sampling.uses_history else None))
        clock.mark("prefill")
        tokens = [token]
        while len(tokens) < max_new_tokens and token not in eos_ids:
            pos = n + len(tokens) - 1  # the last token's KV goes to the slot equal to its position
            logits = engine.forward(cache, [token], [pos], [pos], causal_plan(pos), logits="last")
            token = int(sampling.select(logits[0, -1], generator,
                                          list(prompt_ids) + tokens if sampling.uses_history else None))
            tokens.append(token)
        n_forwards = len(tokens) - 1
        return Generation(tokens, [1] * n_forwards, n_forwards)
