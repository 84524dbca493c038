"""Compiled decode steps: one ``torch.compile`` of the model forward, static shapes, CUDA graphs where possible.

What changes from one decode step to the next is held in tensors, never in Python ints the compiler would guard
on (the gpt-fast recipe, adapted to block-sparse attention):

* ``sdpa`` attention without CUDA graphs (CPU's default): the live prefix (and FAFO's region) is the length of a
  small tensor marked dynamic, so ONE graph slices exactly the filled part of the cache at every length: compiled
  steps never read the dead tail, and a long static cache costs nothing;
* ``flex`` (CUDA's default) and CUDA graphs: the cache is read over its whole static capacity; how many slots are
  live is a ``[1]`` length tensor read by the mask_mod (or an additive mask), and the BlockMask's active KV block
  count is updated in place, so the kernel skips the dead tail of the cache without a rebuild or a recompile
  (every block partial: :mod:`fafo.engine.block_masks`); each flex call is issued to a Triton kernel that exists
  for its shape (:mod:`fafo.engine.flex_routing`);
* step masks come prebuilt from the decoder (FAFO, Lookahead), or are built here once per step length (causal) or
  over a persistent ``[Q, Q]`` buffer the step's mask is copied into (SWIFT's and the tree methods' trees);
* a batched step (several requests, :mod:`fafo.engine.batching`) is the same with a length per row: ``[B]``
  live lengths (copied into the persistent length tensors; their BlockMasks have a batch dimension), ``[B, Q, Q]``
  mask buffers; graphs are specialised per (rows, step shape), the rows padded to a bucket by the batching layer;
* every decode forward has a shape that depends only on the method's hyperparameters (:attr:`Engine.static_shapes`:
  the engine pads a step to the size the decoder names, :mod:`fafo.engine.static_shapes`), so one generation
  compiles a fixed set of graphs and every later sample, of any length, reuses them as long as the cache is not
  reallocated (the runner sizes it once, before warm-up).

A method's own cache plans its compiled steps itself: QuantSpec's quantized cache reads its stored length and the
step's position from tensors and its planes over their static capacity, masked (``baselines/quantspec_cache.py``).

Prefill (``plan.prefix == 0``) runs eagerly on the configured backend: it happens once per turn, is compute
bound, and its length varies. Forwards that skip layers (SWIFT's drafts and layer-set search) take the same static
plan through a graph per sub-layer instead of one per model (:mod:`fafo.engine.skipping_step`): their layer set
changes while SWIFT decodes, and a whole-model graph would recompile for each set.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fafo.engine.attention import AttentionPlan
from fafo.engine.block_masks import buffer_block_mask, causal_block_mask
from fafo.engine.cache import Cache, KVCache
from fafo.engine.flex_masks import LiveLength
from fafo.engine.kernels import gathered_mask, written
from fafo.engine.skipping_step import SkippingStep
from fafo.engine.torch_compat import no_duck_shapes, raise_recompile_limit

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# the modes that turn CUDA graphs on, each with its twin without them (torch/_inductor/__init__.py,
# list_mode_options: "reduce-overhead" and "max-autotune" set "triton.cudagraphs", torch 2.11 and 2.13)
WITHOUT_CUDAGRAPHS = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


@dataclass
class CompileOptions:
    """How decode steps are compiled.

    Attributes:
        mode: a ``torch.compile`` mode; ``reduce-overhead`` and ``max-autotune`` replay CUDA graphs (CUDA only).
        backend: a ``torch.compile`` backend (``inductor``; ``aot_eager`` traces without code generation).
        attention: the compiled steps' attention: ``flex`` (block-sparse over the static cache, skips its dead
            tail) or ``sdpa`` (fused kernels over exactly the live prefix, a dynamic size; with CUDA graphs over
            the whole capacity with a length mask); ``auto`` = flex on CUDA, sdpa on CPU (inductor cannot lower
            FlexAttention's log-sum-exp output on CPU: torch 2.11 and 2.13, ``flex_cpu.py: lower_cpu``).
    """

    mode: str = "default"
    backend: str = "inductor"
    attention: str = "auto"

    @property
    def cudagraphs(self) -> bool:
        return self.mode in WITHOUT_CUDAGRAPHS

    @property
    def mode_without_cudagraphs(self) -> str:
        """The same mode without CUDA graphs (graphs whose outputs later graphs read, whose call sequences vary)."""
        return WITHOUT_CUDAGRAPHS.get(self.mode, self.mode)

    def attention_for(self, device: torch.device) -> str:
        if self.attention != "auto":
            return self.attention
        return "flex" if device.type == "cuda" else "sdpa"


class CompiledStep:
    """The engine's compiled decode forward (same arguments as :meth:`Transformer.forward`).

    Args:
        model: the transformer whose ``forward`` is compiled.
        options: compile mode, backend and attention.
        device: where the model lives (picks the attention for ``attention="auto"``).
    """

    def __init__(self, model, options: CompileOptions, device: torch.device):
        self.options, self.model = options, model
        self.attention = options.attention_for(device)
        raise_recompile_limit(32)  # past the limit dynamo would silently run eager: fail loudly instead
        self.fn = torch.compile(model.forward, mode=options.mode, backend=options.backend, dynamic=False,
                                fullgraph=True)  # a graph break would run part of a step eagerly: an error
        self.skip_fn = SkippingStep(options.mode_without_cudagraphs, options.backend)  # forwards that skip layers
        # live lengths as dynamic sizes (sdpa, no CUDA graphs: those would record one graph per length)
        self.live_lengths = self.attention == "sdpa" and not options.cudagraphs
        if self.live_lengths:  # the prefix and the region may be equal: two symbols, not one
            no_duck_shapes()
        self._live: dict[tuple, torch.Tensor] = {}
        self._lengths: dict[tuple, LiveLength] = {}
        self._causal: dict[tuple, object] = {}
        self._step_buffers: dict[tuple, tuple[torch.Tensor, object]] = {}
        self._in_buffer: dict[tuple, tuple] = {}  # the mask each buffer holds a copy of, and its write count

    def __call__(self, tokens, positions, cache: Cache, slots, plan: AttentionPlan, logits="all", skip=None,
                 greedy: bool = False, into: torch.Tensor | None = None):
        """One compiled forward (:meth:`Transformer.forward`'s arguments); ``greedy`` computes the rows' argmax
        inside the graph, written ``into`` a caller's tensor when one is given (the one copy a CUDA graph's output
        needs anyway)."""
        plan = self.static_plan(cache, plan, tokens.shape[1])
        if skip is not None:  # no CUDA graphs there: outputs are the caller's
            out = self.skip_fn(self.model, tokens, positions, cache, slots, plan, self.attention, logits, skip)
            return (torch.argmax(out, -1, out=into) if into is not None else out.argmax(-1)) if greedy else out
        if self.options.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        out = self.fn(tokens, positions, cache, slots, plan, self.attention, logits, skip, greedy)
        if into is not None:
            return into.copy_(out)
        if self.options.cudagraphs:  # graph outputs are overwritten by the next replay: keep copies
            if isinstance(out, tuple):
                return out[0].clone(), out[1].clone()
            out = out.clone()
        return out

    def buffers(self) -> list[torch.Tensor]:
        """The device tensors kept from step to step outside the graphs (live lengths, their block masks' counts,
        the step mask buffers): device memory to a probe that counts what the host reads
        (:mod:`fafo.bench.tools.host_probe`)."""
        out = [*self._live.values(), *(buf for buf, _ in self._step_buffers.values())]
        return out + [t for length in self._lengths.values() for t in length.tensors()]

    def static_plan(self, cache: Cache, plan: AttentionPlan, n_queries: int) -> AttentionPlan:
        """The plan with every per-step quantity moved into tensors (the compiled graph guards on the rest). A
        method's own cache (QuantSpec's) plans its compiled steps itself (``cache.static_plan``)."""
        if not isinstance(cache, KVCache):
            if not hasattr(cache, "static_plan"):
                raise TypeError(f"{type(cache).__name__} has no static_plan: its steps cannot run compiled")
            return cache.static_plan(plan, n_queries)
        if plan.prefix_lens is not None:
            raise ValueError("compiled steps do not support per-query prefix_lens; run with bench.compile=false")
        dev, capacity = cache.keys[0].device, cache.max_len
        region_ok = plan.region_from is None or plan.region_len >= 2
        if self.live_lengths and 2 <= plan.prefix <= capacity - 2 and region_ok:
            return self._live_plan(cache, plan)
        split = n_queries if plan.region_from is None else plan.region_from
        rows = 1 if plan.prefix_length is None else len(plan.prefix_length)  # a batched step: [B] lengths given
        # a step whose one token's KV is already in the cache reads it there: the live length counts it (a batched
        # step's lengths count it already)
        prefix = self._length("prefix", capacity, dev, rows).set(
            plan.prefix + int(plan.step_in_cache) if plan.prefix_length is None else plan.prefix_length)
        changes = dict(prefix=capacity, prefix_length=prefix.length)
        if plan.region_from is not None:
            if not plan.region_capacity:
                raise ValueError("a region plan needs region_capacity (a static bound) when steps are compiled")
            region = self._length("region", plan.region_capacity, dev, rows).set(
                plan.region_len if plan.region_length is None else plan.region_length)
            changes.update(region_len=plan.region_capacity, region_length=region.length)
        if self.attention == "flex":
            changes.update(prefix_block_mask=prefix.block_mask(split) if split else None,
                           step_block_mask=self._step_block_mask(plan, n_queries, dev))
            if plan.region_from is not None:
                changes.update(region_block_mask=region.block_mask(n_queries - split),
                               dense_block_mask=prefix.block_mask(n_queries) if plan.dense_layers else None)
        if self.attention == "sdpa" and plan.step_mask is not None and plan.step_gather is None:
            changes.update(step_gather=gathered_mask(plan.step_mask, static=True))
        return plan.replace(**changes)

    def _live_plan(self, cache: KVCache, plan: AttentionPlan) -> AttentionPlan:
        """sdpa: static capacities in the ints, live lengths in the sizes of dynamic tensors (a batched step: the
        longest row's; each row's own stay in ``prefix_length`` / ``region_length``)."""
        capacity = cache.max_len
        changes = dict(prefix=capacity, prefix_live=self._live_tensor("prefix", plan.prefix, capacity, cache))
        if plan.region_from is not None:
            if not plan.region_capacity:
                raise ValueError("a region plan needs region_capacity (a static bound) when steps are compiled")
            changes.update(region_len=plan.region_capacity,
                           region_live=self._live_tensor("region", plan.region_len, capacity, cache))
        if plan.step_mask is not None and plan.step_gather is None:
            changes.update(step_gather=gathered_mask(plan.step_mask, static=True))
        return plan.replace(**changes)

    def _live_tensor(self, kind: str, length: int, capacity: int, cache: KVCache) -> torch.Tensor:
        """A view of ``length`` elements whose size the graph reads as a symbol in [2, capacity - 2]."""
        key = (kind, capacity, str(cache.keys[0].device))
        if key not in self._live:
            self._live[key] = torch.empty(capacity, dtype=torch.uint8, device=cache.keys[0].device)
        view = self._live[key][:length]
        torch._dynamo.mark_dynamic(view, 0, min=2, max=capacity - 2)  # + 1 (the token itself) < capacity
        return view

    def _length(self, kind: str, capacity: int, dev, rows: int = 1) -> LiveLength:
        key = (kind, capacity, rows, str(dev))
        if key not in self._lengths:
            self._lengths[key] = LiveLength(capacity, dev, rows)
        return self._lengths[key]

    def _step_block_mask(self, plan: AttentionPlan, Q: int, dev):
        if plan.step_block_mask is not None:
            return plan.step_block_mask
        if plan.step_mask is None:
            if (Q, str(dev)) not in self._causal:
                self._causal[Q, str(dev)] = causal_block_mask(Q, dev)
            return self._causal[Q, str(dev)]
        key = (tuple(plan.step_mask.shape), str(dev))  # [Q, Q], or [B, Q, Q]: a mask per batch row
        if key not in self._step_buffers:  # every block active and partial: any tree fits the same mask
            buf = torch.ones(key[0], dtype=torch.bool, device=dev)
            self._step_buffers[key] = (buf, buffer_block_mask(buf))
            self._in_buffer[key] = (None, 0)
        buf, bm = self._step_buffers[key]
        mask, (held, count) = plan.step_mask, self._in_buffer[key]
        if held is not mask or count != written(mask):  # a mask used step after step (FAFO's) is copied once
            buf.copy_(mask)
            self._in_buffer[key] = (mask, written(mask))
        return bm


def reset_compiled_state() -> None:
    """Forget every compiled graph of this process (dynamo's caches and guards, CUDA-graph trees and their memory
    pools, the compiled FlexAttention) and return freed memory to the device. Between the methods of a comparison
    and the jobs of a sweep: graphs pin the static caches they were compiled against, and their count would
    otherwise approach the recompile limit method after method."""
    import gc

    from fafo.engine import attention

    torch._dynamo.reset()
    attention._compiled_flex = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def cudagraph_skips() -> int:
    """Compiled steps that inductor refused to record as CUDA graphs so far (each then runs without replay)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def compile_stats() -> dict:
    """Graphs compiled and seconds spent compiling in this process so far (dynamo's counters)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    seconds = sum(sum(v) for k, v in compilation_time_metrics.items() if k.endswith("compile_inner"))
    return {"graphs": int(counters["stats"]["unique_graphs"]), "compile_s": float(seconds)}
