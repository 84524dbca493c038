"""SuffixDecoding (Oliaro, Jia, Campos, Qiao, NeurIPS 2025, https://arxiv.org/abs/2411.04975), re-implemented from
snowflakedb/ArcticInference at commit 9d4643881608178f0f58a33d1b61919ca246997f (``arctic_inference/suffix_decoding/
cache.py`` ``SuffixDecodingCache``, ``simulator.py``; unchanged since 8d5d124, Oct 2025): the last ``max_depth``
tokens are matched in two suffix trees (:class:`baselines.suffix_tree.SuffixTree`), the request's own and a global
one of earlier outputs; a draft tree (or path) sized by the match is grown from each and the higher-scoring one is
verified. Defaults are the paper's simulator's. Details and sources: docs/methods/suffix_decoding.md.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from baselines.suffix_tree import SuffixTree
from baselines.tree_drafting import DraftState, TreeDrafter, cut_tree
from fafo.bounds import at_least, check_bounds
from fafo.errors import ConfigError
from fafo.tree import DraftTree


class _SuffixState(DraftState):
    """One request: its own tree (prompt, then each committed token) and its output in the global tree."""

    def __init__(self, cfg: SuffixDecoder, prompt: list[int], seq_id: int | None):
        self.cfg, self.seq_id, self.n_prompt = cfg, seq_id, len(prompt)
        self.local = SuffixTree(cfg.max_depth)
        self.local.extend(0, prompt)  # official start_request
        self.added = 0  # output tokens already added

    def sync(self, context: list[int]) -> None:
        """Official ``add_active_response``: new tokens go to the request's tree and to its global output."""
        out = context[self.n_prompt + self.added:]
        if out:
            self.local.extend(0, out)
            if self.seq_id is not None:  # None: no global tree (max_cached_outputs=0)
                self.cfg.global_tree.extend(self.seq_id, out)
            self.added += len(out)

    def draft(self, context: list[int], max_depth: int) -> DraftTree:
        self.sync(context)
        c = self.cfg
        args = (c.max_spec_tokens, c.max_spec_factor, c.max_spec_offset, c.min_token_prob, c.tree)
        best = self.local.speculate(context, *args)  # both match the last max_depth tokens
        if self.seq_id is not None:
            best = c.global_tree.speculate(context, *args, beat=best.score) or best
        return cut_tree(context[-1], best.tokens, best.parents, max_depth)


@dataclass
class SuffixDecoder(TreeDrafter):
    """SuffixDecoding (see the module docstring).

    Attributes:
        max_depth: suffix tree depth = the longest pattern matched (simulator ``--max-depth``, ``max_tree_depth``, 64).
        max_spec_tokens: most speculated tokens per step (simulator ``--max-spec-tokens``: 0 = ``max_depth``).
        max_spec_factor: speculated tokens <= factor * match length + offset (``--max-spec-factor``).
        max_spec_offset: see ``max_spec_factor``.
        min_token_prob: prune tokens whose estimated probability is below this (``--min-token-prob``).
        tree: a speculation tree (paper's simulator) or a single path (``speculate``'s and vLLM's default;
            simulator ``--use-tree-spec``).
        max_cached_outputs: outputs kept in the global tree, the current one included (None: unlimited, the
            simulator's ``--max-cached-requests -1``, vLLM's hook 100000; 0: no global tree; N: the oldest evicted
            first).
    """

    max_depth: int = at_least(2, 64)
    max_spec_tokens: int = at_least(1, 64)
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    tree: bool = True
    max_cached_outputs: int | None = at_least(0, None)  # None: unlimited (official -1)
    # official: learnt across requests
    cross_request_state: ClassVar[tuple[str, ...]] = ("global_tree", "_cached", "_next_id")

    def __post_init__(self):
        check_bounds(self, "method")
        for name in ("max_spec_factor", "max_spec_offset", "min_token_prob"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"method.{name}={v!r} must be a number")
        if self.max_spec_factor < 0 or not 0 <= self.min_token_prob <= 1:
            raise ConfigError(f"method.max_spec_factor={self.max_spec_factor} must be >= 0 and "
                              f"method.min_token_prob={self.min_token_prob} in [0, 1]")
        self.setup(None)

    def setup(self, engine) -> None:
        self.global_tree = SuffixTree(self.max_depth)
        self._cached: deque = deque()
        self._next_id = 0

    def start(self, engine, prompt_ids, eos_ids) -> DraftState:
        seq_id = None
        if self.max_cached_outputs != 0:  # official start_request: a global slot, evicting oldest-first
            seq_id, self._next_id = self._next_id, self._next_id + 1
            while self.max_cached_outputs is not None and len(self._cached) >= self.max_cached_outputs:
                self.global_tree.remove(self._cached.popleft())
            self._cached.append(seq_id)
        return _SuffixState(self, prompt_ids, seq_id)

    def finish(self, state, prompt_ids, tokens) -> None:
        state.sync(list(prompt_ids) + list(tokens))

    def max_tree(self) -> int:
        return 1 + self.max_spec_tokens

    def buffer_bytes(self) -> int:
        return self.global_tree.nbytes()  # host arrays of the global tree (nothing on the device)
