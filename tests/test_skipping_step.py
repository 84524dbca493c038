"""Compiled forwards that skip layers (fafo/engine/skipping_step.py): the same logits and cache writes as the eager
model with the same set left out, and a fixed number of graphs per step shape whatever the set and the depth."""

import pytest
import torch

from fafo.bench.tools.host_work import identity_layers
from fafo.engine.attention import causal_plan
from fafo.engine.compiled import CompileOptions, compile_stats, reset_compiled_state
from fafo.engine.engine import Engine
from fafo.engine.tiny import tiny_checkpoint
from tests.conftest import MODEL_SPECS

SPEC = dict(num_hidden_layers=4, hidden_size=64)
SETS = [(frozenset({1}), frozenset({2})), (frozenset({1, 2}), frozenset()), (frozenset(), frozenset({1, 2})),
        (frozenset({2}), frozenset({1}))]
PROMPT = list(range(3, 40))


def steps(eng: Engine, skip) -> list[torch.Tensor]:
    """A draft-like step (1 token, its KV written) and a scoring-like one (6 tokens, nothing written) after a fresh
    prefill; returns both steps' logits and the cache's keys and values afterwards."""
    cache = eng.cache(128)
    cache.kv.zero_()
    eng.prefill(cache, PROMPT)
    P = len(PROMPT)
    one = eng.forward(cache, [7], [P], [P], causal_plan(P), logits="last", skip=skip, kind="draft")
    six = eng.forward(cache, PROMPT[:6], torch.arange(P + 1, P + 7), None, causal_plan(P + 1), logits="all",
                      skip=skip, kind="aux")
    return [one, six, cache.kv[:, :, :, :, : P + 1].clone()]


def same_greedy_choice(got: torch.Tensor, want: torch.Tensor, tie: float = 1e-4) -> bool:
    """Each position's argmax equal, or a tie: where they differ, the eager logits of the two tokens are within
    ``tie`` (random tiny weights can put two logits 5e-7 apart, which another summation order may swap)."""
    g, w = got.argmax(-1), want.argmax(-1)
    gap = want.gather(-1, w[..., None]) - want.gather(-1, g[..., None])
    return bool((gap[..., 0][g != w] <= tie).all())


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("name", ["llama_mha", "llama_gqa", "qwen2_gqa"])
def test_compiled_skipping_forwards_equal_eager_ones(name, attention, ckpt_root, fresh_dynamo):
    path = str(tiny_checkpoint({**MODEL_SPECS[name], **SPEC}, cache_dir=ckpt_root))
    eager, compiled = Engine.from_pretrained(path), Engine.from_pretrained(path)
    compiled.enable_compile(CompileOptions(backend="aot_eager", attention=attention))
    for skip in SETS:
        want, got = steps(eager, skip), steps(compiled, skip)
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)  # flex sums in another order
        assert same_greedy_choice(got[0], want[0]) and same_greedy_choice(got[1], want[1])
    # the control: another set gives other logits (the comparison above would see a wrong set)
    assert not torch.allclose(steps(eager, SETS[0])[1], steps(eager, SETS[1])[1], atol=1e-3)


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_graphs_per_step_shape_do_not_grow_with_sets_or_depth(attention, ckpt_root, fresh_dynamo):
    """4 graphs per step shape (embed, attention, MLP, project) at 4 layers and at 8 (4 identity layers appended),
    the first set compiles them and no later set adds one."""
    ckpt = tiny_checkpoint({**MODEL_SPECS["llama_gqa"], **SPEC}, cache_dir=ckpt_root)
    counts = []
    for eng in (Engine.from_pretrained(str(ckpt)), identity_layers(ckpt, 4)):
        reset_compiled_state()
        start = compile_stats()["graphs"]
        eng.enable_compile(CompileOptions(backend="aot_eager", attention=attention))
        steps(eng, SETS[0])
        first = compile_stats()["graphs"] - start
        for skip in SETS[1:] + [(frozenset({5, 6}), frozenset({3, 7}))] * (eng.model.args.n_layers > 4):
            steps(eng, skip)
        counts.append((first, compile_stats()["graphs"] - start))
    # two step shapes (1 token with a "last" row, 6 tokens with every row): 4 graphs each; the attention and MLP
    # graphs of one shape serve every layer
    assert counts == [(8, 8), (8, 8)]
