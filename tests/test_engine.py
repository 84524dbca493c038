"""The engine's logits equal transformers' own model (float32, 1e-4) for prefill and tree steps."""

import contextlib
import inspect
import itertools
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from fafo.engine.attention import AttentionPlan, causal_plan, sdpa_attention, tree_mask, flex_attention_backend
from fafo.engine.cache import KVCache
from fafo.engine.engine import Engine, appends_one_token_host
from fafo.errors import ConfigError
from tests.conftest import MODEL_SPECS
from tests.helpers import ReadsOnTheHost

ATOL = 1e-4


def hf_model(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def cache_keyword(model) -> str:
    """The forward's name for a KV cache: ``cache`` in newer transformers (5.25, where ``past_key_values`` is
    deprecated, to be removed in 5.40), ``past_key_values`` in older ones (5.17)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def random_ids(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, vocab, (n,), generator=g)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize("name", list(MODEL_SPECS))
def test_prefill_logits_match_hf(name, backend, checkpoint, engine):
    eng: Engine = engine(name, backend)
    ids = random_ids(100, eng.model.args.vocab_size, seed=7)  # > original_max (64) for the scaled ropes
    with torch.no_grad():
        ref = hf_model(checkpoint(name))(ids[None]).logits[0]
    cache = eng.cache(256)
    ours = eng.prefill(cache, ids.tolist(), logits="all")[0]
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize("name", list(MODEL_SPECS))
def test_tree_step_at_arbitrary_positions_matches_hf(name, backend, checkpoint, engine):
    """Prefix in the cache, then a token tree at gapped positions with a custom intra-step mask."""
    eng: Engine = engine(name, backend)
    prefix = random_ids(37, eng.model.args.vocab_size, seed=11)
    tree = random_ids(6, eng.model.args.vocab_size, seed=12)
    parents = [-1, 0, 0, 1, 1, 2]
    depth = torch.tensor([0, 1, 1, 2, 2, 2])
    positions = 37 + depth
    mask = tree_mask(parents)

    model = hf_model(checkpoint(name))
    with torch.no_grad():
        past = {cache_keyword(model): DynamicCache(config=model.config)}
        model(prefix[None], use_cache=True, **past)
        additive = torch.zeros(1, 1, 6, 37 + 6)
        additive[0, 0, :, 37:] = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
        ref = model(tree[None], position_ids=positions[None], attention_mask=additive, **past).logits[0]

    cache = eng.cache(128)
    eng.prefill(cache, prefix.tolist())
    slots = torch.arange(60, 66)  # physical slots far from the logical positions
    ours = eng.forward(cache, tree, positions, slots, AttentionPlan(prefix=37, step_mask=mask))[0]
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl", [sdpa_attention, flex_attention_backend])
def test_prefix_lens_limit_what_each_query_reads(impl):
    """A query restricted to the first slots attends exactly those: equal to plain attention over that subset."""
    torch.manual_seed(0)
    B, Hq, Hkv, Q, P, D = 1, 4, 2, 3, 20, 8
    q = torch.randn(B, Hq, Q, D)
    kc, vc = torch.randn(B, Hkv, P, D), torch.randn(B, Hkv, P, D)
    ks, vs = torch.randn(B, Hkv, Q, D), torch.randn(B, Hkv, Q, D)
    lens = torch.tensor([20, 5, 0])
    out = impl(q, kc, vc, ks, vs, AttentionPlan(prefix=P, prefix_lens=lens), D**-0.5)
    for i in range(Q):
        k = torch.cat([kc[:, :, : lens[i]], ks[:, :, : i + 1]], 2).repeat_interleave(2, 1)
        v = torch.cat([vc[:, :, : lens[i]], vs[:, :, : i + 1]], 2).repeat_interleave(2, 1)
        ref = torch.softmax(q[:, :, i : i + 1] @ k.transpose(-1, -2) * D**-0.5, -1) @ v
        torch.testing.assert_close(out[:, :, i : i + 1], ref, atol=1e-5, rtol=0)
    # changing a slot the restricted query cannot see leaves its output unchanged
    kc2 = kc.clone()
    kc2[:, :, 10:] += 5.0
    out2 = impl(q, kc2, vc, ks, vs, AttentionPlan(prefix=P, prefix_lens=lens), D**-0.5)
    torch.testing.assert_close(out2[:, :, 1:], out[:, :, 1:])
    assert not torch.allclose(out2[:, :, 0], out[:, :, 0])


def test_incremental_decode_equals_full_forward(engine):
    eng = engine("llama_gqa")
    ids = random_ids(20, eng.model.args.vocab_size, seed=3).tolist()
    cache = eng.cache(64)
    full = eng.prefill(cache, ids, logits="all")[0]
    eng.prefill(cache, ids[:12])
    for t in range(12, 20):
        step = eng.forward(cache, [ids[t]], [t], [t], causal_plan(t))[0, 0]
        torch.testing.assert_close(step, full[t], atol=ATOL, rtol=0)


def test_a_forward_runs_in_inference_mode_and_leaves_it(engine):
    """What ``@torch.inference_mode()`` gave: outputs are inference tensors, and the mode is off again after the
    call, also when the call raises."""
    eng = engine("llama_gqa")
    cache = eng.cache(16)
    eng.prefill(cache, [1, 2, 3])
    assert eng.forward(cache, [4], [3], [3], causal_plan(3)).is_inference()
    assert not torch.is_inference_mode_enabled()
    with pytest.raises(ValueError, match="unknown forward kind"):
        eng.forward(cache, [4], [3], [3], causal_plan(3), kind="nonsense")
    assert not torch.is_inference_mode_enabled()



def test_a_greedy_forward_returns_each_rows_argmax_and_writes_it_into_a_given_tensor(engine):
    """``greedy=True``: the argmax tokens of the rows the forward would return, ``[B, Q']``; on the host by numpy
    (``into`` untouched), on a device's path (any torch mode on the stack) written into ``into`` and returned in it.
    Captured queries come back beside them, one ``[L, B, H_q, R, D]`` tensor."""
    eng = engine("llama_gqa")
    cache = eng.cache(16)
    eng.prefill(cache, [1, 2, 3])
    plan = causal_plan(3)
    logits = eng.forward(cache, [4, 5, 6], [3, 4, 5], [3, 4, 5], plan)
    want = logits.argmax(-1)
    assert torch.equal(eng.forward(cache, [4, 5, 6], [3, 4, 5], [3, 4, 5], plan, greedy=True), want)
    into = torch.full((1, 1), -1)
    host = eng.forward(cache, [4, 5, 6], [3, 4, 5], [3, 4, 5], plan, logits="last", greedy=True, into=into)
    assert host.tolist() == want[:, -1:].tolist() and into.item() == -1
    with ReadsOnTheHost():
        device = eng.forward(cache, [4, 5, 6], [3, 4, 5], [3, 4, 5], plan, logits="last", greedy=True, into=into)
    assert device is into and into.tolist() == want[:, -1:].tolist()
    capture = causal_plan(3)
    capture.capture_rows = torch.tensor([0, 2])
    tokens, queries = eng.forward(cache, [4, 5, 6], [3, 4, 5], [3, 4, 5], capture, greedy=True, queries=True)
    args = eng.model.args
    assert torch.equal(tokens, want) and queries.shape == (args.n_layers, 1, args.n_heads, 2, args.head_dim)


ONE_TOKEN_STEPS = [  # (tokens, slots, plan, whether the engine reads the token's KV from the cache)
    ([5], [7], causal_plan(7), True),
    (5, 7, causal_plan(7), True),
    ([[5]], [7], causal_plan(7), True),  # a batch row's token
    (np.array([[5]]), np.array([7]), causal_plan(7), True),
    (torch.tensor([5]), range(7, 8), causal_plan(7), True),  # a token fed where a forward left it
    ([5], [8], causal_plan(7), False),  # not the slot after the prefix
    ([5, 6], [7, 8], causal_plan(7), False),
    (np.array([5, 6]), [7], causal_plan(7), False),
    ([], [7], causal_plan(7), False),
    ([5], torch.tensor([7]), causal_plan(7), False),  # slots on the device: not read
    ([5], [0], causal_plan(0), False),  # a prefill
    ([5], [7], AttentionPlan(prefix=7, step_mask=torch.ones(1, 1, dtype=torch.bool)), False),
    ([5], [7], AttentionPlan(prefix=7, region_from=0, region_len=4), False),
]


@pytest.mark.parametrize("tokens, slots, plan, expected", ONE_TOKEN_STEPS)
def test_a_step_appends_one_token_only_when_its_host_values_say_so(tokens, slots, plan, expected):
    assert appends_one_token_host(tokens, slots, plan) is expected


def test_cache_move_compacts_entries(engine):
    eng = engine("llama_mha")
    cache = eng.cache(32)
    eng.prefill(cache, list(range(10, 20)))
    before = cache.keys[0][:, :, [7, 8]].clone()
    cache.move(torch.tensor([7, 8]), torch.tensor([3, 4]))
    torch.testing.assert_close(cache.keys[0][:, :, [3, 4]], before)


def _moved(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """The reference of a per-(layer, batch row, head) move: src, dst [L, B, H, N], read before any write."""
    out, (L, B, H, _) = kv.clone(), src.shape
    for l, b, h in itertools.product(range(L), range(B), range(H)):
        out[:, l, b, h, dst[l, b, h]] = kv[:, l, b, h, src[l, b, h]]
    return out


@pytest.mark.parametrize("path", ["host", "device"])
@pytest.mark.parametrize("view", ["whole", "batch row"])
def test_per_row_moves_equal_a_loop_over_every_layer_row_and_head(view, path):
    """Moves with padding (a spare slot paired with itself, as FAFO's swap lists pad theirs): on the CPU's own path
    those pairs are dropped before the copy; inside a torch mode the CPU runs a device's path, which copies them."""
    L, B, H, S, D, N = 3, 3, 2, 12, 4, 5
    gen = torch.Generator().manual_seed(0)
    whole = KVCache(L, B, H, S, D, torch.float32, "cpu")
    whole.kv.copy_(torch.randn(whole.kv.shape, generator=gen))
    cache = whole if view == "whole" else whole.row(1)  # a view with strides of the whole buffer
    b = cache.batch
    spare = torch.full((3,), S - 1)

    def slots(*shape):  # overlapping: a slot may be read and written by the same move; then the padding
        picks = torch.stack([torch.randperm(S - 1, generator=gen)[:N] for _ in range(math.prod(shape))])
        return torch.cat([picks, spare.expand(len(picks), -1)], -1).view(*shape, -1)

    device_path = ReadsOnTheHost() if path == "device" else contextlib.nullcontext()
    src, dst = slots(L, H), slots(L, H)
    expected = _moved(cache.kv, src[:, None].expand(L, b, H, -1), dst[:, None].expand(L, b, H, -1))
    outside = whole.kv[:, :, 2].clone()
    with device_path:
        cache.move_rows(src, dst)
    assert torch.equal(cache.kv, expected)
    if view == "batch row":
        assert torch.equal(whole.kv[:, :, 2], outside)  # the other rows are untouched
    per_row_src, per_row_dst = slots(b), slots(b)
    expected = _moved(cache.kv, per_row_src[None, :, None].expand(L, b, H, -1),
                      per_row_dst[None, :, None].expand(L, b, H, -1))
    with device_path:
        cache.move_per_row(per_row_src, per_row_dst)
    assert torch.equal(cache.kv, expected)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_engine_tracks_float32(dtype, checkpoint):
    path = str(checkpoint("llama_gqa"))
    ids = random_ids(30, 1000, seed=5).tolist()
    ref = Engine.from_pretrained(path)
    half = Engine.from_pretrained(path, dtype=dtype)
    cache = half.cache(64)
    assert cache.keys[0].dtype == getattr(torch, dtype) and half.dtype == getattr(torch, dtype)
    out = half.prefill(cache, ids, logits="all")[0].float()
    exact = ref.prefill(ref.cache(64), ids, logits="all")[0]
    assert (out.argmax(-1) == exact.argmax(-1)).float().mean() > 0.8
    assert (out - exact).abs().mean() < 0.02 * exact.abs().mean()


def test_bad_model_paths_give_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="model.path"):
        Engine.from_pretrained(str(tmp_path / "missing" / "dir" / "x"))
    with pytest.raises(ConfigError, match="without config.json"):
        Engine.from_pretrained(str(tmp_path))
    with pytest.raises(ConfigError, match="hub"):
        Engine.from_pretrained("nobody-here/not-a-real-model-xyz")
    with pytest.raises(ConfigError, match="bench.dtype"):
        Engine.from_pretrained(str(tmp_path), dtype="float64")


@pytest.mark.parametrize("masked", [False, True])
def test_engine_pads_a_step_to_its_static_shape(engine, monkeypatch, masked):
    """Under static shapes a step is padded to ``pad_to`` rows by the engine: the real rows' logits are those of
    the unpadded step, only they come back, and the padding is computed (the ledger counts it)."""
    eng = engine("llama_gqa")
    ids = random_ids(20, eng.model.args.vocab_size, 0)
    N, chain = len(ids), [5, 6, 7]
    mask = tree_mask([-1, 0, 0]) if masked else None  # a root with two children, or a causal chain
    plan = AttentionPlan(prefix=N, step_mask=mask)
    slots = list(range(N, N + 3))
    cache = eng.cache(N + 16)
    eng.prefill(cache, ids)
    want = eng.forward(cache, chain, slots, slots, plan, pad_to=8)  # static_shapes off: no padding
    monkeypatch.setattr(eng, "static_shapes", True)
    before = eng.ledger.tokens
    got = eng.forward(cache, chain, slots, slots, plan, pad_to=8)
    assert eng.ledger.tokens - before == 8 and got.shape == want.shape == (1, 3, want.shape[-1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    last = eng.forward(cache, chain, slots, slots, plan, logits="last", pad_to=8)
    torch.testing.assert_close(last[0, -1], want[0, -1], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="does not fit pad_to=2"):
        eng.forward(cache, chain, slots, slots, plan, pad_to=2)


@pytest.mark.parametrize("static", [False, True])
def test_host_key_lists_of_a_step_mask_are_the_device_ones(static):
    """``host_gathered`` (numpy, for masks built on the host) gives exactly ``GatheredMask``'s key lists: visible
    keys first in key order, padding pointing at key 0, for one mask and a batch of masks."""
    from fafo.engine.upload import host_gathered
    from fafo.engine.kernels import GatheredMask

    g = torch.Generator().manual_seed(0)
    for Q in (1, 5, 33, 81):
        masks = torch.rand(3, Q, Q, generator=g) < torch.rand(3, Q, 1, generator=g)  # rows of varied density
        masks |= torch.eye(Q, dtype=torch.bool)  # a query always sees itself
        for mask in (masks[0], masks):
            index, valid = host_gathered(mask.numpy(), static)
            device = GatheredMask(mask, static)
            assert torch.equal(torch.from_numpy(index), device.index) and torch.equal(torch.from_numpy(valid),
                                                                                      device.valid)
