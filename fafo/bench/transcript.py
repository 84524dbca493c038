"""An ``outputs.jsonl`` line (:func:`output_line`): one per sample and turn, what its tokens came from, so that a
mismatch can be read side by side with its prompt.

Each line carries the method's ``tokens`` and ``text``, accept lengths, forwards by kind and its decode forwards as
the engine ran them (``forward_log``, :func:`fafo.bench.records.compact`; the reference's in ``ref_forward_log``),
and:

* the prompt: ``prompt_sha256`` (SHA-256 of the JSON list of its token ids, the hash the vanilla reference store
  keys on), ``prompt_ids`` (every id up to :data:`PROMPT_IDS_MAX` tokens, else null: a 128k-token prompt would add
  ~0.8 MB per line; the task rebuilds it from the sample id), and its decoded ``prompt_head`` and ``prompt_tail``
  (the first :data:`HEAD_TOKENS` and the last :data:`TAIL_TOKENS` tokens after those: together the whole prompt up
  to 256 tokens; special tokens kept, the chat template is part of what the model read);
* vanilla's answer to the same prompt: ``ref_tokens`` and ``ref_text`` (decoded as ``text`` is: special tokens
  skipped), whatever the reference timing's source.

``python -m fafo.bench.tools.diff`` and ``python -m fafo.bench.tools.specbench_export`` read them; runs recorded
before they existed lack them, and both tools say what they fall back to.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

PROMPT_IDS_MAX = 8192  # ids stored in full up to this many prompt tokens (~50 KB of JSON a line)
HEAD_TOKENS = 64
TAIL_TOKENS = 192


def prompt_hash(prompt: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt).encode()).hexdigest()


def prompt_fields(tokenizer, prompt: list[int]) -> dict:
    """The prompt's fields of an output line (module docstring)."""
    head = prompt[:HEAD_TOKENS]
    tail = prompt[max(HEAD_TOKENS, len(prompt) - TAIL_TOKENS):]
    return {"prompt_sha256": prompt_hash(prompt), "prompt_ids": list(prompt) if len(prompt) <= PROMPT_IDS_MAX else None,
            "prompt_head": tokenizer.decode(head), "prompt_tail": tokenizer.decode(tail) if tail else ""}


def reference_fields(tokenizer, ref_tokens: list[int] | None) -> dict:
    """Vanilla's answer of an output line (module docstring)."""
    if ref_tokens is None:
        return {"ref_tokens": None, "ref_text": None}
    return {"ref_tokens": list(ref_tokens), "ref_text": tokenizer.decode(ref_tokens, skip_special_tokens=True)}


def output_line(tokenizer, sample_id, turn: int, prompt: list[int], gen, log: list, ref: dict) -> dict:
    """The output line of a (sample, turn): the method's Generation ``gen`` and forward ``log``, the reference's
    state ``ref`` (its tokens and forward log)."""
    return {"sample_id": str(sample_id), "turn": turn, "prompt_tokens": len(prompt), "tokens": gen.tokens,
            "text": tokenizer.decode(gen.tokens, skip_special_tokens=True), "accept_lengths": gen.accept_lengths,
            "forwards": asdict(gen.forwards), "draft_model_forwards": gen.draft_model_forwards,
            "drafted": gen.drafted, "accepted": gen.accepted, "extras": gen.extras, "forward_log": log,
            "ref_forward_log": ref.get("forward_log"), **prompt_fields(tokenizer, prompt),
            **reference_fields(tokenizer, ref["tokens"])}
