"""The draftless methods the check runs, at their presets' step shapes (``conf/method/*.yaml``), built without
Hydra.

Each keeps its preset's step shape (FAFO's 481-row step, Lookahead 5/15/15, Token Recycling's 81-node tree,
SuffixDecoding's 65 and SAM's 40 rows, SWIFT's trees): those shapes decide which attention kernel a GPU runs. On
the tiny correctness models (``small=True``) the compression budgets shrink to a few dozen entries so that
compression takes effect on prompts of a hundred tokens; on the 7B-shaped model they are the presets'.
"""

from __future__ import annotations

from contextlib import contextmanager
from importlib.util import find_spec


def _fafo(small: bool, compress: str, **kw):
    from fafo.compress.quest import Quest
    from fafo.compress.snapkv import SnapKV
    from fafo.compress.stream import StreamingLLM
    from fafo.fafo import FAFODecoder

    if compress == "stream":
        c = StreamingLLM(sink=4, local=28) if small else StreamingLLM()
    elif compress == "quest":
        c = Quest(token_budget=32, page_size=16, dense_layers=1) if small else Quest()
    else:
        c = SnapKV(capacity=32, window=8, local=8) if small else SnapKV()
    return FAFODecoder(compress=c, **kw)


def _triforce(small: bool):
    from baselines.triforce import TriForceDecoder

    return TriForceDecoder(draft=None, budget=32 if small else 4096)


def _swift(small: bool):
    from baselines.swift import SwiftDecoder

    return SwiftDecoder(bayes=find_spec("bayes_opt") is not None)  # else random layer-set search only


def _quantspec(small: bool):
    from baselines.quantspec import QuantSpecDecoder

    # the fp16 verifier: lossless against vanilla, so its tokens can be compared; its INT4 drafts read the
    # quantized cache through the same compiled path as the INT8 verifier's (groups of 32 quantize short prompts)
    return QuantSpecDecoder(target="fp16", group_size=32 if small else 128)


def _longspec(small: bool):
    from baselines.longspec import LongSpecDecoder

    # a random draft (no trained one is on the node): the tokens are the target's whatever it drafts, and its
    # draft rows and levels run as compiled graphs beside the target's verification (the preset's beam tree)
    return LongSpecDecoder(draft={"path": None, "random_seed": 0})


def _simple(module: str, cls: str):
    def build(small: bool):
        import importlib

        return getattr(importlib.import_module(module), cls)()

    return build


# name (conf/method) -> factory(small); in the order the check runs them (the most used first)
METHODS = {
    "vanilla": _simple("baselines.vanilla", "VanillaDecoder"),
    "fafo_stream": lambda small: _fafo(small, "stream"),
    "prompt_lookup": _simple("baselines.prompt_lookup", "PromptLookupDecoder"),
    "lookahead": _simple("baselines.lookahead", "LookaheadDecoder"),
    "token_recycling": _simple("baselines.token_recycling", "TokenRecyclingDecoder"),
    "suffix_decoding": _simple("baselines.suffix_decoding", "SuffixDecoder"),
    "sam_decoding": _simple("baselines.sam_decoding", "SAMDecoder"),
    "fafo_quest": lambda small: _fafo(small, "quest"),
    "fafo_snapkv": lambda small: _fafo(small, "snapkv"),
    "fafo_2forward": lambda small: _fafo(small, "stream", fused=False),
    "swift": _swift,
    "triforce_nodraft": _triforce,
    "quantspec_fp16": _quantspec,
    "longspec": _longspec,
}


def build_method(name: str, small: bool):
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; use one of {', '.join(METHODS)}")
    return METHODS[name](small)


def most_extra_slots(names, max_new: int, small: bool) -> int:
    """The most cache slots beyond prompt + new tokens any of the methods needs (one that cannot even be built
    here is left out: its own case reports why)."""
    extra = 0
    for name in names:
        try:
            extra = max(extra, build_method(name, small).extra_slots(max_new))
        except Exception:  # noqa: BLE001 - e.g. a missing package; raised again, and recorded, when it runs
            pass
    return extra


def selected(names) -> list[str]:
    """The methods to run, in the check's order (all when ``names`` is empty)."""
    if not names:
        return list(METHODS)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; use any of {', '.join(METHODS)}")
    return [n for n in METHODS if n in names]


@contextmanager
def steps_as_the_runner(engine, method):
    """The engine as the runner runs ``method``: with its compiled steps, unless the method's forwards cannot run
    compiled (``Decoder.eager_forwards``, which a user's method may declare: the runner then times it eagerly);
    the compiled steps are kept for the next method."""
    if not method.eager_forwards or engine.compiled is None:
        yield
        return
    saved = engine.compiled, engine.static_shapes
    engine.compiled, engine.static_shapes = None, False
    try:
        yield
    finally:
        engine.compiled, engine.static_shapes = saved
