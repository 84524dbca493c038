"""Suffix automata over token ids with SAM-Decoding's retrieval, as the official automaton-only evaluation runs it:
hyx1999/SAM-Decoding at commit 18c41f055b424fa3fa0bac41a8953d34cea1ed77, ``samd_sam_only/sam/dyn_sam.py``
(:class:`DynamicAutomaton`) and ``samd_sam_only/sam/static_sam.py`` (:class:`CorpusAutomaton`); which official
rule, and the superseded one we do not implement: docs/methods/sam_decoding.md.

The automaton of a text accepts exactly its substrings; each state is a class of substrings with the same end
positions, ``length`` its longest, ``link`` the state of the longest suffix in another class, ``first_end`` the first
end position (1-based; a clone inherits its source's, official ``min_endpos``). It is built online
(:meth:`SuffixAutomaton.add`, amortised O(1) per token). A cursor ``(state, length)`` names the longest suffix of the
decoded text that occurs in the automaton's text; :meth:`SuffixAutomaton.step` follows one token, falling back
along suffix links (official ``transfer_state``). The dynamic rule: each committed token first moves the cursor and
is then added, so the cursor is the longest suffix of the text with an EARLIER occurrence.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from baselines.tree_drafting import cut_tree
from fafo.tree import DraftTree


class SuffixAutomaton:
    """Online suffix automaton of a token list (see the module docstring)."""

    def __init__(self):
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [0]
        self.last = 0
        self.n = 0  # tokens added

    def __len__(self) -> int:
        return self.n

    def _new(self, nxt: dict, link: int, length: int, first_end: int) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.next) - 1

    def add(self, token: int) -> None:
        """Append ``token`` to the automaton's text (official ``add_state``; transition dicts keep the official
        insertion order, which decides ties among a corpus state's children)."""
        self.n += 1
        cur = self._new({}, -1, self.n, self.n)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._new(dict(self.next[q]), self.link[q], self.length[p] + 1, self.first_end[q])
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """The cursor after ``token``: the longest suffix of the cursor's string + ``token`` in the automaton."""
        while state != 0 and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        if token in self.next[state]:
            return self.next[state][token], length + 1
        return 0, 0

    def follow(self, cursor: tuple[int, int], tokens) -> tuple[int, int]:
        """The cursor after ``tokens``, without adding them (official ``transfer_tokens``)."""
        for t in tokens:
            cursor = self.step(*cursor, int(t))
        return cursor


class DynamicAutomaton(SuffixAutomaton):
    """The automaton of one generation's prompt + committed output (official ``DynSAM``), with its cursor."""

    def __init__(self):
        super().__init__()
        self.tokens: list[int] = [-1]  # official input_ids: a sentinel, so end position p is tokens[p]
        self.cursor = (0, 0)

    def extend(self, tokens) -> None:
        """Commit ``tokens``: for each, move the cursor, then add it (official ``add_tokens``)."""
        for t in tokens:
            t = int(t)
            self.cursor = self.step(*self.cursor, t)
            self.add(t)
            self.tokens.append(t)

    def lookup(self, token: int) -> tuple[int, int]:
        """(state, match length) of the longest suffix of ``text + [token]`` occurring in the text."""
        return self.step(*self.cursor, int(token))

    def continuation(self, state: int, n: int) -> list[int]:
        """The (at most) ``n`` tokens after the first occurrence of ``state``'s strings (official ``gen_draft``)."""
        end = self.first_end[state]
        return self.tokens[end + 1: end + 1 + max(n, 0)] if state else []


@dataclass(order=True)
class _Candidate:
    """A node waiting in the best-first search; ordered by ``score`` only (negated path probability), so equal
    scores leave the heap in the order ``heapq`` gives them, as the official ``SearchItem``."""

    score: float
    token: int = field(compare=False)
    state: int = field(compare=False)
    parent: int = field(compare=False)
    depth: int = field(compare=False)


class CorpusAutomaton(SuffixAutomaton):
    """The automaton of a fixed corpus (official ``StaticSAM``): shared by all generations, read only once built.

    ``count[s]`` is the number of end positions of state ``s`` (official ``cnt_endpos``, which the official keeps
    up to date on each add; here summed over the suffix-link tree once, :meth:`finish`: the same numbers).
    """

    def __init__(self):
        super().__init__()
        self.count: list[int] = []
        self._top: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (state, k) -> children

    @classmethod
    def build(cls, documents, eos: int | None) -> "CorpusAutomaton":
        """One text of all documents in order, each followed by ``eos`` unless it ends with it (official
        ``StaticSAM.build`` / ``add_batch_tokens``)."""
        sam = cls()
        for doc in documents:
            for t in doc:
                sam.add(int(t))
            if eos is not None and (not doc or int(doc[-1]) != eos):
                sam.add(eos)
        sam.finish()
        return sam

    def finish(self) -> None:
        """Count end positions: 1 per state created for a position, summed bottom-up. Clones (and the root) start
        at 0: a clone is shorter than its first end position, a state created for position p has length p."""
        count = [int(length == end) for length, end in zip(self.length, self.first_end)]
        count[0] = 0
        for s in sorted(range(1, len(self.next)), key=self.length.__getitem__, reverse=True):  # longest first
            if self.link[s] > 0:
                count[self.link[s]] += count[s]
        self.count, self._top = count, {}

    def children(self, state: int, k: int) -> list[tuple[int, int]]:
        """The ``k`` most frequent (token, state) transitions, most frequent first, ties in insertion order
        (official ``init_topk_next``, computed lazily)."""
        top = self._top.get((state, k))
        if top is None:
            top = sorted(self.next[state].items(), key=lambda kv: self.count[kv[1]], reverse=True)[:k]
            self._top[state, k] = top
        return top

    def tree(self, root: int, state: int, n: int, k: int, max_depth: int) -> DraftTree:
        """At most ``n`` nodes (root included) below ``root``, chosen best-first by the corpus probability of their
        path, at most ``k`` children per node and ``k`` nodes per depth (official ``StaticSAM.gen_draft``); nodes
        deeper than ``max_depth`` are dropped afterwards (they could not be committed)."""
        heap = [_Candidate(-1.0, int(root), state, -1, 0)]
        tokens: list[int] = []  # the chosen nodes, root first; parents index into it
        parents: list[int] = []
        per_depth: dict[int, int] = {}
        while len(tokens) != n and heap:
            item = heapq.heappop(heap)
            if per_depth.get(item.depth, 0) + 1 > k:
                continue
            per_depth[item.depth] = per_depth.get(item.depth, 0) + 1
            index = len(tokens)
            tokens.append(item.token)
            parents.append(item.parent)
            total = self.count[item.state]
            for token, child in self.children(item.state, k):
                heapq.heappush(heap, _Candidate(item.score * (self.count[child] / total), token, child, index,
                                                item.depth + 1))
        return cut_tree(tokens[0], tokens[1:], [p - 1 for p in parents[1:]], max_depth)
