"""SWIFT: on-the-fly self-speculative decoding by layer skipping (Xia et al., ICLR 2025,
https://arxiv.org/abs/2410.06916), greedy and sampled.

The same model with some attention / MLP sub-layers skipped drafts up to ``max_step_draft`` tokens (stopping at a
low-confidence one), the top-k ids of each draft step form a tree hanging off the drafted chain, one full-model
forward verifies it, and the skipped-layer set is searched on the fly between steps (``swift_optimizer.py``).
Mirrors hemingkx/SWIFT @88caed7 (``evaluation_llama/inference_swift.py`` ``swift_forward``; ``model/swift/
utils.py`` ``swift_draft``, ``get_choices_list``, ``tree_decoding``, ``evaluate_posterior``,
``update_inference_inputs``, ``swift_optimization``), re-implemented on our engine. The step in detail and where the
official code is silent or broken: docs/methods/swift.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from baselines.swift_optimizer import LayerSetOptimizer
from fafo.decoding import Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.attention import causal_plan
from fafo.engine.engine import Engine
from fafo.bounds import at_least, check_bounds
from fafo.errors import ConfigError
from fafo.extras import require
from fafo.sampling import Sampling
from fafo.tree import DraftTree, commit_path, greedy_tree_step, verify_tree, warm_tree_steps

CONFIDENCE_BINS = (0.95, 0.8, 0.5)  # official get_choices_list thresholds (strictly greater)
SAMPLING_TREE_WIDTHS = (1, 3, 5, 10)  # official get_choices_list candidate_set when sampling


def tree_widths_for(confidences: list[float], widths: tuple[int, ...], topk: int) -> list[int]:
    """Children of the chain node at each depth (official ``get_choices_list``, greedy candidate set)."""
    # the bin is the first threshold c exceeds: the bins descend, so it counts the thresholds c does not exceed
    return [min(widths[sum(c <= t for t in CONFIDENCE_BINS)], topk) for c in confidences]


def build_tree(root: int, draft_ids: list[list[int]], widths: list[int]) -> DraftTree:
    """The official tree: depth d + 1 holds the top ``widths[d]`` ids of draft step d, all children of the chain
    node of depth d (the root, then each step's top-1, which the next draft step was fed); siblings are leaves."""
    tree, chain = DraftTree.root(root), 0
    for ids, w in zip(draft_ids, widths):
        chain = [tree.add(chain, t) for t in ids[:w]][0]
    return tree


def accept_sampled(tree: DraftTree, logits: torch.Tensor, qs: list[torch.Tensor], sampling: Sampling, generator,
                   hist: list[int] | None) -> tuple[list[int], list[int]]:
    """Sampling ``evaluate_posterior``: at each depth the children of the chain node (drawn without replacement
    from the draft's q at that depth) are tried in turn with ``Sampling.accept_siblings`` against the target p at
    their parent; an accepted chain node continues, an accepted leaf (or the last depth) ends with a bonus token
    drawn from p at it, a full rejection with the residual's token. Exact (see ``accept_siblings``). Returns
    (accepted node indices, committed tokens)."""
    path, new, node = [], [], 0
    for q in qs:
        kids = tree.children(node)
        if not kids:  # an accepted sibling is a leaf
            break
        p = sampling.probs(logits[node], None if hist is None else hist + new)
        tok, i = sampling.accept_siblings(p, q, [tree.tokens[k] for k in kids], generator)
        new.append(tok)
        if i < 0:
            return path, new
        node = kids[i]
        path.append(node)
    p = sampling.probs(logits[node], None if hist is None else hist + new)
    new.append(int(torch.multinomial(p, 1, generator=generator)))
    return path, new


@dataclass
class SwiftDecoder(Decoder):
    """SWIFT: layer-skipping self-draft, confidence tree, one verification forward per step, on-the-fly
    skip-set search. Defaults: the official argparse values (``conf/method/swift.yaml``);
    ``swift_script`` has the ``eval_llama.sh`` values (max_score 0.93, context_window 50).

    Under ``bench.compile`` the verification forward (the whole model, the tree padded to :meth:`max_tree`) runs
    compiled like every method's; the drafts and the search's scoring forwards skip layers of a set that changes
    while decoding, and run compiled a graph per sub-layer, shared by every layer and every set
    (:mod:`fafo.engine.skipping_step`; a whole-model graph would guard on the set).

    Attributes:
        skip_ratio: r, fraction of the 2(L-2) attention/MLP sub-layers a searched set skips.
        opt_interval: optimise after steps whose index is a multiple of this.
        bayes_interval: every this-many-th search iteration is a Bayesian-optimisation suggestion.
        max_opt_iter, max_tolerance_iter, max_score: the search's stopping rules (see ``swift_optimizer``).
        context_window: the first ``context_window + 1`` generated tokens score a candidate set.
        max_step_draft: most draft tokens per step.
        stop_threshold: the draft stops after a token whose confidence is below this.
        topk: draft ids kept per step (official TOPK); caps the tree widths.
        tree_widths: children at a depth for confidence > 0.95 / > 0.8 / > 0.5 / otherwise.
        optimization: search the skip set on the fly (official ``--optimization``: false in argparse, passed by
            every official script).
        bayes: use Bayesian-optimisation suggestions (official ``--bayes``, as ``--optimization``);
            false = random search only.
        reset_per_sample: restart the search (set, scores, optimiser) at every sample (official: never).
        attn_skip, mlp_skip: the starting skip set (null: attention and MLP of the odd layers; official
            ``--cache-hit`` loads one).
        seed: seeds the random search and the optimiser (official ``--seed 2024``).
    """

    skip_ratio: float = 0.45
    opt_interval: int = at_least(1, 1)
    bayes_interval: int = at_least(1, 25)
    max_opt_iter: int = at_least(0, 1000)  # 0: the starting skip set is kept (no search)
    max_tolerance_iter: int = at_least(0, 300)
    max_score: float = 0.95
    context_window: int = at_least(1, 32)
    max_step_draft: int = at_least(1, 25)
    stop_threshold: float = 0.8
    topk: int = at_least(1, 10)
    tree_widths: tuple = (3, 5, 8, 10)
    optimization: bool = True
    bayes: bool = True
    reset_per_sample: bool = False
    attn_skip: list | None = None
    mlp_skip: list | None = None
    seed: int = 2024
    cross_request_state: ClassVar[tuple[str, ...]] = ("optimizer",)  # official: the search goes on across requests
    batch_refusal: ClassVar[str] = "its layer-set search and layer-skipped drafts are one request's (not batched)"

    def __post_init__(self):
        check_bounds(self, "method")
        for name, hi_open in (("skip_ratio", True), ("max_score", False), ("stop_threshold", False)):
            v = getattr(self, name)
            v = float(v) if type(v) is int else v  # an integer, not a bool
            if not isinstance(v, float) or not (0.0 <= v < 1.0 if hi_open else 0.0 <= v <= 1.0):
                bound = "[0, 1)" if hi_open else "[0, 1]"
                raise ConfigError(f"method.{name}={getattr(self, name)!r} must be a number in {bound}")
            setattr(self, name, v)
        widths = list(self.tree_widths) if not isinstance(self.tree_widths, (str, int)) else []
        if len(widths) != 4 or not all(type(w) is int and w >= 1 for w in widths):
            raise ConfigError(f"method.tree_widths={self.tree_widths!r} must be 4 integers >= 1 (official: "
                              "[3, 5, 8, 10] for confidence > 0.95 / > 0.8 / > 0.5 / else)")
        self.tree_widths = tuple(widths)
        for name in ("attn_skip", "mlp_skip"):
            v = getattr(self, name)
            if v is not None:
                if isinstance(v, (str, int)) or not all(type(x) is int and x >= 1 for x in v):
                    raise ConfigError(f"method.{name}={v!r} must be null or a list of layer ids >= 1 "
                                      "(the first and last layer are never skipped)")
                setattr(self, name, sorted(set(v)))
        if type(self.seed) is not int:
            raise ConfigError(f"method.seed={self.seed!r} must be an integer")
        if self.bayes:  # before a model loads (the optimiser imports it on first use)
            require("bayes_opt", "method.bayes=true", "method.bayes=false: random search only")
        self.optimizer: LayerSetOptimizer | None = None  # the run's search state, built by setup
        self._model = None

    # ------------------------------------------------------------------ contract
    def max_tree(self, sampled: bool | None = None) -> int:
        """Most nodes (root included) of a verification tree: ``max_step_draft`` depths of at most the widest
        width, capped at ``topk``. Greedy trees (``sampled=False``) take their widths from ``tree_widths``,
        sampled ones (``True``) from ``SAMPLING_TREE_WIDTHS``; ``None``: the larger of the two. Under
        ``engine.static_shapes`` every tree is padded to this size."""
        greedy = 1 + self.max_step_draft * min(self.topk, max(self.tree_widths))
        samp = 1 + self.max_step_draft * min(self.topk, max(SAMPLING_TREE_WIDTHS))
        return {False: greedy, True: samp, None: max(greedy, samp)}[sampled]

    def warm_shapes(self, engine: Engine) -> None:
        """Its verification padded to :meth:`max_tree` with a shallow or a deep mask: a warm-up generation may draft
        only one kind (:func:`fafo.tree.warm_tree_steps`); a draft and, with the search on, a scoring forward (a
        warm-up generation shorter than ``context_window + 2`` tokens scores nothing). At slot 8 of the shared
        cache, as the trees (the next prefill overwrites it)."""
        warm_tree_steps(engine, [self.max_tree(False), self.max_tree(True)])
        cache, N, n = engine.static_cache, 8, self.context_window + 1
        if not engine.static_shapes or cache is None:
            return
        skip = self.optimizer.skip
        engine.forward(cache, [0], [N], [N], causal_plan(N), logits="last", skip=skip, kind="draft")
        if self.optimization and self.max_opt_iter and cache.max_len >= N + n + 2:
            engine.forward(cache, [0] * n, torch.arange(N, N + n, device=engine.device), None, causal_plan(N),
                           logits="all", skip=skip, kind="aux")

    def extra_slots(self, max_new_tokens: int) -> int:
        # the (padded) tree, >= the draft, is written to slots [N, N + max_tree) with N < prompt + max_new_tokens
        return self.max_tree()

    def check_target(self, hf_config, tokenizer=None, weights: bool = True) -> None:
        n_layers = hf_config.num_hidden_layers
        for name in ("attn_skip", "mlp_skip"):
            bad = [x for x in getattr(self, name) or () if x > n_layers - 2]
            if bad:
                raise ConfigError(f"method.{name} has layers {bad}: this model has {n_layers} layers and "
                                  f"only 1..{n_layers - 2} may be skipped (the first and last never are)")

    def setup(self, engine: Engine) -> None:
        """A fresh search for the run (state then persists across its samples)."""
        self.check_target(engine.model.hf_config)
        self.optimizer = LayerSetOptimizer(
            engine.model.args.n_layers, self.skip_ratio, self.bayes_interval, self.max_opt_iter,
            self.max_tolerance_iter, self.max_score, self.bayes, self.seed)
        self.optimizer.reset(self.attn_skip, self.mlp_skip)
        self._model = engine.model

    # ------------------------------------------------------------------ decoding
    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        if self.optimizer is None or self._model is not engine.model:  # generate without setup, or a new model
            self.setup(engine)
        elif self.reset_per_sample:
            self.optimizer.reset(self.attn_skip, self.mlp_skip)
        state = _SwiftState(self, engine, prompt_ids, max_new_tokens, sampling, generator)
        return decode(engine, state, max_new_tokens, eos_ids, clock)


class _SwiftState(StepState):
    """One generation: layer-skipped drafting, tree verification, and the layer-set search between steps."""

    def __init__(self, cfg: SwiftDecoder, engine: Engine, prompt_ids: list[int], max_new_tokens: int,
                 sampling: Sampling | None, generator):
        self.cfg, self.engine, self.generator = cfg, engine, generator
        self.samp = sampling if sampling is not None and not sampling.greedy else None  # None: greedy
        self.prompt, self.max_new = list(prompt_ids), max_new_tokens
        self.P = len(self.prompt)
        self.cache = engine.cache(self.P + max_new_tokens + cfg.extra_slots(max_new_tokens))
        self.N, self.n_steps = self.P, 0  # committed KV entries; cur sits at position N

    def prefill(self) -> int:
        last = self.engine.prefill(self.cache, self.prompt)[0, -1]
        self.cur = int(last.argmax()) if self.samp is None else int(self.samp.select(last, self.generator, self.prompt))
        self.history = [self.cur]  # every generated token, uncut (the optimisation window reads its head)
        return self.cur

    def _draft(self, hist: list[int] | None):
        """Official ``swift_draft``: per step the top-k ids ([D][topk]), the fed id's raw draft probability (its
        confidence, official ``argmax_prob``; [D]) and, when sampling, the q rows ([D][V]). Sampling (official
        ``sample``) draws up to ``topk`` ids without replacement from q (at most its support size), feeds the first."""
        cfg, engine, cache, N, sampling = self.cfg, self.engine, self.cache, self.N, self.samp
        ids, conf, qs, fed = [], [], [], []
        tok = [self.cur]  # host value: uploaded with the step's positions and slots
        for s in range(cfg.max_step_draft):
            pos = N + s  # scratch slot = position; the verification overwrites it
            logits = engine.forward(cache, tok, [pos], [pos], causal_plan(pos), logits="last", skip=cfg.optimizer.skip,
                                    kind="draft")
            logits = logits[0, -1].float()  # [V]
            if sampling is None:
                ids.append(logits.topk(cfg.topk).indices)
                tok = ids[-1][:1]
            else:
                q = sampling.probs(logits, None if hist is None else hist + fed)
                k = min(cfg.topk, int((q > 0).sum()))
                drawn = torch.multinomial(q, k, replacement=False, generator=self.generator)
                ids.append(drawn.tolist())
                qs.append(q)
                tok = drawn[:1]
                fed.append(int(tok))
            conf.append(float(torch.exp(logits[tok[0]] - torch.logsumexp(logits, -1))))  # the greedy step's one sync
            if conf[-1] < cfg.stop_threshold or N - self.P + s + 2 >= self.max_new:
                break
        return (ids if sampling is not None else torch.stack(ids).tolist()), conf, qs

    def _score(self, cand: dict) -> float:
        """Teacher-forced matchness of a candidate set on the first ``context_window + 1`` generated tokens,
        over the prompt's KV (slots [0, P)); nothing is written to the cache."""
        engine, P, n = self.engine, self.P, self.cfg.context_window + 1
        window = self.history[:n]
        assert len(window) == n  # scored only once N - P > context_window + 1, len(history) == N - P + 1
        pos = torch.arange(P, P + len(window), device=engine.device)
        logits = engine.forward(self.cache, window, pos, None, causal_plan(P), logits="all",
                                skip=(cand["attn"], cand["mlp"]), kind="aux")
        pred = logits[0, :-1].argmax(-1)
        return float((pred == torch.tensor(window[1:], device=engine.device)).float().mean())

    def step(self, remaining: int) -> Step:
        cfg, engine, samp, cache, N, cur = self.cfg, self.engine, self.samp, self.cache, self.N, self.cur
        opt, P = cfg.optimizer, self.P
        hist = self.prompt + self.history if samp is not None and samp.uses_history else None
        draft_ids, conf, qs = self._draft(hist)
        widths = tree_widths_for(conf, cfg.tree_widths if samp is None else SAMPLING_TREE_WIDTHS, cfg.topk)
        tree = build_tree(cur, draft_ids, widths)
        size = cfg.max_tree(samp is not None)  # the engine pads to it under static shapes: one shape per run
        if samp is None:
            path, new = greedy_tree_step(engine, cache, tree, N, size)
        else:
            path, new = accept_sampled(tree, verify_tree(engine, cache, tree, N, size), qs, samp, self.generator, hist)
            commit_path(cache, N, path)
        self.N += len(new)  # the root's KV and the accepted nodes'; the bonus token is the next root
        self.cur = new[-1]
        self.history += new
        # the official loop optimises after every step whose condition holds, the last one included
        due = self.N - P > cfg.context_window + 1 and self.n_steps % cfg.opt_interval == 0
        if cfg.optimization and opt.active and due:
            cand = opt.propose()
            opt.update(cand, self._score(cand))
        self.n_steps += 1
        return Step(new, len(tree) - 1)

    def extras(self) -> dict:
        return {**self.cfg.optimizer.state(), "buffer_bytes": 0}  # scratch lives in the cache
