"""Token selection and lossless verification: greedy, or seeded temperature / top-k / top-p / min-p sampling
with an optional repetition penalty, shared by vanilla and by every method's verification.

Greedy (``temperature == 0``) is what token-exact losslessness is measured on. Sampling follows transformers'
logits processors in their order: repetition penalty (over the prompt and everything generated so far), then
temperature, top-k, top-p, min-p. Every draw comes from a per-(sample, turn) ``torch.Generator`` so a run is
reproducible.

Verification helpers (lossless in distribution: each emitted token is distributed exactly as vanilla sampling's):

* :meth:`Sampling.accept_deterministic` - for guesses with no proposal distribution (FAFO, Lookahead): the
  distinct candidate tokens are tried in turn, token t accepted with probability p(t) / R where R is the mass not
  yet rejected; a rejected token's mass is removed (set to 0); if every candidate is rejected a token is drawn from
  the remaining distribution p restricted to the non-candidates, renormalised.

  Exactness: let c_1..c_m be the distinct candidates and R_i = 1 - sum_{j<i} p(c_j) the mass left when c_i is
  tried. The chance of reaching c_i is prod_{j<i} (1 - p(c_j)/R_j) = prod_{j<i} R_{j+1}/R_j = R_i, so c_i is
  emitted with probability R_i * p(c_i)/R_i = p(c_i); a non-candidate t is emitted with probability
  R_{m+1} * p(t)/R_{m+1} = p(t). The candidates must be fixed before this draw (they are: they come from the
  pool / window state of earlier steps, never from this step's random numbers), so conditioned on the prefix the
  emitted token is distributed as p(. | prefix). Continuing at the next depth only with the candidates that match
  the emitted token, and sampling a bonus token from p after a full match, therefore produces a sequence with
  exactly the autoregressive distribution (induction over depths; stopping early or truncating at EOS /
  max_new_tokens keeps a prefix of an exact sample). This is Lookahead Decoding's sampling verification.

* :meth:`Sampling.speculative_accept` / :func:`residual` - the standard speculative-sampling rule for a token
  drawn from a proposal q: accept with probability min(1, p(t)/q(t)), else draw from norm(max(0, p - q)).
  (Leviathan et al. 2023; Chen et al. 2023.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from fafo.bounds import at_least, check_bounds
from fafo.errors import ConfigError


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution to resample from after a proposal from q is rejected.
    Falls back to p when p <= q everywhere (then rejection has probability 0 anyway)."""
    r = (p.float() - q.float()).clamp_min(0)
    s = r.sum(-1, keepdim=True)
    return torch.where(s > 0, r / s.clamp_min(1e-30), p.float())


def _uniform(generator: torch.Generator | None, device) -> float:
    return float(torch.rand((), generator=generator, device=device))


def _draw(p: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(p.float(), 1, generator=generator))


@dataclass
class Sampling:
    """Sampling settings (the ``sampling`` config group).

    Attributes:
        temperature: 0 is greedy argmax.
        top_p: nucleus mass kept (1.0 = off).
        top_k: candidates kept (0 = off).
        min_p: drop tokens whose probability is below ``min_p`` times the top one's (0 = off).
        repetition_penalty: transformers' CTRL-style penalty over the prompt and generated tokens (1.0 = off);
            sampling only (greedy verification is plain argmax).
        seed: base seed; each sample's generator is seeded from it and the sample index.
        from_generation_config: take the settings above from the checkpoint's ``generation_config.json``
            (``sampling=model_default``); resolved by the runner once the model is known (:meth:`resolve`).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = at_least(0, 0, why="0 = off")
    seed: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    from_generation_config: bool = False

    def __post_init__(self):
        check_bounds(self, "sampling")
        if self.temperature < 0:
            raise ConfigError(f"sampling.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"sampling.top_p={self.top_p} must be in (0, 1]")
        if not 0.0 <= self.min_p < 1.0:
            raise ConfigError(f"sampling.min_p={self.min_p} must be in [0, 1) (0 = off)")
        if self.repetition_penalty <= 0:
            raise ConfigError(f"sampling.repetition_penalty={self.repetition_penalty} must be > 0 (1.0 = off)")
        if self.temperature == 0 and self.repetition_penalty != 1.0 and not self.from_generation_config:
            raise ConfigError(f"sampling.repetition_penalty={self.repetition_penalty} needs sampling "
                              "(temperature > 0); greedy decoding is plain argmax here")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def ignored(self) -> str | None:
        """A warning naming the settings greedy decoding leaves unused (transformers' ``generate`` ignores them too
        without ``do_sample``), so that the greedy point of a temperature sweep says it; None when nothing is."""
        if not self.greedy or self.from_generation_config:
            return None
        unused = [f"sampling.{name}={value}" for name, value, off in
                  (("top_p", self.top_p, 1.0), ("top_k", self.top_k, 0), ("min_p", self.min_p, 0.0)) if value != off]
        return (f"{', '.join(unused)} unused: sampling.temperature=0 is greedy argmax; set sampling.temperature > 0 "
                "to sample with them") if unused else None

    # ------------------------------------------------------------------ model_default
    def resolve(self, checkpoint_path) -> Sampling:
        """The settings with ``from_generation_config`` applied from the checkpoint's generation_config.json
        (``do_sample: false`` -> greedy); ``self`` when the flag is off."""
        if not self.from_generation_config:
            return self
        from transformers import GenerationConfig

        path = Path(checkpoint_path)
        if not (path / "generation_config.json").is_file():
            raise ConfigError(f"sampling=model_default: the checkpoint {path} has no generation_config.json; "
                              "choose sampling=greedy / random or set sampling.temperature, top_p, top_k")
        gc = GenerationConfig.from_pretrained(str(path))
        if not gc.do_sample:
            return replace(self, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0,
                           from_generation_config=False)
        return replace(self, temperature=float(gc.temperature if gc.temperature is not None else 1.0),
                       top_p=float(gc.top_p if gc.top_p is not None else 1.0),
                       top_k=int(gc.top_k or 0), min_p=float(getattr(gc, "min_p", None) or 0.0),
                       repetition_penalty=float(gc.repetition_penalty or 1.0), from_generation_config=False)

    # ------------------------------------------------------------------ distributions
    def generator(self, sample_index: int, device="cpu") -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + sample_index)

    def probs(self, logits: torch.Tensor, history=None) -> torch.Tensor:
        """[..., V] logits -> [..., V] float32 probabilities after repetition penalty (over ``history``, the token
        ids before the predicted one: prompt + generated; one history for every row), temperature, top-k, top-p
        and min-p."""
        logits = logits.float()
        if self.repetition_penalty != 1.0 and history is not None and len(history):
            idx = torch.as_tensor(list(history), device=logits.device).unique()
            idx = idx.expand(*logits.shape[:-1], idx.numel())
            seen = logits.gather(-1, idx)
            seen = torch.where(seen < 0, seen * self.repetition_penalty, seen / self.repetition_penalty)
            logits = logits.scatter(-1, idx, seen)
        logits = logits / self.temperature
        if self.top_k > 0:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) >= self.top_p  # keep the token that crosses top_p
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        if self.min_p > 0.0:
            p = torch.softmax(logits, dim=-1)
            logits = logits.masked_fill(p < self.min_p * p.amax(-1, keepdim=True), float("-inf"))
        return torch.softmax(logits, dim=-1)

    def select(self, logits: torch.Tensor, generator: torch.Generator | None = None, history=None) -> torch.Tensor:
        """[..., V] logits -> [...] token ids (argmax when greedy)."""
        if self.greedy:
            return logits.argmax(dim=-1)
        probs = self.probs(logits, history)
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])

    # ------------------------------------------------------------------ verification
    @staticmethod
    def accept_deterministic(p: torch.Tensor, candidates, generator: torch.Generator | None) -> tuple[int, bool]:
        """Lookahead-style verification of deterministic guesses at one depth (exact; see the module docstring).

        Args:
            p: [V] target probabilities at the current prefix.
            candidates: candidate token ids continuing the prefix (duplicates allowed; tried once, in order).
        Returns:
            (token, accepted): the emitted token and whether it is one of the candidates.
        """
        p = p.float().clone()
        remaining = 1.0
        tried = list(dict.fromkeys(int(c) for c in candidates))
        for t in tried:
            pt = float(p[t])
            if pt > 0 and _uniform(generator, p.device) * remaining < pt:
                return t, True
            p[t] = 0.0
            remaining -= pt
        if float(p.sum()) <= 0:  # rounding only: the candidates held all the mass, the last one had it left
            return tried[-1], True
        return _draw(p / p.sum(), generator), False

    @property
    def uses_history(self) -> bool:
        """Whether :meth:`probs` reads the token history (the repetition penalty is on)."""
        return self.repetition_penalty != 1.0

    def verify_guesses(self, guesses, logits_at, limit: int, generator: torch.Generator | None,
                       history=None) -> tuple[list[int], int]:
        """Multi-depth verification of deterministic guesses (FAFO's candidates, Lookahead's n-grams), exact.

        Depth d emits one token with :meth:`accept_deterministic` over the d-th tokens of the guesses that still
        match everything emitted so far; it continues after an accepted guess token, stops after a token drawn
        from the remaining mass, and after the guesses end draws a bonus token from p; at most ``limit`` tokens.

        Args:
            guesses: token sequences of equal length L (any number, none allowed).
            logits_at: ``logits_at(g, d)`` -> [V] target logits predicting depth d: d = 0 the current token's row
                (g is None), d >= 1 the row of token d-1 of guess g (every live guess shares that prefix).
            limit: most tokens emitted (<= L + 1).
            history: token ids before depth 0 (read only when the repetition penalty is on).
        Returns:
            (emitted tokens, g): every emitted token but the last is token i of guess g (their KV can be kept).
        """
        alive = list(range(len(guesses)))
        out: list[int] = []
        for d in range(limit):
            logits = logits_at(alive[0] if d else None, d)
            p = self.probs(logits, list(history) + out if self.uses_history and history is not None else None)
            cands = [guesses[g][d] for g in alive if d < len(guesses[g])]
            t, ok = self.accept_deterministic(p, cands, generator)
            out.append(t)
            if not ok:
                break
            alive = [g for g in alive if guesses[g][d] == t]
        return out, (alive[0] if alive else 0)

    @staticmethod
    def speculative_accept(p: torch.Tensor, q: torch.Tensor, token: int,
                           generator: torch.Generator | None) -> tuple[int, bool]:
        """Standard speculative sampling for ``token`` drawn from q: accept with probability min(1, p/q), else
        a token from :func:`residual` (p, q). Returns (token, accepted)."""
        pt, qt = float(p[token]), float(q[token])
        if qt > 0 and _uniform(generator, p.device) * qt < pt:
            return int(token), True
        return _draw(residual(p, q), generator), False

    @staticmethod
    def accept_siblings(p: torch.Tensor, q: torch.Tensor, siblings, generator: torch.Generator | None
                        ) -> tuple[int, int]:
        """Recursive rejection sampling over siblings drawn from q WITHOUT replacement (SWIFT's / EAGLE's
        sampling ``evaluate_posterior``): sibling x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)),
        where q_i is q with the earlier siblings removed and renormalised; on rejection p_{i+1} =
        norm(max(0, p_i - q_i)); if every sibling is rejected a token is drawn from the last p.

        Exact: stage i is standard speculative sampling with target p_i and proposal q_i (x_i's law given the
        earlier siblings), whose "resample from the residual" is replaced by stage i+1, which by induction emits
        a token distributed as that residual p_{i+1} (a rejected x_i has p_{i+1}(x_i) = 0 and is never proposed
        again). So the emitted token is distributed as p.

        Returns:
            (token, i): the emitted token and the index of the accepted sibling (-1: drawn from the residual).
        """
        p, q = p.float().clone(), q.float().clone()
        for i, x in enumerate(int(t) for t in siblings):
            qx = float(q[x])
            if qx <= 0:
                continue
            if _uniform(generator, p.device) * qx <= float(p[x]):
                return x, i
            p = residual(p, q)
            q[x] = 0.0
            total = float(q.sum())
            if total <= 0:
                break
            q = q / total
        return _draw(p, generator), -1


GREEDY = Sampling()
