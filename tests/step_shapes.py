"""The query counts of every FlexAttention call a method's decode steps make, recorded from a real generation.

A method is built from its Hydra config exactly as the runner builds it (the hyperparameters of a preset, sweep
values included) and generates a few tokens on a tiny flex engine with ``static_shapes`` on, so every forward is
padded to the size its hyperparameters allow, as compiled steps are. Each call's query count is recorded where the
engine routes it (:func:`fafo.engine.flex_routing.flex_route`); query counts do not depend on the model's size, so
tests/test_kernel_routing.py checks them against the head counts of the real models.

Released draft models cannot be loaded offline: TriForce's llama-68m becomes a tiny draft and LongSpec's a random
one, with every other setting kept (the drafts' hyperparameters, not their weights, set the step shapes).
SAM-Decoding's published preset needs a corpus file only to draft well, and SWIFT's Bayesian optimiser only to
search layers: both are switched off here, as neither changes a shape.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf, open_dict

from fafo.bench.spec import build, method_node
from fafo.engine import attention
from tests.helpers import DRAFT_SPEC
from tests.lossless import PROMPTS

MAX_NEW = 12


def offline_method_node(method: DictConfig) -> DictConfig:
    """``cfg.method`` with its released draft replaced by a tiny or random one (see the module docstring)."""
    node = OmegaConf.create(OmegaConf.to_container(method, resolve=True))
    with open_dict(node):
        draft = node.get("draft")
        if draft is not None and draft.get("path"):
            if "longspec" in node._target_:
                node.draft = {"path": None, "revision": None, "random_seed": 0}
            else:
                node.draft = {"path": None, "revision": None, "tiny": DRAFT_SPEC}
        if node.get("corpus_required"):
            node.corpus_required = False
        if node.get("bayes"):
            node.bayes = False
    return node


def method_key(method: DictConfig) -> str:
    return repr(OmegaConf.to_container(method, resolve=True))


def step_query_counts(method_cfg: DictConfig, engine, monkeypatch) -> tuple[set[int], object]:
    """(query counts of the flex calls, the method): one generation of ``MAX_NEW`` tokens on ``engine`` (a tiny
    ``flex`` engine; ``static_shapes`` is switched on for it and off again)."""
    method = build(method_node(offline_method_node(method_cfg)), "method")
    seen: set[int] = set()
    real = attention.flex_route
    monkeypatch.setattr(attention, "flex_route", lambda q_len, *a, **kw: seen.add(q_len) or real(q_len, *a, **kw))
    engine.static_shapes = True
    try:
        method.setup(engine)
        ids = engine.tokenizer(PROMPTS[0]).input_ids
        method.generate(engine, ids, MAX_NEW)
        method.warm_shapes(engine)  # the shapes a generation may not take, as the runner's warm-up runs them
    finally:
        engine.static_shapes = False
        monkeypatch.setattr(attention, "flex_route", real)
    return seen, method
