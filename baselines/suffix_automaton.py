"""A suffix automaton over token ids with SAM-Decoding's retrieval (hyx1999/SAM-Decoding,
``evaluation/model/sam_only/sam/sam.py`` ``SAM``, ``DynSAM``, ``StaticSAM``).

The automaton of a text accepts exactly its substrings; each state is a class of substrings with the same end
positions, ``length`` its longest, ``link`` the state of the longest suffix in another class, ``min_endpos`` the
first end position (1-based, fixed when the state is created; a clone inherits its source's). It is built online
(:meth:`SuffixAutomaton.add`, amortised O(1) per token). A cursor ``(state, length)`` tracks the longest suffix of
the decoded text that occurs in the automaton's text: :meth:`step` follows one token, falling back along suffix
links; :meth:`retrieve` steps by the current token and then, official ``to_anc``, backs off along suffix links
until the match's first occurrence has ``n_predicts`` tokens after it (the root always qualifies), returning the
``n_predicts`` tokens that followed that occurrence (padded with 0 when the text is shorter, as the official) and
the match length.
"""

from __future__ import annotations


class SuffixAutomaton:
    """Online suffix automaton of a token list (see the module docstring)."""

    def __init__(self, n_predicts: int = 40):
        self.n_predicts = n_predicts
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.min_endpos: list[int] = [0]
        self.tokens: list[int] = [-1]  # official: input_ids[0] is a sentinel, so endpos p is tokens[p]
        self.last = 0
        self.cur = (0, 0)  # (state, match length) of the decoded text's longest matching suffix

    def __len__(self) -> int:
        return len(self.tokens) - 1

    def _new(self, nxt: dict, link: int, length: int, endpos: int) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.min_endpos.append(endpos)
        return len(self.next) - 1

    def add(self, token: int) -> None:
        """Append ``token`` to the automaton's text (official ``add_state``)."""
        token = int(token)
        self.tokens.append(token)
        n = len(self.tokens) - 1
        cur = self._new({}, -1, n, n)
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
                clone = self._new(dict(self.next[q]), self.link[q], self.length[p] + 1, self.min_endpos[q])
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """The longest matching suffix after ``token`` (official ``transfer_state``)."""
        while state != 0 and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        if token in self.next[state]:
            return self.next[state][token], length + 1
        return 0, 0

    def _anc(self, state: int, length: int) -> tuple[int, int]:
        """Back off until the first occurrence has ``n_predicts`` tokens after it (official ``to_anc``)."""
        while state != 0 and self.n_predicts > len(self) - self.min_endpos[state]:
            state = self.link[state]
            length = self.length[state]
        return state, length

    def extend(self, tokens) -> None:
        """Append tokens to the text and advance the cursor over them (official ``add_tokens``)."""
        for t in tokens:
            self.add(t)
            self.cur = self.step(*self.cur, int(t))
        self.cur = self._anc(*self.cur)

    def follow(self, tokens) -> None:
        """Advance the cursor over decoded tokens without adding them (official ``transfer_tokens``, used for a
        static corpus automaton)."""
        for t in tokens:
            self.cur = self.step(*self.cur, int(t))
        self.cur = self._anc(*self.cur)

    def retrieve(self, token: int) -> tuple[list[int], int]:
        """(the ``n_predicts`` tokens after the match of text + ``token``, the match length) (official
        ``lookup``)."""
        state, length = self._anc(*self.step(*self.cur, int(token)))
        end = self.min_endpos[state]
        pred = self.tokens[end + 1: end + self.n_predicts + 1]
        return pred + [0] * (self.n_predicts - len(pred)), length
