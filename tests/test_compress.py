"""Quest, SnapKV and StreamingLLM as FAFO compression functions (fafo_quest, fafo_snapkv) and as lossy decoding."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from baselines.lossy import LossyDecoder
from baselines.vanilla import VanillaDecoder
from fafo.compress.base import FixedRegion
from fafo.compress.quest import Quest
from fafo.compress.snapkv import SnapKV
from fafo.compress.stream import StreamingLLM
from fafo.engine.cache import KVCache
from fafo.errors import ConfigError
from fafo.fafo import FAFODecoder, FAFOState
from tests.conftest import LOSSLESS_MODELS
from tests.lossless import PROMPTS, assert_lossless
from tests.helpers import assert_cache_is_permuted_prefill, region_holds_selection, track_region_after_commits

QUEST = Quest(token_budget=16, page_size=4, dense_layers=1)
SNAP = SnapKV(capacity=8, window=2, kernel=3, local=4)
COMPRESSIONS = {"quest": QUEST, "snapkv": SNAP}


def random_region(compression, n=61, layers=2, heads=2, q_heads=4, dim=8, seed=0, dtype=torch.float32,
                  values=torch.float32):
    """A FixedRegion over a random cache of ``dtype`` holding n entries (slot = position), prefilled with random
    queries; keys, values and queries are random values rounded to ``values``' precision."""
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(layers, 1, heads, n + 8, dim, dtype, "cpu")
    for buf in cache.keys + cache.values:
        buf.copy_(torch.randn(buf.shape, generator=g).to(values))
    rows = compression.prefill_query_rows(n)
    queries = torch.randn(layers, 1, q_heads, len(rows), dim, generator=g).to(values).to(dtype)  # [L, B, H_q, R, D]
    region = FixedRegion(cache, compression, capacity=n + 4)
    keys_before = [k.clone() for k in cache.keys]
    region.prefill(n, queries)
    return region, queries, keys_before


LARGE = {"quest": Quest(token_budget=512, page_size=16), "snapkv": SnapKV(capacity=512)}  # > prompt + generation


@pytest.mark.parametrize("name", LOSSLESS_MODELS)
@pytest.mark.parametrize("compress", list(COMPRESSIONS))
def test_fafo_quest_and_snapkv_are_token_identical(name, compress, engine):
    for n, k in ((1, 1), (8, 2), (40, 6)):  # the FAFO-Stream matrix
        for budget in (COMPRESSIONS[compress], LARGE[compress]):  # smaller and larger than the prompt
            assert_lossless(FAFODecoder(compress=budget, n=n, k=k), engine(name), max_new=24,
                            prompts=[p * 2 for p in PROMPTS])


@pytest.mark.parametrize("compress", [QUEST, SNAP, Quest(token_budget=512), SnapKV(capacity=512)],
                         ids=["quest", "snapkv", "quest>prompt", "snapkv>prompt"])
def test_fixed_region_holds_the_selection_after_every_step(compress, engine, monkeypatch):
    eng = engine("qwen2_gqa_rep")
    checks = track_region_after_commits(monkeypatch)
    ids = eng.tokenizer(PROMPTS[2] * 2).input_ids
    state = FAFOState(FAFODecoder(compress=compress, n=8, k=3), eng, ids, 30)
    state.prefill()
    assert region_holds_selection(state.layout)
    while len(state.history) < len(ids) + 24:
        state.commit(state.step(100))
    assert checks and all(checks)
    assert_cache_is_permuted_prefill(eng, state.layout, state.history)


def test_quest_page_bounds_are_each_pages_key_min_and_max_after_decoding(engine):
    """The pages' min/max keys, folded in as the prompt and then each step's accepted entries are cached, equal the
    min/max over each page's keys read from the cache through the layout, after reselections have moved them."""
    eng = engine("qwen2_gqa_rep")
    ids = eng.tokenizer(PROMPTS[2] * 2).input_ids
    state = FAFOState(FAFODecoder(compress=QUEST, n=8, k=3), eng, ids, 30)
    state.prefill()
    while len(state.history) < len(ids) + 24:
        state.commit(state.step(100))
    region, P = state.layout, QUEST.page_size
    keys = region.cache.kv[0, :, 0]  # [L, H_kv, S, D]
    slots = region.slot_of[..., : region.n]  # [L, H_kv, n]: where each position sits now
    by_position = keys.gather(2, slots[..., None].expand(-1, -1, -1, keys.shape[-1]))  # [L, H_kv, n, D]
    assert not torch.equal(slots, torch.arange(region.n).expand_as(slots))  # entries were moved
    for page in range(-(-region.n // P)):
        part = by_position[:, :, page * P : (page + 1) * P]
        assert torch.equal(region.state["kmax"][:, 0, :, page], part.amax(2))
        assert torch.equal(region.state["kmin"][:, 0, :, page], part.amin(2))


def test_quest_upper_bound_bounds_every_key_of_its_page():
    region, queries, keys = random_region(QUEST)
    for layer in range(2):
        q = queries[layer][:, :, -1]
        ub = QUEST.upper_bound(q, region.state["bounds"][layer], region.state["signs"])  # [1, Hq, pages]
        k = keys[layer][0]  # [H_kv, n, D]
        dots = torch.einsum("hd,hnd->hn", q[0], k.repeat_interleave(2, 0))  # [H_q, n]
        for p in range(ub.shape[-1]):
            page = dots[:, 4 * p : min(4 * p + 4, 61)]  # the cache holds 61 entries
            if page.numel():
                assert (ub[0, :, p : p + 1] >= page - 1e-5).all()


def test_quest_scores_half_precision_keys_in_float32_as_a_float32_cache_does():
    """Half-precision keys and queries: the page bounds are float32 (each page's keys' max and min, exact), the
    scores float32, and the selection the one a float32 cache of the same values makes."""
    half, queries, keys = random_region(QUEST, dtype=torch.float16, values=torch.float16)
    full, _, _ = random_region(QUEST, values=torch.float16)  # the same values in float32
    assert half.state["bounds"].dtype == torch.float32
    first_page = torch.stack([k[0, :, :4].float() for k in keys])  # [L, H_kv, 4, D]
    assert torch.equal(half.state["kmax"][:, 0, :, 0], first_page.amax(2))
    assert torch.equal(half.state["kmin"][:, 0, :, 0], first_page.amin(2))
    q = queries[..., -1, :]  # [L, 1, H_q, D] float16
    scores = QUEST.upper_bound(q, half.state["bounds"][..., :15, :], half.state["signs"])  # the 15 full pages
    assert scores.dtype == torch.float32
    assert torch.equal(scores, QUEST.upper_bound(q.float(), full.state["bounds"][..., :15, :], full.state["signs"]))
    assert torch.equal(QUEST.select(half), QUEST.select(full))


@pytest.mark.parametrize("compress", [QUEST, SNAP], ids=["quest", "snapkv"])
def test_state_bytes_count_what_a_region_allocates(compress):
    """``bench.plan``'s estimate of a compression's state equals what a region over a cache of its widths holds
    after the prefill (every tensor of its state but the captured query, a step's output, and its per-head
    bookkeeping) plus a step's selection mask."""
    from types import SimpleNamespace

    region, _, _ = random_region(compress)  # 2 layers, 2 KV heads, head_dim 8; SnapKV keeps picks of 61 entries
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for key, t in region.state.items() if isinstance(t, torch.Tensor) and key != "query"}
    assert not region.uniform
    held = sum(storages.values()) + region._pos.nbytes + region._slot_of.nbytes
    want = 2 * 2 * region.capacity if isinstance(compress, Quest) else 0  # [L, H_kv, n] bool, n <= capacity
    args = SimpleNamespace(n_layers=2, n_kv_heads=2, head_dim=8)
    assert compress.state_bytes(args, region.capacity) == held + want


def test_quest_selection_equals_brute_force_top_pages_per_kv_head():
    region, queries, keys = random_region(QUEST, n=61)
    sel = QUEST.select(region)  # [L, H_kv, K]
    n_pages = math.ceil(61 / 4)
    for layer in range(2):
        q = queries[layer][0, :, -1]  # [H_q, D]
        for h in range(2):
            scores = []
            for p in range(n_pages - 1):  # every page but the current (last) one
                k = keys[layer][0, h, 4 * p : 4 * p + 4]  # [4, D]
                bound = [sum(max(qi * hi, qi * lo) for qi, hi, lo in zip(q[hq], k.amax(0), k.amin(0)))
                         for hq in (2 * h, 2 * h + 1)]
                scores.append(max(bound))
            top = sorted(range(n_pages - 1), key=lambda p: -scores[p])[: 16 // 4 - 1]
            want = {4 * p + i for p in top for i in range(4)} | set(range(4 * (n_pages - 1), 61))
            assert set(sel[layer, h].tolist()) == want
    assert not torch.equal(sel[:, 0], sel[:, 1])  # KV heads choose their own pages
    for layer in range(2):  # and the region holds each head's own pages
        for h in range(2):
            assert set(region.pos[:, :, : region.region_len][layer, h].tolist()) == set(sel[layer, h].tolist())


@pytest.mark.parametrize("pooling", ["max", "avg"])
def test_snapkv_kept_indices_equal_direct_recomputation(pooling):
    snap = SnapKV(capacity=12, window=3, kernel=5, pooling=pooling, local=4)
    region, queries, keys = random_region(snap, n=40)
    kept = region.state["kept"]  # [L, H_kv, capacity]
    T, w = 40, 3
    for layer in range(2):
        for h in range(2):
            votes = []
            for hq in (2 * h, 2 * h + 1):
                q, k = queries[layer][0, hq], keys[layer][0, h]  # [w, D], [T, D]
                rows = []
                for i in range(w):  # window query i sees keys up to T - w + i
                    logits = (q[i] @ k[: T - w + i + 1].T) / math.sqrt(q.shape[-1])
                    rows.append(torch.softmax(logits, -1)[: T - w])
                v = torch.stack(rows).sum(0)[None, None]
                pool = F.max_pool1d if pooling == "max" else F.avg_pool1d
                votes.append(pool(v, 5, stride=1, padding=2)[0, 0])
            score = torch.stack(votes).mean(0)
            top = set(torch.topk(score, 12 - w).indices.tolist()) | set(range(T - w, T))
            assert set(kept[layer, h].tolist()) == top
    assert not torch.equal(kept[:, 0], kept[:, 1])


@pytest.mark.parametrize("compress", [StreamingLLM(sink=2, local=6), QUEST, SNAP], ids=["stream", "quest", "snapkv"])
def test_lossy_mode_diverges_where_fafo_does_not(compress, engine):
    eng = engine("llama_gqa")
    diverged = []
    for text in PROMPTS:
        ids = eng.tokenizer(text * 2).input_ids
        ref = VanillaDecoder().generate(eng, ids, 30).tokens
        assert FAFODecoder(compress=compress, n=8, k=3).generate(eng, ids, 30).tokens == ref
        diverged.append(LossyDecoder(compress=compress).generate(eng, ids, 30).tokens != ref)
    assert any(diverged)
    big = LossyDecoder(compress=StreamingLLM(sink=4, local=4096))  # C(kv) = everything: lossless again
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    assert big.generate(eng, ids, 30).tokens == VanillaDecoder().generate(eng, ids, 30).tokens


class HostReads(TorchDispatchMode):
    """Counts host reads of device data (``.item()``, ``int()``, ``bool()`` dispatch ``_local_scalar_dense``: each
    a sync on CUDA) and fails on any op whose output shape depends on data (a sync and a dynamic shape)."""

    aten = torch.ops.aten
    DYNAMIC = {aten.nonzero, aten.masked_select, aten._unique2, aten.unique_dim, aten.unique_consecutive,
               aten.repeat_interleave}

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        bool_index = func.overloadpacket in (self.aten.index, self.aten.index_put, self.aten.index_put_) and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())
        if func.overloadpacket in self.DYNAMIC or bool_index:
            raise AssertionError(f"data-dependent shape in a decoding step: {func}")
        self.n += func.overloadpacket is self.aten._local_scalar_dense
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("prompt", [5, 21])
@pytest.mark.parametrize("compress", [StreamingLLM(sink=2, local=6), QUEST, SNAP], ids=["stream", "quest", "snapkv"])
def test_region_update_of_a_step_reads_one_count_and_swaps_only_the_busiest_rows_pairs(compress, prompt, monkeypatch):
    # Steps of 1-4 entries from a prompt inside the budget (5) or past it (21): the region stays exact while
    # commit() reads back at most one value (a selection made on the device: how many entries its busiest row
    # swaps; a host selection reads nothing) and no op has a data-dependent shape, and the per-row swap lists are
    # exactly that long (padded to a bound known without the read, Quest's would list its whole budget per row).
    layers, heads, q_heads, dim, steps = 2, 2, 4, 8, [1, 3, 1, 4, 2, 1, 1, 4, 4, 2, 3, 1, 4, 1, 2, 4]
    capacity = prompt + sum(steps)
    g = torch.Generator().manual_seed(prompt)
    cache = KVCache(layers, 1, heads, capacity + 1 + max(steps), dim, torch.float32, "cpu")
    for buf in cache.keys + cache.values:
        buf.copy_(torch.randn(buf.shape, generator=g))
    ref = [buf[:, :, :capacity].clone() for buf in cache.keys + cache.values]  # KV by position, once committed
    rows = compress.prefill_query_rows(prompt)
    n_rows = 0 if rows is None else len(rows)
    region = FixedRegion(cache, compress, capacity)
    region.prefill(prompt, torch.randn(layers, 1, q_heads, n_rows, dim, generator=g))
    assert region_holds_selection(region)
    widths, move_rows, swapped = [], KVCache.move_rows, 0

    def listed(cache, src, dst):  # the per-row swap lists' width, then the moves
        widths.append(src.shape[-1] // 2)
        move_rows(cache, src, dst)

    monkeypatch.setattr(KVCache, "move_rows", listed)
    for a in steps:
        scratch = torch.arange(capacity, capacity + a)  # the step's new KV, computed beyond the committed slots
        for buf, by_pos in zip(cache.keys + cache.values, ref):
            buf[:, :, scratch] = by_pos[:, :, region.n : region.n + a]
        query = torch.randn(layers, 1, q_heads, 1, dim, generator=g)  # [L, B, H_q, 1, D]
        before, widths[:] = region.pos.clone(), []
        with HostReads() as reads:
            region.commit(scratch, query)
        assert reads.n == (not region.on_host and compress.max_swaps(region, a) > 0)
        n, sel = region.n, compress.select(region).expand(layers, heads, -1)
        # the busiest row's evictions: the entries its region slots held before the swaps that C no longer selects
        K, rows = region.region_len, [(i, h) for i in range(layers) for h in range(heads)]
        evicted = max(int((~torch.isin(before[i, h, :K], sel[i, h])).sum()) for i, h in rows)
        per_row = evicted and not (region.uniform or region.on_host)  # else the same slots of every row move
        assert widths == ([evicted] if per_row else []), widths
        swapped += evicted
        if isinstance(compress, StreamingLLM):  # C(kv) spelled out where it needs no scores
            sink, local = compress.sink, compress.local
            want = list(range(n)) if n <= compress.budget else list(range(sink)) + list(range(n - local, n))
            assert sel.tolist() == [[want] * heads] * layers
        if isinstance(compress, SnapKV):
            recent = torch.arange(max(prompt, n - compress.local), n).expand(layers, heads, -1)
            assert torch.equal(sel, torch.cat([region.state["kept"].expand(layers, heads, -1), recent], -1))
        assert region_holds_selection(region)
        for i, (buf, by_pos) in enumerate(zip(cache.keys + cache.values, ref)):  # each slot holds its entry's KV
            pos = region.pos[i % layers, :, : region.n][None, :, :, None].expand(1, -1, -1, dim)
            assert torch.equal(buf[:, :, : region.n], by_pos.gather(2, pos))
    assert swapped or prompt < compress.budget  # past the budget, every step swaps


@pytest.mark.parametrize("prompt", [5, 21])
@pytest.mark.parametrize("make", [lambda: StreamingLLM(sink=2, local=6), lambda: SnapKV(capacity=8, window=2, local=4)],
                         ids=["stream", "snapkv"])
def test_a_host_selected_region_lays_entries_out_as_the_device_path_does(make, prompt):
    """StreamingLLM's region keeps its one row on the host from the start, SnapKV's from the prefill on (its prompt
    picks differ per head but stay put): after the prefill and every step the layout and the cache equal the device
    path's slot for slot, and a commit launches copies only."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    steps = [1, 3, 1, 4, 2, 1, 1, 4, 4, 2, 3, 1, 4, 1, 2, 4]
    capacity = prompt + sum(steps)
    regions = []
    for where in (None, "device"):
        compress = make()
        if where:
            compress.host_selection = where
        g = torch.Generator().manual_seed(prompt)
        cache = KVCache(2, 1, 2, capacity + 1 + max(steps), 8, torch.float32, "cpu")
        cache.kv.copy_(torch.randn(cache.kv.shape, generator=g))
        rows = compress.prefill_query_rows(prompt)
        queries = torch.randn(2, 1, 4, 0 if rows is None else len(rows), 8, generator=g)  # [L, B, H_q, R, D]
        regions.append(FixedRegion(cache, compress, capacity))
        regions[-1].prefill(prompt, queries)
    host, device = regions
    assert host.on_host and not device.on_host
    assert isinstance(host.compression, SnapKV) == (host.frozen > 0)
    for a in [0] + steps:
        if a:
            with Ops() as ops:
                host.commit(list(range(capacity, capacity + a)))
            assert ops.names <= {"slice", "clone", "copy_"}, ops.names
            device.commit(list(range(capacity, capacity + a)))
        assert host.region_len == device.region_len
        assert torch.equal(host.pos, device.pos) and torch.equal(host.slot_of, device.slot_of)
        assert torch.equal(host.cache.kv, device.cache.kv)
        assert region_holds_selection(host)


def test_bad_compression_settings_are_refused():
    for make in (lambda: Quest(token_budget=8, page_size=16), lambda: Quest(gqa_reduce="sum"),
                 lambda: SnapKV(window=64, capacity=32), lambda: SnapKV(kernel=4), lambda: SnapKV(local=0),
                 lambda: SnapKV(pooling="min"), lambda: SnapKV(gqa_reduce="sum")):
        with pytest.raises(ConfigError, match="method.compress"):
            make()
    with pytest.raises(ConfigError, match=r"^method.compress.gqa_reduce='sum' must be one of max, mean \("):
        Quest(gqa_reduce="sum")
    with pytest.raises(ConfigError, match=r"^method.compress.pooling='min' must be one of max, avg \("):
        SnapKV(pooling="min")
    with pytest.raises(ConfigError, match=r"^method.compress.kernel=4 must be odd"):
        SnapKV(kernel=4)


@pytest.mark.parametrize("compress,knobs", [
    (StreamingLLM(sink=4, local=5000), "method.compress.sink or method.compress.local"),
    (Quest(token_budget=4096), "method.compress.token_budget"),
    (SnapKV(capacity=4000, local=256), "method.compress.capacity or method.compress.local"),
])
def test_a_region_as_large_as_the_context_names_the_settings_that_size_it(compress, knobs):
    with pytest.raises(ConfigError, match=f"compresses nothing; lower {knobs} below 4096$"):
        compress.check_fits(4096)
    compress.check_fits(compress.budget + 1)  # a smaller region is fine
