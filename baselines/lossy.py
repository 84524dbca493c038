"""Plain lossy decoding with a KV compression function: every decode query attends only C(kv).

Not a lossless method: it exists so a run can show how a compression function's output diverges from vanilla
greedy (exact_match_rate, first_mismatch) while FAFO, with the same function and budget, stays identical. It uses
the same fixed-region layout as FAFO, so C(kv) is exactly the entries FAFO's fumble streams would see. The prompt
is prefilled with full attention (as SnapKV and StreamingLLM evaluations do). Query-aware functions (Quest)
re-select from the previous token's query, one step stale, since the selection is swapped in between steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fafo.compress.base import Compression, FixedRegion
from fafo.compress.stream import StreamingLLM
from fafo.decoding import Clock, Decoder, Generation, NullClock
from fafo.engine.attention import AttentionPlan, causal_plan
from fafo.engine.engine import Engine
from fafo.errors import ConfigError
from fafo.sampling import GREEDY, Sampling


@dataclass
class LossyDecoder(Decoder):
    """Autoregressive decoding over the compressed cache C(kv) (plus the token itself)."""

    compress: Compression = field(default_factory=StreamingLLM)

    def __post_init__(self):
        if not isinstance(self.compress, Compression):
            raise ConfigError("method.compress must be a compression function (choose one in conf/method/compress/)")

    def extra_slots(self, max_new_tokens: int) -> int:
        return 1

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        sampling, clock = sampling or GREEDY, clock or NullClock()
        T = len(prompt_ids)
        capacity = T + max_new_tokens
        cache = engine.cache(capacity + 1)
        region = FixedRegion(cache, self.compress, capacity)
        plan = causal_plan(0)
        plan.capture_rows = self.compress.prefill_query_rows(T)
        logits = engine.forward(cache, prompt_ids, torch.arange(T), torch.arange(T), plan, logits="last")
        region.prefill(T, plan.captured or None)
        token = int(sampling.select(logits[0, -1], generator))
        clock.mark("prefill")
        tokens = [token]
        scratch = torch.tensor([capacity])
        rows = torch.zeros(1, dtype=torch.long) if self.compress.wants_decode_query else None
        while len(tokens) < max_new_tokens and token not in eos_ids:
            plan = AttentionPlan(prefix=region.n, region_from=0, region_len=region.region_len,
                                 region_capacity=min(self.compress.budget, cache.max_len),
                                 dense_layers=self.compress.dense(), capture_rows=rows)
            logits = engine.forward(cache, [token], [region.n], scratch, plan, logits="last")
            token = int(sampling.select(logits[0, -1], generator))
            tokens.append(token)
            region.commit(scratch, plan.captured or None)
        n_forwards = len(tokens) - 1
        return Generation(tokens, [1] * n_forwards, n_forwards)
