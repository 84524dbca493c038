"""The BlockMasks of compiled FlexAttention steps read right by a kernel that reads only their block lists.

Every compiled step (static plans: live lengths as block counts written in place, tree masks in a reused buffer,
FAFO's region) runs here with FlexAttention replaced by :func:`tests.kernel_emulation.block_sparse_flex_lse`, what
the CUDA kernels read, and must give eager vanilla's tokens; a block count one short must not."""

import functools

import pytest

from baselines.vanilla import VanillaDecoder
from fafo.engine import attention
from fafo.engine.compiled import CompileOptions
from fafo.engine.engine import Engine
from fafo.engine.flex_masks import LiveLength
from fafo.engine.ledger import model_call
from tests.compiled_cases import CAPACITY, METHODS, SAMPLES
from tests.kernel_emulation import block_sparse_flex_lse


def emulated_engine(checkpoint, name: str) -> Engine:
    """An engine whose decode steps take the compiled path's plans and FlexAttention calls, run eagerly."""
    eng = Engine.from_pretrained(str(checkpoint(name)))
    eng.enable_compile(CompileOptions(backend="aot_eager", attention="flex"))
    eng.compiled.fn = functools.partial(model_call, eng.model.forward, device=eng.device)
    eng.cache(CAPACITY)
    return eng


@pytest.mark.parametrize("method_name", ["vanilla", "prompt_lookup", "token_recycling", "fafo_stream", "lookahead"])
def test_compiled_plans_read_only_their_listed_blocks_give_vanillas_tokens(method_name, checkpoint, engine,
                                                                          monkeypatch):
    from baselines.prompt_lookup import PromptLookupDecoder
    from baselines.token_recycling import TokenRecyclingDecoder

    cases = {**METHODS, "prompt_lookup": PromptLookupDecoder, "token_recycling": TokenRecyclingDecoder}
    monkeypatch.setattr(attention, "flex_attention_lse", block_sparse_flex_lse)
    emulated, eager = emulated_engine(checkpoint, "qwen2_gqa"), engine("qwen2_gqa")
    method = cases[method_name]()
    method.setup(emulated)
    for text in SAMPLES[:2]:
        ids = emulated.tokenizer(text).input_ids
        assert method.generate(emulated, ids, 10).tokens == VanillaDecoder().generate(eager, ids, 10).tokens


def test_a_block_count_one_short_is_caught(checkpoint, engine, monkeypatch):
    """The emulation reads the block counts: the live prefix's last block left out changes the tokens."""
    monkeypatch.setattr(attention, "flex_attention_lse", block_sparse_flex_lse)
    blocks = LiveLength.blocks
    monkeypatch.setattr(LiveLength, "blocks", lambda self, size: blocks(self, size) - 1)
    emulated, eager = emulated_engine(checkpoint, "qwen2_gqa"), engine("qwen2_gqa")
    ids = emulated.tokenizer(SAMPLES[1]).input_ids
    assert VanillaDecoder().generate(emulated, ids, 10).tokens != VanillaDecoder().generate(eager, ids, 10).tokens


@pytest.mark.parametrize("method_name", ["vanilla", "token_recycling"])
def test_batched_plans_read_only_their_listed_blocks_give_each_requests_tokens(method_name, checkpoint, engine,
                                                                               monkeypatch):
    """A static batch of ragged requests (per-row lengths and tree masks, rows that finish early): each request's
    tokens are its own eager vanilla tokens."""
    from tests.batch_cases import ragged_requests, run_batch

    monkeypatch.setattr(attention, "flex_attention_lse", block_sparse_flex_lse)
    emulated, eager = emulated_engine(checkpoint, "qwen2_gqa"), engine("qwen2_gqa")
    requests = ragged_requests(eager)
    result = run_batch(method_name, emulated, "static", requests)
    want = [VanillaDecoder().generate(eager, r.prompt_ids, r.max_new_tokens, eos_ids=r.eos_ids).tokens
            for r in requests]
    assert [g.tokens for g in result.generations] == want
