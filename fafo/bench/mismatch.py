"""Exactness in half precision: is a greedy mismatch numerics (a tie) or a bug (a divergence)? In float16/bfloat16
a one-token decode forward and a many-token verification forward reduce in different orders, so a lossless method
can pick the other of two near-equal tokens. At a sample's first mismatch, outside the timed region, the target's
logits after the shared prefix are recomputed in float32: ``tie`` when the two tokens' logits are within
``bench.tie_margin``, ``divergence`` for a larger gap or a cut at another length, ``unchecked`` when the check
could not run (the summary's ``mismatch_check`` says why). The float32 model is the run's own engine when it is
float32, else a copy on the CPU kept until the run ends (never on the device: later peaks and prefills are
unaffected), or with ``bench.tie_check=device`` one loaded on the device and freed around each check.
"""

from __future__ import annotations

import gc
import traceback

import torch

from fafo.engine.engine import Engine

PLACES = ("cpu", "device")


class MismatchJudge:
    """Classifies first mismatches; ``judge(prompt, method_tokens, ref_tokens, i) -> (kind, gap)``."""

    def __init__(self, engine: Engine, ckpt, context: int, margin: float = 0.1, place: str = "cpu"):
        if place not in PLACES:
            raise ValueError(f"bench.tie_check={place!r}; one of {', '.join(PLACES)}")
        self.engine, self.ckpt, self.context, self.margin, self.place = engine, ckpt, context, float(margin), place
        self._own = engine.dtype == torch.float32
        self._fp32: Engine | None = engine if self._own else None
        self.note = ""  # where the float32 check ran, when not on the run's own engine; or why it could not

    def _load(self, device) -> Engine:
        return Engine.load(self.ckpt.path, self.ckpt.config, self.ckpt.tokenizer, device=device, dtype="float32",
                           backend="sdpa", max_len=self.context, name=self.engine.name)

    def _engine(self) -> Engine:
        if self._fp32 is not None:
            return self._fp32
        if self.place == "device":
            self.note = f"float32 copy of the model on {self.engine.device}, loaded and freed around each check"
            return self._load(self.engine.device)
        self._fp32 = self._load("cpu")
        self.note = "float32 copy of the model on the CPU (kept off the device: peaks and prefills unaffected)"
        return self._fp32

    def __call__(self, prompt: list[int], tokens: list[int], ref_tokens: list[int], i: int) -> tuple[str, float | str]:
        if i >= min(len(tokens), len(ref_tokens)):
            return "divergence", ""  # same tokens, cut at another length
        engine = None
        try:
            engine = self._engine()
            return self._classify(engine, list(prompt) + list(ref_tokens[:i]), tokens[i], ref_tokens[i])
        except Exception as exc:  # noqa: BLE001 - the check must never fail the method's row
            traceback.print_exception(exc)
            self.note = f"float32 tie check not run: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return "unchecked", ""
        finally:
            if engine is not None and engine is not self._fp32:  # bench.tie_check=device: freed at once
                del engine
                gc.collect()
                if self.engine.device.type == "cuda":
                    torch.cuda.empty_cache()

    def _classify(self, engine: Engine, prefix: list[int], token: int, ref_token: int) -> tuple[str, float]:
        cache = engine.cache(len(prefix)) if engine is self.engine else engine.new_cache(len(prefix))
        with engine.ledger.paused():  # the check is not the method's work
            logits = engine.prefill(cache, prefix)[0, -1].float()
        gap = abs(float(logits[token] - logits[ref_token]))
        return ("tie" if gap <= self.margin else "divergence"), gap

    def release(self) -> None:
        """Drop the float32 copy (the run's end)."""
        if not self._own:
            self._fp32 = None
