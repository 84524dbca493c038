"""The depth-bounded suffix tree of SuffixDecoding and its speculation, re-implemented from snowflakedb/ArcticInference
``csrc/suffix_decoding/suffix_tree.{h,cc}`` (commit 9d4643881608178f0f58a33d1b61919ca246997f; unchanged since
8d5d124, Oct 2025) over the storage of ``baselines/suffix_index.py``: a node of the official path-compressed tree is
the set of end positions of its string, never built. Since sequences are only appended, the official sibling order
follows from the positions: by count, then a child seen more than once by its latest occurrence (newest first), a
child seen once by its occurrence (oldest first). :meth:`SuffixTree.speculate` is ``SuffixTree::speculate`` with
float32 probabilities and libstdc++'s priority queue, so drafts are identical, ties included. The tree, the rule and
the known differences: docs/methods/suffix_decoding.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from baselines import suffix_index
from baselines.suffix_index import SuffixIndex

_NEW = float(1 << 40)  # order key offset of a child seen once: behind those whose count changed


def f32(x: float) -> float:
    """``x`` rounded to float32 (C++ ``float``)."""
    return float(np.float32(x))


@dataclass
class Draft:
    """A speculation (``Draft`` in suffix_tree.h): tokens, parent index in the draft (-1 = below the matched
    node), float32 probabilities, score (their float32 sum) and the match length it came from."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0

    def add(self, token: int, parent: int, prob: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.probs.append(prob)
        self.score = f32(self.score + prob)
        return len(self.tokens) - 1


def _order_key(count: int, first: float, last: float) -> float:
    """A child's rank among equal counts, from its first and last end positions (module docstring)."""
    return _NEW + first if count == 1 else -last


def _official_order(kids: list, min_count: float) -> list:
    """``(count, token, end positions, order key)`` children sorted: the first one and those with ``min_count``."""
    kids.sort(key=lambda k: (-k[0], k[3]))
    return [kids[0][:3]] + [k[:3] for k in kids[1:] if k[0] >= min_count]


def _heap_push(heap: list, item: tuple) -> None:
    """libstdc++ ``push_heap`` on a max-heap keyed by ``item[0]``."""
    heap.append(item)
    hole = len(heap) - 1
    while hole > 0 and heap[(hole - 1) // 2][0] < item[0]:
        heap[hole] = heap[(hole - 1) // 2]
        hole = (hole - 1) // 2
    heap[hole] = item


def _heap_pop(heap: list) -> tuple:
    """libstdc++ ``pop_heap`` + ``pop_back`` (``__adjust_heap``: the hole sinks to a leaf, the last item rises)."""
    top, n = heap[0], len(heap) - 1
    if n:
        value, hole, child = heap[n], 0, 0
        while child < (n - 1) // 2:
            child = 2 * (child + 1)
            if heap[child][0] < heap[child - 1][0]:
                child -= 1
            heap[hole], hole = heap[child], child
        if n % 2 == 0 and child == (n - 2) // 2:
            child = 2 * (child + 1)
            heap[hole], hole = heap[child - 1], child - 1
        while hole > 0 and heap[(hole - 1) // 2][0] < value[0]:
            heap[hole] = heap[(hole - 1) // 2]
            hole = (hole - 1) // 2
        heap[hole] = value
    heap.pop()
    return top


class SuffixTree(SuffixIndex):
    """The official depth-bounded suffix tree of a set of sequences (see the module docstring)."""

    def __init__(self, max_depth: int):
        super().__init__(max_depth)
        self._budgets: dict = {}  # (max_spec_tokens, factor, offset) -> {match length: draft size}

    # ---------------------------------------------------------------- the tree below a node
    def _children(self, occ, depth: int, min_count: float) -> tuple[list, int]:
        """``(count, token, end positions)`` children of the node ending at ``occ`` (array, list, or 1-3 tokens) at
        ``depth`` in official order: the first child and those seen >= ``min_count`` times; and the child count."""
        if depth >= self.max_depth:
            return [], 0
        if isinstance(occ, tuple):  # a node named by its 1-3 tokens (below a short match)
            if len(occ) <= 2:
                return self._indexed_children(occ, min_count)
            occ = self._range(list(occ))
        if isinstance(occ, list) or len(occ) <= 16:
            groups: dict[int, list] = {}
            tokens = self.tokens
            for p in (occ if isinstance(occ, list) else occ.tolist()):
                t = int(tokens[p + 1])
                if t >= 0:
                    groups.setdefault(t, []).append(p + 1)
            if not groups:
                return [], 0
            kids = [(len(ps), t, ps, _order_key(len(ps), ps[0], max(ps))) for t, ps in groups.items()]
            n_kids = len(groups)
        else:
            nxt = occ + 1
            toks = self.tokens[nxt]
            keep = toks >= 0
            toks, nxt = toks[keep], nxt[keep]
            if not len(toks):
                return [], 0
            if (toks == toks[0]).all():  # one child (inside a compressed node of the official tree): no grouping
                return [(len(nxt), int(toks[0]), nxt if len(nxt) > 16 else nxt.tolist())], 1
            if len(toks) >= 2048 and int(toks.max()) < 1 << 22:
                per_token = np.bincount(toks)
                uniq = np.flatnonzero(per_token)
                counts, per_entry = per_token[uniq], per_token[toks]
            else:
                uniq, inverse, counts = np.unique(toks, return_inverse=True, return_counts=True)
                per_entry = counts[inverse]
            n_kids, top = len(uniq), int(counts.max())
            # the first child: of the highest count, the oldest if seen once, else the latest seen
            at = np.flatnonzero(per_entry == top)
            first = at[nxt[at].argmin()] if top == 1 else at[nxt[at].argmax()]
            wanted = set(uniq[counts >= min_count].tolist()) | {int(toks[first])}
            kids = []
            for t in wanted:
                ps = nxt[toks == t]
                c = len(ps)
                kids.append((c, t, ps if c > 16 else ps.tolist(), _order_key(c, float(ps.min()), float(ps.max()))))
        return _official_order(kids, min_count), n_kids

    def _indexed_children(self, pattern: tuple, min_count: float) -> tuple[list, int]:
        """``_children`` of a 1-2 token node: its older occurrences grouped once (cached; the newer ones folded in
        now and then), its newest ones scanned. Children are named by their tokens (resolved when expanded)."""
        entry = self._groups.get(pattern)
        if entry is None:
            if len(self._groups) >= 4096:
                self._groups.clear()
            lo, hi = self._index_span(list(pattern))
            nxt = self._pos[lo:hi].astype(np.int64) + 1
            toks = self.tokens[nxt]
            if self._dead:
                alive = self.tokens[nxt - 1] == pattern[-1]
                nxt, toks = nxt[alive], toks[alive]
            keep = (toks >= 0) & (nxt < self._merged)  # a next token not merged yet may still be written
            nxt, toks = nxt[keep], toks[keep].astype(np.int64)
            size = int(toks.max()) + 1 if len(toks) else 1
            counts, first, last = np.bincount(toks, minlength=size), np.full(size, 1 << 62), np.full(size, -1)
            np.minimum.at(first, toks, nxt)
            np.maximum.at(last, toks, nxt)
            uniq = np.flatnonzero(counts)
            entry = self._groups[pattern] = (self._merged, uniq, counts[uniq], first[uniq], last[uniq])
        upto, uniq, counts, first, last = entry  # grouped: the occurrences followed by a token before ``upto``
        recent = self._scan(list(pattern), upto - 1) + 1
        if len(recent):  # newer than all grouped ones
            rt = self.tokens[recent]
            recent, rt = recent[rt >= 0], rt[rt >= 0]
            extra = {}
            for t, p in zip(rt.tolist(), recent.tolist()):
                c, f, _ = extra.get(t, (0, p, p))
                extra[t] = (c + 1, f, p)
            counts, last, new = counts.copy(), last.copy(), []
            for i, (t, (c, f, p)) in zip(np.searchsorted(uniq, list(extra)).tolist(), extra.items()):
                if i < len(uniq) and uniq[i] == t:  # grouped already: add the recent occurrences
                    counts[i] += c
                    last[i] = p
                else:
                    new.append((t, c, f, p))
            if new:  # tokens not grouped yet: appended (sorted when folded in)
                cols = zip(*new)
                uniq, counts, first, last = (np.concatenate([a, x]) for a, x in zip((uniq, counts, first, last), cols))
        if self.n - upto > 2 * suffix_index.RECENT:  # fold the scanned ones in (each next token is written: < n)
            order = np.argsort(uniq)
            self._groups[pattern] = (self.n, uniq[order], counts[order], first[order], last[order])
        if not len(uniq):
            return [], 0
        top = int(counts.max())
        tied = np.flatnonzero(counts == top)
        head = tied[first[tied].argmin()] if top == 1 else tied[last[tied].argmax()]
        wanted = set(np.flatnonzero(counts >= min_count).tolist()) | {int(head)}
        kids = [(int(counts[i]), int(uniq[i]), pattern + (int(uniq[i]),),
                 _order_key(int(counts[i]), float(first[i]), float(last[i]))) for i in wanted]
        return _official_order(kids, min_count), len(uniq)

    @staticmethod
    def _node_end(count: int, kids: list, n_kids: int) -> bool:
        """Whether a compressed node of the official tree ends here (branching, or an occurrence stops)."""
        return n_kids != 1 or kids[0][0] < count

    # ---------------------------------------------------------------- speculation
    def speculate(self, context, max_spec_tokens: int, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                  min_token_prob: float = 0.1, tree: bool = True, beat: float | None = None) -> Draft | None:
        """``SuffixTree::speculate`` over the last ``max_depth`` tokens of ``context``. With ``beat``, only a draft
        scoring strictly more than it is returned (else None): the global tree against the prompt's."""
        ctx = [int(t) for t in context[-self.max_depth:]]
        matches = self._matches(ctx)
        factor, offset, min_prob = f32(max_spec_factor), f32(max_spec_offset), f32(min_token_prob)
        key = (max_spec_tokens, factor, offset)
        if key not in self._budgets:  # official: min(max_spec_tokens, int(m * factor + offset + 1e-6)) in float
            self._budgets[key] = {m: max(min(max_spec_tokens, int(f32(f32(m * factor) + offset) + 1e-6)), 0)
                                  for m in range(1, self.max_depth)}
        budget = {m: self._budgets[key][m] for m in range(1, len(matches) + 1)}
        # a draft's score is at most its size, and at most 1 per level below the match (+ float32 rounding); a
        # node's probability is count(node) / count(match), so level k sums to the share of the match's
        # occurrences followed by k more tokens
        bound = {}
        for m, b in budget.items():
            levels = min(b, self.max_depth - m)
            bound[m] = min(b, levels + 1e-3)
            after = matches[m - 1][1]
            if after is not None:
                mass = float(np.minimum(after, levels).sum()) / len(after)
                bound[m] = min(bound[m], mass * (1 + 1e-4) + 1e-4) if mass else 0.0  # 0: nothing to draft
        # the highest score wins, the longer match on ties; ``beat`` is a floor only a higher score passes
        best = floor = None if beat is None else Draft(score=beat, match_len=self.max_depth + 1)
        for m in sorted(bound, key=lambda m: (-bound[m], -m)):  # the most promising first
            if best is not None and (bound[m], m) < (best.score, best.match_len):
                continue  # cannot win
            occ = matches[m - 1][0]
            if occ is None:  # a short match with many occurrences: named by its tokens
                occ, count = tuple(ctx[-m:]), self._count(ctx[-m:])
            else:
                count = len(occ)
            draft = (self._tree if tree else self._path)(occ, count, m, budget[m], min_prob) if bound[m] else Draft()
            draft.match_len = m
            if best is None or (draft.score, m) > (best.score, best.match_len):
                best = draft
        if best is floor:
            return Draft() if beat is None else None
        return best

    def _path(self, occ, count: int, depth: int, budget: int, min_prob: float) -> Draft:
        out, prob = Draft(), 1.0
        while len(out.tokens) < budget and prob >= min_prob:
            kids, n_kids = self._children(occ, depth, float("inf"))  # the first child only
            if not kids:
                break
            child_count, token, occ = kids[0]
            if self._node_end(count, kids, n_kids):
                prob = f32(prob * f32(child_count / count))
                if prob < min_prob:
                    break
            out.add(token, len(out.tokens) - 1, prob)
            count, depth = child_count, depth + 1
        return out

    def _tree(self, occ, count: int, depth: int, budget: int, min_prob: float) -> Draft:
        # queue items: (prob, 0, count, token, occ, depth, parent) emits a token;
        #              (prob, 1, count, kids, depth, parent) pushes the children of a node end
        out = Draft()
        heap = [self._after(1.0, count, occ, depth, -1, min_prob)]
        while len(out.tokens) < budget and heap:
            item = _heap_pop(heap)
            prob, kind, count = item[:3]
            if kind == 0:
                _, _, _, token, occ, depth, parent = item
                index = out.add(token, parent, prob)
                _heap_push(heap, self._after(prob, count, occ, depth, index, min_prob))
            else:
                for child_count, token, child_occ in item[3]:
                    p = f32(f32(prob * child_count) / count)
                    if p < min_prob:
                        break
                    _heap_push(heap, (p, 0, child_count, token, child_occ, item[4] + 1, item[5]))
        return out

    def _after(self, prob: float, count: int, occ: np.ndarray, depth: int, parent: int, min_prob: float) -> tuple:
        """The queue item after a node: its only continuation inside a compressed node, else its children."""
        kids, n_kids = self._children(occ, depth, min_prob * count * (1 - 1e-5))
        if self._node_end(count, kids, n_kids):
            return (prob, 1, count, kids, depth, parent)
        child_count, token, child_occ = kids[0]
        return (prob, 0, child_count, token, child_occ, depth + 1, parent)
