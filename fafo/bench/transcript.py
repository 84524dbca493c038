"""An ``outputs.jsonl`` line (:func:`output_line`), one per sample and turn: the method's tokens, text, accept
lengths, forwards by kind and decode forwards (``forward_log``; the reference's in ``ref_forward_log``), the prompt
(``prompt_sha256``, the hash the reference store keys on; ``prompt_ids`` up to :data:`PROMPT_IDS_MAX` tokens, else
null; ``prompt_head`` and ``prompt_tail`` decoded with special tokens, together the whole prompt up to 256 tokens)
and vanilla's answer (``ref_tokens``, ``ref_text``), so a mismatch reads side by side with its prompt
(``python -m fafo.bench.tools.diff``, ``python -m fafo.bench.tools.specbench_export``; older runs lack them).
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
