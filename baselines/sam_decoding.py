"""SAM-Decoding (Hu et al., 2024, "SAM Decoding: Speculative Decoding via Suffix Automaton",
https://arxiv.org/abs/2411.10666), the automaton-only variant, re-implemented from the official automaton-only
evaluation: hyx1999/SAM-Decoding at commit 18c41f055b424fa3fa0bac41a8953d34cea1ed77,
``evaluation/inference_sam_only.py`` with the ``samd_sam_only`` package (``draft.py`` ``DraftModel.lookup``/``update``, ``samd_model.py``,
``samd_config.py``, ``sam/dyn_sam.py``, ``sam/static_sam.py``; automata in ``baselines/suffix_automaton.py``).

* A dynamic suffix automaton over the prompt and the committed output, reset per generation: each committed token
  moves the cursor, then is added. The current token is looked up: the longest suffix of ``text + [token]``
  occurring in the text; the draft is the chain of tokens that followed its first occurrence, at most
  ``min(n_predicts, 1 + int(alpha * match))`` nodes with the current token (official ``DynSAM.gen_draft``).
* Optionally a static automaton over a corpus (``corpus_path``; official ``sam_path``): its cursor follows the
  committed tokens without adding them. Its match length minus ``len_bias`` is compared with the dynamic one (the
  dynamic automaton wins ties); when it wins, the draft is a tree of at most ``min(n_predicts, 1 + int(alpha *
  (match - len_bias)))`` nodes chosen best-first by corpus frequency, at most ``topk`` children per node and
  ``topk`` nodes per depth (official ``StaticSAM.gen_draft``, K = 8).
* Drafts are verified in one forward by the shared tree loop (``baselines/tree_drafting.py``); greedy acceptance is
  token-identical to vanilla, sampled acceptance exact (deterministic guesses).

Corpus files (``.jsonl`` / ``.json`` / text): a record's ``ids`` (token ids, as ``scripts/build_sam_corpus.py``
writes them: prompt + model answer) are used as they are; text (``text``, or ``turns`` / ``conversations`` joined)
is tokenised without special tokens. Every document ends with the tokenizer's EOS, and with ``add_vocabulary``
every vocabulary token is added as a one-token document after the corpus (official
``tools/gen_sam_alpaca_sam_only.py``). Not included: the EAGLE / Token Recycling draft of the full SAM-Decoding.
Under ``engine.static_shapes`` a draft is padded to ``n_predicts`` nodes.
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
    """The records of a corpus file: ``.jsonl`` / ``.json`` objects or strings (strings become ``{"text": s}``), or
    plain text (one record); a record with ``ids`` must hold a list of token ids."""
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
        if isinstance(r, str):
            r = {"text": r}
        if not isinstance(r, dict):
            raise src.error(p, f"holds a {type(r).__name__} record, not a string or an object with ids/text/turns")
        ids = r.get("ids")
        if ids is not None and not (isinstance(ids, list) and all(type(t) is int and t >= 0 for t in ids)):
            raise src.error(p, f"record {i + 1}: ids must be a list of token ids (integers >= 0)")
        out.append(r)
    return out


def documents(records: list[dict]) -> list[str | list[int]]:
    """A corpus's documents: token-id lists (records with ``ids``) or texts (``text``, or ``turns`` /
    ``conversations`` joined by newlines)."""
    docs: list[str | list[int]] = []
    for r in records:
        if r.get("ids") is not None:
            docs.append(r["ids"])
        elif "text" in r:
            docs.append(str(r["text"]))
        else:
            turns = r.get("turns") or r.get("conversations") or []
            docs.append("\n".join(t if isinstance(t, str) else str(t.get("value", t.get("content", "")))
                                  for t in turns))
    return docs


def read_corpus(path: str) -> list[str | list[int]]:
    """Documents of a corpus file (:func:`read_records`, :func:`documents`)."""
    return documents(read_records(path))


class _SAMState(DraftState):
    def __init__(self, cfg: SAMDecoder):
        self.cfg = cfg
        self.dyn = DynamicAutomaton()
        self.static = cfg.static_sam
        self.static_cursor = (0, 0)  # official StaticSAM.reset
        self.added = 0

    def draft(self, context: list[int], max_depth: int) -> DraftTree:
        cfg, token = self.cfg, context[-1]
        new = context[self.added:-1]  # committed tokens before the current one (official DraftModel.update)
        self.dyn.extend(new)
        self.added = len(context) - 1
        state, match = self.dyn.lookup(token)
        if self.static is not None:
            self.static_cursor = self.static.follow(self.static_cursor, new)
            s_state, s_match = self.static.step(*self.static_cursor, token)
            s_match -= cfg.len_bias
            if s_match > match:
                return self.static.tree(token, s_state, cfg.nodes(s_match), cfg.topk, max_depth)
        return chain(token, self.dyn.continuation(state, cfg.nodes(match) - 1), max_depth)


@dataclass
class SAMDecoder(TreeDrafter):
    """SAM-Decoding, automaton only (see the module docstring).

    Attributes:
        n_predicts: most nodes of a draft, the current token included (official ``max_predicts``).
        alpha: a draft has at most ``1 + int(alpha * match length)`` nodes.
        len_bias: the corpus automaton's match length is reduced by this before the comparison.
        topk: the corpus tree's most children per node and nodes per depth (official ``K``).
        corpus_path: a corpus for the static automaton (null = none).
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
        docs = [d if isinstance(d, list) else list(tok(d, add_special_tokens=False).input_ids)
                for d in documents(self._records)]
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
