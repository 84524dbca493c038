"""FAFO: Fumble Around and Find Out ("FAFO: Lossy KV Cache Compression for Lossless Inference Acceleration via
Draftless Fumble Decoding", section 4, App. D-I, Algorithms 1-4).

Each step runs ONE forward over ``[current token | m candidates x k | n streams x k (column-wise)]``:

* **Fumble Around**: n streams of k tokens attend only to C(kv) (the fixed head region of the cache), the
  current token and their own earlier tokens; each emits one argmax token, drops its oldest token into its
  buffer of the last k discarded tokens, and its new state is cached in the pool under every suffix of that
  buffer (Alg. 2).
* **Find Out**: m candidates retrieved by the longest matching suffix of the committed text (Alg. 3) are
  verified against the full cache; the longest argmax-matching prefix plus the bonus token is committed (Alg. 4),
  and the KV already computed for those tokens is kept (no recompute).

Sampling (temperature > 0): the streams stay greedy (they are only guesses) and the candidates are verified with
the deterministic-guess rule of ``Sampling.verify_guesses`` (Lookahead's sampling verification), exact in
distribution (the argument is in ``fafo/sampling.py``); see ``FAFOState._sampled_step``.

``fused=False`` is FAFO-2forward (the paper's Table 1 ablation): the same streams, pool and candidates, but the
fumble part and the verification part run as two forwards. Its outputs, tau and pool are identical to FAFO's.

Choices the paper leaves open (documented here, each a config knob):

* Stream positions are relative to the current token at position P: token j of stream i sits at
  ``P + 1 + i * stagger + j``, so streams guess at different horizons (like Lookahead's window columns); they are
  re-based every step as P advances by the committed tokens. ``stagger=0`` puts all streams at ``P + 1``.
* Streams start as k tokens drawn uniformly from the prompt with a generator seeded by ``seed`` (Lookahead draws
  ``random.choice`` unseeded), so runs are reproducible.
* Fumble tokens see the current token (``see_current``): it is the freshest context they can have, and its KV is
  computed in the same forward anyway.
* m (candidates verified) is separate from n (streams); both default to the paper's 40 and the pool keeps n values
  per key (App. E). Fewer retrieved candidates are padded so every step has the same shape (static masks).
* The pool starts empty per generation; ``pool_from_prompt`` seeds it with the prompt's k-grams (off: the paper
  does not do it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from fafo.compress.base import Compression, FixedRegion
from fafo.compress.stream import StreamingLLM
from fafo.decoding import Buffers, Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.attention import AttentionPlan, causal_plan
from fafo.engine.batching import RowLogits, StepInputs, forward_one
from fafo.engine.engine import Engine
from fafo.bounds import at_least, check_bounds
from fafo.errors import ConfigError
from fafo.pool import CandidatePool
from fafo.sampling import Sampling


def fafo_step_mask(m: int, k: int, n: int, see_current: bool = True) -> torch.Tensor:
    """``[Q, Q]`` bool mask over ``[current | m candidates x k | k rows x n streams]``, Q = 1 + m*k + n*k.

    The current token sees itself; candidate tokens see the current token and their own earlier tokens
    (causal within the candidate); stream tokens, laid out column-wise (row j holds token j of every stream),
    see the current token (if ``see_current``) and the tokens of their own stream up to themselves.
    """
    q = 1 + m * k + n * k
    mask = torch.zeros(q, q, dtype=torch.bool)
    mask[:, 0] = True
    if not see_current:
        mask[1 + m * k :, 0] = False
    idx = torch.arange(q)
    cand = idx[1 : 1 + m * k] - 1
    c_row, c_col = cand[:, None], cand[None, :]
    mask[1 : 1 + m * k, 1 : 1 + m * k] = (c_row // k == c_col // k) & (c_col <= c_row)
    st = idx[1 + m * k :] - 1 - m * k
    s_row, s_col = st[:, None], st[None, :]
    mask[1 + m * k :, 1 + m * k :] = (s_row % n == s_col % n) & (s_col // n <= s_row // n)
    return mask


@dataclass
class FAFODecoder(Decoder):
    """FAFO-<compression> (fused, one forward per step) or FAFO-2forward (``fused=False``).

    Attributes:
        compress: the KV compression function C the streams see (StreamingLLM, Quest, SnapKV...).
        n: fumble streams.
        k: tokens per stream, candidate length and longest pool key (paper best: 6-7).
        m: candidates verified per step (None = n).
        pool_cap: values per pool key, LRU (None = n, App. E).
        stagger: stream i starts ``i * stagger`` positions after the current token (0: all at P + 1).
        see_current: whether fumble tokens attend the current token.
        pool_from_prompt: seed the pool with the prompt's k-grams.
        fused: one forward for fumble + verification (False: FAFO-2forward).
        seed: seeds the streams' initial tokens.
    """

    compress: Compression = field(default_factory=StreamingLLM)
    n: int = at_least(1, 40)
    k: int = at_least(1, 6)
    m: int | None = at_least(1, None)
    pool_cap: int | None = at_least(1, None)
    stagger: int = at_least(0, 1)  # 0: every stream at P + 1
    see_current: bool = True
    pool_from_prompt: bool = False
    fused: bool = True
    seed: int = 0
    batch_refusal: ClassVar[str] = ""
    _masks: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_bounds(self, "method")
        if not isinstance(self.compress, Compression):
            raise ConfigError("method.compress must be a compression function (choose one in conf/method/compress/)")

    @property
    def n_candidates(self) -> int:
        return self.m or self.n

    def extra_slots(self, max_new_tokens: int) -> int:
        return 1 + self.n_candidates * self.k

    def forward_tokens(self) -> tuple[int, ...]:
        """[current | m x k candidates | n x k streams] in one forward, or the fumble and verify forwards."""
        verify, fumble = 1 + self.n_candidates * self.k, self.n * self.k
        return (verify + fumble,) if self.fused else (1 + fumble, verify)

    def plan_bytes(self, args, slots: int, nbytes: int, compiled: bool) -> Buffers:
        """The compression's selection state, per generation (Quest's page bounds, SnapKV's picks)."""
        return Buffers(transient=self.compress.state_bytes(args, slots))

    def new_state(self, engine, prompt_ids, max_new_tokens, eos_ids=(), sampling=None, generator=None, cache=None):
        return FAFOState(self, engine, prompt_ids, max_new_tokens, sampling, generator, cache)

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        state = self.new_state(engine, prompt_ids, max_new_tokens, eos_ids, sampling, generator)
        return decode(engine, state, max_new_tokens, eos_ids, clock)

    def step_masks(self, device) -> list[torch.Tensor]:
        """The step's masks on ``device`` (the fused one, or the fumble and verification ones), built once per
        run: every generation, and every request of a batch, shares them."""
        key = str(device)
        if key not in self._masks:
            m, k, n = self.n_candidates, self.k, self.n
            full = fafo_step_mask(m, k, n, self.see_current)
            if self.fused:
                self._masks[key] = [full.to(device)]
            else:
                v_len = 1 + m * k
                keep_f = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(v_len, v_len + n * k)])
                self._masks[key] = [full[keep_f][:, keep_f].to(device), full[:v_len, :v_len].to(device)]
        return self._masks[key]


class FAFOState(StepState):
    """Everything one FAFO generation owns: the fixed-region layout, streams, discard buffers, pool, static masks."""

    def __init__(self, cfg: FAFODecoder, engine: Engine, prompt_ids: list[int], max_new_tokens: int,
                 sampling: Sampling | None = None, generator: torch.Generator | None = None, cache=None):
        self.cfg, self.engine = cfg, engine
        self.sampling = sampling if sampling is not None and not sampling.greedy else None  # None: greedy
        self.generator = generator
        self.n, self.k, self.m = cfg.n, cfg.k, cfg.n_candidates
        self.prompt = list(prompt_ids)
        self.history = list(prompt_ids)
        self.scratch = len(prompt_ids) + max_new_tokens  # committed entries never reach this slot
        need = self.scratch + cfg.extra_slots(max_new_tokens)
        self.cache = cache if cache is not None else engine.cache(need)
        self.layout = FixedRegion(self.cache, cfg.compress, capacity=self.scratch)
        self.pool = CandidatePool(self.k, cfg.pool_cap or self.n)
        if cfg.pool_from_prompt:
            self.pool.add_text(self.prompt)
        g = torch.Generator().manual_seed(cfg.seed)
        init = torch.randint(len(self.prompt), (self.n, self.k), generator=g)
        self.streams = np.asarray(self.prompt, dtype=np.int64)[init.numpy()]  # [n, k], on the host
        self.discarded: list[list[int]] = [[] for _ in range(self.n)]
        self._build_static()

    def _build_static(self) -> None:
        """Masks, relative positions and output rows: fixed for the whole generation (built once). A step's host
        values (tokens, positions, acceptance) are numpy arrays: no torch op is spent on them."""
        n, k, m, dev = self.n, self.k, self.m, self.engine.device
        stream_rel = 1 + (np.arange(n)[None, :] * self.cfg.stagger + np.arange(k)[:, None]).ravel()
        cand_rel = np.tile(np.arange(1, k + 1), m)  # column-wise streams: row j of every stream, then row j + 1...
        self.rel = {"fused": np.concatenate([[0], cand_rel, stream_rel]), "fumble": np.concatenate([[0], stream_rel]),
                    "verify": np.concatenate([[0], cand_rel])}
        self.v_len = 1 + m * k  # current token + candidates
        # [m, k]: the verification row predicting each candidate token (the current token's, then its own earlier)
        cand_rows = 1 + np.arange(m * k).reshape(m, k)
        self.before_rows = np.concatenate([np.zeros((m, 1), dtype=np.int64), cand_rows[:, :-1]], axis=1)
        self.scratch_slots = torch.arange(self.scratch, self.scratch + self.v_len, device=dev)
        self.verify_rows = torch.arange(self.v_len, device=dev)
        stream_last = torch.arange((k - 1) * n, k * n)  # row k-1 of the stream block: each stream's newest token
        self.region_capacity = min(self.cfg.compress.budget, self.cache.max_len)  # static across samples
        self.masks = self.cfg.step_masks(dev)  # [fused] or [fumble, verify]
        if self.cfg.fused:
            self.rows = torch.cat([torch.arange(self.v_len), self.v_len + stream_last]).to(dev)
        else:
            self.rows = (1 + stream_last).to(dev)

    def extras(self) -> dict:
        # buffer_bytes: extra device memory beyond the cache (the step's scratch slots are inside the cache)
        return {"pool_entries": len(self.pool), "buffer_bytes": 0}

    def prefill(self) -> int:
        """Prefill in position order, then let C select and swap its entries into the fixed region."""
        T = len(self.prompt)
        plan = causal_plan(0)
        plan.capture_rows = self.cfg.compress.prefill_query_rows(T)
        logits, queries = self.engine.forward(self.cache, self.prompt, torch.arange(T), torch.arange(T), plan,
                                              logits="last", kind="prefill", queries=True)
        self.layout.prefill(T, queries)
        if self.sampling is None:
            self.cur = int(logits[0, -1].argmax())
        else:
            self.cur = int(self.sampling.select(logits[0, -1], self.generator, self.history))
        self.history.append(self.cur)
        return self.cur

    def candidates(self) -> tuple[np.ndarray, int]:
        """[m, k] candidate tokens (padded with zeros) and how many are real, on the host."""
        found = self.pool.retrieve(self.history, self.m)
        cands = np.zeros((self.m, self.k), dtype=np.int64)
        if found:
            cands[: len(found)] = found
        return cands, len(found)

    def plan(self, mask, region_from: int | None, capture: bool = False) -> AttentionPlan:
        rows = self.verify_rows if capture and self.cfg.compress.wants_decode_query else None
        return AttentionPlan(prefix=self.layout.n, step_mask=mask, region_from=region_from,
                             region_len=self.layout.region_len, region_capacity=self.region_capacity,
                             dense_layers=self.cfg.compress.dense(),
                             capture_rows=rows)

    def inputs(self, remaining: int) -> list[StepInputs]:
        """The step's forwards: ``[current | m x k candidates | n x k streams]`` (fused), or the fumble forward
        ``[current | streams]`` then the verification ``[current | candidates]`` (FAFO-2forward). Each asks for
        the verification rows, then each stream's newest-token row."""
        return self._inputs(*self.candidates())

    def _inputs(self, cands: np.ndarray, n_real: int) -> list[StepInputs]:
        self.cands, self.n_real = cands, n_real
        P = self.layout.n  # the current token's position = number of cached entries
        cur = np.array([self.cur])
        streams = self.streams.T.ravel()  # column-wise
        if self.cfg.fused:
            verify_plan = self.plan(self.masks[0], self.v_len, capture=True)
            return [StepInputs(np.concatenate([cur, self.cands.ravel(), streams]), P + self.rel["fused"],
                               self.scratch_slots, verify_plan, logits=self.rows)]
        f_mask, v_mask = self.masks
        verify_plan = self.plan(v_mask, None, capture=True)
        return [StepInputs(np.concatenate([cur, streams]), P + self.rel["fumble"], None, self.plan(f_mask, 1),
                           logits=self.rows, kind="draft"),
                StepInputs(np.concatenate([cur, self.cands.ravel()]), P + self.rel["verify"], self.scratch_slots,
                           verify_plan)]

    def forward_logits(self, cands: np.ndarray) -> torch.Tensor:
        """The step's logits rows for candidates ``cands``: [1 + m*k verification rows, then each stream's
        newest-token row] (the step's forwards alone, for benchmarks and tests)."""
        out = forward_one(self.engine, self.cache, self._inputs(cands, len(cands))).row(0)
        return out[0].tensor if self.cfg.fused else torch.cat([out[1].tensor, out[0].tensor])

    def outputs(self, remaining: int, logits: list[RowLogits]) -> Step:
        """One FAFO step: the committed tokens (accepted + bonus), the candidate tokens verified, and the scratch
        rows holding the committed tokens' KV (the current token's and the accepted candidate tokens')."""
        verify, fumble = (logits[0], None) if self.cfg.fused else (logits[1], logits[0])
        if self.sampling is not None:
            new, kv_rows = self._sampled_step(verify, fumble)
        else:
            new, kv_rows = self._greedy_step(verify, fumble)
        return Step(new, self.n_real * self.k, rows=kv_rows, queries=verify.queries)

    def _greedy_step(self, verify: RowLogits, fumble: RowLogits | None) -> tuple[list[int], np.ndarray]:
        preds = verify.argmax()  # the one host sync of the step (with the fumble rows, FAFO-2forward)
        cands, n_real = self.cands, self.n_real
        v, new_stream = preds[: self.v_len], preds[self.v_len :] if fumble is None else fumble.argmax()
        best_len, best = 0, 0
        if n_real:
            before = v[self.before_rows[:n_real]]  # [n_real, k]: the prediction for each candidate token
            lengths = np.cumprod(cands[:n_real] == before, axis=1).sum(axis=1)
            best = int(lengths.argmax())  # the first of the longest, as torch.argmax
            best_len = int(lengths[best])
        bonus = int(v[0]) if best_len == 0 else int(v[1 + best * self.k + best_len - 1])
        new = cands[best, :best_len].tolist() + [bonus]
        kv_rows = np.concatenate([[0], 1 + best * self.k + np.arange(best_len)])
        self._advance_streams(new_stream)
        return new, kv_rows

    def _sampled_step(self, verify: RowLogits, fumble: RowLogits | None) -> tuple[list[int], np.ndarray]:
        """Sampling (temperature > 0): the streams stay greedy (argmax over C(kv): they are only guesses); the
        candidates are verified with the deterministic-guess rule (``Sampling.verify_guesses``, Lookahead's
        sampling verification): exact in distribution because the candidates are fixed before the step's
        random draws (the argument is in ``fafo/sampling.py``). KV kept: the current token's and the accepted
        candidate tokens' (every emitted token but the last)."""
        self._advance_streams(verify.argmax()[self.v_len :] if fumble is None else fumble.argmax())
        v, k = verify.tensor[: self.v_len], self.k

        def logits_at(g, d):
            return v[0] if d == 0 else v[1 + g * k + d - 1]

        new, best = self.sampling.verify_guesses(self.cands[: self.n_real].tolist(), logits_at, k + 1,
                                                 self.generator, self.history)
        kv_rows = np.concatenate([[0], 1 + best * k + np.arange(len(new) - 1)])
        return new, kv_rows

    def _advance_streams(self, new_tokens: np.ndarray) -> None:
        dropped = self.streams[:, 0].tolist()
        self.streams = np.concatenate([self.streams[:, 1:], new_tokens[:, None]], axis=1)
        for buf, token in zip(self.discarded, dropped):
            buf.append(token)
            del buf[: -self.k]
        self.pool.add_streams(self.discarded, self.streams.tolist())

    def commit(self, step: Step) -> None:
        """Keep the KV of the current token and the accepted candidate tokens; the bonus becomes current."""
        new, kv_rows = step.tokens, step.rows
        last = int(kv_rows[-1])  # query-aware C re-selects with the newest committed token's query
        query = None if step.queries is None else step.queries[..., last : last + 1, :]
        self.layout.commit((self.scratch + kv_rows).tolist(), query)
        self.history.extend(new)
        self.cur = new[-1]

    def live_slots(self) -> int:
        return self.layout.n
