"""Reading exactness in half precision: is a greedy mismatch numerics (a tie) or a bug (a divergence)?

In float16/bfloat16 a one-token decode forward and a many-token verification forward reduce in different orders,
so a lossless method can pick the other of two near-equal tokens where vanilla picked one. At a sample's first
mismatch (index i), outside the timed region, the target's logits after the shared prefix (prompt + the common
i tokens) are recomputed in float32 and the two tokens' logits compared:

* ``tie``: ``|logit(method token) - logit(reference token)| <= margin`` in float32 (``bench.tie_margin``,
  logit units): the two continuations are equally plausible and the choice is rounding;
* ``divergence``: a larger gap, or the generations differ only in length (a cut at another place): a bug.

The float32 model is the run's own engine when it already is float32, else a float32 copy loaded once, at the
first mismatch, on the run's device (on the CPU if the device has no room); the summary says which.
"""

from __future__ import annotations

import torch

from fafo.engine.engine import Engine


class MismatchJudge:
    """Classifies first mismatches; ``judge(prompt, method_tokens, ref_tokens, i) -> (kind, gap)``."""

    def __init__(self, engine: Engine, ckpt, context: int, margin: float = 0.1):
        self.engine, self.ckpt, self.context, self.margin = engine, ckpt, context, float(margin)
        self._fp32: Engine | None = engine if engine.dtype == torch.float32 else None
        self.note = ""  # where the float32 check ran, when not on the run's own engine

    def fp32_engine(self) -> Engine:
        if self._fp32 is None:
            kwargs = dict(dtype="float32", backend="sdpa", max_len=self.context, name=self.engine.name)
            try:
                self._fp32 = Engine.load(self.ckpt.path, self.ckpt.config, self.ckpt.tokenizer,
                                         device=self.engine.device, **kwargs)
                self.note = f"float32 copy of the model on {self.engine.device}"
            except torch.OutOfMemoryError:
                self._fp32 = Engine.load(self.ckpt.path, self.ckpt.config, self.ckpt.tokenizer, device="cpu",
                                         **kwargs)
                self.note = "float32 copy of the model on the CPU (no room on the device)"
        return self._fp32

    def __call__(self, prompt: list[int], tokens: list[int], ref_tokens: list[int], i: int) -> tuple[str, float | str]:
        if i >= min(len(tokens), len(ref_tokens)):
            return "divergence", ""  # same tokens, cut at another length
        engine = self.fp32_engine()
        prefix = list(prompt) + list(ref_tokens[:i])
        # the check must not count as the method's work: the ledger is restored afterwards
        counts = dict(engine.ledger.counts), engine.ledger.tokens
        cache = engine.new_cache(len(prefix)) if engine is not self.engine else engine.cache(len(prefix))
        logits = engine.prefill(cache, prefix)[0, -1].float()
        engine.ledger.counts, engine.ledger.tokens = counts
        gap = abs(float(logits[tokens[i]] - logits[ref_tokens[i]]))
        return ("tie" if gap <= self.margin else "divergence"), gap
