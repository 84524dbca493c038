"""Batch > 1: the engine's batched forward (fafo/engine/batching.py) computes each request's step as it would alone,
and every method that decodes a batch (fafo/batch.py) gives each request the tokens of its greedy decode alone, at
B = 4 with ragged prompts and rows that end at different steps (EOS, max_new_tokens, a one-token answer, an answer
ended by its first token), in static and continuous batching; methods that learn nothing across requests also
accept exactly what they accept alone. Sampled batches draw what each request draws alone and follow vanilla's law.
Compiled batches (aot_eager + FlexAttention, inductor + SDPA) are in the slow tier."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from baselines.longspec import LongSpecDecoder
from baselines.lossy import LossyDecoder
from baselines.quantspec import Int8KVReference, QuantSpecDecoder
from baselines.suffix_index import SuffixIndex
from baselines.swift import SwiftDecoder
from baselines.token_recycling import TokenRecyclingDecoder
from baselines.triforce import TriForceDecoder
from fafo.batch import BATCHING, Request, check_batch as check_batch_size, decode_batch
from fafo.engine import attention
from fafo.engine.attention import AttentionPlan
from fafo.engine.compiled import CompileOptions
from fafo.engine.engine import Engine
from fafo.engine.batching import (StepInputs, StepLogits, argmax_rows, batch_bucket, forward_one, forward_rows,
                                  greedy_chain, host_logits)
from fafo.errors import ConfigError
from fafo.fafo import fafo_step_mask
from fafo.sampling import Sampling
from fafo.sampling_check import compare, run_many
from fafo.tree import DraftTree, tree_inputs
from tests.helpers import ReadsOnTheHost, compose_with
from tests.batch_cases import (B, CONFIGS, CROSS_REQUEST, METHODS, alone, assert_as_alone, check_batch,
                               check_compiled, compiled_engine, learnt, ragged_requests, run_batch)
from tests.methods import METHOD_CONF, METHODS as METHOD_CONFIGS, sampling_cases
from tests.sampling_law import K, SAMPLES, SAMPLING, passes


# ------------------------------------------------------------------ the batched forward
def _rows(eng, prompts):
    """Step inputs of several kinds on ragged prefixes: a tree, a causal chain, one token, a root alone."""
    trees = [DraftTree.from_paths(7, [[8, 9, 10], [8, 11], [12]]), DraftTree.root(5)]
    steps = [tree_inputs(trees[0], len(prompts[0])), tree_inputs(trees[1], len(prompts[1]))]
    n = len(prompts[2])
    steps.append(StepInputs([3, 4, 5], range(n, n + 3), range(n, n + 3), AttentionPlan(prefix=n), logits="last"))
    n = len(prompts[3])
    steps.append(StepInputs([9], [n], [n], AttentionPlan(prefix=n)))
    return steps


def _prefilled(eng, prompts):
    batch = eng.new_cache(256, batch=len(prompts))
    single = [eng.new_cache(256) for _ in prompts]
    for b, p in enumerate(prompts):
        eng.prefill(batch.row(b), p)
        eng.prefill(single[b], p)
    return batch, single


@pytest.mark.parametrize("backend", ["sdpa", "dense", "flex"])
@pytest.mark.parametrize("name", ["llama_mha", "qwen2_gqa"])
def test_batched_forward_equals_each_request_alone(name, backend, engine):
    """Ragged prefixes, a different kind of step in each row (mask, causal, one token): each row's logits and the
    KV it writes equal its step alone; then every row's one-token step (the fused vanilla path) too."""
    eng = engine(name, backend)
    prompts = [list(range(5, 17)), list(range(3, 40)), list(range(40, 47)), list(range(60, 90))]
    batch, single = _prefilled(eng, prompts)
    steps = _rows(eng, prompts)
    out, _, counts, width = forward_rows(eng, batch, steps)
    assert width == max(len(s.tokens) for s in steps)
    for b, step in enumerate(steps):
        ref = forward_one(eng, single[b], [step]).outs[0][0]
        torch.testing.assert_close(out[b, : counts[b]], ref, atol=2e-5, rtol=0)
        n = len(prompts[b]) + len(step.tokens)
        torch.testing.assert_close(batch.kv[:, :, b, :, :n], single[b].kv[:, :, 0, :, :n], atol=1e-5, rtol=0)
    vanilla = [StepInputs([11 + b], [len(p)], [len(p)], AttentionPlan(prefix=len(p)), "last")
               for b, p in enumerate(prompts)]
    out, _, counts, _ = forward_rows(eng, batch, vanilla)
    for b, step in enumerate(vanilla):
        torch.testing.assert_close(out[b, :1], forward_one(eng, single[b], [step]).outs[0][0], atol=2e-5, rtol=0)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_batched_region_step_equals_each_request_alone(backend, engine):
    """FAFO's fused step (one shared mask, stream queries over each row's own fixed region) on ragged rows."""
    eng = engine("llama_gqa", backend)
    prompts = [list(range(5, 30)), list(range(3, 12)), list(range(40, 70))]
    batch, single = _prefilled(eng, prompts)
    m, k, n = 2, 3, 3
    mask = fafo_step_mask(m, k, n)
    steps = []
    for b, p in enumerate(prompts):
        P, Q = len(p), 1 + m * k + n * k
        plan = AttentionPlan(prefix=P, step_mask=mask, region_from=1 + m * k, region_len=[8, 5, 8][b],
                             region_capacity=8)
        steps.append(StepInputs(list(range(20, 20 + Q)), list(range(P, P + Q)), range(200, 200 + 1 + m * k), plan))
    out, _, counts, _ = forward_rows(eng, batch, steps)
    for b, step in enumerate(steps):
        torch.testing.assert_close(out[b, : counts[b]], forward_one(eng, single[b], [step]).outs[0][0], atol=2e-5,
                                   rtol=0)


def test_one_device_read_per_step_whatever_the_batch(engine, monkeypatch):
    """The argmax of every row of every forward of a step (FAFO-2forward: two) comes back in one read."""
    eng = engine("llama_gqa")
    requests = ragged_requests(eng)
    reads = []
    real = StepLogits._read
    monkeypatch.setattr(StepLogits, "_read", lambda self, *args, **kw: reads.append(1) or real(self, *args, **kw))
    result = decode_batch(METHODS["fafo_2forward"](), eng, requests, B, "continuous")
    assert max(len(s.requests) for s in result.steps) == B and len(reads) == len(result.steps)


# ------------------------------------------------------------------ every method, every request as alone
@pytest.mark.parametrize("batching", BATCHING)
@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_request_equals_its_greedy_decode_alone(name, batching, engine):
    """High acceptance (a repetitive model), GQA Qwen2: tokens as alone; acceptance as alone (unless learnt
    across requests); each batched forward carries exactly the active requests (finished ones cost nothing)."""
    eng = engine("qwen2_gqa_rep")
    requests = ragged_requests(eng)
    eng.ledger.log = []
    try:
        result = run_batch(name, eng, batching, requests)
        decode = [r.batch for r in eng.ledger.log if r.kind != "prefill"]
    finally:
        eng.ledger.log = None
    assert_as_alone(f"{name} {batching}", eng, requests, result)
    if name not in CROSS_REQUEST:
        for gen, ref in zip(result.generations, alone(METHODS[name], eng, requests)):
            assert gen.accept_lengths == ref.accept_lengths  # and so the same forwards (padding aside)
            assert replace(gen.forwards, tokens=0) == replace(ref.forwards, tokens=0)
    sizes = [len(s.requests) for s in result.steps]
    per_step = len(decode) // len(sizes)  # FAFO-2forward: a fumble and a verification forward
    assert decode == [n for n in sizes for _ in range(per_step)]  # rows of each forward = active requests
    seen = set()
    for prev, step in zip([None] + result.steps, result.steps):
        if batching == "continuous" and len(step.requests) < B:  # the batch is short only when none waits
            assert all(t.admitted_s < step.end_s for t in result.times)
        if batching == "static" and prev is not None:  # a batch only loses requests until the next one starts
            assert set(step.requests) <= set(prev.requests) or not set(step.requests) & seen
        seen |= set(step.requests)


@pytest.mark.parametrize(("model", "batching", "batch_size"), [("llama_mha", "static", 3),
                                                               ("llama_gqa", "continuous", B)])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_low_acceptance(name, model, batching, batch_size, engine):
    """Near-zero acceptance (varied text), MHA and GQA Llama, batches of 3 and 4 over 7 requests."""
    eng = engine(model)
    check_batch(name, eng, batching, ragged_requests(eng), batch_size=batch_size)


@pytest.mark.parametrize("name", ["vanilla", "token_recycling", "lookahead", "fafo_quest", "fafo_2forward"])
def test_flex_attention(name, engine):
    eng = engine("qwen2_gqa_rep", "flex")
    check_batch(name, eng, "continuous", ragged_requests(eng)[:5])


@pytest.mark.parametrize("name", ["prompt_lookup", "lookahead", "fafo_stream"])
def test_static_shapes_padding(name, engine, monkeypatch):
    """Under engine.static_shapes (compiled steps) rows are padded to the method's static size: same tokens."""
    eng = engine("llama_gqa")
    monkeypatch.setattr(eng, "static_shapes", True)
    check_batch(name, eng, "static", ragged_requests(eng))


@pytest.mark.parametrize("batching", BATCHING)
def test_result_accounts_for_every_request_and_step(batching, engine):
    """What a caller reads (fafo/batch.py's docstring): each request's committed tokens per step add up to its
    answer, its steps are those it was active in, its times are ordered within the run's, and no step has more
    than B requests."""
    eng = engine("qwen2_gqa_rep")
    requests = ragged_requests(eng)
    result = run_batch("lookahead", eng, batching, requests)
    for i, (gen, t) in enumerate(zip(result.generations, result.times)):
        mine = [s.new_tokens[s.requests.index(i)] for s in result.steps if i in s.requests]
        assert mine == gen.accept_lengths and 1 + sum(mine) == len(gen.tokens)
        ends = [s.end_s for s in result.steps if i in s.requests]
        assert result.start_s <= t.admitted_s <= t.first_token_s <= t.finished_s
        assert all(t.first_token_s < e <= t.finished_s for e in ends)
    assert all(1 <= len(s.requests) <= B and s.requests == sorted(s.requests) for s in result.steps)
    assert [s.end_s for s in result.steps] == sorted(s.end_s for s in result.steps)


def test_batch_of_one_is_the_single_request_loop(engine):
    """B = 1 runs the requests one after another through the batched path: same tokens, acceptance, forwards and
    run-wide state as :func:`fafo.decoding.decode` (Token Recycling's matrix learnt across requests)."""
    eng = engine("qwen2_gqa_rep")
    requests = ragged_requests(eng)
    batched = TokenRecyclingDecoder()
    batched.setup(eng)
    result = decode_batch(batched, eng, requests, 1)
    single = TokenRecyclingDecoder()
    single.setup(eng)
    for gen, r in zip(result.generations, requests):
        ref = single.generate(eng, r.prompt_ids, r.max_new_tokens, r.eos_ids)
        assert (gen.tokens, gen.accept_lengths, gen.forwards) == (ref.tokens, ref.accept_lengths, ref.forwards)
    assert np.array_equal(batched.adjacency, single.adjacency)


@pytest.mark.parametrize("name", sorted(CROSS_REQUEST))
def test_run_wide_state_is_learnt_in_request_order(name, engine):
    """A shared matrix or tree, updated request by request in request order: the same batch gives the same
    acceptance and the same learnt state on every run, static and continuous alike."""
    eng = engine("qwen2_gqa_rep")
    requests = ragged_requests(eng)
    runs = []
    for _ in range(2):
        method = METHODS[name]()
        method.setup(eng)
        result = decode_batch(method, eng, requests, B, "continuous")
        runs.append(([g.accept_lengths for g in result.generations], learnt(method)))
    assert runs[0] == runs[1]


# ------------------------------------------------------------------ sampling
@pytest.mark.parametrize("name", sorted(set(METHODS) - CROSS_REQUEST))
def test_sampled_requests_draw_what_they_draw_alone(name, engine):
    """Each request keeps its own generator and the method's exact rule: a batch draws each request's tokens as
    it draws them alone (so the batch is exact in distribution whenever the method is). Methods that learn across
    requests draft otherwise in a batch, so they draw otherwise: their law is checked below."""
    eng = engine("qwen2_gqa_rep")
    sampling = Sampling(temperature=0.8, top_k=8, seed=3)
    requests = [Request(r.prompt_ids, r.max_new_tokens, r.eos_ids, sampling.generator(i))
                for i, r in enumerate(ragged_requests(eng))]
    method = METHODS[name]()
    method.setup(eng)
    result = decode_batch(method, eng, requests, B, "continuous", sampling)
    again = [Request(r.prompt_ids, r.max_new_tokens, r.eos_ids, sampling.generator(i)) for i, r in enumerate(requests)]
    want = alone(METHODS[name], eng, again, sampling)
    assert [g.tokens for g in result.generations] == [g.tokens for g in want]


SAMPLED = {name: case for name, case in sampling_cases().items() if name in CONFIGS}


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_batched_sampling_matches_vanilla_law(name, law):
    """tests/test_sampling.py's chi-square test, the generations decoded four at a time."""
    eng, ids, joint = law(SAMPLED[name][0])
    method = SAMPLED[name][1]()
    method.setup(eng)
    seqs, tau = run_many(method, eng, ids, SAMPLING, K, SAMPLES, batch_size=B)
    assert tau > 1.1, f"{name}: too few accepted guesses (tau {tau:.3f}) for the test to mean anything"
    rows = compare(seqs, joint, K)
    assert passes(rows), rows


# ------------------------------------------------------------------ what cannot be batched, and the pieces
@pytest.mark.parametrize("cls", [TriForceDecoder, QuantSpecDecoder, Int8KVReference, LongSpecDecoder, SwiftDecoder,
                                 LossyDecoder])
def test_methods_that_cannot_batch_refuse_in_one_line(cls):
    check_batch_size(cls, 1)
    with pytest.raises(ConfigError, match=r"bench\.batch_size=4 .*; set bench\.batch_size=1$") as err:
        check_batch_size(cls, 4)
    assert "\n" not in str(err.value)


def test_every_method_config_says_whether_it_batches():
    """Each conf/method/ config's decoder class decodes a batch exactly when it is listed (tests/batch_cases.py)."""
    from hydra.utils import get_class

    names = {p.stem for p in METHOD_CONF.glob("*.yaml")}
    assert names == set(METHOD_CONFIGS) and CONFIGS <= names
    for name in sorted(names):
        cls = get_class(compose_with(f"method={name}").method._target_)
        assert (not cls.batch_refusal) == (name in CONFIGS), name


def test_rows_of_the_cache_are_views_that_move(engine):
    eng = engine("llama_gqa")
    cache = eng.new_cache(16, batch=3)
    row = cache.row(1)
    eng.prefill(row, [5, 6, 7])
    assert cache.kv[:, :, 1, :, :3].abs().sum() > 0 and cache.kv[:, :, [0, 2]].abs().sum() == 0
    cache.copy_row(1, 2, 3)
    row.bind(cache.kv[:, :, 2:3])
    assert torch.equal(row.kv[:, :, 0], cache.kv[:, :, 1]) and cache.rows(2) is cache.rows(2)
    assert [batch_bucket(n, 6) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]


def test_an_older_sequence_can_grow_again():
    """SuffixDecoding's global tree grows each request of a batch in turn: the same occurrences as if each
    sequence had been written whole."""
    grown, whole = SuffixIndex(8), SuffixIndex(8)
    seqs = {0: [1, 2, 3, 1, 2], 1: [2, 3, 1], 2: [3, 1, 2, 3, 4]}
    for chunk in range(3):
        for seq_id, tokens in seqs.items():
            grown.extend(seq_id, tokens[chunk * 2 : chunk * 2 + 2])
    for seq_id, tokens in seqs.items():
        whole.extend(seq_id, tokens)
    for pattern in ([1], [2, 3], [1, 2], [3, 1, 2], [2, 3, 1], [4]):
        assert grown.count(pattern) == whole.count(pattern), pattern
    assert len(grown) == len(whole) == sum(len(t) for t in seqs.values())


# ------------------------------------------------------------------ compiled batches (slow: cold compiles)
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(METHODS))
def test_compiled_flex_batches_are_token_identical_and_compile_once(name, checkpoint, engine, fresh_dynamo):
    """aot_eager + FlexAttention (the path CUDA compiles): BlockMasks with a batch dimension, [B] live lengths."""
    compiled = compiled_engine(checkpoint, "qwen2_gqa_rep", CompileOptions(backend="aot_eager", attention="flex"))
    eager = engine("qwen2_gqa_rep")
    check_compiled(name, eager, compiled, ragged_requests(eager))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vanilla", "fafo_stream"])
def test_compiled_sdpa_batches_are_token_identical_and_compile_once(name, checkpoint, engine, fresh_dynamo):
    """inductor + SDPA (CPU's compiled path): live prefixes as dynamic sizes, [B] lengths masking each row."""
    compiled = compiled_engine(checkpoint, "llama_gqa", CompileOptions(backend="inductor", attention="sdpa"))
    eager = engine("llama_gqa")
    check_compiled(name, eager, compiled, ragged_requests(eager)[:5])


# ------------------------------------------------------------------ what a GPU relies on, checked on the CPU
@pytest.mark.parametrize("name", ["token_recycling", "fafo_quest"])  # one mask per request; one for all + regions
def test_flex_calls_keep_their_single_request_shapes(name, engine, monkeypatch):
    """The kernel routing (fafo/engine/flex_routing.py, held for every preset's step shapes by
    tests/test_kernel_routing.py) depends on a call's query count and heads, not its batch (torch's
    ``_use_flex_decoding`` asks only that the batch be static): a batched step makes the calls one request makes,
    with BlockMasks of one head whose batch is 1 (shared) or B (one mask per request)."""
    eng = engine("qwen2_gqa_rep", "flex")
    requests = ragged_requests(eng)[:5]
    calls = {"alone": set(), "batch": set()}
    mode = ["alone"]
    real_route, real_call = attention.flex_route, attention.flex_attention_lse

    def route(q_len, hq, hkv, *a, **kw):
        calls[mode[0]].add((q_len, hq, hkv))
        return real_route(q_len, hq, hkv, *a, **kw)

    def call(fn, q, k, v, block_mask, *a, **kw):
        if block_mask is not None:
            assert block_mask.kv_num_blocks.shape[1] == 1 and block_mask.kv_num_blocks.shape[0] in (1, q.shape[0])
        return real_call(fn, q, k, v, block_mask, *a, **kw)

    monkeypatch.setattr(attention, "flex_route", route)
    monkeypatch.setattr(attention, "flex_attention_lse", call)
    alone(METHODS[name], eng, requests)
    mode[0] = "batch"
    run_batch(name, eng, "continuous", requests)
    assert calls["batch"] and calls["batch"] <= calls["alone"]


@pytest.mark.slow
def test_cuda_graphs_record_batched_steps(checkpoint, engine, fresh_dynamo):
    """With CUDA graphs every tensor a batched compiled step writes (each row view's keys and values) is a static
    input, as cudagraph trees require: torch (2.11, 2.13) makes an input static when it carries
    ``_dynamo_static_input_type`` (``_functorch/_aot_autograd/frontend_utils.py``, static_input_indices) and
    records no graph that mutates any other input (``_inductor/cudagraph_utils.py: check_for_mutation``). Traced
    here by a backend that reads the same placeholder metadata inductor does."""
    import functools

    from fafo.engine.ledger import model_call

    eng = Engine.from_pretrained(str(checkpoint("qwen2_gqa_rep")))
    eng.enable_compile(CompileOptions(mode="reduce-overhead", attention="flex"))  # caches marked for CUDA graphs
    written = []

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_method" and node.target.endswith("_") and node.args[0].op == "placeholder":
                written.append(node.args[0].meta.get("tensor_dict", {}).get("_dynamo_static_input_type"))
        return gm.forward

    traced = torch.compile(eng.model.forward, backend=backend, dynamic=False, fullgraph=True)
    eng.compiled.fn = functools.partial(model_call, traced, device=eng.device)
    requests = ragged_requests(engine("qwen2_gqa_rep"))[:5]
    for name in ("vanilla", "fafo_stream"):
        assert_as_alone(name, engine("qwen2_gqa_rep"), requests, run_batch(name, eng, "static", requests))
    assert written and set(written) == {"unguarded"}, written


@pytest.mark.parametrize("name", ["vanilla", "prompt_lookup", "token_recycling", "sam_decoding", "lookahead"])
def test_host_work_per_step_does_not_grow_with_the_batch(name, engine):
    """Outside its forwards a batched step launches what one request's step does (fafo/bench/tools/host_probe.py's
    probe): one upload per forward and one for every row's KV moves, one read of every row's argmax (and top-k),
    two ops for the moves (counted over steps that no request finished before: a finished request adds the copy
    that moves the last one into its row). FAFO's per-request region swaps are per row: its step grows with B."""
    from fafo.bench.tools.host_probe import HostWork

    eng = engine("qwen2_gqa_rep")
    texts = ["The quick brown fox", "def fibonacci(n):\n    if n < 2:", "1, 2, 3, 4, 5, 6", "The quick brown fox" * 3]
    requests = [Request(eng.tokenizer(t).input_ids, 12) for t in texts]
    work = {}
    for batch in (1, 4):
        method = METHODS[name]()
        method.setup(eng)
        decode_batch(method, eng, requests[:batch], batch)  # step structures built once per run (Lookahead's)
        with HostWork([eng]) as probe:
            steps = decode_batch(method, eng, requests[:batch], batch).steps
        # the probe counts from the end of one step to the end of the next (the first step is not counted)
        kept = [w for w, a, b in zip(probe.steps, steps, steps[1:]) if a.requests == b.requests]
        work[batch] = {k: max(w[k] for w in kept) for k in ("ops", "h2d", "d2h")}
    assert work[4] == work[1] and work[4]["h2d"] <= 2 and work[4]["d2h"] <= 2, work


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_host_argmax_reads_what_the_device_argmax_reads(dtype):
    """``argmax_rows`` reads CPU logits by numpy and falls back to torch's op under a torch mode (a probe counting
    what a device runs): both give torch's answer, ties (the first index) and NaN (counted largest) included."""
    from torch.overrides import TorchFunctionMode

    class Calls(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    logits = torch.randn(2, 7, 33, generator=torch.Generator().manual_seed(1), dtype=dtype).round()  # many ties
    logits[0, 2, 5] = logits[1, 4, 30] = float("nan")
    expected = logits.argmax(-1).tolist()
    assert argmax_rows(logits) == expected and argmax_rows(logits[0]) == expected[0]
    assert all(argmax_rows(logits[1, r]) == expected[1][r] for r in range(7))  # one row: one int
    with Calls() as calls:
        assert argmax_rows(logits) == expected
    assert "argmax" in calls.names


@pytest.mark.parametrize("stop, length", [((), 8), ((15,), 3), ((5, 4), 2)])  # the chain: 8 4 15 5 8 4 15 5
def test_a_greedy_chain_on_a_device_is_read_once_and_equals_the_host_chain(stop, length):
    """``greedy_chain`` on host logits reads each token and stops after a stop token; on a device (any torch mode on
    the stack: the CPU takes the device's path) each token is written to its buffer, fed from there and the chain is
    read once, the forwards past a stop token run and are cut: the same tokens, each forward fed its predecessor.
    The forwards are :meth:`Engine.forward`'s greedy ones: the argmax token, written ``into`` the buffer where the
    engine does (not where numpy reads it)."""
    table = torch.randn(16, 16, generator=torch.Generator().manual_seed(2))  # next-token logits of each token

    def chain(fed):
        def forward(feed, i, into):
            feed = torch.as_tensor(feed).view(-1)
            fed.append([int(t) for t in feed])
            row = table[feed[-1]][None, None]  # [1, 1, V]
            if host_logits([row]):
                return torch.from_numpy(row.numpy().argmax(-1))
            return torch.argmax(row, -1, out=into)
        return forward

    host_fed, device_fed = [], []
    want = greedy_chain(chain(host_fed), [5], 8, torch.empty(8, dtype=torch.long), stop)
    chain_buffer = torch.empty(8, dtype=torch.long)
    with ReadsOnTheHost() as reads:
        got = greedy_chain(chain(device_fed), [5], 8, chain_buffer, stop)
    assert got == want and reads.n == 1
    assert host_fed == [[5]] + [[t] for t in want[:-1]] and device_fed[: len(want)] == host_fed
    assert chain_buffer[: len(want)].tolist() == want  # where the device path left its tokens
    assert len(want) == length and len(device_fed) == 8  # the device does not see the stop token
