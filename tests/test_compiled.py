"""Compiled decode steps (``bench.compile``): token-identical to eager, and no recompilation across steps/samples.

Two compiled paths are checked against eager vanilla greedy on CPU:

* ``aot_eager`` + FlexAttention: the path CUDA runs (static plans, in-place BlockMask lengths), traced by dynamo
  and AOTAutograd and run without code generation (inductor cannot lower flex's log-sum-exp output on CPU);
* ``inductor`` + SDPA: real code generation on CPU (the ``auto`` choice there), marked slow.

Compiles are counted with ``torch._dynamo``'s counters: the first generation compiles a fixed set of graphs,
later generations on prompts of other lengths (and other acceptance) compile none.
"""

import re

import pytest
import torch

from baselines.lossy import LossyDecoder
from baselines.token_recycling import TokenRecyclingDecoder
from fafo.engine.attention import causal_plan
from fafo.engine.compiled import COMPILE_MODES, CompileOptions, compile_stats
from fafo.engine.engine import Engine
from fafo.engine.tiny import tiny_checkpoint
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.errors import ConfigError
from tests.compiled_cases import CAPACITY, METHODS, SAMPLES, SMALL, WARMUP, check_compiled, compiled_engine
from tests.helpers import make_cfg, read_rows

pytestmark = pytest.mark.slow  # cold torch.compile runs: the full tier (make test), not make test-fast

@pytest.mark.parametrize("method_name", list(METHODS))
@pytest.mark.parametrize("model", ["llama_mha_rep", "qwen2_gqa"])
def test_compiled_flex_is_token_identical_and_compiles_once(method_name, model, engine, checkpoint, fresh_dynamo):
    compiled = compiled_engine(checkpoint, model, CompileOptions(backend="aot_eager", attention="flex"))
    check_compiled(method_name, engine(model), compiled, max_new=24)


@pytest.mark.slow
@pytest.mark.parametrize("method_name", list(METHODS))
def test_compiled_inductor_is_token_identical(method_name, engine, checkpoint, fresh_dynamo):
    compiled = compiled_engine(checkpoint, "llama_gqa", CompileOptions(backend="inductor", attention="auto"))
    assert compiled.step_backend == "sdpa"
    check_compiled(method_name, engine("llama_gqa"), compiled, max_new=16)


# GQA group 3 (SmolLM2-135M's 9/3): the compiled flex calls pad it to 4 (fafo.engine.flex_routing)
GROUP3 = dict(family="llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=2, seed=12)


@pytest.mark.parametrize("method_name", ["vanilla", "fafo_stream", "lookahead", "token-recycling"])
def test_compiled_flex_pads_groups_exactly(method_name, ckpt_root, fresh_dynamo):
    """A group that is not a power of two: the traced calls pad it (and Token Recycling's 81-row trees, 81 x 4
    rows, take BLOCK_M = 128: tests/test_kernel_routing.py), traced the way CUDA compiles them; tokens equal
    eager vanilla's on the sdpa path."""
    path = str(tiny_checkpoint(GROUP3, ckpt_root))
    eager = Engine.from_pretrained(path)
    compiled = Engine.from_pretrained(path)
    compiled.enable_compile(CompileOptions(backend="aot_eager", attention="flex"))
    compiled.cache(CAPACITY)
    if method_name != "token-recycling":
        return check_compiled(method_name, eager, compiled, max_new=16)
    method = TokenRecyclingDecoder()
    method.setup(compiled)
    graphs = []
    for text in [WARMUP] + SAMPLES:
        ids = compiled.tokenizer(text).input_ids
        assert method.generate(compiled, ids, 16).tokens == METHODS["vanilla"]().generate(eager, ids, 16).tokens
        graphs.append(compile_stats()["graphs"])
    assert graphs[0] >= 1 and set(graphs) == {graphs[0]}  # compiled in the first generation only


def test_lossy_compiled_equals_lossy_eager(engine, checkpoint, fresh_dynamo):
    """Lossy decoding is not vanilla, but compiling it must not change a token."""
    compiled = compiled_engine(checkpoint, "llama_gqa", CompileOptions(backend="aot_eager", attention="flex"))
    for text in [WARMUP] + SAMPLES:
        ids = compiled.tokenizer(text).input_ids
        want = LossyDecoder(compress=SMALL).generate(engine("llama_gqa"), ids, 24).tokens
        assert LossyDecoder(compress=SMALL).generate(compiled, ids, 24).tokens == want


def test_live_length_is_read_from_tensors(checkpoint, fresh_dynamo):
    """The compiled plan reads the whole static cache: the live prefix is a tensor and the BlockMask's active
    KV blocks follow it, so a step at another length is the same graph with other tensor values."""
    eng = compiled_engine(checkpoint, "llama_gqa", CompileOptions(backend="aot_eager", attention="flex"))
    cache = eng.cache(CAPACITY)
    step = eng.compiled
    for prefix in (5, 200, 129):
        plan = step.static_plan(cache, causal_plan(prefix), 1)
        assert plan.prefix == cache.max_len and int(plan.prefix_length) == prefix
        bm = plan.prefix_block_mask
        assert bm.seq_lengths == (1, cache.max_len)
        assert int(bm.kv_num_blocks.max()) == -(-prefix // bm.BLOCK_SIZE[1])  # the dead tail is skipped


@pytest.mark.parametrize("overrides", [
    ["bench.compile_backend=aot_eager", "bench.compile_attention=flex"],
    pytest.param([], marks=pytest.mark.slow),  # inductor + sdpa: CPU's default compiled path
], ids=["aot_eager-flex", "inductor"])
def test_runner_compiles_in_warmup_only(overrides, tmp_path, fresh_dynamo):
    """Multi-turn samples of different lengths: the warm-up compiles, no timed row does, tokens stay exact."""
    cfg = make_cfg(tmp_path, "method=fafo_stream", "method.n=4", "method.k=3", "bench.compile=true",
                   "bench.max_new_tokens=12", "bench.max_samples=5", *overrides)
    run_dir = tmp_path / "run"
    summary = Runner().run(resolve(cfg, run_dir))
    rows = read_rows(run_dir)
    assert len(rows) > 5 and {r["status"] for r in rows} == {"ok"}  # two-turn samples included
    assert len({r["prompt_tokens"] for r in rows}) > 3
    assert all(r["exact_match"] == "True" for r in rows)
    assert all(r["compiles"] == "0" for r in rows), [r["compiles"] for r in rows]
    assert summary["compiled_graphs"] >= 2 and summary["compile_s"] > 0  # vanilla's step and FAFO's
    assert summary["compile"]["mode"] == "default" and summary["step_attention"] in ("flex", "sdpa")


@pytest.mark.parametrize("overrides,message", [
    (["bench.compile=maybe"], "bench.compile='maybe'"),
    (["bench.compile=true", "bench.compile_mode=reduce-overhead"], "needs a CUDA device"),
    (["bench.compile=true", "bench.compile_mode=max-autotune"], "use bench.compile_mode=max-autotune-no-cudagraphs"),
    (["bench.compile=true", "bench.compile_mode=fastest"], "(a torch.compile mode)"),
    (["bench.compile=true", "bench.compile_attention=flex"], "bench.compile_backend=aot_eager"),
])
def test_bad_compile_settings_fail_before_loading(overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(make_cfg(tmp_path, *overrides), tmp_path / "run")


def test_compile_is_off_by_default_on_cpu(tmp_path):
    assert resolve(make_cfg(tmp_path), tmp_path / "run").compile is None


@pytest.mark.parametrize("method_name", ["prompt_lookup", "token_recycling", "fafo_stream"])  # chain, tree, region
def test_compiled_flex_over_a_long_cache_equals_eager(method_name, engine, checkpoint, fresh_dynamo, monkeypatch):
    """Over a cache of 4096 slots (block masks whose live blocks are a small part of it), compiled flex steps traced
    the way CUDA compiles them give eager vanilla's tokens, and nothing recompiles."""
    from baselines.prompt_lookup import PromptLookupDecoder

    monkeypatch.setitem(METHODS, "prompt_lookup", PromptLookupDecoder)
    monkeypatch.setitem(METHODS, "token_recycling", TokenRecyclingDecoder)
    compiled = compiled_engine(checkpoint, "qwen2_gqa", CompileOptions(backend="aot_eager", attention="flex"))
    compiled.cache(4096)
    check_compiled(method_name, engine("qwen2_gqa"), compiled, max_new=16)


def test_a_static_step_mask_takes_one_of_two_widths():
    """Under static shapes a step of Q queries gathers key lists of two widths only: the widest sparse one for every
    tree that is sparse enough, Q otherwise (the dense kernel); each covers the busiest query."""
    from fafo.engine.kernels import GATHER_MAX_DENSITY, gather_width

    for Q in range(2, 600):
        widths = {gather_width(keys, Q, static=True) for keys in range(1, Q + 1)}
        assert len(widths) <= 2 and Q in widths
        for keys in range(1, Q + 1):
            free, static = gather_width(keys, Q), gather_width(keys, Q, static=True)
            assert keys <= free <= static and (static == Q or static <= GATHER_MAX_DENSITY * Q)
            assert (free <= GATHER_MAX_DENSITY * Q) == (static <= GATHER_MAX_DENSITY * Q)  # same kernel as eager


@pytest.mark.parametrize("method_name", ["prompt_lookup", "swift"])
@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_trees_of_every_depth_reuse_the_warmed_graphs(attention, method_name, engine, checkpoint, fresh_dynamo):
    """After warm_shapes alone (the runner calls it after its warm-up generation, which may draft only shallow or
    only deep trees), a tree of any depth, 1 to its padded size - 1, compiles nothing: under sdpa its key lists take
    one of two widths per step size and the warm-up steps read a live prefix length as real steps do. The logits
    equal the eager engine's on the same cache contents."""
    from baselines.prompt_lookup import PromptLookupDecoder
    from baselines.swift import SwiftDecoder
    from fafo.tree import DraftTree, verify_tree

    compiled = compiled_engine(checkpoint, "llama_gqa", CompileOptions(backend="aot_eager", attention=attention))
    eager = engine("llama_gqa")
    method = PromptLookupDecoder(num_tokens=12) if method_name == "prompt_lookup" else \
        SwiftDecoder(optimization=False, max_step_draft=6, topk=2)  # trees of 13 rows
    method.setup(compiled)
    method.warm_shapes(compiled)
    warm = compile_stats()["graphs"]
    n = method.max_tree(False) if method_name == "swift" else method.max_tree()
    ids = compiled.tokenizer(WARMUP).input_ids
    eager_cache = eager.cache(CAPACITY)
    for depth in range(1, n):
        tree = DraftTree(list(range(5, 6 + depth)), list(range(-1, depth)))  # a chain of `depth` drafts
        for eng, cache in ((compiled, compiled.static_cache), (eager, eager_cache)):
            eng.prefill(cache, ids)
        got = verify_tree(compiled, compiled.static_cache, tree, len(ids), n)
        want = verify_tree(eager, eager_cache, tree, len(ids), n)
        assert compile_stats()["graphs"] == warm, f"a tree of depth {depth} compiled a graph"
        assert torch.allclose(got, want, atol=1e-4), depth


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_the_modes_that_replay_cuda_graphs_are_torchs(mode):
    """Which compile modes replay CUDA graphs (outputs cloned, static addresses, two warm-up rounds), and each one's
    twin without them (SWIFT's and LongSpec's per-layer and per-level graphs), read from torch's own table:
    ``torch._inductor.list_mode_options`` (the ``triton.cudagraphs`` option), on the torch this suite runs."""
    from torch._inductor import list_mode_options

    options = CompileOptions(mode=mode)
    assert options.cudagraphs == bool(list_mode_options(mode).get("triton.cudagraphs"))
    plain = list_mode_options(options.mode_without_cudagraphs)
    assert not plain.get("triton.cudagraphs")
    assert plain == {k: v for k, v in list_mode_options(mode).items() if k != "triton.cudagraphs"}


def test_a_step_mask_is_copied_into_the_graphs_buffer_only_when_it_changed(engine, monkeypatch):
    """A compiled flex step reads its mask from a buffer the graph holds. The same mask step after step (FAFO's) is
    copied once; another mask, or the same one written in place, is copied again (a copy is a launch)."""
    from fafo.engine.attention import AttentionPlan
    from fafo.engine.compiled import CompiledStep

    eng = engine("llama_gqa")
    step = CompiledStep(eng.model, CompileOptions(backend="aot_eager", attention="flex"), eng.device)
    copies, copy = [], torch.Tensor.copy_

    def counted(self, src, *args, **kwargs):
        copies.append(src)
        return copy(self, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", counted)
    first, second = torch.ones(6, 6, dtype=torch.bool).tril(), torch.eye(6, dtype=torch.bool)
    for mask, copied in ((first, 1), (first, 0), (second, 1), (first, 1), (first, 0)):
        copies.clear()
        step._step_block_mask(AttentionPlan(prefix=8, step_mask=mask), 6, eng.device)
        assert len(copies) == copied and torch.equal(step._step_buffers[(6, 6), str(eng.device)][0], mask)
    first[0, 1] = True  # written in place: copied again
    step._step_block_mask(AttentionPlan(prefix=8, step_mask=first), 6, eng.device)
    assert torch.equal(step._step_buffers[(6, 6), str(eng.device)][0], first)
