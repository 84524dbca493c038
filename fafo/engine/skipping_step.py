"""Compiled forwards that skip layers: a graph per sub-layer, shared by every layer, the layer loop in Python.

Self-speculative drafting (SWIFT: Xia et al., "SWIFT: On-the-Fly Self-Speculative Decoding for LLM Inference
Acceleration", ICLR 2025, https://arxiv.org/abs/2410.06916) runs the model with a set of attention and MLP
sub-layers left out, and searches that set while it decodes. One whole-model graph would guard on the set (the
layer loop unrolls over it): one graph per set, recompiles inside timed samples, and the recompile limit after a
few dozen sets. Here the forward is four compiled functions instead, each taking the layer it runs as an input
rather than a constant:

* ``embed``: the embeddings and the rotary cos, sin of the step's positions;
* ``attention``: one attention sub-layer (norm, projections, RoPE, the KV write, attention, residual), given the
  layer's :class:`~fafo.engine.model.Block` and its :class:`~fafo.engine.cache.LayerKV` (the layer's cache views);
* ``mlp``: one MLP sub-layer (norm, gate / up / down, residual);
* ``project``: the final norm and the LM head over the rows asked for.

Dynamo lifts a module's parameters to graph inputs (``inline_inbuilt_nn_modules``, on in torch 2.11 and 2.13) and
the graph never reads the layer index, so every layer of a step shape replays the same graph: a step shape compiles
4 graphs whatever the depth and whatever the set, and a forward is ``2 + (sub-layers kept)`` compiled calls in place
of about 15 eager ops per sub-layer. The plan is the compiled steps' static plan (live lengths in tensors), so the
same attention kernels run as in the whole-model graph.

These graphs do not replay CUDA graphs, even under ``reduce-overhead`` or ``max-autotune``: cudagraph trees record a
path per sequence of graph calls, and each new set is a new sequence (a recording inside a timed sample, and memory
in the pool per set). Their kernels are inductor's, fused as in every other compiled step; their launches are one
per kernel.
"""

from __future__ import annotations

import torch

from fafo.engine.attention import AttentionPlan
from fafo.engine.cache import KVCache


def _embed(model, tokens, positions):
    return model.embed(tokens, positions)


def _attention(block, x, cos, sin, layer_kv, slots, plan, backend):
    return block.attention_part(x, cos, sin, layer_kv, slots, plan, backend)


def _mlp(block, x):
    return block.mlp_part(x)


def _project(model, x, logits):
    return model.project(x, logits)


class SkippingStep:
    """Compiled forwards with ``skip=(attention layers, MLP layers)`` (see the module docstring).

    Args:
        mode: a ``torch.compile`` mode without CUDA graphs (``CompileOptions.mode_without_cudagraphs``).
        backend: the ``torch.compile`` backend.
    """

    def __init__(self, mode: str, backend: str):
        def compiled(fn):
            return torch.compile(fn, mode=mode, backend=backend, dynamic=False, fullgraph=True)

        self.embed, self.attention, self.mlp, self.project = map(compiled, (_embed, _attention, _mlp, _project))

    def __call__(self, model, tokens, positions, cache: KVCache, slots, plan: AttentionPlan, backend: str,
                 logits, skip: tuple[frozenset, frozenset]) -> torch.Tensor:
        """One forward of ``model`` (as :meth:`Transformer.forward`) with a static ``plan`` over ``cache``."""
        if not isinstance(cache, KVCache) or plan.capture_rows is not None or plan.region_from is not None:
            raise ValueError("compiled layer-skipping forwards take the engine's KVCache and a plan without captured "
                             "queries or a region; run with bench.compile=false")
        skip_attn, skip_mlp = skip
        x, cos, sin = self.embed(model, tokens, positions)
        for i, block in enumerate(model.model.layers):
            if i not in skip_attn:
                x = self.attention(block, x, cos, sin, cache.layer(i), slots, plan, backend)
            if i not in skip_mlp:
                x = self.mlp(block, x)
        return self.project(model, x, logits)
