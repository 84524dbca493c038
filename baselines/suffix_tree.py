"""The depth-bounded suffix tree of SuffixDecoding and its speculation, re-implemented from snowflakedb/ArcticInference
``csrc/suffix_decoding/suffix_tree.{h,cc}`` (commit 9d4643881608178f0f58a33d1b61919ca246997f; these files last
changed in 8d5d124, Oct 2025), stored compactly: the official tree is never built node by node.

**What the official tree holds.** For each sequence added, every substring of length <= ``max_depth`` is a path
from the root; a node's ``count`` is its number of occurrences. Nodes are path-compressed (a node ends where paths
branch or an occurrence ends), children are kept in a list ordered by decreasing count in which a child whose count
changes moves to the front of its new count group and a new child (count 1) joins the back.

**How it is stored here.** All tokens sit in one int32 array (sequences separated by -1) with a sorted index of
(token, previous token) -> end positions (int64 key + int32 position, merged from the newest tokens every
:data:`RECENT` appends). A node of the official tree is the set of end positions of its string: its count is the
set's size, its children are the tokens after those positions, and its node ends (path compression) are where the
set stops continuing as one. The sibling order follows from the positions when sequences are only appended (a
position is a time): among equal counts, a child seen more than once ranks by its latest occurrence (newest
first), a child seen once by its occurrence (oldest first). About 16 bytes per token, against ~64 trie nodes per
token before. Removing a sequence overwrites it with -1 (compacted when half the array is dead); the official
reorders siblings on removal too, which this index does not replay (it matters only for ties after evictions).

:meth:`SuffixTree.speculate` is ``SuffixTree::speculate``: for each match length ``m`` (``context[-m:]``
occurs, ``m < len(context)``) a draft of at most ``min(max_spec_tokens, int(m * max_spec_factor +
max_spec_offset + 1e-6))`` tokens is grown from the matched node, as a tree (``_speculate_tree``: a priority queue
by estimated probability, a child's being its parent's times ``count(child) / count(node)``, children below
``min_token_prob`` dropped) or a path (``_speculate_path``: the first child each time, stopping below
``min_token_prob``). The highest score (sum of probabilities) wins, the longer match on ties. Probabilities and
scores are float32 as in C++, and the queue reproduces libstdc++'s ``std::priority_queue`` (``push_heap`` /
``pop_heap``), so equal probabilities come out in the official order. Matches are tried longest first and a
shorter one skipped when its budget cannot beat the best score, which gives the same draft.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

RECENT = 8192  # tokens kept outside the sorted index (scanned) before a merge
_F32 = struct.Struct("<f")
_NEW = float(1 << 40)  # order key offset of a child seen once: behind those whose count changed


def f32(x: float) -> float:
    """``x`` rounded to float32 (C++ ``float``)."""
    return _F32.unpack(_F32.pack(x))[0]


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


def _heap_push(heap: list, item: tuple) -> None:
    """libstdc++ ``push_heap`` on a max-heap keyed by ``item[0]``."""
    heap.append(item)
    hole = len(heap) - 1
    while hole > 0 and heap[(hole - 1) // 2][0] < item[0]:
        heap[hole] = heap[(hole - 1) // 2]
        hole = (hole - 1) // 2
    heap[hole] = item


def _heap_pop(heap: list) -> tuple:
    """libstdc++ ``pop_heap`` + ``pop_back`` (``__adjust_heap``: the hole sinks to a leaf, then the last item
    rises from there)."""
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


class SuffixTree:
    """The official depth-bounded suffix tree of a set of sequences, stored as a token array and a sorted index
    (see the module docstring). ``extend`` grows the newest sequence (or starts one); ``remove`` forgets one."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.tokens = np.full(1024, -1, dtype=np.int32)  # [0] and every gap are -1 (separators)
        self.n = 1  # used length
        self.seqs: dict[object, list[int]] = {}  # seq_id -> [start, end)
        self._last = None  # the sequence that can grow
        self._keys = np.zeros(0, np.int64)  # sorted (token << 32 | previous + 1) of positions < _merged
        self._pos = np.zeros(0, np.int32)
        self._merged = 1
        self._dead = 0

    def __len__(self) -> int:
        """Tokens held (all sequences)."""
        return sum(end - start for start, end in self.seqs.values())

    def nbytes(self) -> int:
        return self.tokens.nbytes + self._keys.nbytes + self._pos.nbytes

    # ---------------------------------------------------------------- updates
    def extend(self, seq_id, tokens) -> None:
        """Append ``tokens`` to sequence ``seq_id``: the newest one, or a new one (``SuffixTree::extend``)."""
        tokens = np.asarray(tokens, dtype=np.int64).ravel()
        if seq_id != self._last:
            if seq_id in self.seqs:
                raise ValueError(f"sequence {seq_id!r} is not the newest: only the newest sequence can grow")
            self.n += 1 if self.tokens[self.n - 1] >= 0 else 0  # a -1 gap after the previous sequence
            self.seqs[seq_id], self._last = [self.n, self.n], seq_id
        if len(tokens) == 0:
            return
        if tokens.min() < 0 or tokens.max() >= 1 << 31:
            raise ValueError("token ids must be in [0, 2**31)")
        need = self.n + len(tokens) + 2
        if need > len(self.tokens):
            grown = np.full(max(need, 2 * len(self.tokens)), -1, dtype=np.int32)
            grown[: self.n] = self.tokens[: self.n]
            self.tokens = grown
        self.tokens[self.n: self.n + len(tokens)] = tokens
        self.n += len(tokens)
        self.seqs[seq_id][1] = self.n
        if self.n - self._merged >= RECENT:
            self._merge()

    def remove(self, seq_id) -> None:
        """Forget sequence ``seq_id`` (``SuffixTree::remove``)."""
        if seq_id not in self.seqs:
            return  # never extended
        start, end = self.seqs.pop(seq_id)
        self.tokens[start:end] = -1
        self._dead += end - start
        if seq_id == self._last:
            self._last = None
        if self._dead > max(self.n // 2, RECENT):
            self._compact()

    def _merge(self) -> None:
        pos = np.arange(self._merged, self.n, dtype=np.int64)
        pos = pos[self.tokens[pos] >= 0]
        keys = (self.tokens[pos].astype(np.int64) << 32) | (self.tokens[pos - 1].astype(np.int64) + 1)
        order = np.argsort(keys, kind="stable")
        keys, pos = keys[order], pos[order]
        at = np.searchsorted(self._keys, keys, side="right")  # after older equal keys: positions stay sorted
        self._keys, self._pos = np.insert(self._keys, at, keys), np.insert(self._pos, at, pos.astype(np.int32))
        self._merged = self.n

    def _compact(self) -> None:
        parts, seqs, n = [np.full(1, -1, np.int32)], {}, 1
        for seq_id, (start, end) in self.seqs.items():
            parts += [self.tokens[start:end], np.full(1, -1, np.int32)]
            seqs[seq_id], n = [n, n + end - start], n + end - start + 1
        live = np.concatenate(parts)
        self.tokens = np.full(max(2 * len(live), 1024), -1, dtype=np.int32)
        self.tokens[: len(live)] = live
        self.n, self.seqs, self._dead = max(n - 1, 1), seqs, 0
        self._keys, self._pos, self._merged = np.zeros(0, np.int64), np.zeros(0, np.int32), 1
        self._merge()

    # ---------------------------------------------------------------- occurrences
    def _range(self, lo_key: int, hi_key: int, x: int, y: int | None) -> np.ndarray:
        """End positions of ``x`` (preceded by ``y`` unless None): the sorted index plus a scan of the newest."""
        lo, hi = np.searchsorted(self._keys, [lo_key, hi_key])
        old = self._pos[lo:hi].astype(np.int64)
        recent = self.tokens[self._merged: self.n] == x
        if y is not None:
            recent &= self.tokens[self._merged - 1: self.n - 1] == y
        occ = np.concatenate([old, np.flatnonzero(recent) + self._merged])
        if self._dead:
            occ = occ[self.tokens[occ] == x]
            if y is not None:
                occ = occ[self.tokens[occ - 1] == y]
        return occ

    def _matches(self, ctx: list[int]) -> list:
        """``out[m - 1]`` = end positions of ``ctx[-m:]`` for m = 1 .. M (M < len(ctx) the longest that occurs);
        ``out[0]`` may be None (not needed unless m = 1 is tried; it occurs since m = 2 does)."""
        if len(ctx) < 2:
            return []
        x = ctx[-1]
        if len(ctx) >= 3:
            occ = self._range((x << 32) | (ctx[-2] + 1), ((x << 32) | (ctx[-2] + 1)) + 1, x, ctx[-2])
            if len(occ):
                out = [None, occ]
                for m in range(3, len(ctx)):
                    occ = occ[self.tokens[occ - (m - 1)] == ctx[-m]]
                    if not len(occ):
                        break
                    out.append(occ)
                return out
        occ = self._occ1(x)
        return [occ] if len(occ) else []

    def _occ1(self, x: int) -> np.ndarray:
        return self._range(x << 32, (x + 1) << 32, x, None)

    def count(self, pattern) -> int:
        """Occurrences of ``pattern`` (1 <= length <= max_depth): the official node count."""
        pattern = [int(t) for t in pattern]
        occ = self._occ1(pattern[-1])
        for m in range(2, len(pattern) + 1):
            occ = occ[self.tokens[occ - (m - 1)] == pattern[-m]]
        return len(occ)

    # ---------------------------------------------------------------- the tree below a node
    def _children(self, occ: np.ndarray, depth: int, min_count: float) -> tuple[list, int]:
        """Children of the node with end positions ``occ`` at ``depth``, in the official sibling order, as
        ``(count, token, end positions)``; those with fewer than ``min_count`` occurrences are left out (the first
        is always kept). Also returns the number of children."""
        if depth >= self.max_depth:
            return [], 0
        nxt = occ + 1
        toks = self.tokens[nxt]
        if len(occ) <= 16:
            groups: dict[int, list] = {}
            for t, p in zip(toks.tolist(), nxt.tolist()):
                if t >= 0:
                    groups.setdefault(t, []).append(p)
            kids = [(len(ps), t, np.array(ps, dtype=np.int64), _NEW + ps[0] if len(ps) == 1 else -float(max(ps)))
                    for t, ps in groups.items()]
        else:
            keep = toks >= 0
            toks, nxt = toks[keep], nxt[keep]
            if not len(toks):
                return [], 0
            order = np.lexsort((nxt, toks))
            toks, nxt = toks[order], nxt[order]
            cut = np.flatnonzero(np.diff(toks)) + 1
            starts, ends = np.concatenate([[0], cut]), np.concatenate([cut, [len(toks)]])
            counts = ends - starts
            sel = np.flatnonzero(counts >= min_count)
            if len(sel) == 0 and len(counts):
                sel = np.flatnonzero(counts == counts.max())
            kids = [(int(counts[i]), int(toks[starts[i]]), nxt[starts[i]: ends[i]],
                     _NEW + float(nxt[starts[i]]) if counts[i] == 1 else -float(nxt[ends[i] - 1])) for i in sel]
            groups = counts
        kids.sort(key=lambda k: (-k[0], k[3]))
        n_kids = len(groups)
        if not kids:
            return [], n_kids
        return [kids[0][:3]] + [k[:3] for k in kids[1:] if k[0] >= min_count], n_kids

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
        best, floor = None, beat
        for m in range(len(matches), 0, -1):
            budget = max(min(max_spec_tokens, int(f32(f32(m * factor) + offset) + 1e-6)), 0)
            if floor is not None and min(budget, self.max_depth - m + 1e-3) <= floor:
                continue  # each level of a draft sums to <= 1: it cannot beat the best
            occ = matches[m - 1] if matches[m - 1] is not None else self._occ1(ctx[-1])
            grow = self._tree if tree else self._path
            draft = grow(occ, m, budget, min_prob)
            if floor is None or draft.score > floor:
                draft.match_len = m
                best, floor = draft, draft.score
        return Draft() if best is None and beat is None else best

    def _path(self, occ: np.ndarray, depth: int, budget: int, min_prob: float) -> Draft:
        out, prob, count = Draft(), 1.0, len(occ)
        while len(out.tokens) < budget and prob >= min_prob:
            kids, n_kids = self._children(occ, depth, 1)
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

    def _tree(self, occ: np.ndarray, depth: int, budget: int, min_prob: float) -> Draft:
        # queue items: (prob, 0, count, token, occ, depth, parent) emits a token;
        #              (prob, 1, count, kids, depth, parent) pushes the children of a node end
        out = Draft()
        heap = [self._after(1.0, len(occ), occ, depth, -1, min_prob)]
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
