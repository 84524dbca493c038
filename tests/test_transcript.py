"""What an outputs.jsonl line holds beside the tokens: the prompt (ids up to a limit, head and tail text, its hash)
and vanilla's answer."""

import hashlib
import json

from fafo.bench.records import HEAD_TOKENS, PROMPT_IDS_MAX, TAIL_TOKENS, prompt_fields, reference_fields
from fafo.engine.tiny_tokenizer import build_tiny_tokenizer


def test_prompt_fields_keep_short_prompts_whole_and_long_ones_by_hash():
    tok = build_tiny_tokenizer()
    ids = tok("The morning fog lifted slowly from the river, and the town woke. " * 40).input_ids
    short = ids[:HEAD_TOKENS + TAIL_TOKENS]
    f = prompt_fields(tok, short)
    assert f["prompt_ids"] == short and f["prompt_head"] + f["prompt_tail"] == tok.decode(short)
    assert f["prompt_sha256"] == hashlib.sha256(json.dumps(short).encode()).hexdigest()
    f = prompt_fields(tok, ids[:HEAD_TOKENS + TAIL_TOKENS + 50])  # the middle 50 tokens are in neither text
    assert f["prompt_head"] == tok.decode(ids[:HEAD_TOKENS])
    assert f["prompt_tail"] == tok.decode(ids[HEAD_TOKENS + 50:HEAD_TOKENS + TAIL_TOKENS + 50])
    long = (ids * (PROMPT_IDS_MAX // len(ids) + 1))[:PROMPT_IDS_MAX + 1]
    f = prompt_fields(tok, long)
    assert f["prompt_ids"] is None and f["prompt_sha256"] == hashlib.sha256(json.dumps(long).encode()).hexdigest()
    assert prompt_fields(tok, long[:PROMPT_IDS_MAX])["prompt_ids"] == long[:PROMPT_IDS_MAX]


def test_reference_fields_decode_as_the_method_text_is():
    tok = build_tiny_tokenizer()
    ids = tok("A good explanation starts with what the reader knows.").input_ids[1:] + [tok.eos_token_id]
    assert reference_fields(tok, ids) == {"ref_tokens": ids, "ref_text": tok.decode(ids, skip_special_tokens=True)}
    assert not reference_fields(tok, ids)["ref_text"].endswith("</s>")
    assert reference_fields(tok, None) == {"ref_tokens": None, "ref_text": None}
