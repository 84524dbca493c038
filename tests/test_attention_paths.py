"""The fast attention paths equal the dense reference for every method's step structure, and stay lossless.

Paths (``fafo.engine.attention``): ``sdpa`` (fused kernels: the single-token call straight over the cache, the
gathered per-branch step attention for sparse masks, the fused masked kernel for dense ones), ``dense`` (exact
float32 maths with dense masks, the reference) and ``flex`` (eager FlexAttention with block masks).
"""

import dataclasses
import json

import pytest
import torch

from baselines.lookahead import lookahead_step_mask
from baselines.vanilla import VanillaDecoder
from fafo.engine.attention import AttentionPlan, causal_plan, dense_attention, flex_attention_backend, \
    sdpa_attention, tree_mask
from fafo.engine.engine import Engine
from fafo.engine.kernels import gathered_mask
from fafo.fafo import fafo_step_mask
from tests.conftest import LOSSLESS_MODELS
from tests.lossless import PROMPTS, assert_lossless
from tests.helpers import run_cli
from tests.methods import METHODS as CASES

ATOL = 1e-5


def fafo_fused():  # [current | m x k candidates | n x k streams]; the streams read only the head region
    m, k, n = 5, 4, 6
    return dict(step_mask=fafo_step_mask(m, k, n), region_from=1 + m * k, region_len=9, region_capacity=9)


def fafo_2forward_fumble():
    m, k, n = 5, 4, 6
    full = fafo_step_mask(m, k, n)
    keep = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(1 + m * k, 1 + m * k + n * k)])
    return dict(step_mask=full[keep][:, keep], region_from=1, region_len=9, region_capacity=9)


STRUCTURES = {
    "vanilla": lambda: dict(),
    "causal-chunk": lambda: dict(),
    "fafo-fused": fafo_fused,
    "fafo-2forward-fumble": fafo_2forward_fumble,
    "fafo-2forward-verify": lambda: dict(step_mask=fafo_step_mask(5, 4, 6)[:21, :21]),
    "lookahead": lambda: dict(step_mask=lookahead_step_mask(4, 3, 3, 3)),
    "tree": lambda: dict(step_mask=tree_mask([-1, 0, 0, 1, 1, 2, 3, 3, 5, -1, 9, 10])),
}


def step_len(name: str, extra: dict) -> int:
    if name == "vanilla":
        return 1
    if name == "causal-chunk":
        return 7
    return extra["step_mask"].shape[0]


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_kernel_paths_equal_the_dense_reference(structure, hq, hkv):
    torch.manual_seed(0)
    extra = STRUCTURES[structure]()
    Q, P, D, S = step_len(structure, extra), 37, 16, 128
    q = torch.randn(1, hq, Q, D)
    kc, vc = torch.randn(1, hkv, S, D), torch.randn(1, hkv, S, D)
    ks, vs = torch.randn(1, hkv, Q, D), torch.randn(1, hkv, Q, D)
    # vanilla: the step's KV was written right after the prefix (what the engine checks before the fast call)
    kc[:, :, P : P + Q], vc[:, :, P : P + Q] = ks, vs
    plan = lambda **kw: AttentionPlan(**{"prefix": P, **extra, **kw})  # noqa: E731
    ref = dense_attention(q, kc, vc, ks, vs, plan(), D**-0.5)
    fast = sdpa_attention(q, kc, vc, ks, vs, plan(step_in_cache=structure == "vanilla"), D**-0.5)
    torch.testing.assert_close(fast, ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(flex_attention_backend(q, kc, vc, ks, vs, plan(), D**-0.5), ref, atol=ATOL, rtol=0)
    # compiled steps' plans: the live prefix/region as dynamic-size tensors, or static capacities + length masks
    live = plan(prefix=S, prefix_live=torch.empty(P), step_in_cache=structure == "vanilla")
    if "region_from" in extra:
        live.region_len, live.region_live = S, torch.empty(extra["region_len"])
    torch.testing.assert_close(sdpa_attention(q, kc, vc, ks, vs, live, D**-0.5), ref, atol=ATOL, rtol=0)
    capped = plan(prefix=S, prefix_length=torch.tensor([P]))
    if "region_from" in extra:
        capped.region_len, capped.region_length = 32, torch.tensor([extra["region_len"]])
    torch.testing.assert_close(sdpa_attention(q, kc, vc, ks, vs, capped, D**-0.5), ref, atol=ATOL, rtol=0)
    # a key no query may see changes nothing; a visible one changes the output (the comparison can fail)
    kc2 = kc.clone()
    kc2[:, :, P + Q + 1 :] += 3.0
    torch.testing.assert_close(sdpa_attention(q, kc2, vc, ks, vs, plan(), D**-0.5), ref, atol=ATOL, rtol=0)
    kc2[:, :, 0] += 3.0
    assert not torch.allclose(sdpa_attention(q, kc2, vc, ks, vs, plan(), D**-0.5), ref, atol=ATOL)


def test_sparse_masks_are_gathered_and_dense_ones_are_not():
    fafo = gathered_mask(fafo_step_mask(40, 6, 40))  # the default step: 481 queries, each sees <= k + 1 keys
    assert fafo.sparse and fafo.width == 8 and fafo.index.shape == (481, 8)
    assert not gathered_mask(torch.ones(64, 64, dtype=torch.bool).tril()).sparse
    mask = tree_mask([-1, 0, 1, 2])
    assert gathered_mask(mask) is gathered_mask(mask)  # computed once per mask tensor
    mask[3, 0] = False  # ... and again after an in-place edit
    assert gathered_mask(mask).valid.sum() == mask.sum()


def fafo_step_plan(eng: Engine, prompt: list[int]):
    """Prefill, then one FAFO step's inputs, as FAFOState builds them (region = the sink + local entries)."""
    m, k, n = 4, 3, 5
    cache = eng.cache(256)
    eng.prefill(cache, prompt)
    P = len(prompt)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(5, eng.model.args.vocab_size, (1 + m * k + n * k,), generator=g)
    rel = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(1, k + 1).repeat(m),
                     1 + (torch.arange(n)[None] + torch.arange(k)[:, None]).flatten()])
    plan = AttentionPlan(prefix=P, step_mask=fafo_step_mask(m, k, n), region_from=1 + m * k, region_len=P // 2,
                         region_capacity=P // 2)
    return cache, tokens, P + rel, torch.arange(P, P + 1 + m * k), plan


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_gqa", "llama_mha"])
def test_engine_logits_equal_across_paths(name, engine):
    """Whole-model logits of a vanilla step, a FAFO step, a Lookahead step and a tree step: equal on every path."""
    prompt = torch.randint(5, 200, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    steps = {}
    for backend in ("dense", "sdpa", "flex"):
        eng = engine(name, backend)
        cache = eng.cache(256)
        eng.prefill(cache, prompt)
        out = {"vanilla": eng.forward(cache, [7], [40], [40], causal_plan(40))}
        lk = lookahead_step_mask(4, 3, 2, 3)
        out["lookahead"] = eng.forward(cache, torch.arange(5, 5 + lk.shape[0]), 41 + torch.arange(lk.shape[0]) % 4,
                                       None, AttentionPlan(prefix=41, step_mask=lk))
        tm = tree_mask([-1, 0, 0, 1, 2, 2])
        out["tree"] = eng.forward(cache, [9, 8, 7, 6, 5, 4], [41, 42, 42, 43, 43, 43], None,
                                  AttentionPlan(prefix=41, step_mask=tm))
        out["fafo"] = eng.forward(*fafo_step_plan(eng, prompt))
        steps[backend] = out
    for backend in ("sdpa", "flex"):
        for kind, logits in steps[backend].items():
            # float32 rounding of blocked vs one-shot softmax, amplified through the layers: 1e-5 relative
            torch.testing.assert_close(logits, steps["dense"][kind], atol=ATOL, rtol=1e-5, msg=f"{backend} {kind}")


METHODS = {name: CASES[name].compiled for name in ("fafo_stream", "fafo_2forward", "lookahead", "swift")}


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("name", LOSSLESS_MODELS)
def test_lossless_on_the_dense_reference_path(method, name, engine):
    """The lossless suites run on ``sdpa`` (the default); the same methods are lossless on ``dense`` too, and
    vanilla's tokens agree across the two paths."""
    dense = engine(name, "dense")
    decoder = METHODS[method]()
    decoder.setup(dense)
    assert_lossless(decoder, dense, max_new=24, prompts=PROMPTS[:1])
    ids = dense.tokenizer("1, 2, 3, 4, 5").input_ids
    assert VanillaDecoder().generate(dense, ids, 24).tokens == VanillaDecoder().generate(engine(name), ids, 24).tokens


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "dense"])
def test_cli_runs_fafo_on_each_path(attention, tmp_path):
    proc = run_cli("method=fafo_stream", "method.n=5", "method.k=3", "method.compress.local=16",
                   f"model.attention={attention}", "bench.max_new_tokens=10", "bench.max_samples=2",
                   f"bench.output_dir={tmp_path}", "wandb.mode=disabled", "bench.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(next(tmp_path.glob("**/summary.json")).read_text())
    assert summary["exact_match_rate"] == 1.0 and summary["n_samples"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("method_name", ["vanilla", "fafo_stream", "fafo_quest", "fafo_2forward", "lookahead",
                                         "triforce_nodraft", "triforce", "swift"])
def test_compiled_sdpa_reads_only_the_live_prefix_and_compiles_once(method_name, engine, checkpoint):
    """CPU's compiled path: the live prefix is the size of a dynamic tensor (one graph for every length, the dead
    tail of a large cache never read), token-identical to eager, no recompiles after the warm-up generation."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from fafo.engine.compiled import CompileOptions
    from tests.compiled_cases import check_compiled, compiled_engine

    torch._dynamo.reset()
    counters.clear()
    try:
        eng = compiled_engine(checkpoint, "llama_gqa", CompileOptions(backend="aot_eager", attention="sdpa"))
        cache = eng.cache(512)
        plan = eng.compiled.static_plan(cache, dataclasses.replace(causal_plan(130), step_in_cache=True), 1)
        assert plan.prefix == cache.max_len and plan.prefix_live.shape == (130,) and plan.step_in_cache
        fafo = eng.compiled.static_plan(cache, AttentionPlan(prefix=90, **fafo_fused()), 45)
        assert fafo.region_live.shape == (9,) and fafo.step_gather is not None and not fafo.step_in_cache
        check_compiled(method_name, engine("llama_gqa"), eng, max_new=16)
    finally:
        torch._dynamo.reset()
