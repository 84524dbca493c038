"""Every FlexAttention call of every method's decode steps, on every preset model's real head counts, is issued to
a Triton kernel that exists (:mod:`fafo.engine.flex_routing`), and the routed call computes the same attention.

The rule is checked against torch's own source (the fragments it transcribes must still be there, on each stack
CI runs), over every query count up to 2048 on every preset model, and over the step shapes each method actually
makes (recorded from generations with the presets' hyperparameters: tests/step_shapes.py).
"""

import inspect
import re

import pytest
import torch
from hydra import compose, initialize_config_dir

from fafo.engine import attention
from fafo.engine.attention import _flex_call
from fafo.engine.block_masks import length_block_mask
from fafo.engine.flex_routing import FlexRoute, flex_route, is_power_of_2, lowered_kernel, next_power_of_2
from fafo.engine.kernels import reference_attention_lse
from fafo.engine.torch_compat import main_template_option
from tests.helpers import CONF, PRESETS, preset_jobs
from tests.plan_hub import MODELS
from tests.step_shapes import method_key, step_query_counts

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

# (query heads, KV heads) of every preset model (their hub config.json, in tests/plan_hub.py), the
# embedded SmolLM2-135M (conf/model/smollm2_135m.yaml: 9/3) and the tiny configs (conf/model/tiny_*.yaml: 4/2)
HEADS = {hub: (f["num_attention_heads"], f["num_key_value_heads"]) for hub, f in MODELS.items()}
HEADS.update({"SmolLM2-135M-Instruct": (9, 3), "tiny-llama": (4, 2), "tiny-qwen2": (4, 2)})
GROUPS = sorted({hq // hkv for hq, hkv in HEADS.values()})


def assert_has_kernel(q_len: int, hq: int, hkv: int) -> str:
    """The route of a call with ``q_len`` queries lowers to the template it names, with a config; returns it."""
    route = flex_route(q_len, hq, hkv)
    group = route.heads // hkv
    assert route.heads % hkv == 0 and route.heads >= hq and is_power_of_2(group) or route.heads == hq
    assert lowered_kernel(q_len, route.heads, hkv, 128, route.options) == (route.kernel, True), (q_len, hq, hkv)
    # one-token steps take the split-over-keys decoding kernel; other short steps the main template, forced (the
    # decoding kernel was measured wrong for them on a GPU: fafo.engine.flex_routing, rule 2)
    assert route.kernel == ("decoding" if q_len == 1 else "attention"), (q_len, hq, hkv)
    if 1 < q_len < 128:
        assert route.options == main_template_option() and route.heads == hq
    return route.kernel


def _source(fn) -> str:
    return re.sub(r"\s+", "", inspect.getsource(fn))


def test_the_rule_is_the_one_in_torchs_source():
    """The conditions :func:`lowered_kernel` transcribes, as they stand in the installed torch (2.11 and 2.13 in
    CI; 2.14.1 and 2.15.0 pass too): a torch that changed them fails here, not on a GPU."""
    from importlib.resources import files

    from torch._inductor.kernel.flex import flex_attention as lowering
    from torch._inductor.kernel.flex import flex_decoding

    use = _source(flex_decoding._use_flex_decoding)
    for fragment in ('kernel_options.get("FORCE_USE_FLEX_ATTENTION",False)', "sympy.Lt(query.get_size()[-2],128)",
                     "static_batch=isinstance(query.get_size()[0],(int,sympy.Integer))",
                     "sympy.Eq(kv_indices.get_size()[1],1)", "sympy.Eq(ratio&(ratio-1),0)"):
        assert fragment in use, fragment
    kernel = _source(flex_decoding.create_flex_decoding_kernel)
    for fragment in ('kernel_options.setdefault("BLOCK_M",', "next_power_of_2(", "else16,"):
        assert fragment in kernel, fragment
    # every config is skipped unless SPARSE_Q_BLOCK_SIZE % BLOCK_M == 0: torch 2.11 and 2.13 test the options'
    # BLOCK_M, 2.14 and 2.15 each config's copy of the options (the same BLOCK_M: a config adds BLOCK_N, warps and
    # stages) and, with no config left, raise a ValueError naming them instead of NoValidChoicesError
    skip_before_2_14 = 'ifSPARSE_Q_BLOCK_SIZE%kernel_options["BLOCK_M"]!=0:continue'
    skip_from_2_14 = ('cur_kernel_options.setdefault("SPARSE_Q_BLOCK_SIZE",SPARSE_Q_BLOCK_SIZE)',
                      'cur_kernel_options["SPARSE_Q_BLOCK_SIZE"]%cur_kernel_options["BLOCK_M"]!=0',
                      "invalid_block_options=cur_kernel_options")
    assert skip_before_2_14 in kernel or all(f in kernel for f in skip_from_2_14), skip_from_2_14
    assert 'use_decode=(backend=="TRITON_DECODE")or(backend=="AUTO"andcan_use_decode)' in _source(
        lowering.flex_attention)
    template = re.sub(r"\s+", "", (files("torch._inductor.kernel.flex") / "templates" / "flex_decode.py.jinja")
                      .read_text())
    # what a BLOCK_M below Q * G relies on: several programs along the rows, each finding its sparse row
    assert "NUM_BLOCK_M=tl.cdiv(Q_LEN*G,BLOCK_M)" in template
    assert "sparse_idx_m=off_block_m*BLOCK_M_PER_HQ//SPARSE_Q_BLOCK_SIZE" in template


def test_unrouted_calls_that_have_no_kernel_or_a_slow_one():
    """What the routing fixes, by the same rule: no config for a Token Recycling tree on Llama-3-8B (G = 4), the
    main template (no split over the keys) for a one-token decode on Qwen2.5-7B (G = 7)."""
    assert lowered_kernel(81, 32, 8, 128) == ("decoding", False)
    assert lowered_kernel(120, 32, 8, 128) == ("decoding", False)
    assert lowered_kernel(32, 32, 8, 128) == ("decoding", True)
    assert lowered_kernel(1, 28, 4, 128) == ("attention", True)
    assert flex_route(81, 32, 8) == FlexRoute("attention", 32, main_template_option())
    assert flex_route(2, 28, 4) == FlexRoute("attention", 28, main_template_option())
    assert flex_route(1, 28, 4).heads == 32 and flex_route(1, 28, 4).options == {}
    assert flex_route(300, 28, 4).heads == 28 and flex_route(300, 28, 4).kernel == "attention"
    assert flex_route(5, 28, 4, static=False).kernel == "attention"  # eager CUDA steps: dynamic head counts


@pytest.mark.parametrize("model", sorted(HEADS))
def test_every_query_count_has_a_kernel(model):
    hq, hkv = HEADS[model]
    kernels = {assert_has_kernel(q, hq, hkv) for q in range(1, 2049)}
    assert kernels == {"decoding", "attention"}


# each method's step shape (tokens per forward), on the models where they had no kernel (G = 4) or a slow one (G = 7)
NAMED = {"token_recycling": 81, "suffix_decoding": 65, "sam_decoding": 40, "lookahead": 120,
         "lookahead_specbench": 56, "longspec": 69, "fafo_stream": 481, "vanilla": 1}


@pytest.fixture(scope="module")
def flex_engine(checkpoint):
    from fafo.engine.engine import Engine

    return Engine.from_pretrained(str(checkpoint("llama_gqa")), backend="flex")


def test_the_named_steps_are_recorded_and_routed(flex_engine, monkeypatch):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for name, rows in NAMED.items():
            cfg = compose("config", overrides=[f"method={name}"])
            counts, method = step_query_counts(cfg.method, flex_engine, monkeypatch)
            assert rows in counts, (name, sorted(counts))
            if method.forward_tokens() is not None:  # the hyperparameters' step sizes (vanilla 1, FAFO 1+mk+nk)
                assert set(method.forward_tokens()) <= counts, name
            for model in ("meta-llama/Meta-Llama-3-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"):
                for q in counts:
                    assert_has_kernel(q, *HEADS[model])


@pytest.mark.slow
def test_every_step_of_every_preset_job_has_a_kernel(flex_engine, monkeypatch):
    """Every job of every experiment preset (sweeps expanded, as bench.plan builds them) and every method config:
    the step shapes of its method on its model's heads."""
    jobs: dict[str, tuple] = {}  # method config -> (its config, the models it runs on)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for name in sorted(p.stem for p in (CONF / "method").glob("*.yaml")):
            cfg = compose("config", overrides=[f"method={name}"])
            jobs.setdefault(method_key(cfg.method), (cfg.method, set()))[1].update(HEADS)
    for preset in PRESETS + ["demo", "smoke"]:
        for _, cfg in preset_jobs(preset):
            model = cfg.model.get("path") or cfg.model.name
            jobs.setdefault(method_key(cfg.method), (cfg.method, set()))[1].add(model)
    assert len(jobs) > 40
    seen = set()
    for method_cfg, models in jobs.values():
        counts, _ = step_query_counts(method_cfg, flex_engine, monkeypatch)  # none: QuantSpec's own INT8 cache
        seen |= counts
        for model in models:
            for q in counts:
                assert_has_kernel(q, *HEADS[model])
    assert {1, 40, 65, 81, 120, 481} <= seen


@pytest.mark.parametrize("hq,hkv", [(6, 2), (7, 1), (32, 8)])
@pytest.mark.parametrize("q_len", [1, 40, 81, 130])
def test_a_routed_call_computes_the_same_attention(q_len, hq, hkv, monkeypatch):
    """Padded groups and the BLOCK_M option change how a call is issued, not what it computes (eager flex on the
    CPU; compiled steps on a padded group: test_compiled.py)."""
    g = torch.Generator().manual_seed(q_len)
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h, n in ((hq, q_len), (hkv, 300), (hkv, 300)))
    live = torch.tensor([217])
    for bm, visible in ((length_block_mask(live, q_len, 300), torch.arange(300)[None] < 217), (None, None)):
        out, lse = _flex_call(q, k, v, bm, 0.25, compiled=False)
        ref, ref_lse = reference_attention_lse(q.view(1, hkv, hq // hkv, q_len, 16), k, v, visible, 0.25)
        torch.testing.assert_close(out, ref.view(out.shape), atol=1e-5, rtol=0)
        torch.testing.assert_close(lse, ref_lse.view(lse.shape), atol=1e-5, rtol=0)
    issued = []  # what flex_attention receives: the route's heads and kernel options
    real = attention.flex_attention_lse
    monkeypatch.setattr(attention, "flex_attention_lse", lambda fn, q, k, v, bm, scale, options: issued.append(
        (q.shape[1], options)) or real(fn, q, k, v, bm, scale, options))
    _flex_call(q, k, v, length_block_mask(live, q_len, 300), 0.25, compiled=False)
    route = flex_route(q_len, hq, hkv)
    assert issued == [(route.heads, route.options)]
    padded = hkv * next_power_of_2(hq // hkv)
    assert route.heads == (padded if q_len == 1 else hq)
    assert route.options == (main_template_option() if 1 < q_len < 128 else {})


def test_compiled_steps_are_routed_and_eager_cuda_calls_take_the_main_template(monkeypatch):
    """Inside a compiled step (static shapes) a call is routed; an eager step on CUDA goes through one wrapper
    compiled with dynamic shapes, whose head counts are symbolic: the main template, said explicitly."""
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = torch.randn(1, 6, 81, 16), torch.randn(1, 2, 300, 16), torch.randn(1, 2, 300, 16)
    bm = length_block_mask(torch.tensor([217]), 81, 300)
    issued = []
    real = attention.flex_attention_lse
    monkeypatch.setattr(attention, "flex_attention_lse", lambda fn, q, k, v, bm, scale, options: issued.append(
        (q.shape[1], options)) or real(fn, q, k, v, bm, scale, options))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    _flex_call(q, k, v, bm, 0.25, compiled=True)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(attention, "_compiled_flex", flex_attention)  # the wrapper, left uncompiled here
    _flex_call(q, k, v, bm, 0.25, compiled=True)
    assert issued == [(6, main_template_option()), (6, main_template_option())]
