"""GPU memory of a job, estimated from the model's config alone (no weights): what ``bench.plan`` adds up.

* **weights**: the parameters of the engine's transformer (:mod:`fafo.engine.model`), counted from the config's
  dimensions, times the bytes of the run's dtype;
* **KV cache**: ``2 x layers x kv_heads x head_dim x bytes`` per slot (GQA: the KV heads, not the query heads),
  for the engine's shared static cache, which is allocated in whole blocks of 256 slots;
* **the method's own buffers** (:class:`Buffers` from :data:`METHOD_BYTES`, or a decoder's own
  ``plan_bytes(config, slots, nbytes, compiled)`` where it has one): draft models, quantized caches, retrieval
  caches, adjacency matrices; what a decoder keeps across generations stays allocated while the other one runs;
* **activations**: the transient tensors of the largest forward: an un-chunked prefill's MLP intermediates and
  hidden states, and one step's logits in float32.

The estimate is what these tensors hold; the CUDA allocator's fragmentation and the CUDA context (about 0.5 GB) come
on top, so ``bench.plan`` keeps :data:`HEADROOM` of the GPU free.
"""

from __future__ import annotations

from dataclasses import dataclass

from fafo.decoding import Buffers
from fafo.engine.model import ModelArgs

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
HEADROOM = 0.95  # fraction of the GPU a job may plan to fill (allocator fragmentation, CUDA context)
CACHE_BLOCK = 256  # Engine.cache allocates whole blocks of this many slots
GB = 1e9


def cache_slots(needed: int) -> int:
    """Slots the engine allocates for ``needed`` (rounded up to whole :data:`CACHE_BLOCK` blocks)."""
    return -(-needed // CACHE_BLOCK) * CACHE_BLOCK


@dataclass(frozen=True)
class Dims:
    """The sizes of a decoder-only transformer the estimates need (from a transformers config)."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    qkv_bias: bool
    tied: bool

    @classmethod
    def of(cls, config) -> "Dims":
        heads = config.num_attention_heads
        return cls(vocab=config.vocab_size, hidden=config.hidden_size, intermediate=config.intermediate_size,
                   layers=config.num_hidden_layers, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                   qkv_bias=config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
                   tied=bool(getattr(config, "tie_word_embeddings", False)))

    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden + ((q + 2 * kv) if self.qkv_bias else 0)
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden  # + 2 RMSNorms

    def params(self) -> int:
        """Parameters of the whole model (embeddings, layers, final norm, LM head unless tied)."""
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * self.layer_params() + self.hidden

    def kv_per_slot(self, nbytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * nbytes


def method_buffers(decoder, config, slots: int, nbytes: int, compiled: bool) -> Buffers:
    """A decoder's :class:`~fafo.decoding.Buffers` (its own ``plan_bytes``)."""
    return decoder.plan_bytes(ModelArgs.from_hf(config), slots, nbytes, compiled)


def activation_bytes(config, prompt_tokens: int, step_tokens: int, nbytes: int) -> int:
    """The largest transient tensors: an un-chunked prefill's MLP intermediates (gate, up, their product) and
    residual stream, and one step's float32 logits over the vocabulary."""
    d = Dims.of(config)
    prefill = prompt_tokens * (3 * d.intermediate + 4 * d.hidden) * nbytes + d.vocab * 4
    return max(prefill, step_tokens * d.vocab * 4)


@dataclass
class Memory:
    """A job's estimated peak (bytes). The reference and the method run one after the other: ``peak`` is the
    larger of their phases (weights + every decoder's kept buffers + this decoder's transient ones + the engine's
    cache where it is allocated in that phase + activations); ``kv`` and ``method`` are the largest of each."""

    weights: int
    kv: int
    method: int
    activations: int
    peak: int


def job_memory(config, method, reference, needed_slots: int, longest_prompt: int, dtype: str,
               compiled: bool) -> Memory:
    """Peak memory of one job whose samples fit in ``needed_slots`` (the largest sample's prompt + new tokens +
    scratch). The engine's cache, once allocated (by a decoder using it, or up front for compiled steps), stays
    until a decoder that releases it runs."""
    nbytes = DTYPE_BYTES[dtype]
    d, slots = Dims.of(config), cache_slots(needed_slots)
    bufs = [method_buffers(x, config, slots, nbytes, compiled) for x in (method, reference)]
    kept = sum(b.kept for b in bufs)
    kv_bytes = slots * d.kv_per_slot(nbytes)
    steps = [1] + list(method.forward_tokens() or ()) + [method.extra_slots(0) or 1]
    act = activation_bytes(config, longest_prompt, max(steps), nbytes)
    phases = []
    for b, other in ((bufs[0], bufs[1]), (bufs[1], bufs[0])):
        has_kv = b.uses_engine_cache or compiled or (other.uses_engine_cache and not b.releases_engine_cache)
        phases.append((kv_bytes if has_kv else 0, kept + b.transient))
    peak = max(d.params() * nbytes + kv + own + act for kv, own in phases)
    return Memory(d.params() * nbytes, max(p[0] for p in phases), max(p[1] for p in phases), act, peak)
