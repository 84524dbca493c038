"""A depth-bounded suffix tree with occurrence counts and frequency-ordered speculation, the data structure of
SuffixDecoding (ArcticInference ``csrc/suffix_decoding/suffix_tree.cc``), as an uncompressed trie.

The tree of a set of sequences holds every substring of length <= ``max_depth``; a node's ``count`` is the number
of its occurrences (start positions; ArcticInference counts the suffixes passing through a node, the same number).
Appending a token to a sequence extends each of the sequence's last ``max_depth - 1`` suffixes (and starts a new
one); removing a sequence walks the same suffixes back, decrementing counts and pruning empty nodes.

:meth:`SuffixTree.speculate` is ArcticInference's ``SuffixTree::speculate``: for every match length
``m = 1, 2, ...`` (while ``context[-m:]`` occurs; never the whole context) a draft is grown from the matched node
with at most ``min(max_spec_tokens, int(m * max_spec_factor + max_spec_offset))`` tokens, either as a tree
(``_speculate_tree``: best-first by estimated probability, a child's probability being its parent's times
``count(child) / count(parent)``, children below ``min_token_prob`` pruned) or as a path (``_speculate_path``:
the most frequent child each time, stopping once the probability falls below ``min_token_prob``); the draft
with the highest score (sum of its tokens' probabilities) wins, a later (longer) match winning ties.
Equal probabilities in the tree's priority queue are taken in insertion order (C++'s heap order is unspecified).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


class Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count = 0
        self.children: dict[int, Node] = {}


@dataclass
class Draft:
    """A speculation: tokens with their parent index in the draft (-1 = below the matched node), probabilities
    and score (sum of probabilities)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0

    def paths(self) -> list[list[int]]:
        """Root-to-leaf token paths (for :meth:`fafo.tree.DraftTree.from_paths`)."""
        has_child = {p for p in self.parents if p >= 0}
        out = []
        for i in range(len(self.tokens)):
            if i in has_child:
                continue
            path, j = [], i
            while j >= 0:
                path.append(self.tokens[j])
                j = self.parents[j]
            out.append(path[::-1])
        return out


class SuffixTree:
    """Counts of every substring of length <= ``max_depth`` of the sequences added (see the module docstring)."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = Node()
        self.seqs: dict[object, list[int]] = {}
        self._active: dict[object, list[Node]] = {}  # per sequence: nodes of its last suffixes (depth < max)
        self.n_nodes = 1

    def extend(self, seq_id, tokens) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (created if new)."""
        seq = self.seqs.setdefault(seq_id, [])
        active = self._active.setdefault(seq_id, [])
        for t in tokens:
            t = int(t)
            seq.append(t)
            nxt = []
            for node in [self.root, *active]:  # the new suffix starts at the root
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = Node()
                    self.n_nodes += 1
                child.count += 1
                nxt.append(child)
            # nxt[i] sits at depth i + 1 (suffix started i tokens ago); keep those that can still grow
            self._active[seq_id] = active = nxt[: self.max_depth - 1]

    def remove(self, seq_id) -> None:
        """Forget sequence ``seq_id`` (its counts are subtracted, empty nodes pruned)."""
        seq = self.seqs.pop(seq_id, None)
        self._active.pop(seq_id, None)
        if seq is None:
            return
        for start in range(len(seq)):
            node = self.root
            for t in seq[start: start + self.max_depth]:
                child = node.children[t]
                child.count -= 1
                if child.count == 0:
                    del node.children[t]
                    self.n_nodes -= self._size(child)
                    break
                node = child

    @staticmethod
    def _size(node: Node) -> int:
        return 1 + sum(SuffixTree._size(c) for c in node.children.values())

    def match(self, context) -> Node | None:
        node = self.root
        for t in context:
            node = node.children.get(int(t))
            if node is None:
                return None
        return node

    def speculate(self, context: list[int], max_spec_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1, tree: bool = True) -> Draft:
        context = context[-self.max_depth:]
        best = Draft()
        for m in range(1, len(context)):
            node = self.match(context[len(context) - m:])
            if node is None:
                break
            budget = max(min(max_spec_tokens, int(m * max_spec_factor + max_spec_offset + 1e-6)), 0)
            draft = (self._tree if tree else self._path)(node, budget, min_token_prob)
            if draft.score >= best.score:
                draft.match_len = m
                best = draft
        return best

    @staticmethod
    def _ranked(node: Node) -> list[tuple[int, Node]]:
        # children by decreasing count (ArcticInference keeps them sorted); equal counts by token id
        return sorted(node.children.items(), key=lambda kv: (-kv[1].count, kv[0]))

    def _path(self, node: Node, budget: int, min_prob: float) -> Draft:
        out, prob = Draft(), 1.0
        while len(out.tokens) < budget:
            if not node.children:
                break
            token, child = self._ranked(node)[0]
            prob *= child.count / node.count
            if prob < min_prob:
                break
            out.parents.append(len(out.tokens) - 1)
            out.tokens.append(token)
            out.probs.append(prob)
            out.score += prob
            node = child
        return out

    def _tree(self, node: Node, budget: int, min_prob: float) -> Draft:
        out, order = Draft(), 0
        heap: list = []

        def push_children(parent_node: Node, prob: float, parent: int) -> None:
            nonlocal order
            for token, child in self._ranked(parent_node):
                p = prob * child.count / parent_node.count
                if p < min_prob:
                    break  # children are sorted: the rest are smaller
                heapq.heappush(heap, (-p, order, token, child, parent))
                order += 1

        push_children(node, 1.0, -1)
        while len(out.tokens) < budget and heap:
            neg, _, token, child, parent = heapq.heappop(heap)
            out.parents.append(parent)
            out.tokens.append(token)
            out.probs.append(-neg)
            out.score += -neg
            push_children(child, -neg, len(out.tokens) - 1)
        return out
