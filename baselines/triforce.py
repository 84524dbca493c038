"""TriForce: hierarchical speculative decoding (Sun et al., COLM 2024, https://arxiv.org/abs/2404.11912, Alg. 1).

A tiny draft model sharing the target's vocabulary, on a StreamingLLM cache, drafts ``gamma1`` tokens for the
target on a *retrieval cache* (whole ``chunk_size`` prompt chunks chosen per KV head), which proposes ``gamma2``
tokens for one verification over the target's full cache: the output is exactly the target's. Matches
Infini-AI-Lab/TriForce @ 164c8c0 (``utils/decoding.py::TriForce`` and ``Middle_Spec``, ``models/cache.py``,
``utils/graph_infer.py``); ``draft: null`` is "retrieval without hierarchy" (Table 2). The three levels, the
rebuild stride, the choices where the paper and the code are silent, the static shapes and what tau and
``extras`` count are in docs/methods/triforce.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from baselines.triforce_cache import RetrievalCache, StreamingDraft
from fafo.decoding import Buffers, Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.attention import AttentionPlan, causal_plan
from fafo.engine.engine import Engine
from fafo.engine.loader import open_checkpoint
from fafo.engine.model import ModelArgs
from fafo.engine.rope import rope_parameters
from fafo.bounds import at_least, check_bounds, one_of, plain
from fafo.errors import ConfigError
from fafo.sampling import Sampling


@dataclass
class TriForceDecoder(Decoder):
    """TriForce (paper defaults; ``gamma1=1`` = the official code; ``draft=None`` = no hierarchy).

    Attributes:
        gamma1: draft tokens per middle-level (retrieval) forward (official code: 1, ``method=triforce_official``).
        gamma2: tokens the middle level proposes before a full-cache verification (it may reach gamma2 + gamma1).
        budget: retrieval cache slots (a multiple of chunk_size, at least 2 chunks).
        chunk_size: tokens per retrieval chunk.
        draft: ``{path, revision}`` (hub id or local dir) or ``{tiny: build_tiny_checkpoint kwargs}``; None: no
            draft model (retrieval without hierarchy).
        draft_budget: draft cache budget as the official ``draft_cache_budget``: the window holds
            ``draft_budget - draft_start - gamma2`` recent tokens.
        draft_start: draft sink tokens (official 16).
        rebuild_interval: re-select the retrieval chunks every this many generated tokens (paper Sec. 4.3, no value
            given; 256 = the official code's generation length; None: never, as the official loop).
        gqa_reduce: how a KV head combines its query heads' chunk scores: mean (their sum) or max.
    """

    batch_refusal: ClassVar[str] = ("its retrieval cache, draft model and draft cache are one request's (the "
                                    "hierarchy is not batched)")

    gamma1: int = at_least(1, 2)
    gamma2: int = at_least(1, 6)
    budget: int = at_least(2, 4096)
    chunk_size: int = at_least(1, 8)
    draft: dict | None = field(default_factory=lambda: {"path": "JackFram/llama-68m", "revision": None, "tiny": None})
    draft_budget: int = at_least(1, 256)  # and >= draft_start + gamma2 + 1 with a draft (__post_init__)
    draft_start: int = at_least(0, 16)  # 0: a window without sinks
    rebuild_interval: int | None = at_least(1, 256)  # generated tokens; null: never
    gqa_reduce: str = one_of(("mean", "max"), "mean", why="how a KV head combines its query heads' chunk scores")
    _loaded: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _ckpt: object = field(default=None, init=False, repr=False, compare=False)
    _rkv: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_bounds(self, "method")
        if self.budget % self.chunk_size or self.budget < 2 * self.chunk_size:
            raise ConfigError(f"method.budget={self.budget} must be a multiple of method.chunk_size="
                              f"{self.chunk_size} and at least 2 chunks (chunk 0 is always kept)")
        if self.draft is None:
            return
        if not isinstance(self.draft, Mapping):
            raise ConfigError(f"method.draft={self.draft!r} must be null or a mapping with path or tiny")
        self.draft = plain(dict(self.draft))
        unknown = set(self.draft) - {"path", "revision", "tiny"}
        if unknown or bool(self.draft.get("path")) == bool(self.draft.get("tiny")):
            raise ConfigError(f"method.draft={self.draft} needs exactly one of path (hub id or directory) or "
                              "tiny (a tiny model spec), and no other keys than revision; null = no draft")
        low = self.draft_start + self.gamma2 + 1
        if self.draft_budget < low:
            raise ConfigError(f"method.draft_budget={self.draft_budget!r} must be an integer >= draft_start + "
                              f"gamma2 + 1 = {low} (the window holds draft_budget - draft_start - gamma2 tokens)")

    @property
    def max_proposal(self) -> int:
        return self.gamma2 + (self.gamma1 if self.draft is not None else 0)

    def extra_slots(self, max_new_tokens: int) -> int:
        return self.max_proposal + 1  # the verification writes [current | proposal] past the committed tokens

    def plan_bytes(self, args, slots: int, nbytes: int, compiled: bool) -> Buffers:
        """The retrieval cache and the draft model (weights and its StreamingLLM cache), kept across generations."""
        retrieval = (self.budget + self.max_proposal + 1) * args.kv_bytes_per_slot(nbytes)
        if self.draft is None:
            return Buffers(retrieval)
        draft = ModelArgs.from_hf(self._draft_checkpoint(weights=False).config)
        window = (self.draft_budget + self.gamma2 + 1) * draft.kv_bytes_per_slot(nbytes)
        return Buffers(retrieval + draft.n_params() * nbytes + window)

    # ---------------------------------------------------------------- the draft model
    def _draft_checkpoint(self, weights: bool = True):
        """The draft's checkpoint (``weights=False``: its config and tokenizer only, as ``bench.plan`` reads)."""
        if self._ckpt is None or (weights and not self._ckpt[1]):
            self._ckpt = (open_checkpoint(**self.draft, weights=weights, setting="method.draft"), weights)
            rope = rope_parameters(self._ckpt[0].config)["rope_type"]
            if rope in ("dynamic", "longrope"):
                raise ConfigError(f"method.draft: a {rope}-rope draft cannot slide its window at original positions "
                                  "(its frequencies change with the position); use a fixed-rope draft model")
        return self._ckpt[0]

    def check_target(self, hf_config, tokenizer, weights: bool = True) -> None:
        if self.draft is None:
            return
        ckpt = self._draft_checkpoint(weights)
        if ckpt.config.vocab_size != hf_config.vocab_size:
            raise ConfigError(f"method.draft={self.draft} has vocabulary size {ckpt.config.vocab_size}, the target "
                              f"{hf_config.vocab_size}; the draft must share the target's vocabulary (or use "
                              "method=triforce_nodraft)")

    def setup(self, engine: Engine) -> None:
        """Load the draft on the target's device, dtype and attention backend (once per target engine); the draft
        engine follows the target's ``static_shapes`` (checked at every call: the flag may change between runs)."""
        if self.draft is None:
            return
        if self._loaded is None or self._loaded[0] is not engine:
            self.check_target(engine.model.hf_config, engine.tokenizer)
            ckpt = self._draft_checkpoint()
            draft = Engine.load(ckpt.path, ckpt.config, ckpt.tokenizer, device=engine.device, dtype=engine.dtype,
                                backend=engine.backend, name="triforce-draft")
            if engine.compiled is not None:  # the draft's steps are compiled like the target's
                draft.enable_compile(engine.compiled.options)
            window = self.draft_budget - self.draft_start - self.gamma2  # official recent_size
            # lagging committed + proposal + drafts; the slack also holds static-shape padding (StreamingDraft)
            scratch = 3 * (self.max_proposal + 1) + self.gamma1
            self._loaded = (engine, StreamingDraft(draft, self.draft_start, window, scratch))
        self._loaded[1].engine.static_shapes = engine.static_shapes

    def engines(self, engine: Engine) -> list[Engine]:
        draft = self._loaded[1].engine if self.draft is not None and self._loaded is not None else None
        return [engine] + ([draft] if draft is not None else [])

    def held_bytes(self) -> int:
        """The draft model (weights, its static cache, the streaming cache) and the retrieval cache's buffers."""
        held = self._rkv[1].nbytes if self._rkv is not None else 0
        if self._loaded is not None and self._loaded[1] is not None:
            draft = self._loaded[1]
            held += draft.nbytes + draft.engine.cache_nbytes  # its weights and caches
        return held

    def _retrieval_kv(self, engine: Engine, n: int):
        """The retrieval cache's buffers, reused across generations on the same target (like ``engine.cache``)."""
        if self._rkv is None or self._rkv[0] is not engine or self._rkv[1].max_len < n:
            self._rkv = None  # free the old one first
            self._rkv = (engine, engine.new_cache(n))
        return self._rkv[1]

    # ---------------------------------------------------------------- decoding
    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        self.setup(engine)
        state = TriForceState(self, engine, prompt_ids, max_new_tokens, sampling, generator, eos_ids)
        return decode(engine, state, max_new_tokens, eos_ids, clock)


class TriForceState(StepState):
    """One generation: the full cache (the engine's), the retrieval cache, the draft, the committed text."""

    def __init__(self, cfg: TriForceDecoder, engine: Engine, prompt_ids: list[int], max_new_tokens: int,
                 sampling: Sampling | None = None, generator: torch.Generator | None = None, eos_ids=()):
        self.cfg, self.engine, self.eos_ids = cfg, engine, eos_ids
        self.sampling = sampling if sampling is not None and not sampling.greedy else None  # None: greedy
        self.generator = generator
        self.prompt = list(prompt_ids)
        self.hist = list(prompt_ids)  # committed tokens; hist[N] is the current token (no KV yet)
        self.N = len(self.prompt)  # committed tokens with KV in the full cache (slot = position)
        self.cache = engine.cache(self.N + max_new_tokens + cfg.extra_slots(max_new_tokens))
        self.aligned = self.N // cfg.chunk_size * cfg.chunk_size
        budget = min(cfg.budget, self.aligned)
        self.retrieval = None
        if budget >= 2 * cfg.chunk_size:  # else: the middle level reads the full cache
            # static shapes: one size for every prompt, so compiled middle forwards never meet a new cache shape
            kv = cfg._retrieval_kv(engine, (cfg.budget if engine.static_shapes else budget) + cfg.max_proposal + 1)
            self.retrieval = RetrievalCache(kv, budget, cfg.chunk_size, cfg.gqa_reduce)
        self.draft = cfg._loaded[1] if cfg.draft is not None else None
        self.stats = dict.fromkeys(("rounds", "proposed", "accepted", "drafted", "draft_accepted", "rebuilds"), 0)
        self.draft_mark = self.draft.engine.ledger.mark() if self.draft else None
        self.rebuilt_at = 0  # rebuild_interval multiples of generated tokens covered by the last (re)build
        # the budget held every prompt entry (or the middle level reads the full cache): no retrieval took place
        self.covers_prompt = cfg.budget >= self.aligned
        # per-round forward lengths under engine.static_shapes (else each forward has its real length)
        self.static = engine.static_shapes
        self.verify_len = cfg.max_proposal + 1  # [current | up to max_proposal proposed tokens]
        self.middle_len = 1 + (cfg.gamma1 if self.draft is not None else 0)  # [v's last token | gamma1 drafts]
        self.all_rows = torch.arange(self.verify_len, device=engine.device)  # the captured rows of a verification

    def prefill(self) -> int:
        """Prefill the full cache capturing the last prompt token's query, build C_r, prefill the draft."""
        T, dev = self.N, self.engine.device
        plan = causal_plan(0)
        plan.capture_rows = torch.tensor([T - 1], device=dev)
        idx = torch.arange(T, device=dev)
        logits, queries = self.engine.forward(self.cache, self.prompt, idx, idx, plan, logits="last", kind="prefill",
                                              queries=True)
        if self.retrieval is not None:
            self.retrieval.build(self.cache, self.aligned, queries, T)
        if self.draft is not None:
            self.draft.prefill(self.prompt)
        s = self.sampling
        self.cur = int(logits[0, -1].argmax()) if s is None else int(s.select(logits[0, -1], self.generator, self.hist))
        self.hist.append(self.cur)
        return self.cur

    def _padded(self, tokens: list[int], length: int) -> list[int]:
        """``tokens`` followed by copies of the last one up to ``length`` under static shapes (else as they are);
        the caller gives the padding scratch slots and keeps only the real logits rows (docs/methods/triforce.md)."""
        if not self.static:
            return tokens
        if len(tokens) > length:
            raise RuntimeError(f"triforce: a {len(tokens)}-token step exceeds its static length {length}")
        return tokens + tokens[-1:] * (length - len(tokens))

    def _middle(self, v: list[int], valid: int, drafts: list[int]) -> torch.Tensor:
        """One middle-level forward over v's tokens without middle KV yet plus the drafts (their KV goes to the
        middle scratch): the logits rows after v's last token and after each draft, [len(drafts) + 1, V] (greedy:
        their argmax tokens, [len(drafts) + 1]). Every middle step appends one token past ``valid``, so the feed is
        ``[v[-1]] + drafts`` (``middle_len`` tokens)."""
        if self.retrieval is not None:
            kv, base = self.retrieval.kv, self.retrieval.budget
        else:
            kv, base = self.cache, self.N  # full-cache fallback: scratch = the slots the verification rewrites
        feed = v[valid:] + drafts
        tokens = self._padded(feed, self.middle_len)
        n, p, s = len(tokens), self.N + valid, base + valid  # positions p.., slots s.. (scratch): host values
        rows = list(range(len(v) - 1 - valid, len(feed)))  # real rows only: len(drafts) + 1
        out = self.engine.forward(kv, tokens, list(range(p, p + n)), list(range(s, s + n)),
                                  AttentionPlan(prefix=base + valid), logits=rows, kind="draft",
                                  greedy=self.sampling is None)
        return out[0]

    def _hist(self, extra: list[int]) -> list[int] | None:
        """The token history before a predicted token (only built when the repetition penalty reads it)."""
        return self.hist[: self.N] + extra if self.sampling.uses_history else None

    def _drafts(self, v: list[int]) -> tuple[list[int], list[torch.Tensor]]:
        """The draft model's ``gamma1`` tokens after ``v`` and, when sampling, the distributions q they were drawn
        from (none without a draft model)."""
        dq: list[torch.Tensor] = []
        if self.draft is None:
            return [], dq
        pick = None
        if self.sampling is not None:
            def pick(logits, out, v=v):  # called inside propose, this round
                q = self.sampling.probs(logits, self._hist(v + out))
                dq.append(q)
                return torch.multinomial(q, 1, generator=self.generator)

        d = self.draft.D
        return self.draft.propose(self.hist[d : self.N] + v, d, self.cfg.gamma1, pick), dq

    def _accept(self, rows: torch.Tensor, proposed: list[int], qs: list, before: list[int]):
        """One level's verification of ``proposed`` against ``rows`` ([len(proposed) + 1, V] logits, row i
        predicting ``proposed[i]``; greedy: their argmax tokens, [len(proposed) + 1], computed in the forward;
        ``before``: the tokens since the last commit before ``proposed[0]``).
        Greedy: the longest argmax-matching prefix and the argmax after it. Sampling: speculative sampling with
        proposal rows ``qs`` (accept with min(1, p/q), else draw from norm(max(0, p - q)) and stop; after a full
        accept draw from p). Returns (accepted count, the next token, the probability rows p read)."""
        if self.sampling is None:
            y, a = rows.tolist(), 0  # one read
            while a < len(proposed) and proposed[a] == y[a]:
                a += 1
            return a, y[a], []
        s, g, ps = self.sampling, self.generator, []
        for a, t in enumerate(proposed):
            ps.append(s.probs(rows[a], self._hist(before + proposed[:a])))
            tok, ok = s.speculative_accept(ps[-1], qs[a], t, g)
            if not ok:
                return a, tok, ps
        ps.append(s.probs(rows[len(proposed)], self._hist(before + proposed)))
        return len(proposed), int(torch.multinomial(ps[-1], 1, generator=g)), ps

    def step(self, remaining: int) -> Step:
        """One round: the middle level proposes (checking the draft model's tokens), the full cache verifies.

        Sampling is exact at both levels: every token the middle level emits is distributed as its own p_m, so the
        final level verifies against those p_m rows (``qs``), not the draft's q (docs/methods/triforce.md)."""
        cfg, stats = self.cfg, self.stats
        v, valid, qs = [self.cur], 0, []  # v[i] at position N + i; middle KV exists for v[:valid]; v[i+1] ~ qs[i]
        want = min(cfg.gamma2, remaining - 1)
        while len(v) - 1 < want and not any(t in self.eos_ids for t in v[1:]):
            drafts, dq = self._drafts(v)
            j, tok, ps = self._accept(self._middle(v, valid, drafts), drafts, dq, v)
            qs += ps
            stats["drafted"] += len(drafts)
            stats["draft_accepted"] += j
            valid = len(v) + j
            v += drafts[:j] + [tok]
        logits, queries = self._verify(v)
        a, tok, _ = self._accept(logits[0], v[1:], qs, v[:1])
        stats["proposed"] += len(v) - 1
        stats["accepted"] += a
        return Step(v[1 : 1 + a] + [tok], len(v) - 1, queries=queries)

    def _verify(self, v: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The full-cache target forward over ``[x0, proposals...]`` (KV written in place): [1, len(v), V] logits
        (greedy: their argmax tokens, [1, len(v)]), and every row's query when a rebuild may need one. Under static
        shapes ``v`` is padded to ``verify_len`` tokens, whose KV goes past anything the commit keeps (the cache's
        ``extra_slots`` cover them)."""
        N = self.N
        tokens = self._padded(v, self.verify_len)
        n = len(tokens)
        plan = causal_plan(N)
        self.stats["rounds"] += 1
        if self.cfg.rebuild_interval is not None:  # every round, so compiled verifications keep one graph
            plan.capture_rows = self.all_rows[:n]  # all rows (a fixed count); a rebuild reads row `accepted`
        out, queries = self.engine.forward(self.cache, tokens, list(range(N, N + n)), list(range(N, N + n)), plan,
                                           logits="all", queries=True, greedy=self.sampling is None)
        return out[:, : len(v)], queries  # [1, len(tokens), V] (greedy: [1, len(tokens)]) -> the real rows

    def commit(self, step: Step) -> None:
        """The KV of [current | accepted] is at slots N..N+accepted; update C_r (and maybe rebuild) and the draft.

        A rebuild is due when the commit brings the generated tokens with full-cache KV (``end - prompt``) to the
        next multiple of ``rebuild_interval`` since the last (re)build; it uses the newest committed token's query
        (row ``accepted`` of the verification)."""
        new, accepted = step.tokens, step.accepted
        end = self.N + accepted + 1
        every = self.cfg.rebuild_interval
        if self.retrieval is not None:
            if step.queries is not None and every is not None and (end - len(self.prompt)) // every > self.rebuilt_at:
                self.retrieval.build(self.cache, self.aligned, step.queries[..., accepted : accepted + 1, :], end)
                self.stats["rebuilds"] += 1
                self.rebuilt_at = (end - len(self.prompt)) // every
            else:
                self.retrieval.add_recent(self.cache, self.N, end)
        self.hist.extend(new)
        self.N, self.cur = end, new[-1]
        if self.draft is not None:
            d = self.draft.D
            self.draft.commit(self.hist[d:end], d, end)

    def draft_model(self) -> tuple[int, int]:
        """The draft model's forwards in this generation (its prefill included) and its parameter count."""
        if self.draft is None:
            return 0, 0
        params = sum(p.numel() for p in self.draft.engine.model.parameters())
        return (self.draft.engine.ledger.mark() - self.draft_mark).total, params

    def extras(self) -> dict:
        s = self.stats
        retrieval_bytes = self.retrieval.kv.nbytes if self.retrieval is not None else 0
        draft_bytes = self.draft.nbytes if self.draft is not None else 0
        return {
            "budget_used": self.retrieval.budget if self.retrieval is not None else 0,
            "rebuilds": s["rebuilds"],
            "retrieval_covers_prompt": self.covers_prompt,
            "accept_rate": s["accepted"] / max(s["proposed"], 1),  # official acceptance_rate (final level)
            "middle_accept_rate": s["draft_accepted"] / max(s["drafted"], 1),  # official acc_rate_middle
            "retrieval_bytes": retrieval_bytes,
            "draft_bytes": draft_bytes,
            "buffer_bytes": retrieval_bytes + draft_bytes,
        }
