"""LongSpec: a trained one-layer draft over the target's own KV cache, beam-tree drafting, hybrid tree attention.

LongSpec (Yang et al., 2025, https://arxiv.org/abs/2502.17421), following ``sail-sg/LongSpec`` @ 15e4998
(``longspec/test/llama_glide.py``: ``tree_spec_generate``, ``spec_generate``). NOT draftless: it needs a draft
trained for the target (released ``sail/longspec-*`` drafts, or ``scripts/train_longspec_draft.py``). The draft is
:class:`~baselines.longspec_draft.GlideLayer`; its cross-attention reads the target's last-layer KV in place. Each
round the draft catches up on the newly committed tokens and grows a dynamic beam tree (``mode=chain``: ``gamma``
greedy tokens), which the target verifies in one forward (:mod:`fafo.tree`, the paper's hybrid tree attention).
The round step by step, sampling and the deviations from the release: docs/methods/longspec.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from baselines.longspec_draft import (WindowCache, check_shapes, load_draft, new_draft, read_draft_config,
                                     resolve_draft)
from fafo.decoding import Buffers, Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.attention import causal_plan
from fafo.engine.batching import argmax_rows
from fafo.engine.engine import Engine
from fafo.engine.ledger import model_call
from fafo.bounds import at_least, check_bounds, one_of, plain
from fafo.errors import ConfigError
from fafo.sampling import Sampling
from fafo.tree import DraftTree, commit_path, verify_tree


@dataclass
class LongSpecDecoder(Decoder):
    """LongSpec with a released-format draft (greedy and sampling).

    Attributes:
        draft: ``{path, revision}`` (hub id or directory of a LongSpec draft), or ``{random_seed: s}`` with
            ``path: null`` for a randomly initialised draft (smoke tests only: near-zero acceptance).
        mode: ``tree`` (dynamic beam tree of ``tree_shape``) or ``chain`` (``gamma`` greedy draft tokens).
        tree_shape: beam width per draft level (paper/official default [4, 16, 16, 16, 16]).
        gamma: chain length in ``chain`` mode (official ``spec_generate`` default 4).
        window: the draft's self-attention window (official 512): a query at p sees its keys at p-window..p.
    """

    batch_refusal: ClassVar[str] = "its draft layer, its cache and its beam tree are one request's (not batched)"
    draft: dict = field(default_factory=lambda: {"path": "sail/longspec-vicuna-7b-v1.5-16k", "revision": None,
                                                 "random_seed": None})
    mode: str = one_of(("tree", "chain"), "tree", why="tree = the beam tree of tree_shape, chain = gamma draft tokens")
    tree_shape: list = field(default_factory=lambda: [4, 16, 16, 16, 16])
    gamma: int = at_least(1, 4)
    window: int = at_least(1, 512)
    _loaded: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _consts: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # device constants
    _compiled: tuple | None = field(default=None, init=False, repr=False, compare=False)  # (engine's step, fns)

    def __post_init__(self):
        check_bounds(self, "method")
        shape = list(self.tree_shape) if self.tree_shape is not None else []
        if not shape or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in shape):
            raise ConfigError(f"method.tree_shape={self.tree_shape!r} must be a non-empty list of integers >= 1, "
                              "e.g. [4, 16, 16, 16, 16]")
        self.tree_shape = shape
        if not isinstance(self.draft, Mapping):
            raise ConfigError(f"method.draft={self.draft!r} must be a mapping with path (or random_seed)")
        self.draft = plain(dict(self.draft))
        unknown = set(self.draft) - {"path", "revision", "random_seed"}
        if unknown or bool(self.draft.get("path")) == (self.draft.get("random_seed") is not None):
            raise ConfigError(f"method.draft={self.draft} needs exactly one of path (a LongSpec draft: hub id or "
                              "directory) or random_seed (a random draft, smoke tests only), besides revision")

    @property
    def shape(self) -> list[int]:
        """Beam widths per level (chain mode: ``[1] * gamma``)."""
        return self.tree_shape if self.mode == "tree" else [1] * self.gamma

    @property
    def tree_size(self) -> int:
        return 1 + sum(self.shape)

    def extra_slots(self, max_new_tokens: int) -> int:
        return self.tree_size  # the verification writes the tree past the committed tokens

    def plan_bytes(self, args, slots: int, nbytes: int, compiled: bool) -> Buffers:
        """The draft layer (self and cross attention, MLP, three norms) and its window ring of self-attention KV."""
        q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
        attn = args.dim * (q + 2 * kv) + (q + 2 * kv) + q * args.dim
        layer = 2 * attn + 3 * args.dim * args.intermediate_size + 3 * args.dim
        return Buffers((layer + 2 * self.window * kv) * nbytes)

    def check_target(self, hf_config, tokenizer, weights: bool = True) -> None:
        """Refuse a draft whose files are damaged or whose config does not fit the target (before weights load)."""
        if self.draft.get("path"):
            ckpt = resolve_draft(self.draft["path"], self.draft.get("revision"), weights=weights)
            check_shapes(read_draft_config(ckpt), hf_config, repr(self.draft["path"]))

    def setup(self, engine: Engine) -> None:
        """Load (or build) the draft on the target's device and dtype, once per target engine."""
        if self._loaded is not None and self._loaded[0] is engine:
            return
        config = engine.model.hf_config
        if self.draft.get("path"):
            layer = load_draft(resolve_draft(self.draft["path"], self.draft.get("revision")), config,
                               engine.dtype, engine.device)
        else:
            layer = new_draft(config, self.draft["random_seed"], engine.dtype, engine.device).eval()
            layer.requires_grad_(False)
        a = layer.self_attn
        ring = WindowCache(self.window, a.n_kv_heads, a.head_dim, engine.dtype, engine.device)
        self._loaded = (engine, layer, ring)

    def held_bytes(self) -> int:
        """The draft layer's weights and its window cache."""
        if self._loaded is None:
            return 0
        _, layer, ring = self._loaded
        return sum(p.numel() * p.element_size() for p in layer.parameters()) + ring.nbytes

    @property
    def layer(self):
        return self._loaded[1]

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        self.setup(engine)
        state = _LongSpecState(self, engine, prompt_ids, max_new_tokens, sampling, generator)
        return decode(engine, state, max_new_tokens, eos_ids, clock)

    # ------------------------------------------------------------------------------------------------ drafting
    def _functions(self, engine: Engine) -> tuple:
        """(rows, level): :func:`draft_rows` and :func:`draft_level`, compiled when the engine's steps are (a graph
        per shape; no CUDA graphs, as the engine's layer-skipping steps: a level's outputs are read by the next
        levels, which a CUDA-graph replay would overwrite), else as they are."""
        if engine.compiled is None:
            return draft_rows, draft_level
        key = (id(engine.compiled), engine.compiled.options)  # a new compiled step may reuse a freed one's id
        if self._compiled is None or self._compiled[0] != key:
            options = engine.compiled.options
            self._compiled = (key, *(torch.compile(f, mode=options.mode_without_cudagraphs, backend=options.backend,
                                                   dynamic=False, fullgraph=True) for f in (draft_rows, draft_level)))
        return self._compiled[1:]

    @property
    def catch_rows(self) -> int:
        """The most catch-up tokens a round feeds (the accepted path and the bonus token): compiled rounds pad to it."""
        return len(self.shape) + 1

    def _commit(self, engine: Engine, ring: WindowCache, ids, first_pos: int) -> None:
        if len(ids):
            pos = torch.arange(first_pos, first_pos + len(ids), device=engine.device)
            ids = engine.tensor(ids)  # host ids: one copy
            *_, k, v = model_call(draft_rows, engine.model, self.layer, ids, pos, device=engine.device)
            ring.append(k, v, pos)

    def _draft_tree(self, engine: Engine, layer, ring: WindowCache, cache, catch: list[int], N: int,
                    catch_ids: torch.Tensor | None = None):
        """Build the round's beam tree: one draft forward per level, the beam kept on the device (every level's
        shape is known on the host), read back once at the end. Returns (tree, catch-up k, v and positions).

        Under compiled steps the catch-up rows are padded to :attr:`catch_rows` (``catch_ids`` comes padded; the
        padding's keys are hidden by a position of -1) and the target's KV is read at a dynamic length, so a round
        compiles nothing new after the first."""
        dev, (rows_fn, level_fn) = engine.device, self._functions(engine)
        C = len(catch)
        padded = self.catch_rows if engine.compiled is not None else C
        c_pos = torch.arange(N - C + 1, N - C + 1 + padded, device=dev)  # the root is the last catch-up token
        catch_ids = engine.tensor(catch + [0] * (padded - C)) if catch_ids is None else catch_ids  # on the device
        x, cos, sin, ck, cv = model_call(rows_fn, engine.model, layer, catch_ids, c_pos, device=dev)  # [1, Hkv, C, D]
        tk, tv = cache.keys[-1][:, :, :N], cache.values[-1][:, :, :N]  # the target's last layer, in place
        if engine.compiled is not None and N >= 2:  # one graph for every length
            for t in (tk, tv):
                torch._dynamo.mark_dynamic(t, 2, min=2, max=cache.max_len)
        shown = c_pos if padded == C else c_pos.masked_fill(self._const("depths", dev, padded) >= C, -1)  # padding
        keys_k, keys_v, fixed_pos = [ring.k, ck], [ring.v, cv], torch.cat([ring.pos, shown])
        # the ring and catch-up keys a query at depth d (position N + d) sees by the window rule alone
        depths = self._const("depths", dev, len(self.shape) + 1)
        level_pos = depths + N  # [levels + 1]: the position of the root, then of each level's nodes
        oldest = (depths + (N - self.window)).clamp_(min=0)  # the oldest position each level's queries see
        fixed = fixed_pos >= oldest[:, None]  # [levels + 1, K_fixed] (empty ring slots hold position -1)
        rows, masks = (x[:, C - 1 : C], cos[:, :, C - 1 : C], sin[:, :, C - 1 : C]), [fixed[:1]]
        scores, picks, ancestors, sizes = self._const("zero", dev), [], None, []
        for depth, width in enumerate(self.shape, start=1):
            scores, picked, toks, ancestors = model_call(level_fn, engine.model, layer, rows, keys_k, keys_v, masks,
                                                         tk, tv, scores, width, ancestors, device=dev)
            picks.append(picked)
            sizes.append(picked.numel())
            if depth == len(self.shape):
                break  # the last level is verified, never run through the draft
            # the next draft forward, over this level's nodes: window keys + catch-up + their tree ancestors
            rows = model_call(rows_fn, engine.model, layer, toks, level_pos[depth].expand(len(toks)), device=dev)
            keys_k.append(rows[3])
            keys_v.append(rows[4])
            rows = rows[:3]
            if depth - 1 > self.window:  # a tree key at depth j < depth - window is out of the window (rare)
                levels = np.repeat(np.arange(1, depth + 1), sizes)
                ancestors = ancestors & torch.from_numpy(levels >= depth - self.window).to(dev)
            masks = [fixed[depth].expand(len(toks), -1), ancestors]
        tree = self._tree(catch[-1], torch.cat(picks).cpu().numpy(), engine.model.args.vocab_size)  # the one tree read
        return tree, ck[:, :, :C], cv[:, :, :C], c_pos[:C]

    def _const(self, name: str, dev, n: int = 0) -> torch.Tensor:
        """A constant on the device, built once: ``depths`` 0..n-1, a float ``zero`` [1]."""
        key = (name, n, str(dev))
        if key not in self._consts:
            self._consts[key] = {"depths": lambda: torch.arange(n, device=dev),
                                 "zero": lambda: torch.zeros(1, device=dev)}[name]()
        return self._consts[key]

    def _tree(self, root: int, picks: np.ndarray, V: int) -> DraftTree:
        """The beam tree from every level's top-k indices over (parent beam, token) pairs, in level order (the
        indices of a level are distinct, so are the (parent, token) pairs)."""
        parents, tokens, first, count, at = [np.array([-1])], [np.array([root])], 0, 1, 0  # first node, size of a level
        for width in self.shape:
            n = min(width, count * V)
            level = picks[at : at + n]
            parents.append(first + level // V)
            tokens.append(level % V)
            first, count, at = first + count, n, at + n
        return DraftTree.from_arrays(np.concatenate(tokens).tolist(), np.concatenate(parents).tolist())


class _LongSpecState(StepState):
    """One generation: the target's full cache, the draft's window ring, a beam tree per step."""

    def __init__(self, cfg: LongSpecDecoder, engine: Engine, prompt_ids: list[int], max_new_tokens: int,
                 sampling: Sampling | None, generator):
        self.cfg, self.engine, self.generator = cfg, engine, generator
        _, self.layer, self.ring = cfg._loaded
        self.samp = sampling if sampling is not None and not sampling.greedy else None
        self.prompt = list(prompt_ids)
        self.cache = engine.cache(len(self.prompt) + max_new_tokens + cfg.extra_slots(max_new_tokens))
        self.draft_forwards = 0

    def prefill(self) -> int:
        cfg, P = self.cfg, len(self.prompt)
        ids, pos = self.engine.upload(self.prompt, list(range(P)))  # the draft's window reads them too
        last = self.engine.forward(self.cache, ids, pos, pos, causal_plan(0), logits="last", kind="prefill")[0, -1]
        cur = int(last.argmax()) if self.samp is None else int(self.samp.select(last, self.generator, self.prompt))
        # the draft's prompt "prefill": k/v of the last `window` prompt tokens (nothing else is ever read)
        self.ring.reset()
        start = max(0, P - cfg.window)
        cfg._commit(self.engine, self.ring, ids[start:], start)
        self.N, self.catch = P, [cur]  # committed target KV; tokens at N-len(catch)+1..N not in the ring yet
        self.catch_ids = None  # the catch-up tokens on the device (uploaded with the last commit)
        self.committed = [cur]
        return cur

    def step(self, remaining: int) -> Step:
        """Draft and verify; the step's ``rows``: the accepted nodes (moved by :meth:`commit`)."""
        cfg, engine, N, catch = self.cfg, self.engine, self.N, self.catch
        tree, ck, cv, c_pos = cfg._draft_tree(engine, self.layer, self.ring, self.cache, catch, N, self.catch_ids)
        self.draft_forwards += len(cfg.shape)
        self.ring.append(ck, cv, c_pos)
        logits = verify_tree(engine, self.cache, tree, N, cfg.tree_size)  # padded to it under static shapes
        if self.samp is None:
            preds = argmax_rows(logits)  # the verification's one read
            path = tree.accept_greedy(preds)
            new = [tree.tokens[i] for i in path] + [preds[path[-1] if path else 0]]
        else:
            hist = self.prompt + self.committed if self.samp.uses_history else None
            path, new = tree.accept_sampled(logits, self.samp, self.generator, hist)
        return Step(new, len(tree) - 1, rows=path)

    def commit(self, step: Step) -> None:
        """The accepted path's KV move and the next round's catch-up tokens: one copy to the device."""
        new = step.tokens
        pad = [0] * (self.cfg.catch_rows - len(new)) if self.engine.compiled is not None else []
        self.catch_ids = commit_path(self.cache, self.N, step.rows, carry=new + pad, engine=self.engine)
        self.N += len(new)
        self.catch = new
        self.committed += new

    def draft_model(self) -> tuple[int, int]:
        """The draft layer's tree forwards (it reads the target's embedding and LM head too; only the layer's own
        parameters are counted here)."""
        return self.draft_forwards, sum(p.numel() for p in self.layer.parameters())

    def extras(self) -> dict:
        return {"draft_window_entries": int((self.ring.pos >= 0).sum()),
                "buffer_bytes": self.cfg.held_bytes()}  # the draft layer's weights and its window ring


def draft_rows(model, layer, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Draft rows of tokens ``ids`` [Q] at ``positions`` [Q]: (embeddings, cos, sin, self-attention k, v)."""
    x, cos, sin = model.embed(ids[None], positions)
    return (x, cos, sin, *layer.self_kv(x, cos, sin))


def draft_level(model, layer, rows, keys_k, keys_v, masks, tk, tv, scores: torch.Tensor, width: int,
                ancestors: torch.Tensor | None):
    """One draft forward over a level's rows (:func:`draft_logp`: the layer over every key they may see, then the
    LM head, no final norm, as the release) and the beam's next level: the ``width`` best (beam score +
    log-probability) over (parent beam, token) pairs. ``keys_k``, ``keys_v``, ``masks``: the key blocks (ring,
    catch-up, each tree level) and their visibility; ``ancestors``: the level's nodes' ancestors-or-self among the
    tree's nodes below the root (None at the first level). Returns (scores, flat indices, tokens), each
    ``[width]``, and the new nodes' ancestors-or-self ``[width, tree nodes so far]``: their parent's row, then
    themselves."""
    logp = draft_logp(model, layer, rows, keys_k, keys_v, masks, tk, tv)
    V = logp.shape[-1]
    top = (scores[:, None] + logp).reshape(-1).topk(min(width, scores.numel() * V))
    itself = torch.eye(top.indices.numel(), dtype=torch.bool, device=logp.device)
    parents = top.indices // V
    new = itself if ancestors is None else torch.cat([ancestors[parents], itself], dim=1)
    return top.values, top.indices, top.indices % V, new


def draft_logp(model, layer, rows, keys_k, keys_v, masks, tk, tv) -> torch.Tensor:
    """The draft's log-probabilities ``[n, V]`` (float32) of a level's rows (see :func:`draft_level`)."""
    h = layer(*rows, torch.cat(keys_k, 2), torch.cat(keys_v, 2), torch.cat(masks, 1), tk, tv)
    return torch.log_softmax(model.lm_head(h)[0].float(), dim=-1)
