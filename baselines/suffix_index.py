"""The storage behind SuffixDecoding's suffix trees (``baselines/suffix_tree.py``): every token of the sequences
in one int32 array, sequences separated by -1, and a sorted index of (token, previous two tokens) -> end position
(int64 key + int32 position; the newest :data:`RECENT` tokens are scanned until merged in), about 16-20 bytes per
token. A node of the official tree is the set of end positions of its string; :meth:`SuffixIndex._matches` finds
them for every match length. Only the newest sequence grows in place: an older one that grows again (requests
decoded side by side, fafo/batch.py) is moved to the end first; a removed (or moved) one is overwritten with -1
(compacted once half the array is dead). Sizes and speed: docs/methods/suffix_decoding.md, "Storage and speed".
"""

from __future__ import annotations

import numpy as np

RECENT = 8192  # tokens kept outside the sorted index (scanned) before a merge
_MAX_TOKEN = (1 << 21) - 1


def _key(x, y, z):
    """Index key of a position: its token ``x``, the previous ``y`` and the one before ``z`` (-1: none)."""
    return (x << 42) | ((y + 1) << 21) | (z + 1)


class SuffixIndex:
    """Token array + sorted index of a set of sequences (see the module docstring). ``extend`` grows the newest
    sequence (or starts one); ``remove`` forgets one; ``count`` is a pattern's number of occurrences."""

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
        self._groups: dict = {}  # 1-2 token pattern -> children of its older occurrences (see _indexed_children)

    def __len__(self) -> int:
        """Tokens held (all sequences)."""
        return sum(end - start for start, end in self.seqs.values())

    def nbytes(self) -> int:
        return self.tokens.nbytes + self._keys.nbytes + self._pos.nbytes

    # ---------------------------------------------------------------- updates
    def extend(self, seq_id, tokens) -> None:
        """Append ``tokens`` to sequence ``seq_id`` (``SuffixTree::extend``): the newest one grows in place; an
        older one is moved to the end (its tokens become the newest occurrences); a new one starts there."""
        tokens = np.asarray(tokens, dtype=np.int64).ravel()
        if seq_id != self._last:
            if seq_id in self.seqs:
                if len(tokens) == 0:
                    return
                start, end = self.seqs[seq_id]
                tokens = np.concatenate([self.tokens[start:end].astype(np.int64), tokens])
                self.remove(seq_id)
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
        back = np.arange(matched, longest)
        before = occ[:, None] - back  # [N, longest - matched]: the positions compared, each occurrence backwards
        same = (before >= 0) & (self.tokens[np.maximum(before, 0)] == np.asarray(ctx[::-1][matched:longest]))
        lengths = np.where(same.all(1), longest, matched + same.argmin(1)).tolist()  # up to the first mismatch
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
        occ = self._range(pattern[-1:])
        for m in range(2, len(pattern) + 1):
            occ = occ[self.tokens[occ - (m - 1)] == pattern[-m]]
        return len(occ)
