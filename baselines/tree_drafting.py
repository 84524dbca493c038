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

from fafo.decoding import Clock, Decoder, Generation, NullClock, truncate_at_stop
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
        sampling = sampling or GREEDY
        clock = clock or NullClock()
        prompt = list(prompt_ids)
        cache = engine.cache(len(prompt) + max_new_tokens + self.extra_slots(max_new_tokens))
        logits = engine.prefill(cache, prompt)
        first = int(sampling.select(logits[0, -1], generator, prompt if sampling.uses_history else None))
        clock.mark("prefill")
        state = self.start(engine, prompt, eos_ids)
        tokens, finished = truncate_at_stop([first], max_new_tokens, eos_ids)
        N = len(prompt)  # committed KV entries = the current token's position and slot
        accept_lengths: list[int] = []
        drafted = 0
        while not finished:
            tree = state.draft(prompt + tokens, max_new_tokens - len(tokens) - 1)
            drafted += len(tree) - 1
            size = self.max_tree() if engine.static_shapes else len(tree)
            out = verify_tree(engine, cache, tree, N, size)
            if sampling.greedy:
                preds = out.argmax(-1).tolist()  # the step's one host sync
                path = tree.accept_greedy(preds)
                new = [tree.tokens[i] for i in path] + [preds[path[-1] if path else 0]]
            else:
                path, new = tree.accept_sampled(out, sampling, generator, prompt + tokens)
            commit_path(cache, N, path)
            state.observe(tree, out, new)
            N += len(new)
            tokens, finished = truncate_at_stop(tokens + new, max_new_tokens, eos_ids)
            accept_lengths.append(len(tokens) - sum(accept_lengths) - 1)
        self.finish(state, prompt, tokens)
        extras = {"drafted_tokens": drafted, "buffer_bytes": self.buffer_bytes()}
        return Generation(tokens, accept_lengths, len(accept_lengths), extras)

    def buffer_bytes(self) -> int:
        """Bytes of the method's own draft structures (added to peak memory on CPU)."""
        return 0
