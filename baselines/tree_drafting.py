"""The decode loop shared by the draftless tree drafters (Prompt Lookup, Token Recycling, SuffixDecoding,
SAM-Decoding): each step a drafter proposes a :class:`fafo.tree.DraftTree` rooted at the current token (a chain is
a one-path tree, the root alone one vanilla step), the target verifies it in ONE forward
(:func:`fafo.tree.tree_inputs`), the accepted path plus the bonus token is committed (greedy: token-identical to
vanilla; sampled: Lookahead's exact rule for deterministic guesses) and the drafter is told what happened. Trees are
never deeper than the tokens left to generate minus one, and are padded to :meth:`TreeDrafter.max_tree` nodes under
``engine.static_shapes``. The whole picture: docs/methods/README.md, "The draftless baselines' shared loop".
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar


from fafo.decoding import Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.batching import RowLogits, StepInputs
from fafo.engine.engine import Engine
from fafo.sampling import GREEDY, Sampling
from fafo.tree import DraftTree, commit_path, drafter_inputs, warm_tree_steps


class DraftState:
    """One generation's drafter: sees the committed text, proposes trees, learns from verifications."""

    def draft(self, context: list[int], max_depth: int) -> DraftTree:
        """A tree rooted at ``context[-1]`` (the current token) with depth <= ``max_depth``."""
        raise NotImplementedError

    def observe(self, tree: DraftTree, logits: RowLogits, new: list[int]) -> None:
        """After a verification: ``logits`` (the target's rows for the real nodes: ``.tensor`` ``[len(tree), V]``,
        ``.topk(k)`` on the host) and the committed tokens ``new`` (accepted path + bonus, before any EOS /
        max_new_tokens cut)."""


def chain(root: int, tokens, max_depth: int) -> DraftTree:
    """A one-path tree: ``root`` then ``tokens`` (cut at ``max_depth``)."""
    return DraftTree.from_paths(root, [list(tokens)[:max(max_depth, 0)]])


def cut_tree(root: int, tokens, parents, max_depth: int) -> DraftTree:
    """The tree of nodes ``tokens`` below ``root`` (``parents[i]``: an earlier node, -1 = the root; parents
    precede children), nodes deeper than ``max_depth`` dropped (they could not be committed)."""
    tree = DraftTree.root(root)
    node_of, depth = {-1: 0}, {-1: 0}
    for i, (t, p) in enumerate(zip(tokens, parents)):
        if p in node_of and depth[p] < max_depth:
            node_of[i], depth[i] = tree.add(node_of[p], t), depth[p] + 1
    return tree


@dataclass
class TreeDrafter(Decoder):
    """Base class: subclasses define :meth:`start` (a :class:`DraftState` per generation) and :meth:`max_tree`.

    At batch B each request has its own :class:`DraftState`; run-wide state (Token Recycling's matrix,
    SuffixDecoding's global tree) is shared and updated request by request in request order
    (:func:`fafo.batch.decode_batch`)."""

    batch_refusal: ClassVar[str] = ""

    @abstractmethod
    def start(self, engine: Engine, prompt_ids: list[int], eos_ids) -> DraftState:
        """A fresh drafter for one generation (run-wide state, e.g. Token Recycling's matrix, lives on self)."""

    def warm_shapes(self, engine: Engine) -> None:
        """Vanilla's step when nothing was drafted and the padded tree with a shallow or a deep mask
        (:func:`fafo.tree.warm_tree_steps`)."""
        warm_tree_steps(engine, [self.max_tree()], alone=True)

    @abstractmethod
    def max_tree(self) -> int:
        """Most nodes of a drafted tree, root included (the padded size under ``engine.static_shapes``)."""

    def extra_slots(self, max_new_tokens: int) -> int:
        # the (padded) tree is written to slots [N, N + max_tree) with N < prompt + max_new_tokens
        return self.max_tree()

    def finish(self, state: DraftState, prompt_ids: list[int], tokens: list[int]) -> None:
        """Called after each generation with its committed tokens (e.g. to cache the output)."""

    def new_state(self, engine, prompt_ids, max_new_tokens, eos_ids=(), sampling=None, generator=None, cache=None):
        return _TreeState(self, engine, prompt_ids, max_new_tokens, sampling or GREEDY, generator, eos_ids, cache)

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        state = self.new_state(engine, prompt_ids, max_new_tokens, eos_ids, sampling, generator)
        return decode(engine, state, max_new_tokens, eos_ids, clock)

    def buffer_bytes(self) -> int:
        """Bytes of the method's own draft structures (added to peak memory on CPU)."""
        return 0


class _TreeState(StepState):
    """One generation of a tree drafter: draft, verify in one forward, commit the accepted path and the bonus."""

    def __init__(self, cfg: TreeDrafter, engine: Engine, prompt_ids: list[int], max_new_tokens: int,
                 sampling: Sampling, generator, eos_ids, cache=None):
        self.cfg, self.engine, self.sampling, self.generator, self.eos_ids = cfg, engine, sampling, generator, eos_ids
        self.context = list(prompt_ids)  # prompt + committed tokens; context[-1] is the current token
        self.n_prompt = len(self.context)
        need = self.n_prompt + max_new_tokens + cfg.extra_slots(max_new_tokens)
        self.cache = cache if cache is not None else engine.cache(need)

    def prefill(self) -> int:
        logits = self.engine.prefill(self.cache, self.context)
        history = self.context if self.sampling.uses_history else None
        first = int(self.sampling.select(logits[0, -1], self.generator, history))
        self.drafter = self.cfg.start(self.engine, self.context, self.eos_ids)
        self.context = self.context + [first]
        return first

    def inputs(self, remaining: int) -> list[StepInputs]:
        self.tree = self.drafter.draft(self.context, remaining - 1)
        return [drafter_inputs(self.tree, len(self.context) - 1, self.cfg.max_tree())]

    def outputs(self, remaining: int, logits: list[RowLogits]) -> Step:
        tree, out = self.tree, logits[0]
        N = len(self.context) - 1  # committed KV entries = the current token's position and slot
        if self.sampling.greedy:
            preds = out.argmax().tolist()  # the step's one host sync
            path = tree.accept_greedy(preds)
            new = [tree.tokens[i] for i in path] + [preds[path[-1] if path else 0]]
        else:
            path, new = tree.accept_sampled(out.tensor, self.sampling, self.generator, self.context)
        commit_path(self.cache, N, path)
        self.drafter.observe(tree, out, new)
        self.context += new
        return Step(new, len(tree) - 1)

    def live_slots(self) -> int:
        return len(self.context) - 1

    def finish(self, tokens: list[int]) -> None:
        self.cfg.finish(self.drafter, self.context[: self.n_prompt], tokens)

    def extras(self) -> dict:
        return {"buffer_bytes": self.cfg.buffer_bytes()}
