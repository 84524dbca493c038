"""SAM-Decoding (Hu et al., 2024, "SAM Decoding: Speculative Decoding via Suffix Automaton",
https://arxiv.org/abs/2411.10666), automaton only, re-implemented from hyx1999/SAM-Decoding at commit
18c41f055b424fa3fa0bac41a8953d34cea1ed77 (``evaluation/inference_sam_only.py``, ``samd_sam_only/draft.py``): a
suffix automaton of the prompt and output drafts the chain after the first occurrence of the longest match; an
optional corpus automaton (``corpus_path``) drafts a best-first top-``topk`` tree when its match minus ``len_bias``
is longer (automata: ``baselines/suffix_automaton.py``). The official files matched, the corpus format and the
presets' published numbers: docs/methods/sam_decoding.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from baselines.suffix_automaton import CorpusAutomaton, DynamicAutomaton
from baselines.tree_drafting import DraftState, TreeDrafter, chain
from fafo.bounds import at_least, check_bounds
from fafo.errors import ConfigError
from fafo.files import Source, parse_json, parse_jsonl, read_text
from fafo.tree import DraftTree

BUILD_HINT = "build one with python scripts/build_sam_corpus.py model=<the target> task=<prompts> --out FILE"


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of a tokenizer's vocabulary: corpora of token ids are only valid for the same one."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def _source(path) -> Source:
    return Source("method.corpus_path", str(path), f"point it at a .jsonl/.json/.txt corpus ({BUILD_HINT}) or set "
                  "method.corpus_path=null")


def read_records(path: str) -> list[dict]:
    """The records of a corpus file: ``.jsonl`` / ``.json`` objects or strings, or plain text (one record), each
    with its document: ``ids`` (a list of token ids) or ``text`` (a string; ``turns`` / ``conversations`` joined by
    newlines)."""
    p, src = Path(path), _source(path)
    text = read_text(p, src)
    if p.suffix == ".jsonl":
        records = parse_jsonl(text, p, src)
    elif p.suffix == ".json":
        records = parse_json(text, p, src, kind=None)
        records = records if isinstance(records, list) else [records]
    else:
        return [{"text": text}]
    out = []
    for i, r in enumerate(records):
        r = {"text": r} if isinstance(r, str) else r
        if not isinstance(r, dict):
            raise src.error(p, f"holds a {type(r).__name__} record, not a string or an object with ids/text/turns")
        ids = r.get("ids")
        if ids is not None and not (isinstance(ids, list) and all(type(t) is int and t >= 0 for t in ids)):
            raise src.error(p, f"record {i + 1}: ids must be a list of token ids (integers >= 0)")
        if ids is None:
            turns = r.get("turns") or r.get("conversations") or []
            r = {**r, "text": str(r["text"]) if "text" in r else "\n".join(
                t if isinstance(t, str) else str(t.get("value", t.get("content", ""))) for t in turns)}
        out.append(r)
    return out


def read_corpus(path: str) -> list[str | list[int]]:
    """The documents of a corpus file (:func:`read_records`): token-id lists or texts."""
    return [r["ids"] if r.get("ids") is not None else r["text"] for r in read_records(path)]


class _SAMState(DraftState):
    def __init__(self, cfg: SAMDecoder):
        self.cfg = cfg
        self.dyn = DynamicAutomaton()
        self.static_cursor = (0, 0)  # official StaticSAM.reset
        self.added = 0

    def draft(self, context: list[int], max_depth: int) -> DraftTree:
        cfg, token = self.cfg, context[-1]
        new = context[self.added:-1]  # committed tokens before the current one (official DraftModel.update)
        self.dyn.extend(new)
        self.added = len(context) - 1
        state, match = self.dyn.lookup(token)
        if cfg.static_sam is not None:
            self.static_cursor = cfg.static_sam.follow(self.static_cursor, new)
            s_state, s_match = cfg.static_sam.step(*self.static_cursor, token)
            s_match -= cfg.len_bias
            if s_match > match:
                return cfg.static_sam.tree(token, s_state, cfg.nodes(s_match), cfg.topk, max_depth)
        return chain(token, self.dyn.continuation(state, cfg.nodes(match) - 1), max_depth)


@dataclass
class SAMDecoder(TreeDrafter):
    """SAM-Decoding, automaton only (see the module docstring).

    Attributes:
        n_predicts: most nodes of a draft, the current token included (official ``max_predicts``).
        alpha: a draft has at most ``1 + int(alpha * match length)`` nodes.
        len_bias: the corpus automaton's match length is reduced by this before the comparison.
        topk: the corpus tree's most children per node and nodes per depth (official ``K``).
        corpus_path: a .jsonl/.json/.txt corpus for the static automaton (null = none; scripts/build_sam_corpus.py).
        add_vocabulary: add every vocabulary token as a one-token document to the corpus (as the official builder).
        corpus_required: refuse to run without ``corpus_path`` (presets reproducing a run that used a corpus).
    """

    n_predicts: int = at_least(1, 40)
    alpha: float = 4.0
    len_bias: int = at_least(0, 5)  # 0: the static automaton's match counts in full
    topk: int = at_least(1, 8)
    corpus_path: str | None = None
    add_vocabulary: bool = False
    corpus_required: bool = False

    def __post_init__(self):
        check_bounds(self, "method")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or self.alpha <= 0:
            raise ConfigError(f"method.alpha={self.alpha!r} must be a number > 0")
        # read now (one ConfigError line for a bad file) rather than after loading the model
        self._records = read_records(str(self.corpus_path)) if self.corpus_path is not None else None
        self.static_sam: CorpusAutomaton | None = None
        self._bytes = 0

    def nodes(self, match: int) -> int:
        """Nodes of a draft for a match of ``match`` tokens, the current token included."""
        return min(self.n_predicts, 1 + int(match * self.alpha))

    def check_target(self, hf_config, tokenizer, weights: bool = True) -> None:
        if self._records is None:
            if self.corpus_required:
                raise ConfigError("method.corpus_path is required by this preset (the published run drafted from a "
                                  f"corpus of the model's own answers); {BUILD_HINT} and set method.corpus_path=FILE")
            return
        src, mine, size = _source(self.corpus_path), tokenizer_fingerprint(tokenizer), len(tokenizer)
        for i, r in enumerate(self._records):
            if r.get("ids") is None:
                continue
            if r.get("tokenizer", mine) != mine:
                raise src.error(self.corpus_path, f"record {i + 1} holds token ids of another tokenizer (built for "
                                f"{r.get('model', 'another model')}); {BUILD_HINT}")
            if r["ids"] and max(r["ids"]) >= size:
                raise src.error(self.corpus_path, f"record {i + 1} holds token id {max(r['ids'])}, beyond the "
                                f"target's vocabulary of {size}; {BUILD_HINT}")

    def setup(self, engine) -> None:
        self.static_sam = None
        tok = engine.tokenizer
        self.check_target(None, tok)
        if self._records is None:
            return
        docs = [r["ids"] if r.get("ids") is not None else list(tok(r["text"], add_special_tokens=False).input_ids)
                for r in self._records]
        if self.add_vocabulary:
            docs += [[i] for i in range(len(tok))]
        self.static_sam = CorpusAutomaton.build(docs, tok.eos_token_id)
        self._bytes = 200 * len(self.static_sam.next) + 85 * sum(len(d) for d in self.static_sam.next)

    def start(self, engine, prompt_ids, eos_ids) -> DraftState:
        if (self._records is not None or self.corpus_required) and self.static_sam is None:
            self.setup(engine)
        return _SAMState(self)

    def max_tree(self) -> int:
        return self.n_predicts

    def buffer_bytes(self) -> int:
        """The corpus automaton's Python lists and dicts: about 200 bytes per state and 85 per transition (measured
        with tracemalloc; about 340 bytes per state in all)."""
        return self._bytes if self.static_sam is not None else 0
