"""Draft token trees: building, verification in one forward, accepted-path extraction and KV compaction.

One helper for every tree-drafting method (Prompt Lookup's chains, Token Recycling's adjacency trees,
SuffixDecoding's suffix trees, SAM-Decoding, LongSpec's beam trees). A tree is rooted at the *current* token
``t0`` (the last committed token, whose KV is not cached yet) sitting at position ``N``, where ``N`` is the number
of committed KV entries (slots ``[0, N)``). Node ``i`` has a parent ``parents[i] < i`` and sits at position
``N + depth[i]``; its KV goes to slot ``N + i``. The target verifies the whole tree in one forward (prefix
attention over slots ``[0, N)`` merged with the step's ancestor mask, :mod:`fafo.engine.attention`), then the
longest root path whose every token is the target's choice at its parent is accepted, plus the bonus token (the
target's choice after the path's last node). The accepted nodes' KV is moved to slots ``N+1, N+2, ...`` (the
root's is already at ``N``), so after a step ``N += len(accepted)`` and the bonus token is the next root.

Under ``engine.static_shapes`` (compiled steps) the engine pads a tree to the method's largest size
(:mod:`fafo.engine.static_shapes`): the real nodes' logits are those of the unpadded tree.

Greedy acceptance is exact (token-identical to vanilla). Sampled acceptance treats the tree as deterministic
guesses (no draft distribution): at each node the children are tried with Lookahead's exact rule
(:meth:`fafo.sampling.Sampling.accept_deterministic`), so the output law is the target's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from fafo.engine.attention import AttentionPlan, causal_plan
from fafo.engine.batching import StepInputs, argmax_rows, forward_one
from fafo.engine.engine import Engine
from fafo.engine.upload import upload
from fafo.sampling import Sampling


@dataclass
class DraftTree:
    """A token tree; node 0 is the root (the current token).

    Attributes:
        tokens: token id of each node.
        parents: parent index of each node (-1 for the root); a parent always precedes its children.
    """

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    _children: dict = field(default_factory=dict, repr=False)  # (parent, token) -> node, for de-duplication

    @classmethod
    def root(cls, token: int) -> "DraftTree":
        return cls([int(token)], [-1])

    @classmethod
    def from_paths(cls, root: int, paths, max_nodes: int | None = None) -> "DraftTree":
        """A trie of token paths hanging below ``root`` (shared prefixes share nodes), in the paths' order,
        stopping once ``max_nodes`` nodes (root included) are placed."""
        tree = cls.root(root)
        for path in paths:
            tree.add_path(path, max_nodes=max_nodes)
        return tree

    @classmethod
    def from_arrays(cls, tokens: list[int], parents: list[int]) -> "DraftTree":
        """The tree of ``tokens`` under ``parents`` (node 0 the root, ``parents[0] == -1``) whose children of a node
        all carry distinct tokens (a beam's picks): built in one pass, without :meth:`add`'s lookups."""
        tree = cls(tokens, parents)
        tree._children = dict(zip(zip(parents[1:], tokens[1:]), range(1, len(tokens))))
        if len(tree._children) != len(tokens) - 1:
            raise ValueError("DraftTree.from_arrays: two children of a node carry the same token")
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int) -> int:
        """The child of ``parent`` with ``token`` (created if new); returns its index."""
        key = (parent, int(token))
        if key not in self._children:
            self._children[key] = len(self.tokens)
            self.tokens.append(int(token))
            self.parents.append(parent)
        return self._children[key]

    def add_path(self, path, parent: int = 0, max_nodes: int | None = None) -> list[int]:
        """Insert ``path`` below ``parent``; returns the nodes it occupies (cut short at ``max_nodes``)."""
        nodes = []
        for t in path:
            if max_nodes is not None and (parent, int(t)) not in self._children and len(self) >= max_nodes:
                break
            parent = self.add(parent, t)
            nodes.append(parent)
        return nodes

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    @property
    def depths(self) -> list[int]:
        depth = [0] * len(self)
        for i in range(1, len(self)):
            depth[i] = depth[self.parents[i]] + 1
        return depth

    # ------------------------------------------------------------------ the verification forward
    def mask(self, device=None) -> torch.Tensor:
        """``[len, len]`` bool: node i sees itself and its ancestors, i.e. its parent's row and itself (a parent
        precedes its children, so its row is complete and holds nothing at or past ``i``)."""
        mask = np.eye(len(self), dtype=bool)
        for i, p in enumerate(self.parents[1:], start=1):
            mask[i, :i] = mask[p, :i]
        mask = torch.from_numpy(mask)
        return mask if device is None else mask.to(device)

    def inputs(self, N: int) -> tuple[list[int], list[int], torch.Tensor]:
        """The verification forward's host tokens and positions ``[len]`` and step mask ``[len, len]``, with the
        root at position ``N``."""
        return self.tokens, [N + d for d in self.depths], self.mask()

    # ------------------------------------------------------------------ acceptance
    def accept_greedy(self, preds: list[int]) -> list[int]:
        """Accepted nodes below the root given the target's argmax ``preds[i]`` after each node (children of a
        node carry distinct tokens, so the path is unique)."""
        path, node = [], 0
        while True:
            nxt = self._children.get((node, preds[node]))
            if nxt is None:
                return path
            path.append(nxt)
            node = nxt

    def accept_sampled(self, logits: torch.Tensor, sampling: Sampling, generator=None, history=None,
                       limit: int | None = None) -> tuple[list[int], list[int]]:
        """Exact sampled verification of the tree as deterministic guesses.

        Args:
            logits: ``[>= len, V]`` the target's logits after each node.
            history: token ids before the root's successor (read only with a repetition penalty).
            limit: most tokens emitted.
        Returns:
            (accepted nodes below the root, emitted tokens = their tokens + one drawn token).
        """
        path, out, node = [], [], 0
        limit = limit or len(self) + 1
        while len(out) < limit:
            hist = list(history) + out if sampling.uses_history and history is not None else None
            p = sampling.probs(logits[node].float(), hist)
            kids = self.children(node)
            t, ok = sampling.accept_deterministic(p, [self.tokens[c] for c in kids], generator)
            out.append(t)
            if not ok:
                break
            node = self._children[(node, t)]
            path.append(node)
        return path, out


def tree_inputs(tree: DraftTree, N: int, size: int | None = None) -> StepInputs:
    """The target's forward over the tree (root at position/slot ``N``), as host values: node i's KV is written to
    slot ``N + i``. ``size``: the largest tree the method drafts; under static shapes the engine pads the step to
    it (the caller's cache must have ``N + size`` slots)."""
    tokens, positions, mask = tree.inputs(N)  # host values: the engine uploads them in one copy
    plan = AttentionPlan(prefix=N, step_mask=mask.numpy())  # a host array: gathered on the host (Engine.forward)
    return StepInputs(tokens, positions, list(range(N, N + len(tree))), plan, "all", size)


def drafter_inputs(tree: DraftTree, N: int, size: int | None = None) -> StepInputs:
    """:func:`tree_inputs`; for a tree of its root alone (nothing drafted this step), decoded alone, vanilla's step
    instead (``alone``), as in the official code of the draftless methods, where an empty draft is an ordinary
    decoding step: one token, no mask, not padded, so it takes the engine's 1-token path and vanilla's compiled
    graph rather than a tree step of ``size`` rows. In a batch it stays a padded tree row like the others."""
    step = tree_inputs(tree, N, size)
    if len(tree) > 1:
        return step
    return replace(step, alone=StepInputs(tree.tokens, [N], [N], causal_plan(N), "last"))


def warm_tree_steps(engine: Engine, sizes, alone: bool = False) -> None:
    """Under ``engine.static_shapes``, one forward of each step shape a tree method padded to ``size`` rows can take,
    for each of ``sizes``: a shallow tree and a full-depth chain (the two widths of a compiled step's key lists,
    :func:`fafo.engine.kernels.gather_width`) and, with ``alone``, vanilla's 1-token step (:func:`drafter_inputs`).
    A warm-up generation may take only some; run after it, every graph compiles before a timed sample. They run
    after 8 slots of the shared cache (the next prefill overwrites them; a compiled sdpa step reads a prefix of 2
    slots or more as a live length, as real steps do)."""
    cache, N = engine.static_cache, 8
    if not engine.static_shapes or cache is None:
        return
    shallow = ([DraftTree.root(0)] if alone else []) + [DraftTree([0, 0], [-1, 0])]
    for n in sorted(set(sizes)):
        if cache.max_len < N + n + 2:  # the next, larger sizes do not fit either
            return
        chain = DraftTree([0] * n, list(range(-1, n - 1)))  # every node on one path: the deepest mask
        for tree in shallow + [chain]:
            forward_one(engine, cache, [drafter_inputs(tree, N, n)])


def verify_tree(engine: Engine, cache, tree: DraftTree, N: int, size: int | None = None) -> torch.Tensor:
    """One target forward over the tree (:func:`tree_inputs`); returns ``[len(tree), V]`` logits."""
    step = tree_inputs(tree, N, size)
    return engine.forward(cache, step.tokens, step.positions, step.slots, step.plan, logits="all", pad_to=size)[0]


def commit_path(cache, N: int, path: list[int], carry=None, engine: Engine | None = None):
    """Move the accepted nodes' KV from slots ``N + node`` to ``N + 1, N + 2, ...`` (no-op when in place).

    ``carry``: host values to upload in the same copy (e.g. the tokens a draft reads next), returned on the device
    (counted in ``engine``'s ledger when given); None when there are none."""
    moves = bool(path) and path != list(range(1, len(path) + 1))
    if not moves and carry is None:
        return None
    if cache.pending is not None and carry is None:  # a request's row in a batch: moved with every row's at once
        cache.pending.append(([N + i for i in path], list(range(N + 1, N + 1 + len(path)))))
        return None
    values = ([[N + i for i in path], list(range(N + 1, N + 1 + len(path)))] if moves else []) + \
        ([carry] if carry is not None else [])
    out = engine.upload(*values) if engine is not None else upload(values, cache.keys[0].device)
    if moves:
        cache.move(out[0], out[1])
    return out[-1] if carry is not None else None


def greedy_tree_step(engine: Engine, cache, tree: DraftTree, N: int, size: int | None = None
                     ) -> tuple[list[int], list[int]]:
    """Verify ``tree`` greedily and compact its accepted KV; returns (accepted nodes, new tokens incl. bonus).

    After it, the committed KV holds ``N + len(new)`` entries and ``new[-1]`` is the next root."""
    preds = argmax_rows(verify_tree(engine, cache, tree, N, size))  # the step's one host sync
    path = tree.accept_greedy(preds)
    commit_path(cache, N, path)
    return path, [tree.tokens[i] for i in path] + [preds[path[-1] if path else 0]]


def sampled_tree_step(engine: Engine, cache, tree: DraftTree, N: int, sampling: Sampling, generator=None,
                      history=None, size: int | None = None) -> tuple[list[int], list[int]]:
    """:func:`greedy_tree_step` under sampling (exact, see :meth:`DraftTree.accept_sampled`)."""
    logits = verify_tree(engine, cache, tree, N, size)
    path, new = tree.accept_sampled(logits, sampling, generator, history)
    commit_path(cache, N, path)
    return path, new
