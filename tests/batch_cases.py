"""The batch cases (fafo/batch.py): small instances of every method that decodes a batch, and ragged batches of
requests whose every answer must equal the request's own greedy decode (tests/test_batch.py)."""

from __future__ import annotations

from torch._dynamo.utils import counters

from baselines.lookahead import LookaheadDecoder
from baselines.prompt_lookup import PromptLookupDecoder
from baselines.sam_decoding import SAMDecoder
from baselines.suffix_decoding import SuffixDecoder
from baselines.token_recycling import TokenRecyclingDecoder
from baselines.vanilla import VanillaDecoder
from fafo.batch import BATCHING, Request, decode_batch
from fafo.compress.quest import Quest
from fafo.compress.snapkv import SnapKV
from fafo.compress.stream import StreamingLLM
from fafo.engine.compiled import compile_stats
from fafo.engine.engine import Engine
from fafo.fafo import FAFODecoder
from tests.lossless import PROMPTS, first_diff

SMALL = StreamingLLM(sink=2, local=6)  # a region smaller than the prompts: swaps happen
METHODS = {  # every method config that decodes a batch, by its family's small instance
    "vanilla": VanillaDecoder,
    "prompt_lookup": lambda: PromptLookupDecoder(num_tokens=4),
    "token_recycling": TokenRecyclingDecoder,
    "suffix_decoding": SuffixDecoder,
    "sam_decoding": lambda: SAMDecoder(n_predicts=8),
    "lookahead": lambda: LookaheadDecoder(level=4, window=3, guess_set=2),
    "fafo_stream": lambda: FAFODecoder(compress=SMALL, n=3, k=2),
    "fafo_2forward": lambda: FAFODecoder(compress=SMALL, n=3, k=2, fused=False),
    "fafo_quest": lambda: FAFODecoder(compress=Quest(token_budget=16, page_size=4, dense_layers=1), n=4, k=3),
    "fafo_snapkv": lambda: FAFODecoder(compress=SnapKV(capacity=16, window=4, kernel=3, local=4), n=4, k=3),
}
# the method configs (conf/method/) whose decoder decodes a batch; the others refuse bench.batch_size > 1
CONFIGS = {"vanilla", "fafo_stream", "fafo_2forward", "fafo_quest", "fafo_snapkv", "lookahead", "lookahead_13b",
           "lookahead_specbench", "prompt_lookup", "token_recycling", "suffix_decoding", "sam_decoding",
           "sam_decoding_published"}
CROSS_REQUEST = {"token_recycling", "suffix_decoding"}  # learn across requests: acceptance depends on the batch
# ragged prompts (14 to 141 tokens), each with its budget and the step at which its EOS first appears
TEXTS = [PROMPTS[0], PROMPTS[1] * 2, PROMPTS[2], PROMPTS[0] * 3, PROMPTS[1], PROMPTS[2] * 2, PROMPTS[1] * 4]
MAX_NEW = [24, 20, 24, 24, 1, 24, 16]  # one answer of one token
EOS_AT = [3, 10, 0, 20, 5, None, 8]  # request 2 ends at its first token; request 5 never meets its EOS
B = 4


def ragged_requests(engine, texts=TEXTS, max_new=MAX_NEW, eos_at=EOS_AT) -> list[Request]:
    """Requests whose EOS is the token that first appears nearest step ``eos_at`` of the request's greedy answer
    (so rows stop at different steps), with no EOS where ``eos_at`` is None."""
    requests = []
    for text, n, at in zip(texts, max_new, eos_at):
        ids = engine.tokenizer(text).input_ids
        ref = VanillaDecoder().generate(engine, ids, max(max_new)).tokens
        eos = ()
        if at is not None:
            first = min({ref.index(t) for t in ref}, key=lambda i: abs(i - at))
            eos = (ref[first],)
        requests.append(Request(ids, n, eos))
    return requests


def alone(make, engine, requests, sampling=None) -> list:
    """Each request decoded by itself, one after another, by one instance of the method."""
    method = make()
    method.setup(engine)
    return [method.generate(engine, r.prompt_ids, r.max_new_tokens, r.eos_ids, sampling, r.generator)
            for r in requests]


def run_batch(name, engine, batching, requests, batch_size=B, make=None):
    method = (make or METHODS[name])()
    method.setup(engine)
    return decode_batch(method, engine, requests, batch_size, batching)


def assert_as_alone(label, engine, requests, result) -> None:
    """Every request's tokens equal its greedy decode alone (vanilla's), its counters are consistent."""
    want = [g.tokens for g in alone(VanillaDecoder, engine, requests)]
    for i, (gen, ref) in enumerate(zip(result.generations, want)):
        assert gen.tokens == ref, f"{label}: request {i} diverged at {first_diff(gen.tokens, ref)}"
        assert gen.forwards.verify == len(gen.accept_lengths) and sum(gen.accept_lengths) == len(ref) - 1


def check_batch(name, engine, batching, requests, batch_size=B, make=None):
    """:func:`run_batch` then :func:`assert_as_alone`; returns the batch's result."""
    result = run_batch(name, engine, batching, requests, batch_size, make)
    assert_as_alone(f"{name} {batching}", engine, requests, result)
    return result


def learnt(method) -> object:
    """What a method learnt across requests: Token Recycling's matrix, the sequences of SuffixDecoding's tree."""
    if isinstance(method, TokenRecyclingDecoder):
        return method.adjacency.tobytes()
    tree = method.global_tree
    return {seq: tree.tokens[start:end].tolist() for seq, (start, end) in tree.seqs.items()}


def compiled_engine(checkpoint, name, options):
    eng = Engine.from_pretrained(str(checkpoint(name)))
    eng.enable_compile(options)
    return eng


def check_compiled(name, eager, compiled, requests):
    """Static then continuous batches, twice: tokens as alone (eager vanilla), graphs compiled in the first round
    only, and none broken."""
    graphs = []
    for _ in range(2):
        for batching in BATCHING:
            result = run_batch(name, compiled, batching, requests)
            assert_as_alone(f"{name} {batching} compiled", eager, requests, result)
        graphs.append(compile_stats()["graphs"])
    assert graphs[0] >= 1 and graphs[1] == graphs[0], f"{name} recompiled in the second round: {graphs}"
    assert not counters["graph_break"], dict(counters["graph_break"])
