"""Prompt Lookup Decoding (Saxena, 2023, https://github.com/apoorvumang/prompt-lookup-decoding; in transformers as
``generate(prompt_lookup_num_tokens=...)``, in vLLM as the ``ngram`` speculator).

The draft is the chain of up to ``num_tokens`` tokens that followed the leftmost earlier occurrence of the
context's last n-gram (``n = max_ngram`` down to ``min_ngram``), cut before a stop id: transformers'
``PromptLookupCandidateGenerator.get_candidates`` (5.x) rule exactly. The rule, the defaults' sources and the
verification: docs/methods/prompt_lookup.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from baselines.tree_drafting import DraftState, TreeDrafter, chain
from fafo.bounds import at_least, check_bounds
from fafo.errors import ConfigError
from fafo.tree import DraftTree


class NgramIndex:
    """Every n-gram (``min_n <= n <= max_n``) of a growing token list -> its first start position."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.first: dict[tuple[int, ...], int] = {}

    def extend(self, tokens) -> None:
        for t in tokens:
            self.tokens.append(int(t))
            end = len(self.tokens)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.first.setdefault(tuple(self.tokens[end - n:]), end - n)

    def lookup(self, num_tokens: int, eos_ids=()) -> list[int]:
        """The continuation of the leftmost earlier occurrence of the longest matching suffix n-gram."""
        L = len(self.tokens)
        # transformers: ngram sizes from min(max_n, L - 1) down to 1 (here down to min_n)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            start = self.first.get(tuple(self.tokens[L - n:]))
            if start is None or start + n >= L:  # only the suffix itself: no earlier occurrence
                continue
            draft = self.tokens[start + n: start + n + num_tokens]
            # transformers drops the candidates from the first EOS on, and stops at the first match even when the
            # EOS cut empties it
            return draft[:next((i for i, t in enumerate(draft) if t in eos_ids), len(draft))]
        return []


class _PLDState(DraftState):
    def __init__(self, cfg: PromptLookupDecoder, eos_ids):
        self.cfg, self.eos = cfg, tuple(eos_ids)
        self.index = NgramIndex(cfg.min_ngram, cfg.max_ngram)  # fed the context (prompt included) as it grows

    def draft(self, context: list[int], max_depth: int) -> DraftTree:
        self.index.extend(context[len(self.index.tokens):])
        return chain(context[-1], self.index.lookup(self.cfg.num_tokens, self.eos), max_depth)


@dataclass
class PromptLookupDecoder(TreeDrafter):
    """Prompt Lookup Decoding (see the module docstring).

    Attributes:
        num_tokens: most draft tokens per step (transformers' ``prompt_lookup_num_tokens``).
        max_ngram: longest n-gram matched (transformers' ``max_matching_ngram_size``; 3 as the original and
        Spec-Bench, transformers' own default being 2).
        min_ngram: shortest n-gram matched (transformers and the original: 1).
    """

    num_tokens: int = at_least(1, 10)
    max_ngram: int = at_least(1, 3)
    min_ngram: int = at_least(1, 1)

    def __post_init__(self):
        check_bounds(self, "method")
        if self.min_ngram > self.max_ngram:
            raise ConfigError(f"method.min_ngram={self.min_ngram} is above method.max_ngram={self.max_ngram}; "
                              "set min_ngram <= max_ngram")

    def start(self, engine, prompt_ids, eos_ids) -> DraftState:
        return _PLDState(self, eos_ids)

    def max_tree(self) -> int:
        return 1 + self.num_tokens
