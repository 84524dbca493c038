"""A compiled step's prefix read in chunks (``fafo.engine.flex_routing.prefix_chunks``): the rule, and the chunked
call equal to the one-call attention it replaces, for per-row live lengths that end in the first chunk, across
chunks and at the capacity, under GQA (group 3, not a power of two) and MHA."""

import pytest
import torch

from fafo.engine import attention
from fafo.engine.flex_masks import LiveLength
from fafo.engine.flex_routing import MIN_CHUNK, MIN_CHUNKED, prefix_chunks


def test_the_rule_fills_the_device_with_programs_and_keeps_chunks_long():
    # Llama-2-7B (32 heads), an H100 (132 SMs): a 64-row step's 32 programs -> 8 chunks of a 4096-slot cache
    assert prefix_chunks(64, 32, 4096, sms=132) == 8 and prefix_chunks(64, 32, 8192, sms=132) == 16
    assert prefix_chunks(241, 32, 8192, sms=132) == 8  # FAFO's verification rows: 2 query blocks x 32 heads
    assert prefix_chunks(481, 32, 8192, sms=132) == 4 and prefix_chunks(64, 32, 1 << 20, sms=132) == 16
    assert prefix_chunks(1, 32, 8192) == 1  # vanilla's step: the decoding kernel splits the keys itself
    assert prefix_chunks(64, 32, MIN_CHUNKED - 256) == 1  # a short cache: one call
    assert prefix_chunks(64, 4, 2176) == 1  # 17 blocks: halves would not be whole blocks
    assert prefix_chunks(64, 4, 2304) == 2  # 18 blocks: halves of 9, quarters would not be whole
    for q, h, cap in [(2, 8, 2048), (11, 32, 4096), (120, 28, 16384), (81, 32, 32768)]:
        c = prefix_chunks(q, h, cap)
        assert cap % (c * 128) == 0 and (c == 1 or cap // c >= MIN_CHUNK)


@pytest.mark.parametrize("hq, hkv", [(6, 2), (4, 4)])
@pytest.mark.parametrize("lengths", [[5, 4096], [700, 1500], [513, 3000]])
def test_the_chunked_call_equals_one_call(hq, hkv, lengths):
    torch.manual_seed(0)
    B, Q, D, S = len(lengths), 11, 16, 4096
    q, k, v = torch.randn(B, hq, Q, D), torch.randn(B, hkv, S, D), torch.randn(B, hkv, S, D)
    live = LiveLength(S, "cpu", B).set(torch.tensor(lengths))
    out, lse = attention._flex_call(q, k, v, live.block_mask(Q), 0.25, compiled=False)
    chunks = prefix_chunks(Q, hq, S)
    assert chunks == 8
    out_c, lse_c = attention._chunked_flex_call(q, k, v, live.chunked_block_mask(Q, chunks, hq, hkv), chunks, 0.25,
                                                compiled=False)
    assert torch.allclose(out_c, out, atol=1e-5) and torch.allclose(lse_c, lse, atol=1e-5)
    blocks = live.chunked_block_mask(Q, chunks, hq, hkv).kv_num_blocks  # [B, heads, 1]: each chunk's live blocks
    per_chunk = blocks[:, :: hq // hkv, 0].view(B, hkv, chunks)[:, 0]
    for b, n in enumerate(lengths):
        assert per_chunk[b].tolist() == [-(-max(0, min(512, n - c * 512)) // 128) for c in range(chunks)]
