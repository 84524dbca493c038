"""Plain lossy decoding with a KV compression function: every decode query attends only C(kv) (plus itself), on the
fixed-region layout FAFO uses, after a full-attention prefill. Not lossless: it shows how a compression function's
output diverges from vanilla where FAFO, with the same function, stays identical (docs/methods/vanilla.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from fafo.compress.base import Compression, FixedRegion
from fafo.compress.stream import StreamingLLM
from fafo.decoding import Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.attention import AttentionPlan, causal_plan
from fafo.engine.engine import Engine
from fafo.errors import ConfigError
from fafo.sampling import GREEDY, Sampling


@dataclass
class LossyDecoder(Decoder):
    """Autoregressive decoding over the compressed cache C(kv) (plus the token itself)."""

    batch_refusal: ClassVar[str] = "lossy decoding illustrates a compression function one request at a time"
    compress: Compression = field(default_factory=StreamingLLM)

    def __post_init__(self):
        if not isinstance(self.compress, Compression):
            raise ConfigError("method.compress must be a compression function (choose one in conf/method/compress/)")

    def extra_slots(self, max_new_tokens: int) -> int:
        return 1

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        state = _LossyState(self.compress, engine, prompt_ids, max_new_tokens, sampling or GREEDY, generator)
        return decode(engine, state, max_new_tokens, eos_ids, clock)


class _LossyState(StepState):
    def __init__(self, compress: Compression, engine: Engine, prompt_ids: list[int], max_new_tokens: int,
                 sampling: Sampling, generator):
        self.compress, self.engine, self.sampling, self.generator = compress, engine, sampling, generator
        self.prompt = prompt_ids
        capacity = len(prompt_ids) + max_new_tokens
        self.cache = engine.cache(capacity + 1)
        self.region = FixedRegion(self.cache, compress, capacity)
        self.scratch = [capacity]
        self.rows = torch.zeros(1, dtype=torch.long) if compress.wants_decode_query else None

    def prefill(self) -> int:
        T = len(self.prompt)
        plan = causal_plan(0)
        plan.capture_rows = self.compress.prefill_query_rows(T)
        logits, queries = self.engine.forward(self.cache, self.prompt, torch.arange(T), torch.arange(T), plan,
                                              logits="last", kind="prefill", queries=True)
        self.region.prefill(T, queries)
        self.cur = int(self.sampling.select(logits[0, -1], self.generator))
        return self.cur

    def step(self, remaining: int) -> Step:
        plan = AttentionPlan(prefix=self.region.n, region_from=0, region_len=self.region.region_len,
                             region_capacity=min(self.compress.budget, self.cache.max_len),
                             dense_layers=self.compress.dense(), capture_rows=self.rows)
        logits, queries = self.engine.forward(self.cache, [self.cur], [self.region.n], self.scratch, plan,
                                              logits="last", queries=True)
        return Step([int(self.sampling.select(logits[0, -1], self.generator))], queries=queries)

    def commit(self, step: Step) -> None:
        self.region.commit(self.scratch, step.queries)
        self.cur = step.tokens[0]
