"""Method configs in turn on one engine, as a comparison runs them (``compare.methods``): what a method leaves on
the engine must not change the next one's tokens or stop it. Each method allocates the shared static cache on a
fresh engine state; that cache must be a normal tensor (one allocated inside a method's ``torch.inference_mode``
cannot be written in place outside it), and FAFO, which moves KV in place, then runs on it token-identically."""

import pytest

from baselines.vanilla import VanillaDecoder
from fafo.bench.spec import build, method_node
from fafo.compress.stream import StreamingLLM
from fafo.engine.engine import Engine
from fafo.fafo import FAFODecoder
from tests.helpers import make_cfg
from tests.lossless import PROMPTS
from tests.methods import METHODS


@pytest.fixture(scope="module")
def shared(checkpoint):
    engine = Engine.from_pretrained(str(checkpoint("qwen2_gqa_rep")))
    prompt = engine.tokenizer(PROMPTS[0] * 3).input_ids
    return engine, prompt, VanillaDecoder().generate(engine, prompt, 12).tokens


@pytest.mark.parametrize("name", list(METHODS))
def test_the_cache_a_method_allocates_serves_the_next_method(name, shared, tmp_path):
    engine, prompt, reference = shared
    method = build(method_node(make_cfg(tmp_path, f"method={name}", *METHODS[name].overrides).method), "method")
    engine.release_cache()
    method.setup(engine)
    method.generate(engine, prompt, 12)
    cache = engine.static_cache or engine.cache(len(prompt) + 12)
    assert not any(t.is_inference() for t in cache.tensors())
    assert FAFODecoder(compress=StreamingLLM(sink=2, local=6), n=3, k=2).generate(engine, prompt, 12).tokens == \
        reference
