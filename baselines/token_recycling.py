"""Token Recycling (Luo et al., ACL 2025, "Turning Trash into Treasure: Accelerating Inference of Large Language
Models with Token Recycling", https://arxiv.org/abs/2408.08696), re-implemented from Luowaterbi/TokenRecycling
(``evaluation/inference_recycling.py`` ``recycling_forward``, ``model/recycling/tree_template_.py``).

An adjacency matrix ``M`` ``[V, topk]`` holds, for every token, the target's top-``topk`` next tokens the last time
it was a verification input (overwritten from EVERY tree node's logits after each verification: the "recycled"
tokens); the official static 80-node template fills the draft tree from it breadth-first. The algorithm and where
we differ from the official code: docs/methods/token_recycling.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from baselines.tree_drafting import DraftState, TreeDrafter
from fafo.bounds import at_least, check_bounds, one_of
from fafo.errors import ConfigError
from fafo.tree import DraftTree

# official tree_template_.py, version "2.2.2": each node is its path of ranks below the root
TEMPLATES = {
    "2.2.2": [
        [0], [1], [2], [3], [4], [5], [6], [7],
        [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [1, 0], [1, 1], [1, 2], [1, 3], [2, 0],
        [2, 1], [2, 2], [3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0],
        [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 0, 6], [0, 0, 7], [0, 1, 0],
        [0, 1, 1], [0, 1, 2], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0],
        [1, 0, 0], [1, 0, 1], [1, 1, 0], [2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0],
        [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 1, 1],
        [0, 0, 2, 0], [0, 0, 3, 0], [0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0],
        [3, 0, 0, 0],
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0],
        [0, 1, 0, 0, 0], [1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0],
    ],
}


class Template:
    """A tree template as arrays, built once: node ``i + 1`` is template path ``i`` (node 0 the root), with its
    parent node, its rank and its depth; ``levels`` the nodes of each depth (the template is in BFS order)."""

    def __init__(self, paths: list[list[int]]):
        index = {(): 0} | {tuple(path): i + 1 for i, path in enumerate(paths)}
        self.parent = np.array([-1] + [index[tuple(path[:-1])] for path in paths])
        self.rank = np.array([0] + [path[-1] for path in paths])
        self.depth = np.array([0] + [len(path) for path in paths])
        self.levels = [np.flatnonzero(self.depth == d) for d in range(1, int(self.depth.max()) + 1)]


def template_tree(template: Template, root: int, adjacency: np.ndarray, max_depth: int) -> DraftTree:
    """The draft tree: template node ``path`` carries ``adjacency[token of path[:-1], path[-1]]``, filled a depth
    at a time on arrays (BFS order; identical siblings merged); nodes deeper than ``max_depth`` are dropped."""
    tokens = np.empty(len(template.parent), dtype=np.int64)
    tokens[0] = root
    for nodes in template.levels[:max_depth]:
        tokens[nodes] = adjacency[tokens[template.parent[nodes]], template.rank[nodes]]
    tree, node_of = DraftTree.root(root), [0] * len(tokens)
    parent = template.parent.tolist()
    for i, (t, d) in enumerate(zip(tokens.tolist(), template.depth.tolist())):
        if 0 < d <= max_depth:
            node_of[i] = tree.add(node_of[parent[i]], t)
    return tree


class _TRState(DraftState):
    def __init__(self, cfg: TokenRecyclingDecoder):
        self.cfg = cfg
        self.template = _template(cfg.tree)

    def draft(self, context: list[int], max_depth: int) -> DraftTree:
        return template_tree(self.template, context[-1], self.cfg.adjacency, max_depth)

    def observe(self, tree: DraftTree, logits, new: list[int]) -> None:
        last = {t: i for i, t in enumerate(tree.tokens)}  # a token at several nodes: the last row wins
        self.cfg.adjacency[list(last)] = logits.topk(self.cfg.topk, list(last.values()))  # on the host


@functools.cache
def _template(version: str) -> Template:
    return Template(TEMPLATES[version])


@dataclass
class TokenRecyclingDecoder(TreeDrafter):
    """Token Recycling (see the module docstring). Official defaults: ``--output-id-topk 8``, ``--tree_version
    2.2.2``.

    Attributes:
        topk: candidates kept per token in the adjacency matrix (the template uses ranks 0..7, so >= 8).
        tree: the static tree template's version.
        reset_per_sample: start every generation from a zero matrix (official: one matrix per run).
    """

    topk: int = at_least(1, 8)  # and at least the template's largest rank + 1 (__post_init__)
    tree: str = one_of(tuple(TEMPLATES), "2.2.2", why="the official tree_template_.py versions")
    reset_per_sample: bool = False
    cross_request_state: ClassVar[tuple[str, ...]] = ("adjacency",)  # official: learnt across requests

    def __post_init__(self):
        check_bounds(self, "method")
        need = 1 + max(r for path in TEMPLATES[self.tree] for r in path)
        if self.topk < need:
            raise ConfigError(f"method.topk={self.topk!r} must be an integer >= {need} (template {self.tree} "
                              f"uses ranks up to {need - 1})")
        self.adjacency: np.ndarray | None = None

    def setup(self, engine) -> None:
        self.adjacency = None

    def start(self, engine, prompt_ids, eos_ids) -> DraftState:
        vocab = engine.model.args.vocab_size
        if self.adjacency is None or self.reset_per_sample or self.adjacency.shape[0] != vocab:
            self.adjacency = np.zeros((vocab, self.topk), dtype=np.int64)  # on the host: read per node
        return _TRState(self)

    def max_tree(self) -> int:
        return 1 + len(TEMPLATES[self.tree])

    def buffer_bytes(self) -> int:
        return 0 if self.adjacency is None else self.adjacency.nbytes
