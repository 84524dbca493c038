"""SuffixDecoding (Oliaro, Jia, Campos, Qiao, NeurIPS 2025, https://arxiv.org/abs/2411.04975), re-implemented from
snowflakedb/ArcticInference (``arctic_inference/suffix_decoding/cache.py`` ``SuffixDecodingCache``,
``csrc/suffix_decoding/suffix_tree.cc``, the vLLM hook in ``arctic_inference/vllm/model_runner.py``).

* Two suffix trees (``baselines/suffix_tree.py``) of depth ``max_depth``: a per-generation one over the prompt,
  and a global one over the outputs of the run (earlier generations AND the current one as it grows; official
  ``add_active_response``), keeping the last ``max_cached_outputs`` outputs (FIFO eviction, as the official).
* Each step the pattern (the last ``max_depth`` committed tokens, the current token included) is matched in both
  trees and a speculation grown from each; the one with the higher score (expected accepted tokens) is verified,
  the prompt's winning ties (official). Its size adapts to the match: at most ``max_spec_factor * match_length +
  max_spec_offset`` tokens and ``max_spec_tokens``, tokens whose estimated probability (frequency ratio along the
  path) falls below ``min_token_prob`` pruned.
* ``tree=true`` (the paper's speculation tree, ``use_tree_spec``) verifies a best-first tree in one forward with
  tree attention; ``tree=false`` a single most-frequent path (ArcticInference's current vLLM default).

Defaults: ArcticInference's (``suffix_cache_max_depth`` 64, ``suffix_max_spec_factor`` 1.0,
``suffix_max_spec_offset`` 0.0, ``suffix_min_token_prob`` 0.1) and vLLM's ``MAX_SPEC_LEN`` 32 for
``max_spec_tokens``. Where we differ: our trie is uncompressed Python (about 64 nodes per cached token), so the
default global cache keeps 128 outputs (official 100,000 requests in a compressed C++ tree); trees are cut at
the tokens left to generate. Under ``engine.static_shapes`` the tree is padded to ``max_spec_tokens + 1`` nodes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from baselines.suffix_tree import Draft, SuffixTree
from baselines.tree_drafting import DraftState, TreeDrafter
from fafo.bounds import at_least, check_bounds
from fafo.errors import ConfigError
from fafo.tree import DraftTree


def draft_tree(root: int, draft: Draft, max_depth: int) -> DraftTree:
    """The :class:`DraftTree` of a speculation (parents precede children), nodes deeper than ``max_depth``
    dropped."""
    tree = DraftTree.root(root)
    node_of, depth = {-1: 0}, {-1: 0}
    for i, (t, p) in enumerate(zip(draft.tokens, draft.parents)):
        if p not in node_of or depth[p] + 1 > max_depth:
            continue
        node_of[i] = tree.add(node_of[p], t)
        depth[i] = depth[p] + 1
    return tree


class _SuffixState(DraftState):
    def __init__(self, cfg: SuffixDecoder, prompt: list[int], seq_id: int):
        self.cfg, self.seq_id, self.n_prompt = cfg, seq_id, len(prompt)
        self.local = SuffixTree(cfg.max_depth)
        self.local.extend("prompt", prompt)
        self.added = 0  # output tokens already in the global tree
        self.matches: list[int] = []

    def sync(self, context: list[int]) -> None:
        out = context[self.n_prompt + self.added:]
        if out:
            self.cfg.global_tree.extend(self.seq_id, out)
            self.added += len(out)

    def draft(self, context: list[int], max_depth: int) -> DraftTree:
        self.sync(context)
        c = self.cfg
        pattern = context[-c.max_depth:]
        args = (c.max_spec_tokens, c.max_spec_factor, c.max_spec_offset, c.min_token_prob, c.tree)
        local = self.local.speculate(pattern, *args)
        glob = c.global_tree.speculate(pattern, *args)
        best = local if local.score >= glob.score else glob
        self.matches.append(best.match_len)
        return draft_tree(context[-1], best, max_depth)


@dataclass
class SuffixDecoder(TreeDrafter):
    """SuffixDecoding (see the module docstring).

    Attributes:
        max_depth: suffix tree depth = the longest pattern matched (``suffix_cache_max_depth``).
        max_spec_tokens: most speculated tokens per step.
        max_spec_factor: speculated tokens <= factor * match length + offset.
        max_spec_offset: see ``max_spec_factor``.
        min_token_prob: prune tokens whose estimated probability is below this.
        tree: a speculation tree (paper) or a single path (vLLM default).
        max_cached_outputs: earlier outputs kept in the global tree (0: only the current one).
    """

    max_depth: int = at_least(2, 64)
    max_spec_tokens: int = at_least(1, 32)
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    tree: bool = True
    max_cached_outputs: int = at_least(0, 128)  # 0: the prompt's tree only
    cross_request_state: ClassVar[tuple[str, ...]] = ("global_tree", "_cached", "_next_id")  # official: learnt across requests

    def __post_init__(self):
        check_bounds(self, "method")
        for name in ("max_spec_factor", "max_spec_offset", "min_token_prob"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"method.{name}={v!r} must be a number")
        if self.max_spec_factor < 0 or not 0 <= self.min_token_prob <= 1:
            raise ConfigError(f"method.max_spec_factor={self.max_spec_factor} must be >= 0 and "
                              f"method.min_token_prob={self.min_token_prob} in [0, 1]")
        if not isinstance(self.tree, bool):
            raise ConfigError(f"method.tree={self.tree!r} must be true or false")
        self.setup(None)

    def setup(self, engine) -> None:
        self.global_tree = SuffixTree(self.max_depth)
        self._cached: deque = deque()
        self._next_id = 0

    def start(self, engine, prompt_ids, eos_ids) -> DraftState:
        seq_id, self._next_id = self._next_id, self._next_id + 1
        return _SuffixState(self, prompt_ids, seq_id)

    def finish(self, state, prompt_ids, tokens) -> None:
        state.sync(list(prompt_ids) + list(tokens))
        self._cached.append(state.seq_id)
        while len(self._cached) > self.max_cached_outputs:  # FIFO eviction (official)
            self.global_tree.remove(self._cached.popleft())

    def max_tree(self) -> int:
        return 1 + self.max_spec_tokens

    def buffer_bytes(self) -> int:
        return 0  # host-side Python structures; nothing on the device
