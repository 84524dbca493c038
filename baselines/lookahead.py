"""Lookahead Decoding (Fu, Bailis, Stoica, Zhang, ICML 2024, https://arxiv.org/abs/2402.02057), greedy and sampled.

Re-implemented from hao-ai-lab/LookaheadDecoding @ eed010d (``lade/decoding.py``
``jacobi_greedy_search_multilevel``, ``lade/models/modeling_llama.py`` ``j_make_causal_mask_multilevel``): each
step is ONE forward over ``[current | (N-1) x W Jacobi window | up to G n-gram guesses]``; the window's top level
feeds an n-gram pool keyed by one token, and the guesses under the current token are verified with the official
``max_hit`` rule (at most N-1 tokens per step). The algorithm step by step, the sampling rule and where we differ
from the official code: docs/methods/lookahead.md.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from fafo.bounds import at_least, check_bounds
from fafo.decoding import Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.attention import AttentionPlan, causal_plan, tree_mask
from fafo.engine.batching import RowLogits, StepInputs
from fafo.engine.engine import Engine
from fafo.errors import ConfigError
from fafo.sampling import Sampling
from fafo.tree import commit_path


def lookahead_step_mask(columns: int, levels: int, n_guesses: int, guess_len: int) -> torch.Tensor:
    """``[Q, Q]`` bool mask over ``[level 0 | level 1 | ... | guess 0 | guess 1 | ...]``, Q = levels*columns +
    n_guesses*guess_len, the official ``j_make_causal_mask_multilevel`` (without its distributed offsets).

    It is a tree's ancestor mask: level 0 (row 0 = the current token) is a chain, token (l >= 1, column i) hangs
    below (l - 1, i), so it sees level-0 columns 0..i and column i of levels 1..l; each guess is a chain below the
    current token; nothing else.
    """
    w = levels * columns
    parents = [i - 1 for i in range(columns)] + [i - columns for i in range(columns, w)]
    parents += [w + i - 1 if i % guess_len else 0 for i in range(n_guesses * guess_len)]
    return tree_mask(parents)


class NgramPool:
    """The official ``token_map``: one token -> at most ``cap`` (N-1)-grams, least recently inserted first."""

    def __init__(self, cap: int):
        self.cap = cap
        self.table: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())

    def get(self, key: int) -> list[tuple[int, ...]]:
        """The guesses for ``key``, oldest first (the official list order, which decides ties)."""
        return list(self.table.get(key, ()))

    def add(self, key: int, ngram: tuple[int, ...]) -> None:
        """Official LRU rule: present -> moved to the end; else appended, evicting the oldest when full."""
        if self.cap > 0:
            bucket = self.table.setdefault(key, OrderedDict())
            bucket.pop(ngram, None)
            bucket[ngram] = None
            if len(bucket) > self.cap:
                bucket.popitem(last=False)

    def add_text(self, tokens: list[int], n: int) -> None:
        """Every N-gram of ``tokens`` in order, under its first token (``fill_pool_with_prompt``)."""
        for s in range(len(tokens) - n + 1):
            self.add(tokens[s], tuple(tokens[s + 1 : s + n]))

    def add_window(self, current: int, levels: list[list[int]], top: list[int]) -> None:
        """``update_token_map``: column i of the window (levels 1..N-2, then the top level's prediction
        ``top[i]``) is stored under its level-0 token (the current token, then ``levels[0]``), i = 0, 1..."""
        for i, key in enumerate([current, *levels[0]]):
            self.add(key, tuple(lv[i] for lv in levels[1:]) + (top[i],))


@dataclass
class LookaheadDecoder(Decoder):
    """Lookahead Decoding, one forward per step (official presets: 7B 5/15/15, 13B 5/10/10, README and
    Spec-Bench 5/7/7).

    Attributes:
        level: N, the n-gram size; the window has N-1 levels and guesses are N-1 tokens long (>= 3).
        window: W, window columns (>= 1).
        guess_set: G, n-grams kept per pool key and hence guesses verified per step at most (0: none).
        bonus_token: after a fully matched guess also commit the model's next prediction (official: no).
        pool_from_prompt: also store the prompt's and the committed text's N-grams (POOL_FROM_PROMPT).
        seed: seeds the window's initial tokens (drawn from the prompt; official: unseeded).
    """

    level: int = at_least(3, 5, why="N-1 >= 2 levels; N=2 would commit one token per step")
    window: int = at_least(1, 15)
    guess_set: int = at_least(0, 15)  # 0: no guesses verified (the window alone)
    bonus_token: bool = False
    pool_from_prompt: bool = False
    seed: int = 0
    batch_refusal: ClassVar[str] = ""
    # step structures by (columns, levels, guesses, device): built once per run, not per generation
    _shapes: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_bounds(self, "method")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"method.seed={self.seed!r} must be an integer")

    def step_tokens(self) -> int:
        """The most tokens one forward processes after the prefill (warm-up windows: wider, shallower)."""
        n, w = self.level, self.window
        steady = (n - 1) * w + self.guess_set * (n - 1)
        return max([steady] + [(f + 1) * (w + n - 2 - f) for f in range(1, n - 2)])

    def forward_tokens(self) -> tuple[int, ...]:
        return (self.step_tokens(),)

    def extra_slots(self, max_new_tokens: int) -> int:
        # a step writes its KV to slots [P, P + Q) and keeps what it accepts; Q <= step_tokens() also when
        # the guesses are padded to G (engine.static_shapes)
        return self.step_tokens()

    def new_state(self, engine, prompt_ids, max_new_tokens, eos_ids=(), sampling=None, generator=None, cache=None):
        return LookaheadState(self, engine, prompt_ids, max_new_tokens, sampling, generator, cache)

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        state = self.new_state(engine, prompt_ids, max_new_tokens, eos_ids, sampling, generator)
        return decode(engine, state, max_new_tokens, eos_ids, clock)


@dataclass
class _Shape:
    """What one step shape (window columns x levels, number of guesses) needs, built once per generation."""

    mask: torch.Tensor  # [Q, Q] bool, on device
    rel: np.ndarray  # [Q] positions relative to the current token (host: uploaded with the step's tokens)
    rows: torch.Tensor  # logits rows: current token, top window level, every guess token
    guess_base: int  # row of the first guess token
    host: tuple[np.ndarray, np.ndarray]  # mask and rows on the host (a batch stacks requests in other phases)


class LookaheadState(StepState):
    """One generation: the window levels, the pool, the current token and its position."""

    def __init__(self, cfg: LookaheadDecoder, engine: Engine, prompt_ids: list[int], max_new_tokens: int,
                 sampling: Sampling | None = None, generator: torch.Generator | None = None, cache=None):
        self.cfg, self.engine, self.n = cfg, engine, cfg.level
        self.sampling = sampling if sampling is not None and not sampling.greedy else None  # None: greedy
        self.generator = generator
        self.prompt = list(prompt_ids)
        self.history = list(prompt_ids)
        need = len(self.prompt) + max_new_tokens + cfg.extra_slots(max_new_tokens)
        self.cache = cache if cache is not None else engine.cache(need)
        g = torch.Generator().manual_seed(cfg.seed)
        init = torch.randint(len(self.prompt), (cfg.window + self.n - 3,), generator=g).tolist()
        # levels[0]: level 0 minus the current token; levels 1.. appear during warm-up (official past_tokens)
        self.levels: list[list[int]] = [[self.prompt[i] for i in init]]
        self.pool = NgramPool(cfg.guess_set)
        if cfg.pool_from_prompt:
            self.pool.add_text(self.prompt, self.n)
        self.guesses_verified = 0
        self.P = len(self.prompt)  # the current token's position = its slot = committed KV entries
        self.cur = -1

    def _select(self, logits: torch.Tensor, argmax: int) -> int:
        """The committed token: sampled under sampling (the window's predictions stay argmax), else ``argmax``."""
        return argmax if self.sampling is None else int(self.sampling.select(logits, self.generator, self.history))

    def prefill(self) -> int:
        """The official first forward: prompt + level 0, causal; only the prompt's KV is kept."""
        T, level0 = len(self.prompt), self.levels[0]
        dev = self.engine.device
        out = self.engine.forward(self.cache, self.prompt + level0, torch.arange(T + len(level0), device=dev),
                                  torch.arange(T, device=dev), causal_plan(0),
                                  logits=torch.arange(T - 1, T + len(level0), device=dev), kind="prefill")
        preds = out[0].argmax(-1).tolist()
        self.levels = [level0[1:], preds[1:]]  # level 1 <- the prediction of every level-0 token
        self._extend([self._select(out[0, 0], preds[0])])
        return self.cur

    def _shape(self, columns: int, levels: int, n_guesses: int) -> _Shape:
        key = (columns, levels, n_guesses, str(self.engine.device))
        shapes = self.cfg._shapes
        if key not in shapes:
            dev, k = self.engine.device, self.n - 1
            mask = lookahead_step_mask(columns, levels, n_guesses, k)
            col = np.arange(columns)
            guess_rel = [np.arange(1, k + 1)] * n_guesses  # every guess at P+1..P+N-1
            rel = np.concatenate([col] + [lv + col for lv in range(1, levels)] + guess_rel)  # (l, i) at P+l+i
            w = levels * columns
            rows = np.concatenate([[0], np.arange(w - columns, w + n_guesses * k)])
            host = (mask.numpy(), rows)  # read before the upload: on the CPU `.to(device)` returns `mask` itself
            shapes[key] = _Shape(mask.to(dev), rel, torch.from_numpy(rows).to(dev), w, host)
        return shapes[key]

    def extras(self) -> dict:
        # the step's scratch slots are inside the cache: no buffer beyond it
        return {"pool_entries": len(self.pool), "guesses_verified": self.guesses_verified, "buffer_bytes": 0}

    def inputs(self, remaining: int) -> list[StepInputs]:
        """One forward over ``[current | window levels | guesses]``. Under ``engine.static_shapes`` the guesses
        are padded to G after the warm-up (the current token repeated, isolated by the mask and never accepted)."""
        levels, k = self.levels, self.n - 1
        warm = len(levels) < k  # official: past_tokens[LEVEL - 2] is None
        self.guesses = [] if warm or self.cfg.guess_set == 0 else self.pool.get(self.cur)
        # guesses in the forward's verification branch; columns is W and levels N-1 after the warm-up
        n_branch = self.cfg.guess_set if self.engine.static_shapes and not warm else len(self.guesses)
        s = self.shape = self._shape(len(levels[0]) + 1, len(levels), n_branch)
        padding = [self.cur] * ((n_branch - len(self.guesses)) * k)  # KV to scratch slots past the real guesses
        tokens = [self.cur] + [t for lv in levels for t in lv] + [t for g in self.guesses for t in g] + padding
        plan = AttentionPlan(prefix=self.P, step_mask=s.mask)
        slots = range(self.P, self.P + len(tokens))  # KV to slots P .. P+Q-1
        return [StepInputs(tokens, s.rel + self.P, slots, plan, logits=s.rows, host_mask=s.host[0],
                           host_logits=s.host[1])]

    def outputs(self, remaining: int, logits: list[RowLogits]) -> Step:
        """The committed tokens; the step's ``rows`` are the rows (relative to P) of the accepted guess tokens, whose
        KV is kept after the current token's."""
        levels, k, s, guesses = self.levels, self.n - 1, self.shape, self.guesses
        warm, columns = len(levels) < k, len(levels[0]) + 1
        preds = logits[0].argmax().tolist()  # the step's one host sync
        out = logits[0].tensor
        first, top, checked = preds[0], preds[1 : 1 + columns], preds[1 + columns :]
        if warm:  # every level drops column 0; the top level's predictions, minus column 0, are the new level
            self.levels = [lv[1:] for lv in levels] + [top[1:]]
            return Step([self._select(out[0], first)], 0)
        self.guesses_verified += len(guesses)
        # most tokens committed; official: `gg` stops at N-2 even after a full match (<= N-1 tokens/step)
        limit = k + 1 if self.cfg.bonus_token else k
        if self.sampling is not None:  # the deterministic-guess rule, exact (docs/methods/lookahead.md)
            new, best = self.sampling.verify_guesses(
                guesses, lambda g, d: out[0] if d == 0 else out[1 + columns + g * k + d - 1], limit,
                self.generator, self.history)
        else:
            hit, best = 0, 0
            for g, guess in enumerate(guesses):  # official max_hit loop
                want = [first] + checked[g * k : g * k + k - 1]  # what guess token t must equal
                m = 0
                while m < limit - 1 and guess[m] == want[m]:
                    m += 1
                if m > hit:  # strict: ties keep the first (oldest) guess
                    hit, best = m, g
            new = [first] + checked[best * k : best * k + hit]
        if self.cfg.guess_set:
            self.pool.add_window(self.cur, levels, top)
        self.levels = [levels[1][1:], *levels[2:], top]  # one column forward, whatever was accepted
        return Step(new, len(guesses) * k, rows=[s.guess_base + best * k + t for t in range(len(new) - 1)])

    def commit(self, step: Step) -> None:
        """The current token's KV is already at slot P; move the accepted guess tokens' KV next to it."""
        commit_path(self.cache, self.P, step.rows)
        self.P += len(step.tokens)
        self._extend(step.tokens)

    def live_slots(self) -> int:
        return self.P

    def _extend(self, new: list[int]) -> None:
        for t in new:
            self.history.append(t)
            if self.cfg.pool_from_prompt:  # official append_new_generated_pool, on the true history
                self.pool.add_text(self.history[-self.n :], self.n)
        self.cur = new[-1]
