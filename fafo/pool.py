"""The "Find Out" candidate pool (FAFO paper, Algorithms 2-3 and App. E), kept on the CPU.

Caching (Alg. 2): a stream's new k-token state is stored under every suffix (lengths 1..k) of that stream's
buffer of its last k discarded tokens: the key is the text the state *followed*. Each key keeps at most ``cap``
values, least recently used evicted first (App. E; re-adding a value refreshes it).

Retrieval (Alg. 3): look up the committed text's suffix of length k first, then shorter ones down to 1, and
collect distinct candidates until ``m`` are found. Within one key, the most recently added come first (the
paper leaves the order open; recent guesses were made with a context closer to the current one).

The keys form a trie read from their last token backwards: key ``t_{-L} .. t_{-1}`` is the child, by token
``t_{-L}``, of key ``t_{-L+1} .. t_{-1}``, so storing a state under all k suffixes of a buffer is one walk of k
integer lookups (no key tuple built or hashed), and a retrieval walks the context's suffix once. Every key of length
L > 1 has its suffix of length L - 1 stored too (a state goes under every suffix), so a walk stops at the first
missing token. Nodes are integers, the trie's edges one flat dict of integers and a bucket a dict of integer value
ids (a state's tuple hashed once per addition, not once per key). CPython's cyclic garbage collector tracks none of
them before 3.14 (a dict of atomic values is untracked; so is a tuple of ints after one collection), so a pool of
10^5 keys adds nothing to a collection's work; with a tracked dict per key (the pool before, and any dict on 3.14),
collections took about a third of the pool's time. The pool is most of a FAFO step's host work: k bucket updates for
each of the n streams every step. Ids live as long as the pool (one generation), at most n new ones a step, a few MB
over thousands of steps.
"""

from __future__ import annotations

from collections.abc import Sequence


class CandidatePool:
    """Suffix-keyed n-gram pool.

    Args:
        k: stream length, also the longest key.
        cap: values kept per key (the paper uses n, the number of streams).
    """

    def __init__(self, k: int, cap: int):
        self.k, self.cap = k, cap
        self._child: dict[int, int] = {}  # node << 32 | token (a token id < 2^32) -> the key with token prepended
        self._buckets: list[dict[int, None]] = [{}]  # by node (0: the empty key): value ids in LRU order, oldest first
        self._ids: dict[tuple[int, ...], int] = {}  # each value added so far, by id
        self._values: list[tuple[int, ...]] = []

    def __len__(self) -> int:
        return sum(map(len, self._buckets))

    @property
    def table(self) -> dict[tuple[int, ...], list[tuple[int, ...]]]:
        """Every key's values, least recently used first (a copy, for inspection)."""
        return {key: [self._values[v] for v in bucket] for key, bucket in self._nodes()}

    def _nodes(self):
        """(key, bucket) of every stored key, a key after its suffix."""
        keys = {0: ()}
        for edge, node in sorted(self._child.items(), key=lambda item: item[1]):  # nodes numbered as made
            keys[node] = (edge & 0xFFFFFFFF, *keys[edge >> 32])
            yield keys[node], self._buckets[node]

    def add_stream(self, discarded: Sequence[int], state: Sequence[int]) -> None:
        """Alg. 2 for one stream: ``state`` under each suffix of ``discarded`` (its last k dropped tokens)."""
        self.add_streams([discarded], [state])

    def add_streams(self, discarded: Sequence[Sequence[int]], states: Sequence[Sequence[int]]) -> None:
        """Alg. 2 for every stream of a step, in stream order.

        A bucket ends holding its ``cap`` most recently added values in the order of their last addition, so a
        stream that a later one of the step repeats (the same dropped tokens and state: converged streams) is
        skipped: the pool ends as if every stream were added."""
        ids, values, cap, k, child_of, buckets = self._ids, self._values, self.cap, self.k, self._child, self._buckets
        last: dict[tuple, None] = {}  # distinct (dropped tokens, state), the last occurrence first
        for tail, state in zip(reversed(discarded), reversed(states)):
            last.setdefault((tuple(tail[-k:]), tuple(state)), None)
        for tail, value in reversed(last):
            vid = ids.get(value)
            if vid is None:
                vid = ids[value] = len(values)
                values.append(value)
            node = 0
            for token in reversed(tail):  # the key of length 1, then 2...
                edge = node << 32 | token
                node = child_of.get(edge)
                if node is None:
                    node = child_of[edge] = len(buckets)
                    buckets.append({vid: None})
                else:
                    bucket = buckets[node]
                    if vid in bucket:  # refreshed: to the most recent end
                        del bucket[vid]
                        bucket[vid] = None
                    else:
                        bucket[vid] = None
                        if len(bucket) > cap:
                            del bucket[next(iter(bucket))]  # the least recently used

    def add_text(self, tokens: Sequence[int]) -> None:
        """Seed from a text (e.g. the prompt): every k-gram stored under each suffix of the text before it."""
        tokens = list(tokens)
        starts = range(1, len(tokens) - self.k + 1)
        self.add_streams([tokens[max(0, s - self.k) : s] for s in starts], [tokens[s : s + self.k] for s in starts])

    def retrieve(self, context: Sequence[int], m: int) -> list[tuple[int, ...]]:
        """Alg. 3: up to ``m`` distinct candidates, longest matching suffix of ``context`` first."""
        buckets, node = [], 0
        for length in range(1, min(self.k, len(context)) + 1):
            node = self._child.get(node << 32 | context[-length])
            if node is None:
                break
            buckets.append(self._buckets[node])
        found: dict[int, None] = {}
        for bucket in reversed(buckets):  # the longest key first, the most recent value first
            for vid in reversed(bucket):
                found.setdefault(vid, None)
                if len(found) == m:
                    return [self._values[v] for v in found]
        return [self._values[v] for v in found]
