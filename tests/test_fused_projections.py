"""Fused projections (``Transformer.fuse_projections``, on by default on CUDA): each layer's q/k/v and gate/up as one
matrix give the unfused model's logits, every method stays token-identical to vanilla on the fused model, compiled
steps compile it, and the weights read back under transformers' names are the checkpoint's."""

import pytest
import torch

from baselines.vanilla import VanillaDecoder
from fafo.engine.attention import causal_plan
from fafo.engine.engine import Engine
from fafo.engine.tiny import tiny_checkpoint
from tests.conftest import MODEL_SPECS
from tests.lossless import PROMPTS, assert_lossless
from tests.methods import METHODS


def fused(path) -> Engine:
    return Engine.from_pretrained(str(path), fuse_projections=True)


@pytest.mark.parametrize("name", ["llama_mha", "llama_gqa", "qwen2_gqa", "qwen2_bias", "llama_bias"])
def test_fused_model_gives_the_unfused_logits_and_weights(name, checkpoint, engine):
    plain, eng = engine(name), fused(checkpoint(name))
    assert eng.model.fused and not plain.model.fused  # the CPU default: the checkpoint's own matrices
    attn, mlp = eng.model.model.layers[0].self_attn, eng.model.model.layers[0].mlp
    assert not hasattr(attn, "q_proj") and not hasattr(mlp, "gate_proj")  # replaced, not kept beside
    state, want = eng.model.hf_state_dict(), plain.model.state_dict()
    assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)
    assert eng.weights_nbytes == plain.weights_nbytes
    ids = plain.tokenizer(PROMPTS[1]).input_ids
    for e in (plain, eng):
        e.cache_ = e.model.new_cache(len(ids) + 4)
    outs = [e.forward(e.cache_, ids, list(range(len(ids))), list(range(len(ids))), causal_plan(0))
            for e in (plain, eng)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    steps = [e.forward(e.cache_, [7, 8], [len(ids), len(ids) + 1], [len(ids), len(ids) + 1], causal_plan(len(ids)))
             for e in (plain, eng)]
    torch.testing.assert_close(steps[1], steps[0], rtol=1e-5, atol=1e-5)
    for text in PROMPTS[:3]:
        ids = plain.tokenizer(text).input_ids
        assert VanillaDecoder().generate(eng, ids, 24).tokens == VanillaDecoder().generate(plain, ids, 24).tokens


# every lossless method config with a small instance of its own (tests/methods.py)
FUSED_CASES = sorted(n for n, c in METHODS.items() if c.lossless and (c.variants or c.compiled or c.traffic))


@pytest.mark.parametrize("method", FUSED_CASES)
def test_every_method_is_token_identical_to_vanilla_on_the_fused_model(method, ckpt_root):
    """Each method's small instance on its FlexAttention case's model (SWIFT's deep one), fused: KV moves, captured
    queries, layer skipping and QuantSpec's 4-bit MLPs (made from the fused gate/up) see the same model."""
    case = METHODS[method]
    model = case.flex.model if case.flex else "qwen2_gqa_rep"
    eng = fused(tiny_checkpoint(MODEL_SPECS[model] if isinstance(model, str) else model, cache_dir=ckpt_root))
    decoder = case.traffic_instance() if case.traffic else (case.compiled or case.small)()
    decoder.setup(eng)
    assert_lossless(decoder, eng, 24, prompts=PROMPTS[2:3])


def test_compiled_steps_on_the_fused_model(checkpoint, engine, fresh_dynamo):
    from fafo.engine.compiled import CompileOptions, compile_stats

    eng = fused(checkpoint("llama_gqa"))
    eng.enable_compile(CompileOptions(backend="aot_eager"))
    eng.cache(256)
    for text in PROMPTS[:3]:
        ids = eng.tokenizer(text).input_ids
        assert VanillaDecoder().generate(eng, ids, 16).tokens == VanillaDecoder().generate(
            engine("llama_gqa"), ids, 16).tokens
    assert compile_stats()["graphs"] >= 1


def test_the_transformers_twin_of_a_fused_engine_reads_the_same_tensors():
    from fafo.bench.tools.random_model import llama_config, random_engine, transformers_twin

    config = llama_config("embedded", num_hidden_layers=2)
    eng = random_engine(config)
    eng.model.fuse_projections()
    hf = transformers_twin(eng)
    qkv = eng.model.model.layers[0].self_attn.qkv_proj.weight
    assert hf.model.layers[0].self_attn.q_proj.weight.data_ptr() == qkv.data_ptr()  # a view, no copy
    ids = torch.tensor([[3, 5, 7, 9]])
    cache = eng.model.new_cache(8)
    ours = eng.forward(cache, ids[0].tolist(), [0, 1, 2, 3], [0, 1, 2, 3], causal_plan(0))
    with torch.no_grad():
        torch.testing.assert_close(ours, hf(ids).logits, rtol=1e-4, atol=1e-4)


def test_an_engine_fuses_on_cuda_only_unless_told(checkpoint, monkeypatch):
    """The rule of ``Engine(fuse_projections=None)``: fused where the model's device is CUDA (the device faked here:
    only the rule is read), not on the CPU; an explicit value wins."""
    from fafo.engine.loader import load_hf_config, load_model, load_tokenizer

    path = checkpoint("llama_gqa")
    config = load_hf_config(path)

    def build(device: str, fuse):
        monkeypatch.setattr(Engine, "device", property(lambda self: torch.device(device)))
        model = load_model(path, config, torch.float32, torch.device("cpu"))
        return Engine(model, load_tokenizer(path), fuse_projections=fuse).model.fused

    assert build("cuda", None) and not build("cpu", None)
    assert not build("cuda", False) and build("cpu", True)
