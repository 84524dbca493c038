"""The "Find Out" candidate pool (FAFO paper, Algorithms 2-3 and App. E), kept on the CPU.

Caching (Alg. 2): a stream's new k-token state is stored under every suffix (lengths 1..k) of that stream's
buffer of its last k discarded tokens: the key is the text the state *followed*. Each key keeps at most ``cap``
values, least recently used evicted first (App. E; re-adding a value refreshes it).

Retrieval (Alg. 3): look up the committed text's suffix of length k first, then shorter ones down to 1, and
collect distinct candidates until ``m`` are found. Within one key, the most recently added come first (the
paper leaves the order open; recent guesses were made with a context closer to the current one).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class CandidatePool:
    """Suffix-keyed n-gram pool.

    Args:
        k: stream length, also the longest key.
        cap: values kept per key (the paper uses n, the number of streams).
    """

    def __init__(self, k: int, cap: int):
        self.k, self.cap = k, cap
        self.table: dict[tuple[int, ...], OrderedDict[tuple[int, ...], None]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())

    def add(self, key: tuple[int, ...], value: tuple[int, ...]) -> None:
        bucket = self.table.setdefault(key, OrderedDict())
        bucket.pop(value, None)
        bucket[value] = None
        if len(bucket) > self.cap:
            bucket.popitem(last=False)

    def add_stream(self, discarded: Sequence[int], state: Sequence[int]) -> None:
        """Alg. 2 for one stream: ``state`` under each suffix of ``discarded`` (its last k dropped tokens)."""
        self._add(tuple(discarded[-self.k :]), tuple(state))

    def add_streams(self, discarded: Sequence[Sequence[int]], states: Sequence[Sequence[int]]) -> None:
        """Alg. 2 for every stream of a step, in stream order. A stream whose last k dropped tokens and state equal
        a later stream's is skipped: under LRU a bucket holds the ``cap`` values added last, in the order of their
        last addition, and the later stream adds the same values under the same keys (streams often converge: on
        the host table's text 4 in 10 of a step's streams repeat a later one)."""
        last: dict[tuple, None] = {}
        for buf, state in zip(discarded, states):
            pair = (tuple(buf[-self.k :]), tuple(state))
            last.pop(pair, None)  # kept at its last place
            last[pair] = None
        for tail, value in last:
            self._add(tail, value)

    def _add(self, tail: tuple[int, ...], value: tuple[int, ...]) -> None:
        """:meth:`add` of ``value`` under each suffix of ``tail``, inlined: it runs k times per stream and step,
        the bulk of a FAFO step's host work."""
        table, cap = self.table, self.cap
        for length in range(1, len(tail) + 1):
            key = tail[-length:]
            bucket = table.get(key)
            if bucket is None:
                table[key] = bucket = OrderedDict()
            elif value in bucket:
                bucket.move_to_end(value)
                continue
            bucket[value] = None
            if len(bucket) > cap:
                bucket.popitem(last=False)

    def add_text(self, tokens: Sequence[int]) -> None:
        """Seed from a text (e.g. the prompt): every k-gram stored under each suffix of the text before it."""
        tokens = list(tokens)
        for start in range(1, len(tokens) - self.k + 1):
            self.add_stream(tokens[max(0, start - self.k) : start], tokens[start : start + self.k])

    def retrieve(self, context: Sequence[int], m: int) -> list[tuple[int, ...]]:
        """Alg. 3: up to ``m`` distinct candidates, longest matching suffix of ``context`` first."""
        found: dict[tuple[int, ...], None] = {}
        for length in range(min(self.k, len(context)), 0, -1):
            bucket = self.table.get(tuple(context[-length:]))
            if not bucket:
                continue
            for value in reversed(bucket):
                found.setdefault(value, None)
                if len(found) == m:
                    return list(found)
        return list(found)
