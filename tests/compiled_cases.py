"""The compiled-step cases (``bench.compile``): small instances of the compiled methods, an engine compiled with a
fixed cache size, and the check that a method's compiled tokens equal eager vanilla's with no recompilation after
the first generation (tests/test_compiled.py and the methods' own compiled tests)."""

from torch._dynamo.utils import counters

from baselines.lookahead import LookaheadDecoder
from baselines.swift import SwiftDecoder
from baselines.triforce import TriForceDecoder
from baselines.vanilla import VanillaDecoder
from fafo.compress.quest import Quest
from fafo.compress.snapkv import SnapKV
from fafo.compress.stream import StreamingLLM
from fafo.engine.compiled import CompileOptions, compile_stats
from fafo.engine.engine import Engine
from fafo.fafo import FAFODecoder
from tests.helpers import DRAFT_SPEC
from tests.lossless import PROMPTS

SMALL = StreamingLLM(sink=2, local=6)
CAPACITY = 512  # the runner sizes the cache once per run, before warm-up; so do these tests
METHODS = {
    "vanilla": lambda: VanillaDecoder(),
    "fafo-stream": lambda: FAFODecoder(compress=SMALL, n=6, k=3),
    "fafo-quest": lambda: FAFODecoder(compress=Quest(token_budget=16, page_size=4, dense_layers=1), n=4, k=3),
    "fafo-snapkv": lambda: FAFODecoder(compress=SnapKV(capacity=16, window=4, kernel=3, local=4), n=4, k=3),
    "fafo-2forward": lambda: FAFODecoder(compress=SMALL, n=6, k=3, fused=False),
    "lookahead": lambda: LookaheadDecoder(level=3, window=4, guess_set=3),
    "triforce": lambda: TriForceDecoder(draft=None, budget=16, chunk_size=4, gamma2=4),
    "triforce-draft": lambda: TriForceDecoder(draft={"tiny": DRAFT_SPEC}, budget=16, chunk_size=4, gamma1=2,
                                              draft_budget=24, draft_start=4),
    "swift": lambda: SwiftDecoder(),
}
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
