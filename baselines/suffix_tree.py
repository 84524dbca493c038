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
``pop_heap``), so equal probabilities come out in the official order. Matches are tried most promising first, a
match skipped when its budget (or its depth left) cannot beat the best score, which gives the same draft.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

RECENT = 8192  # tokens kept outside the sorted index (scanned) before a merge
_F32 = struct.Struct("<f")
_NEW = float(1 << 40)  # order key offset of a child seen once: behind those whose count changed


_MAX_TOKEN = (1 << 21) - 1


def _key(x, y, z):
    """Index key of a position: its token ``x``, the previous ``y`` and the one before ``z`` (-1: none)."""
    return (x << 42) | ((y + 1) << 21) | (z + 1)


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
        self.tokens = np.full(1024, -1, dtype=np.int32)  # [0:3] and every gap are -1 (separators)
        self.n = 3  # used length
        self.seqs: dict[object, list[int]] = {}  # seq_id -> [start, end)
        self._last = None  # the sequence that can grow
        self._keys = np.zeros(0, np.int64)  # sorted trigram keys (see _key) of the positions < _merged
        self._pos = np.zeros(0, np.int32)
        self._merged = 3
        self._dead = 0
        self._bounds = None  # (starts, ends) of the sequences, for _tokens_after
        self._budgets: dict = {}
        self._groups: dict = {}  # 1-2 token pattern -> children of its indexed occurrences (per merge)

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
            self.seqs[seq_id], self._last, self._bounds = [self.n, self.n], seq_id, None
        if len(tokens) == 0:
            return
        if tokens.min() < 0 or tokens.max() >= _MAX_TOKEN:
            raise ValueError(f"token ids must be in [0, {_MAX_TOKEN}) (the index packs three in 64 bits)")
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
        self._bounds = None
        self._groups.clear()
        self.tokens[start:end] = -1
        self._dead += end - start
        if seq_id == self._last:
            self._last = None
        if self._dead > max(self.n // 2, RECENT):
            self._compact()

    def _merge(self) -> None:
        pos = np.arange(self._merged, self.n, dtype=np.int64)
        pos = pos[self.tokens[pos] >= 0]
        t = [self.tokens[np.maximum(pos - k, 0)].astype(np.int64) for k in range(3)]
        keys = _key(t[0], t[1], np.where(t[1] >= 0, t[2], -1))
        order = np.argsort(keys, kind="stable")
        keys, pos = keys[order], pos[order]
        at = np.searchsorted(self._keys, keys, side="right")  # after older equal keys: positions stay sorted
        self._keys, self._pos = np.insert(self._keys, at, keys), np.insert(self._pos, at, pos.astype(np.int32))
        self._merged = self.n
        self._groups.clear()

    def _compact(self) -> None:
        parts, seqs, n = [np.full(3, -1, np.int32)], {}, 3
        for seq_id, (start, end) in self.seqs.items():
            parts += [self.tokens[start:end], np.full(1, -1, np.int32)]
            seqs[seq_id], n = [n, n + end - start], n + end - start + 1
        live = np.concatenate(parts)
        self.tokens = np.full(max(2 * len(live), 1024), -1, dtype=np.int32)
        self.tokens[: len(live)] = live
        self.n, self.seqs, self._dead, self._bounds = max(n - 1, 3), seqs, 0, None
        self._keys, self._pos, self._merged = np.zeros(0, np.int64), np.zeros(0, np.int32), 3
        self._merge()

    # ---------------------------------------------------------------- occurrences
    def _index_span(self, suffix: list[int]) -> tuple[int, int]:
        """Where the merged index holds the end positions of ``suffix`` (1 to 3 tokens)."""
        x, y, z = (suffix[::-1] + [None, None])[:3]
        lo = _key(x, -1 if y is None else y, -1 if z is None else z)
        hi = lo + (1 << 42 if y is None else 1 << 21 if z is None else 1)
        lo, hi = np.searchsorted(self._keys, [lo, hi])
        return int(lo), int(hi)

    def _scan(self, suffix: list[int], start: int | None = None) -> np.ndarray:
        """End positions of ``suffix`` (1 to 3 tokens) from ``start`` on (default: the tokens not merged yet)."""
        start, hit = self._merged if start is None else start, None
        for k, t in enumerate(suffix[::-1]):
            same = self.tokens[start - k: self.n - k] == t
            hit = same if hit is None else hit & same
        return np.flatnonzero(hit) + start

    def _range(self, suffix: list[int]) -> np.ndarray:
        """End positions of ``suffix`` (1 to 3 tokens): the sorted index plus a scan of the newest tokens."""
        lo, hi = self._index_span(suffix)
        occ = np.concatenate([self._pos[lo:hi].astype(np.int64), self._scan(suffix)])
        if self._dead:  # removed sequences are -1 in the token array but may still be in the index
            occ = occ[self.tokens[occ] == suffix[-1]]
        return occ

    def _matches(self, ctx: list[int]) -> list:
        """``out[m - 1]`` = (end positions of ``ctx[-m:]``, tokens after each in its sequence or None for large
        sets) for m = 1 .. M (M < len(ctx) the longest that occurs); shorter than the index's first hit, the
        positions are None (looked up if that m is tried). Equal sets for successive m are the same arrays."""
        longest = len(ctx) - 1
        k = min(3, longest)  # the index answers up to 3 tokens
        occ = self._range(ctx[-k:]) if k > 0 else []
        while not len(occ) and k > 1:
            k -= 1
            occ = self._range(ctx[-k:])
        if not len(occ):
            return []
        after = self._tokens_after(occ) if len(occ) <= 4096 else None
        out = [(None, None)] * (k - 1) + [(occ, after)]
        for m in range(k + 1, longest + 1):
            if len(occ) <= 32:  # few left: each one's match length, in Python
                return out + self._match_lengths(ctx, occ, after, m - 1)
            keep = self.tokens[occ - (m - 1)] == ctx[-m]
            if not keep.all():
                occ = occ[keep]
                after = None if after is None else after[keep]
                if not len(occ):
                    break
            if after is None and len(occ) <= 4096:
                after = self._tokens_after(occ)
            out.append((occ, after))
        return out

    def _match_lengths(self, ctx: list[int], occ: np.ndarray, after: np.ndarray, matched: int) -> list:
        """``_matches`` from m = matched + 1 on, for a few occurrences that all match ``matched`` tokens."""
        longest = len(ctx) - 1
        lengths = []
        for p in occ.tolist():
            seq = self.tokens[max(p - longest + 1, 0): p + 1].tolist()[::-1]
            k = matched
            while k < min(longest, len(seq)) and seq[k] == ctx[-1 - k]:
                k += 1
            lengths.append(k)
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # longest match first
        out, alive, kept = [], len(order), -1
        for m in range(matched + 1, lengths[order[0]] + 1):
            while lengths[order[alive - 1]] < m:
                alive -= 1
            if alive != kept:  # the set shrinks: new arrays (else the same ones)
                idx = sorted(order[:alive])
                pair, kept = (occ[idx], after[idx]), alive
            out.append(pair)
        return out

    def _count(self, suffix: list[int]) -> int:
        """Occurrences of ``suffix`` (1 to 3 tokens)."""
        if self._dead:
            return len(self._range(suffix))
        lo, hi = self._index_span(suffix)
        return hi - lo + len(self._scan(suffix))

    def _occ1(self, x: int) -> np.ndarray:
        return self._range([x])

    def _tokens_after(self, occ: np.ndarray) -> np.ndarray:
        """Tokens after each end position ``occ`` in its sequence."""
        if self._bounds is None:
            spans = sorted(self.seqs.values())
            self._bounds = (np.array([s for s, _ in spans], np.int64), np.array([e for _, e in spans], np.int64))
        starts, ends = self._bounds
        if self._last is not None:
            ends[-1] = self.seqs[self._last][1]  # the newest sequence still grows
        return ends[np.searchsorted(starts, occ, side="right") - 1] - occ - 1

    def count(self, pattern) -> int:
        """Occurrences of ``pattern`` (1 <= length <= max_depth): the official node count."""
        pattern = [int(t) for t in pattern]
        occ = self._occ1(pattern[-1])
        for m in range(2, len(pattern) + 1):
            occ = occ[self.tokens[occ - (m - 1)] == pattern[-m]]
        return len(occ)

    # ---------------------------------------------------------------- the tree below a node
    def _children(self, occ, depth: int, min_count: float) -> tuple[list, int]:
        """Children of the node with end positions ``occ`` (array, or list when small) at ``depth``, in the
        official sibling order, as ``(count, token, end positions)``: those with at least ``min_count``
        occurrences and all of the highest count (the first child). Also returns the number of children."""
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
            if len(groups) < 2:  # at most one child: no order to decide
                if not groups:
                    return [], 0
                ((t, ps),) = groups.items()
                return [(len(ps), t, ps)], 1
            kids = [(len(ps), t, ps, _NEW + ps[0] if len(ps) == 1 else -float(max(ps))) for t, ps in groups.items()]
            n_kids = len(groups)
        else:
            nxt = occ + 1
            toks = self.tokens[nxt]
            keep = toks >= 0
            toks, nxt = toks[keep], nxt[keep]
            if not len(toks):
                return [], 0
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
                kids.append((c, t, ps if c > 16 else ps.tolist(), _NEW + float(ps.min()) if c == 1 else -float(ps.max())))
        kids.sort(key=lambda k: (-k[0], k[3]))
        return [kids[0][:3]] + [k[:3] for k in kids[1:] if k[0] >= min_count], n_kids

    def _indexed_children(self, pattern: tuple, min_count: float) -> tuple[list, int]:
        """``_children`` of a 1-2 token node: its older occurrences grouped once per index merge (cached), its
        newest ones scanned. Children are named by their tokens (resolved when expanded)."""
        entry = self._groups.get(pattern)
        if entry is None:
            lo, hi = self._index_span(list(pattern))
            nxt = np.sort(self._pos[lo:hi]).astype(np.int64) + 1
            toks = self.tokens[nxt]
            if self._dead:
                alive = self.tokens[nxt - 1] == pattern[-1]
                nxt, toks = nxt[alive], toks[alive]
            keep = (toks >= 0) & (nxt < self._merged)  # a next token not merged yet may still be written
            nxt, toks = nxt[keep], toks[keep]
            uniq, first, counts = np.unique(toks, return_index=True, return_counts=True)
            last = len(toks) - 1 - np.unique(toks[::-1], return_index=True)[1]
            entry = self._groups[pattern] = (uniq, counts, nxt[first], nxt[last])
        uniq, counts, first, last = entry
        recent = self._scan(list(pattern), self._merged - 1) + 1
        if len(recent):  # newer than all grouped ones
            rt = self.tokens[recent]
            recent, rt = recent[rt >= 0], rt[rt >= 0]
            extra = {}
            for t, p in zip(rt.tolist(), recent.tolist()):
                c, f, _ = extra.get(t, (0, p, p))
                extra[t] = (c + 1, f, p)
            at = np.searchsorted(uniq, list(extra))
            known = [i < len(uniq) and uniq[i] == t for i, t in zip(at.tolist(), extra)]
            counts, last = counts.copy(), last.copy()
            new = [(t, *v) for (t, v), k in zip(extra.items(), known) if not k]
            for i, (t, (c, _, p)), k in zip(at.tolist(), extra.items(), known):
                if k:
                    counts[i] += c
                    last[i] = p
            if new:
                uniq = np.concatenate([uniq, [t for t, *_ in new]])
                counts = np.concatenate([counts, [c for _, c, _, _ in new]])
                first = np.concatenate([first, [f for _, _, f, _ in new]])
                last = np.concatenate([last, [p for *_, p in new]])
        if not len(uniq):
            return [], 0
        top = int(counts.max())
        tied = np.flatnonzero(counts == top)
        head = tied[first[tied].argmin()] if top == 1 else tied[last[tied].argmax()]
        wanted = set(np.flatnonzero(counts >= min_count).tolist()) | {int(head)}
        kids = [(int(counts[i]), int(uniq[i]), pattern + (int(uniq[i]),),
                 _NEW + float(first[i]) if counts[i] == 1 else -float(last[i])) for i in wanted]
        kids.sort(key=lambda k: (-k[0], k[3]))
        return [kids[0][:3]] + [k[:3] for k in kids[1:] if k[0] >= min_count], len(uniq)

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
        bound, small = {}, {}
        for m, b in budget.items():
            levels = min(b, self.max_depth - m)
            bound[m] = min(b, levels + 1e-3)
            after = matches[m - 1][1]
            if after is not None:
                if len(after) <= 8:
                    if id(after) not in small:
                        small[id(after)] = after.tolist()
                    mass = sum(min(a, levels) for a in small[id(after)]) / len(after)
                else:
                    mass = float(np.minimum(after, levels).sum()) / len(after)
                bound[m] = min(bound[m], mass * (1 + 1e-4) + 1e-4) if mass else 0.0  # 0: nothing to draft
        best = None
        for m in sorted(bound, key=lambda m: (-bound[m], -m)):  # the most promising first
            if best is not None:
                if bound[m] < best.score or (bound[m] == best.score and m < best.match_len):
                    continue  # cannot win: the highest score wins, the longer match on ties
            elif beat is not None and bound[m] <= beat:
                continue
            occ = matches[m - 1][0]
            if occ is None:  # a short match with many occurrences: named by its tokens
                occ, count = tuple(ctx[-m:]), self._count(ctx[-m:])
            else:
                count = len(occ)
            draft = (self._tree if tree else self._path)(occ, count, m, budget[m], min_prob) if bound[m] else Draft()
            draft.match_len = m
            if best is None:
                if beat is None or draft.score > beat:
                    best = draft
            elif draft.score > best.score or (draft.score == best.score and m > best.match_len):
                best = draft
        return Draft() if best is None and beat is None else best

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
