"""Vanilla autoregressive decoding: one target forward per token. The reference every method is timed against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fafo.decoding import Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.attention import causal_plan
from fafo.engine.batching import RowLogits, StepInputs
from fafo.engine.engine import Engine
from fafo.sampling import GREEDY, Sampling


class _VanillaState(StepState):
    def __init__(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, sampling: Sampling, generator,
                 cache=None):
        self.engine, self.sampling, self.generator = engine, sampling, generator
        self.history = list(prompt_ids) if sampling.uses_history else None  # the repetition penalty reads it
        self.prompt = prompt_ids
        self.cache = cache if cache is not None else engine.cache(len(prompt_ids) + max_new_tokens)
        self.pos = len(prompt_ids)  # the current token's position = its KV slot

    def _select(self, rows) -> int:
        """The token after the last of ``rows``: ``[R, V]`` logits, or a step's :class:`RowLogits` (greedy: their
        argmax, read on the host with every other request's of a batched step)."""
        if isinstance(rows, RowLogits):
            if self.sampling.greedy:
                return int(rows.argmax()[-1])
            rows = rows.tensor
        token = int(self.sampling.select(rows[-1], self.generator, self.history))
        if self.history is not None:
            self.history.append(token)
        return token

    def prefill(self) -> int:
        self.cur = self._select(self.engine.prefill(self.cache, self.prompt)[0])
        return self.cur

    def inputs(self, remaining: int) -> list[StepInputs]:
        pos = self.pos
        return [StepInputs([self.cur], [pos], [pos], causal_plan(pos), logits="last")]

    def outputs(self, remaining: int, logits) -> Step:
        return Step([self._select(logits[0])])

    def commit(self, step: Step) -> None:
        self.cur = step.tokens[0]
        self.pos += 1

    def live_slots(self) -> int:
        return self.pos


@dataclass
class VanillaDecoder(Decoder):
    """Greedy (or sampled) decoding, one token per forward, on the shared static cache."""

    batch_refusal: ClassVar[str] = ""

    def forward_tokens(self) -> tuple[int, ...]:
        return (1,)

    def new_state(self, engine, prompt_ids, max_new_tokens, eos_ids=(), sampling=None, generator=None, cache=None):
        return _VanillaState(engine, prompt_ids, max_new_tokens, sampling or GREEDY, generator, cache)

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        state = self.new_state(engine, prompt_ids, max_new_tokens, eos_ids, sampling, generator)
        return decode(engine, state, max_new_tokens, eos_ids, clock)
