"""SAM-Decoding (Hu et al., 2024, "SAM Decoding: Speculative Decoding via Suffix Automaton",
https://arxiv.org/abs/2411.10666), the automaton-only variant, re-implemented from hyx1999/SAM-Decoding
(``evaluation/model/sam_only/``: ``draft.py`` ``DraftModel.lookup``/``update``, ``samd_model.py``,
``samd_config.py``, ``sam/sam.py``).

* A dynamic suffix automaton (``baselines/suffix_automaton.py``) over the prompt and the committed output, built
  online and reset per generation, and optionally a static one over a corpus (``corpus_path``; off by default,
  as the brief of this harness asks; the official ``sam_data`` is a tokenised ShareGPT-like corpus).
* Each step the current token is looked up in both: the draft is the text that followed the first occurrence of
  the longest matching suffix (backed off until ``n_predicts`` tokens follow it), truncated to
  ``int(alpha * match_length)`` tokens; the static automaton's match length is first reduced by ``len_bias``
  and the dynamic one wins ties (official ``lookup``). The draft is a chain, verified in one forward.
* After a step the current token and the accepted tokens are added to the dynamic automaton; the static one's
  cursor follows them (official ``update``).

Defaults: ``SamdConfig`` (``max_predicts`` 40, ``alpha`` 4.0, ``len_bias`` 5). Not included: the EAGLE / EAGLE-2
draft head of the full SAM-Decoding (its leaderboard row, SAMD[EAGLE2], uses one) and the Token Recycling
fallback tree of the ``samd`` package. Corpus documents end with the tokenizer's EOS, as the official builder.
Under ``engine.static_shapes`` the chain is padded to ``n_predicts + 1`` nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from baselines.suffix_automaton import SuffixAutomaton
from baselines.tree_drafting import DraftState, TreeDrafter, chain
from fafo.bounds import at_least, check_bounds
from fafo.errors import ConfigError
from fafo.files import Source, parse_json, parse_jsonl, read_text
from fafo.tree import DraftTree


def read_corpus(path: str) -> list[str]:
    """Documents of a corpus file: ``.jsonl`` (a ``text`` field, or ``turns``/``conversations`` joined), ``.json``
    (a list of such records or strings) or plain text (one document)."""
    p = Path(path)
    src = Source("method.corpus_path", str(path), "point it at a .jsonl/.json/.txt corpus or set "
                 "method.corpus_path=null")
    text = read_text(p, src)
    if p.suffix == ".jsonl":
        records = parse_jsonl(text, p, src)
    elif p.suffix == ".json":
        records = parse_json(text, p, src, kind=None)
        records = records if isinstance(records, list) else [records]
    else:
        return [text]
    bad = next((r for r in records if not isinstance(r, (str, dict))), None)
    if bad is not None:
        raise src.error(p, f"holds a {type(bad).__name__} record, not a string or an object with text/turns")
    docs = []
    for r in records:
        if isinstance(r, str):
            docs.append(r)
        elif "text" in r:
            docs.append(str(r["text"]))
        else:
            turns = r.get("turns") or r.get("conversations") or []
            docs.append("\n".join(t if isinstance(t, str) else str(t.get("value", t.get("content", "")))
                                  for t in turns))
    return docs


class _SAMState(DraftState):
    def __init__(self, cfg: SAMDecoder, prompt: list[int]):
        self.cfg = cfg
        self.dyn = SuffixAutomaton(cfg.n_predicts)
        self.static = cfg.static_sam
        if self.static is not None:
            self.static.cur = (0, 0)  # official StaticSAM.reset
        self.added = 0
        self.matches: list[int] = []

    def draft(self, context: list[int], max_depth: int) -> DraftTree:
        new = context[self.added:-1]  # committed tokens before the current one (official update)
        self.dyn.extend(new)
        if self.static is not None:
            self.static.follow(new)
        self.added = len(context) - 1
        pred, match = self.dyn.retrieve(context[-1])
        if self.static is not None:
            spred, smatch = self.static.retrieve(context[-1])
            if smatch - self.cfg.len_bias > match:
                pred, match = spred, smatch - self.cfg.len_bias
        self.matches.append(match)
        return chain(context[-1], pred[: int(self.cfg.alpha * match)], max_depth)


@dataclass
class SAMDecoder(TreeDrafter):
    """SAM-Decoding, automaton only (see the module docstring).

    Attributes:
        n_predicts: tokens retrieved per step (official ``max_predicts``).
        alpha: the draft is at most ``alpha`` x the match length.
        len_bias: the static automaton's match length is reduced by this before the comparison.
        corpus_path: a corpus for the static automaton (null = none, the default).
    """

    n_predicts: int = at_least(1, 40)
    alpha: float = 4.0
    len_bias: int = at_least(0, 5)  # 0: the static automaton's match counts in full
    corpus_path: str | None = None

    def __post_init__(self):
        check_bounds(self, "method")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or self.alpha <= 0:
            raise ConfigError(f"method.alpha={self.alpha!r} must be a number > 0")
        if self.corpus_path is not None:
            read_corpus(str(self.corpus_path))  # fails now (one ConfigError line) rather than after loading
        self.static_sam: SuffixAutomaton | None = None

    def setup(self, engine) -> None:
        self.static_sam = None
        if self.corpus_path is not None:
            tok = engine.tokenizer
            eos = tok.eos_token_id
            sam = SuffixAutomaton(self.n_predicts)
            for doc in read_corpus(str(self.corpus_path)):
                ids = list(tok(doc, add_special_tokens=False).input_ids)
                if eos is not None and (not ids or ids[-1] != eos):
                    ids.append(eos)
                for t in ids:
                    sam.add(t)
            self.static_sam = sam

    def start(self, engine, prompt_ids, eos_ids) -> DraftState:
        if self.corpus_path is not None and self.static_sam is None:
            self.setup(engine)
        return _SAMState(self, prompt_ids)

    def max_tree(self) -> int:
        return 1 + self.n_predicts
