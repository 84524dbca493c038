"""Token selection: greedy, or seeded temperature / top-k / top-p sampling.

Greedy (``temperature == 0``) is what losslessness is measured on. Sampling follows transformers' logits
warpers (temperature, then top-k, then top-p) and draws from a per-sample ``torch.Generator`` so a run is
reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fafo.errors import ConfigError


@dataclass
class Sampling:
    """Sampling settings (the ``sampling`` config group).

    Attributes:
        temperature: 0 is greedy argmax.
        top_p: nucleus mass kept (1.0 = off).
        top_k: candidates kept (0 = off).
        seed: base seed; each sample's generator is seeded from it and the sample index.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"sampling.top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ConfigError(f"sampling.top_k={self.top_k} must be >= 0 (0 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, sample_index: int, device="cpu") -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + sample_index)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] logits -> [..., V] float32 probabilities after temperature, top-k and top-p."""
        logits = logits.float() / self.temperature
        if self.top_k > 0:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) >= self.top_p  # keep the token that crosses top_p
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        return torch.softmax(logits, dim=-1)

    def select(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """[..., V] logits -> [...] token ids (argmax when greedy)."""
        if self.greedy:
            return logits.argmax(dim=-1)
        probs = self.probs(logits)
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


GREEDY = Sampling()
