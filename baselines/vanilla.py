"""Vanilla autoregressive decoding: one target forward per token. The reference every method is timed against."""

from __future__ import annotations

from dataclasses import dataclass

from fafo.decoding import Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.attention import causal_plan
from fafo.engine.engine import Engine
from fafo.sampling import GREEDY, Sampling


class _VanillaState(StepState):
    def __init__(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, sampling: Sampling, generator):
        self.engine, self.sampling, self.generator = engine, sampling, generator
        self.history = list(prompt_ids) if sampling.uses_history else None  # the repetition penalty reads it
        self.prompt = prompt_ids
        self.cache = engine.cache(len(prompt_ids) + max_new_tokens)
        self.pos = len(prompt_ids)  # the current token's position = its KV slot

    def _select(self, logits) -> int:
        token = int(self.sampling.select(logits[0, -1], self.generator, self.history))
        if self.history is not None:
            self.history.append(token)
        return token

    def prefill(self) -> int:
        self.cur = self._select(self.engine.prefill(self.cache, self.prompt))
        return self.cur

    def step(self, remaining: int) -> Step:
        pos = self.pos
        logits = self.engine.forward(self.cache, [self.cur], [pos], [pos], causal_plan(pos), logits="last")
        return Step([self._select(logits)])

    def commit(self, step: Step) -> None:
        self.cur = step.tokens[0]
        self.pos += 1


@dataclass
class VanillaDecoder(Decoder):
    """Greedy (or sampled) decoding, one token per forward, on the shared static cache."""

    def forward_tokens(self) -> tuple[int, ...]:
        return (1,)

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        state = _VanillaState(engine, prompt_ids, max_new_tokens, sampling or GREEDY, generator)
        return decode(engine, state, max_new_tokens, eos_ids, clock)
