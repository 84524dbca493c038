"""The method matrix: every method config (``conf/method/<name>.yaml``) with its test settings, as kvpress's
``default_presses`` lists every press with its test kwargs. One entry per config drives

* the config case (tests/test_method_presets.py: the preset composed with ``overrides`` is token-identical to
  vanilla greedy) and the CLI case (tests/test_method_matrix.py: ``python -m fafo.bench method=<name>`` on the
  tiny model records exact-match rows);
* the lossless cases of small instances (``variants``: tests/test_draftless.py, the FlexAttention case);
* the sampling case (``sampling``: tests/test_sampling.py, exact in distribution);
* the compiled-step case (``compiled``: tests/compiled_cases.py), the host-device traffic per step of a small
  instance (``traffic``: tests/test_gpu_readiness.py) and the host ops per step of the config (``ops``:
  tests/test_host_work.py).

Adding a method: one method file, one YAML, one entry here; tests/test_method_matrix.py fails until every method
class of conf/method/ has a traffic case and, unless it runs eagerly, a compiled case.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from baselines.longspec import LongSpecDecoder
from baselines.lookahead import LookaheadDecoder
from baselines.prompt_lookup import PromptLookupDecoder
from baselines.quantspec import QuantSpecDecoder
from baselines.sam_decoding import SAMDecoder
from baselines.suffix_decoding import SuffixDecoder
from baselines.swift import SwiftDecoder
from baselines.token_recycling import TokenRecyclingDecoder
from baselines.triforce import TriForceDecoder
from baselines.vanilla import VanillaDecoder
from fafo.compress.quest import Quest
from fafo.compress.snapkv import SnapKV
from fafo.compress.stream import StreamingLLM
from fafo.fafo import FAFODecoder
from tests.conftest import MODEL_SPECS
from tests.helpers import CONF, DRAFT_SPEC
from tests.lossless import PROMPTS

METHOD_CONF = CONF / "method"
SAM_CORPUS = Path(__file__).resolve().parent / "data" / "sam_corpus.txt"  # a small text corpus (PROMPTS)
# TriForce presets get a tiny draft (llama-68m cannot be fetched offline)
TINY_DRAFT = ("method.draft.path=null", "method.draft.tiny={family: llama, hidden_size: 32, num_hidden_layers: 1}")
SMALL_TRIFORCE = ("method.budget=16", "method.chunk_size=4")
RANDOM_DRAFT = ("method.draft.path=null", "method.draft.random_seed=0")  # LongSpec's released drafts are online only
# 6 layers: SWIFT can skip layers 1..4 (8 sub-layers)
DEEP_QWEN = {"num_hidden_layers": 6, "num_attention_heads": 4, "family": "qwen2", "num_key_value_heads": 2,
             "seed": 3, "initializer_range": 0.05, "tie_word_embeddings": True}
SWIFT_SEARCH = {"context_window": 4, "bayes_interval": 3, "max_tolerance_iter": 12, "max_opt_iter": 40}
TRIFORCE_SAMPLING = {"budget": 64, "chunk_size": 4, "draft_budget": 24, "draft_start": 4, "gamma1": 2, "gamma2": 3}
TRIFORCE_SMALL = {"budget": 16, "chunk_size": 4, "draft_budget": 24, "draft_start": 4}
COMPILED_STREAM = StreamingLLM(sink=2, local=6)  # small enough that the tiny prompts swap entries


@dataclass(frozen=True)
class Traffic:
    """The host-device traffic case: host-to-device ``copies`` and device-to-host ``reads`` per decode step at most
    (docs/performance.md, "The GPU path, checked on the CPU"), of ``instance`` (default: the compiled case, else
    the first variant)."""

    copies: int
    reads: int
    instance: Callable | None = None


@dataclass(frozen=True)
class Flex:
    """The FlexAttention case: the small instance on ``model`` (a MODEL_SPECS name or a spec), FlexAttention
    backend, token-identical to vanilla greedy over ``prompts`` (EOS and max_new_tokens cuts included)."""

    model: str | dict = "qwen2_gqa_rep"
    prompts: tuple[str, ...] = tuple(PROMPTS[2:])
    max_new: int = 16
    draft_model: bool = False  # the draft model must run (TriForce with a draft)


@dataclass(frozen=True)
class Case:
    """One method config's test settings."""

    overrides: tuple[str, ...] = ()      # what a tiny-model run of the preset needs (config and CLI cases)
    lossless: bool = True                # False: lossy by design (its rows may mismatch)
    variants: dict[str, Callable] = field(default_factory=dict)  # named small instances (the first: the method's)
    flex: Flex | None = None             # the FlexAttention case, with the first variant
    sampling: str | None = None          # the repetitive model of the sampling case ("rep2", "rep4"); None: none
    compiled: Callable | None = None     # the compiled-step case's small instance (tests/compiled_cases.py)
    traffic: Traffic | None = None       # the host-device traffic case (tests/test_gpu_readiness.py)
    ops: int = 0                         # torch ops per step outside forwards at most (tests/test_host_work.py)

    def small(self):
        return next(iter(self.variants.values()))()

    def traffic_instance(self):
        return (self.traffic.instance or self.compiled or self.small)()


METHODS: dict[str, Case] = {
    "vanilla": Case(compiled=VanillaDecoder, traffic=Traffic(1, 1), ops=1),
    "fafo_stream": Case(variants={"fafo_stream": lambda: FAFODecoder(compress=StreamingLLM(sink=2, local=6), n=3,
                                                                     k=2)},
                        flex=Flex(), sampling="rep2", compiled=lambda: FAFODecoder(compress=COMPILED_STREAM, n=6, k=3),
                        traffic=Traffic(1, 1), ops=6),
    "fafo_2forward": Case(compiled=lambda: FAFODecoder(compress=COMPILED_STREAM, n=6, k=3, fused=False),
                          traffic=Traffic(1, 1), ops=7),
    "fafo_quest": Case(compiled=lambda: FAFODecoder(compress=Quest(token_budget=16, page_size=4, dense_layers=1),
                                                    n=4, k=3), traffic=Traffic(1, 2), ops=27),
    "fafo_snapkv": Case(compiled=lambda: FAFODecoder(compress=SnapKV(capacity=16, window=4, kernel=3, local=4), n=4,
                                                     k=3), traffic=Traffic(1, 1), ops=9),
    "lossy": Case(lossless=False, ops=20),
    "lookahead": Case(variants={"lookahead": lambda: LookaheadDecoder(level=4, window=3, guess_set=2)},
                      flex=Flex(), sampling="rep2",
                      compiled=lambda: LookaheadDecoder(level=3, window=4, guess_set=3), traffic=Traffic(2, 1), ops=5),
    "lookahead_13b": Case(ops=5),
    "lookahead_specbench": Case(ops=5),
    "swift": Case(variants={"swift": lambda: SwiftDecoder(**SWIFT_SEARCH, stop_threshold=0.0, max_step_draft=4)},
                  flex=Flex(model=DEEP_QWEN), sampling="rep4", compiled=SwiftDecoder, traffic=Traffic(3, 3), ops=14),
    "swift_script": Case(ops=14),
    "triforce": Case(overrides=TINY_DRAFT + SMALL_TRIFORCE,
                     variants={"triforce": lambda: TriForceDecoder(**TRIFORCE_SMALL, gamma2=3,
                                                                   draft={"tiny": DRAFT_SPEC})},
                     flex=Flex(model="llama_gqa", prompts=(PROMPTS[0] * 4,), max_new=12, draft_model=True),
                     sampling="rep2", compiled=lambda: TriForceDecoder(**TRIFORCE_SMALL, gamma1=2,
                                                                       draft={"tiny": DRAFT_SPEC}),
                     traffic=Traffic(20, 12), ops=21),
    "triforce_nodraft": Case(overrides=SMALL_TRIFORCE, sampling="rep2",
                             compiled=lambda: TriForceDecoder(draft=None, budget=16, chunk_size=4, gamma2=4),
                             traffic=Traffic(5, 5), ops=9),
    "triforce_official": Case(overrides=TINY_DRAFT + SMALL_TRIFORCE, ops=15),
    "longspec": Case(overrides=RANDOM_DRAFT, ops=12,
                     traffic=Traffic(2, 2, lambda: LongSpecDecoder(draft={"path": None, "random_seed": 0}))),
    "longspec_chain": Case(overrides=RANDOM_DRAFT, ops=12),
    "quantspec": Case(traffic=Traffic(7, 2, QuantSpecDecoder), ops=7),
    "quantspec_fp16": Case(ops=7, compiled=lambda: QuantSpecDecoder(group_size=16, gamma=4, weight_group=32,
                                                                    chunk_size=32, target="fp16")),
    "prompt_lookup": Case(variants={"prompt_lookup": lambda: PromptLookupDecoder(),
                                    "prompt_lookup_small": lambda: PromptLookupDecoder(num_tokens=3, max_ngram=2)},
                          flex=Flex(), sampling="rep2", traffic=Traffic(1, 1), ops=3),
    "token_recycling": Case(variants={"token_recycling": lambda: TokenRecyclingDecoder()}, flex=Flex(),
                            sampling="rep2", traffic=Traffic(2, 2), ops=8),
    "suffix_decoding": Case(variants={"suffix_decoding": lambda: SuffixDecoder(),
                                      "suffix_decoding_path": lambda: SuffixDecoder(tree=False, max_depth=8,
                                                                                    max_spec_factor=2.0)},
                            sampling="rep2", traffic=Traffic(1, 1), ops=3),
    "sam_decoding": Case(variants={"sam_decoding": lambda: SAMDecoder(n_predicts=8)}, sampling="rep2",
                         traffic=Traffic(1, 1), ops=3),
    # its corpus is built per model (scripts/build_sam_corpus.py); a small text corpus here
    "sam_decoding_published": Case(overrides=(f"method.corpus_path={SAM_CORPUS}",), ops=3),
}
DRAFTLESS = ("prompt_lookup", "token_recycling", "suffix_decoding", "sam_decoding")  # draft from text, not a model
# sampling instances: the small variant, or a sampling-specific one where the test needs acceptance on its model
SAMPLING_VARIANTS: dict[str, Callable] = {
    "fafo_stream": lambda: FAFODecoder(n=4, k=3, pool_from_prompt=True),
    "lookahead": lambda: LookaheadDecoder(level=3, window=3, guess_set=4, pool_from_prompt=True, bonus_token=True),
    "triforce": lambda: TriForceDecoder(**TRIFORCE_SAMPLING, draft={"tiny": MODEL_SPECS["llama_mha_rep"]}),
    "triforce_nodraft": lambda: TriForceDecoder(**TRIFORCE_SAMPLING, draft=None),
    "swift": lambda: SwiftDecoder(optimization=False, stop_threshold=0.0, max_step_draft=3, attn_skip=[1],
                                  mlp_skip=[2]),
}


def sampling_cases() -> dict[str, tuple[str, Callable]]:
    """{method: (repetitive model, decoder factory)} of every method with a sampling case."""
    return {name: (case.sampling, SAMPLING_VARIANTS.get(name) or case.small)
            for name, case in METHODS.items() if case.sampling}


def variants(names=None) -> dict[str, Callable]:
    """Every named small instance of the methods ``names`` (default all)."""
    return {k: f for name in (names or METHODS) for k, f in METHODS[name].variants.items()}
