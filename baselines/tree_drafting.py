"""The decode loop shared by the draftless tree drafters (Prompt Lookup, Token Recycling, SuffixDecoding,
SAM-Decoding): draft a token tree from a data structure, verify it in ONE target forward, commit the accepted
path plus the bonus token, tell the drafter what happened.

Each step, with ``N`` committed KV entries and the current token ``t0`` (committed, KV not cached yet) at
position ``N``: the drafter returns a :class:`fafo.tree.DraftTree` rooted at ``t0`` (a chain is a one-path tree;
no draft is the root alone, i.e. one vanilla step); :func:`fafo.tree.verify_tree` runs the target over it (prefix
attention + ancestor mask), greedy acceptance is :meth:`DraftTree.accept_greedy` (token-identical to vanilla) and
sampled acceptance :meth:`DraftTree.accept_sampled` (the drafts are deterministic guesses, verified with
Lookahead's exact rule, so the output law is the target's); :func:`fafo.tree.commit_path` moves the accepted
nodes' KV into place. Under ``engine.static_shapes`` the tree is padded to :meth:`TreeDrafter.max_tree` nodes, a
size fixed by the method's hyperparameters, so every verification has one shape.

Trees are never deeper than the tokens left to generate minus one (deeper nodes could not be committed).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import torch

from fafo.decoding import Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.engine import Engine
from fafo.sampling import GREEDY, Sampling
from fafo.tree import DraftTree, commit_path, verify_tree


class DraftState:
    """One generation's drafter: sees the committed text, proposes trees, learns from verifications."""

    def draft(self, context: list[int], max_depth: int) -> DraftTree:
        """A tree rooted at ``context[-1]`` (the current token) with depth <= ``max_depth``."""
        raise NotImplementedError

    def observe(self, tree: DraftTree, logits: torch.Tensor, new: list[int]) -> None:
        """After a verification: ``logits`` ``[len(tree), V]`` (the target's rows for the real nodes) and the
        committed tokens ``new`` (accepted path + bonus, before any EOS / max_new_tokens cut)."""


def chain(root: int, tokens, max_depth: int) -> DraftTree:
    """A one-path tree: ``root`` then ``tokens`` (cut at ``max_depth``)."""
    return DraftTree.from_paths(root, [list(tokens)[:max(max_depth, 0)]])


@dataclass
class TreeDrafter(Decoder):
    """Base class: subclasses define :meth:`start` (a :class:`DraftState` per generation) and :meth:`max_tree`."""

    @abstractmethod
    def start(self, engine: Engine, prompt_ids: list[int], eos_ids) -> DraftState:
        """A fresh drafter for one generation (run-wide state, e.g. Token Recycling's matrix, lives on self)."""

    @abstractmethod
    def max_tree(self) -> int:
        """Most nodes of a drafted tree, root included (the padded size under ``engine.static_shapes``)."""

    def extra_slots(self, max_new_tokens: int) -> int:
        # the (padded) tree is written to slots [N, N + max_tree) with N < prompt + max_new_tokens
        return self.max_tree()

    def finish(self, state: DraftState, prompt_ids: list[int], tokens: list[int]) -> None:
        """Called after each generation with its committed tokens (e.g. to cache the output)."""

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        state = _TreeState(self, engine, prompt_ids, max_new_tokens, sampling or GREEDY, generator, eos_ids)
        return decode(engine, state, max_new_tokens, eos_ids, clock)

    def buffer_bytes(self) -> int:
        """Bytes of the method's own draft structures (added to peak memory on CPU)."""
        return 0


class _TreeState(StepState):
    """One generation of a tree drafter: draft, verify in one forward, commit the accepted path and the bonus."""

    def __init__(self, cfg: TreeDrafter, engine: Engine, prompt_ids: list[int], max_new_tokens: int,
                 sampling: Sampling, generator, eos_ids):
        self.cfg, self.engine, self.sampling, self.generator, self.eos_ids = cfg, engine, sampling, generator, eos_ids
        self.context = list(prompt_ids)  # prompt + committed tokens; context[-1] is the current token
        self.n_prompt = len(self.context)
        self.cache = engine.cache(self.n_prompt + max_new_tokens + cfg.extra_slots(max_new_tokens))
        self.N = self.n_prompt  # committed KV entries = the current token's position and slot

    def prefill(self) -> int:
        logits = self.engine.prefill(self.cache, self.context)
        history = self.context if self.sampling.uses_history else None
        first = int(self.sampling.select(logits[0, -1], self.generator, history))
        self.drafter = self.cfg.start(self.engine, self.context, self.eos_ids)
        self.context = self.context + [first]
        return first

    def step(self, remaining: int) -> Step:
        tree = self.drafter.draft(self.context, remaining - 1)
        size = self.cfg.max_tree() if self.engine.static_shapes else len(tree)
        out = verify_tree(self.engine, self.cache, tree, self.N, size)
        if self.sampling.greedy:
            preds = out.argmax(-1).tolist()  # the step's one host sync
            path = tree.accept_greedy(preds)
            new = [tree.tokens[i] for i in path] + [preds[path[-1] if path else 0]]
        else:
            path, new = tree.accept_sampled(out, self.sampling, self.generator, self.context)
        commit_path(self.cache, self.N, path)
        self.drafter.observe(tree, out, new)
        self.N += len(new)
        self.context += new
        return Step(new, len(tree) - 1)

    def finish(self, tokens: list[int]) -> None:
        self.cfg.finish(self.drafter, self.context[: self.n_prompt], tokens)

    def extras(self) -> dict:
        return {"buffer_bytes": self.cfg.buffer_bytes()}
