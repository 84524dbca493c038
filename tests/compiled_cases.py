"""The compiled-step cases (``bench.compile``): small instances of the compiled methods, an engine compiled with a
fixed cache size, and the check that a method's compiled tokens equal eager vanilla's with no recompilation after
the first generation (tests/test_compiled.py and the methods' own compiled tests)."""

from torch._dynamo.utils import counters

from baselines.vanilla import VanillaDecoder
from fafo.engine.compiled import CompileOptions, compile_stats
from fafo.engine.engine import Engine
from tests.lossless import PROMPTS
from tests.methods import COMPILED_STREAM as SMALL, METHODS as CASES  # noqa: F401 (SMALL: test_compiled)

CAPACITY = 512  # the runner sizes the cache once per run, before warm-up; so do these tests
METHODS = {name: case.compiled for name, case in CASES.items() if case.compiled}  # tests/methods.py
# the runner's warm-up prompt, then prompts of other lengths and acceptance (repetitive and varied)
WARMUP = PROMPTS[0]
SAMPLES = [PROMPTS[1], PROMPTS[2] * 3, PROMPTS[0] * 2 + PROMPTS[1]]


def compiled_engine(checkpoint, name: str, options: CompileOptions) -> Engine:
    eng = Engine.from_pretrained(str(checkpoint(name)))
    eng.enable_compile(options)
    eng.cache(CAPACITY)
    return eng


def check_compiled(method_name: str, eager: Engine, compiled: Engine, max_new: int) -> None:
    method = METHODS[method_name]()
    method.setup(compiled)
    ids = compiled.tokenizer(WARMUP).input_ids
    assert method.generate(compiled, ids, max_new).tokens == VanillaDecoder().generate(eager, ids, max_new).tokens
    method.warm_shapes(compiled)  # as the runner's warm-up: the step shapes the generation did not take
    warm = compile_stats()["graphs"]
    assert warm >= 1, "nothing was compiled"
    for text in SAMPLES:
        ids = compiled.tokenizer(text).input_ids
        ref = VanillaDecoder().generate(eager, ids, max_new).tokens
        assert method.generate(compiled, ids, max_new).tokens == ref, f"{method_name} diverged on {text!r}"
        eos = ref[len(ref) // 2]
        want = ref[: ref.index(eos) + 1]
        assert method.generate(compiled, ids, max_new, eos_ids=(eos,)).tokens == want
        assert method.generate(compiled, ids, 3).tokens == ref[:3]
    assert compile_stats()["graphs"] == warm, f"{method_name} recompiled after the warm-up generation"
    assert not counters["graph_break"], dict(counters["graph_break"])
