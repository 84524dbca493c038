"""The Decoder contract every method implements, vanilla included.

A decoder is a dataclass whose fields are its hyperparameters (they become the Hydra schema; ``__post_init__``
validates them, so a bad value fails before any model is loaded). The runner builds it from config, calls
:meth:`Decoder.setup` once with the engine, then :meth:`Decoder.generate` per prompt. Decoders never time
themselves: they call ``clock.mark("prefill")`` when the prompt is processed and the runner does the timing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from fafo.engine.engine import Engine
from fafo.sampling import Sampling


class Clock(Protocol):
    def mark(self, phase: str) -> None:
        """Record that ``phase`` (e.g. ``"prefill"``) just finished."""


class NullClock:
    def mark(self, phase: str) -> None:
        pass


@dataclass
class Generation:
    """What one generate call produced.

    Attributes:
        tokens: the new token ids (prompt excluded), ending at the first EOS or at max_new_tokens.
        accept_lengths: tokens committed by each decode forward of the target model (prefill excluded).
        n_forwards: decode forwards of the target model with its full cache (prefill excluded); tau is
            ``len(tokens) / (n_forwards + 1)``.
        extras: method-specific counters (draft forwards, pool hits, extra buffer bytes under ``buffer_bytes``...).
    """

    tokens: list[int]
    accept_lengths: list[int] = field(default_factory=list)
    n_forwards: int = 0
    extras: dict = field(default_factory=dict)

    @property
    def tau(self) -> float:
        return len(self.tokens) / (self.n_forwards + 1)


@dataclass
class Decoder(ABC):
    """Base class of all decoding methods."""

    def setup(self, engine: Engine) -> None:
        """Called once per run, before any generate (state that persists across samples lives here)."""

    def check_sampling(self, sampling: Sampling) -> None:
        """Raise ConfigError if this method cannot decode with ``sampling`` (checked before loading a model)."""

    def check_target(self, hf_config, tokenizer) -> None:
        """Raise ConfigError if this method cannot run on the target model (e.g. a draft model with another
        vocabulary). Called with the target's transformers config and tokenizer before any weights are loaded."""

    def forward_tokens(self) -> tuple[int, ...] | None:
        """Tokens in each target forward of one decode step ((1,) for vanilla), or None where it varies (drafts).
        The run summary reports their sum as ``tokens_per_forward`` and, given ``bench.cost_curve``, the
        break-even tau (:mod:`fafo.bench.cost_curve`)."""
        return None

    def extra_slots(self, max_new_tokens: int) -> int:
        """Cache slots this method needs beyond ``prompt + max_new_tokens`` (scratch for drafts, windows...)."""
        return 0

    @abstractmethod
    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids: tuple[int, ...] = (),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        """Decode up to ``max_new_tokens`` tokens after ``prompt_ids``, stopping after any of ``eos_ids``."""


def truncate_at_stop(tokens: list[int], max_new_tokens: int, eos_ids) -> tuple[list[int], bool]:
    """Cut a committed run at the first EOS (kept) or at max_new_tokens; returns (tokens, finished)."""
    for i, t in enumerate(tokens[:max_new_tokens]):
        if t in eos_ids:
            return tokens[: i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens
