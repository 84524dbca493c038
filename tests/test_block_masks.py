"""Every BlockMask the engine builds lets each query see exactly what its dense mask says, on every supported torch.

Each kind is checked two ways against the dense ``[Q, K]`` mask it stands for: the mask a Triton kernel
applies (the mask_mod on partial blocks, everything on full blocks, nothing elsewhere: :func:`kernel_view`),
and FlexAttention's output and log-sum-exp against exact attention under the dense mask. Live lengths are
changed *after* the mask is built, as compiled steps change them: a mask whose fully visible blocks skip the
mask_mod (what ``create_block_mask`` builds on torch 2.11) attends past the live length, and these checks fail
on it (``test_the_checks_catch_a_full_block_that_skips_the_length``).
"""

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from baselines.lookahead import LookaheadDecoder, lookahead_step_mask
from baselines.vanilla import VanillaDecoder
from fafo.engine import attention
from fafo.engine.attention import tree_mask
from fafo.engine.block_masks import (BLOCK, buffer_block_mask, causal_block_mask, length_block_mask,
                                     prefix_lens_block_mask, step_block_mask)
from fafo.engine.flex_masks import LiveLength
from fafo.engine.kernels import reference_attention_lse
from fafo.engine.torch_compat import flex_attention_lse
from fafo.fafo import FAFODecoder, fafo_step_mask
from tests.lossless import PROMPTS

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _blocks(num: torch.Tensor, idx: torch.Tensor, n_cols: int) -> torch.Tensor:
    """[rows, n_cols] bool: the first ``num[r]`` entries of ``idx[r]`` marked (torch's ordered block layout)."""
    used = torch.arange(idx.shape[-1])[None] < num[:, None]
    dense = torch.zeros(idx.shape[0], n_cols + 1, dtype=torch.bool)
    dense[torch.arange(idx.shape[0])[:, None], torch.where(used, idx.long(), n_cols)] = True
    return dense[:, :n_cols]


def kernel_view(bm: BlockMask) -> torch.Tensor:
    """``[Q, K]`` bool: what a kernel applying ``bm`` lets each query see."""
    Q, K = bm.seq_lengths
    n_cols = bm.kv_indices.shape[-1]
    partial = _blocks(bm.kv_num_blocks[0, 0], bm.kv_indices[0, 0], n_cols)
    full = torch.zeros_like(partial)
    if bm.full_kv_num_blocks is not None:
        full = _blocks(bm.full_kv_num_blocks[0, 0], bm.full_kv_indices[0, 0], n_cols)
    q, kv = torch.arange(Q)[:, None], torch.arange(K)[None, :]
    qb, kb = q // bm.BLOCK_SIZE[0], kv // bm.BLOCK_SIZE[1]
    zero = torch.zeros((), dtype=torch.long)
    mod = bm.mask_mod(zero, zero, q, kv).expand(Q, K)
    return full[qb, kb] | (partial[qb, kb] & mod)


def check(bm: BlockMask, want: torch.Tensor) -> None:
    """``bm`` against the dense mask ``want``: the kernel's view of it, then what flex attention computes."""
    assert torch.equal(kernel_view(bm), want)
    check_outputs(bm, want)


def check_outputs(bm: BlockMask, want: torch.Tensor, hq: int = 4, hkv: int = 2) -> None:
    """FlexAttention (GQA, with the log-sum-exp) under ``bm`` equals exact attention under ``want``."""
    Q, K = want.shape
    g = torch.Generator().manual_seed(Q * 1000 + K)
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h, n in ((hq, Q), (hkv, K), (hkv, K)))
    out, lse = flex_attention_lse(flex_attention, q, k, v, bm, 0.25)
    ref, ref_lse = reference_attention_lse(q.view(1, hkv, hq // hkv, Q, 16), k, v, want, 0.25)
    out, lse = out.view(ref.shape), lse.view(ref_lse.shape)
    seen = want.any(-1)  # a query that sees no key: lse -inf, no output to compare
    torch.testing.assert_close(out[..., seen, :], ref[..., seen, :], atol=1e-5, rtol=0)
    torch.testing.assert_close(lse[..., seen], ref_lse[..., seen], atol=1e-5, rtol=0)
    assert torch.equal(lse[..., ~seen], ref_lse[..., ~seen])


@pytest.mark.parametrize("n", [1, 100, 128, 129, 300])
def test_causal(n):
    check(causal_block_mask(n, "cpu"), torch.ones(n, n, dtype=torch.bool).tril())


@pytest.mark.parametrize("n_queries", [1, 81, 200])
def test_length_follows_the_live_length_after_it_was_built(n_queries):
    live = LiveLength(capacity=384, device="cpu").set(384)
    bm = live.block_mask(n_queries)  # built once, at the full capacity: every block would be full
    for length in (384, 300, 129, 128, 50, 1, 0, 257):
        live.set(length)
        want = (torch.arange(384) < length)[None].expand(n_queries, 384)
        check(bm, want)
        assert int(bm.kv_num_blocks.max()) == -(-length // BLOCK)  # the dead tail is never read


def test_a_live_length_writes_only_what_changed():
    """Every mask of a live length follows each set, an int length or a tensor of one per row, while an int length
    is written only when it changes and a mask's block count only when that changes (on a device each write is a
    launch, and a length is set before every compiled forward)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Writes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func.__name__.split(".")[0] in ("fill_", "copy_")
            return func(*args, **(kwargs or {}))

    live, masks, writes = LiveLength(capacity=384, device="cpu", batch=2), {}, []
    masks[1] = live.block_mask(1)
    for length in (300, 300, 290, 257, 256, torch.tensor([5, 200]), 256, 129, "another mask", 128, 128):
        if length == "another mask":
            masks[81] = live.block_mask(81)
            continue
        with Writes() as counted:
            live.set(length)
        writes.append(counted.n)
        rows = length.tolist() if isinstance(length, torch.Tensor) else [length, length]
        for n_queries, bm in masks.items():
            assert bm.kv_num_blocks.shape == (2, 1, -(-n_queries // BLOCK))
            blocks = [-(-n // BLOCK) for n in rows]  # each row's, in every query block
            assert bm.kv_num_blocks.flatten(1).T.tolist() == [blocks] * bm.kv_num_blocks.shape[-1]
    # the length, then each mask whose count changed; a tensor: copied, and every count computed from it
    assert writes == [2, 0, 1, 1, 2, 2, 2, 1, 3, 0]


STEP_MASKS = {
    "tree": lambda: tree_mask([-1, 0, 0, 1, 1, 2, 3, 3, 5, -1, 9, 10]),
    "lookahead-5-15-15": lambda: lookahead_step_mask(15, 4, 15, 4),
    "fafo-40x6": lambda: fafo_step_mask(40, 6, 40),  # 481 rows: four blocks, most of them empty
    "causal-130": lambda: torch.ones(130, 130, dtype=torch.bool).tril(),
}


@pytest.mark.parametrize("name", list(STEP_MASKS))
def test_step_mask(name):
    mask = STEP_MASKS[name]()
    bm = step_block_mask(mask)
    check(bm, mask)
    assert bm.full_kv_num_blocks is None


def test_step_buffer_takes_any_mask_written_into_it():
    buf = torch.ones(200, 200, dtype=torch.bool)
    bm = buffer_block_mask(buf)
    for mask in (torch.eye(200, dtype=torch.bool), fafo_step_mask(9, 6, 25)[:200, :200],
                 torch.ones(200, 200, dtype=torch.bool).tril()):
        buf.copy_(mask)
        check(bm, mask)


@pytest.mark.parametrize("n_keys", [7, 128, 300])
def test_prefix_lens(n_keys):
    g = torch.Generator().manual_seed(n_keys)
    lens = torch.randint(0, n_keys + 1, (150,), generator=g)
    lens[:3] = torch.tensor([0, n_keys, 1])
    check(prefix_lens_block_mask(lens, n_keys), torch.arange(n_keys)[None] < lens[:, None])


def test_the_checks_catch_a_full_block_that_skips_the_length():
    """The same length mask with the blocks that were fully visible when it was built marked full (the layout
    ``create_block_mask`` gives on torch 2.11): once the length drops inside such a block, a Triton kernel attends
    past it (``templates/common.py.jinja: forward_block_mn`` applies the mask_mod only ``if not IS_FULL_BLOCKS``),
    and the kernel-view check fails. (Eager flex on a CPU evaluates the mask_mod everywhere, so its output alone
    would not show it.)"""
    length = torch.tensor([384])
    good = length_block_mask(length, 8, 384)
    ones = torch.ones(1, 1, 1, dtype=torch.int32)
    bad = BlockMask.from_kv_blocks(ones * 0, good.kv_indices, ones * 3, good.kv_indices, BLOCK_SIZE=BLOCK,
                                   mask_mod=good.mask_mod, seq_lengths=(8, 384))
    length.fill_(50)
    want = (torch.arange(384) < 50)[None].expand(8, 384)
    check(good, want)
    assert kernel_view(bad).all(), "full blocks ignore the live length"
    with pytest.raises(AssertionError):
        check(bad, want)


def test_the_engine_never_evaluates_a_dense_mask(engine, monkeypatch):
    """Prefill, vanilla, FAFO and Lookahead on ``model.attention=flex``: every mask comes from its block
    structure (``create_block_mask`` / ``create_mask`` would evaluate a dense ``[Q, K]`` grid)."""
    import torch.nn.attention.flex_attention as fa

    eng, ref = engine("llama_gqa", "flex"), engine("llama_gqa")
    ids = eng.tokenizer(PROMPTS[2]).input_ids
    want = VanillaDecoder().generate(ref, ids, 10).tokens

    def refuse(*args, **kwargs):
        raise AssertionError("a dense mask was evaluated")

    monkeypatch.setattr(fa, "create_block_mask", refuse)
    monkeypatch.setattr(fa, "create_mask", refuse)
    attention._causal_masks.clear()
    eng._flex = None
    for method in (VanillaDecoder(), FAFODecoder(n=4, k=3), LookaheadDecoder(level=4, window=3, guess_set=2)):
        method.setup(eng)
        assert method.generate(eng, ids, 10).tokens == want, type(method).__name__
