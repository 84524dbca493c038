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


def _quantspec_cache(d: Dims, slots: int, nbytes: int, group: int, scratch: int, lower: bool, full: bool) -> int:
    """Bytes of a :class:`baselines.quantspec_cache.QuantKVCache` (planes, per-group scales, fp buffer)."""
    from baselines.quantspec_cache import quantized_count

    t = quantized_count(slots, group)
    per_layer_head = 2 * t * d.head_dim // 2 * (2 if lower else 1)  # k and v upper (+ lower) 4-bit planes
    per_layer_head += 2 * (t // group) * d.head_dim * nbytes + 2 * t * nbytes  # key min/scale, value min/scale
    if not full:
        per_layer_head += 2 * (2 * group + scratch) * d.head_dim * nbytes  # the full-precision buffer
    return d.layers * d.kv_heads * per_layer_head


@dataclass
class Buffers:
    """What a decoder holds besides the weights: ``kept`` across generations (draft models, 4-bit weights,
    retrieval caches), ``transient`` only while it generates (freed after), and what it does with the engine's
    shared cache: ``uses`` it, or ``releases`` it when it starts (QuantSpec's INT8 verifier, eager)."""

    kept: int = 0
    transient: int = 0
    uses_engine_cache: bool = True
    releases_engine_cache: bool = False


def _quantspec(m, d: Dims, slots: int, nbytes: int, compiled: bool) -> Buffers:
    int8 = m.target == "int8kv"
    cache = _quantspec_cache(d, slots, nbytes, m.group_size, m.gamma + 1, int8, not int8)
    weights = 0
    if m.weight_bits is not None and m.gamma > 0:  # 4-bit draft MLPs: codes + per-group min/scale
        n = 3 * d.hidden * d.intermediate
        weights = d.layers * (n // 2 + 2 * (n // m.weight_group) * nbytes + (n * nbytes if m.resident_weights else 0))
    # the quantized cache is freed after each generation; int8kv releases the engine's cache unless compiled
    return Buffers(weights, cache, uses_engine_cache=not int8, releases_engine_cache=int8 and not compiled)


def _int8_reference(m, d: Dims, slots: int, nbytes: int, compiled: bool) -> Buffers:
    if m.kv == "fp":
        return Buffers()
    cache = _quantspec_cache(d, slots, nbytes, m.group_size, 1, True, False)
    return Buffers(0, cache, uses_engine_cache=False, releases_engine_cache=not compiled)


def _triforce(m, d: Dims, slots: int, nbytes: int, compiled: bool) -> Buffers:
    retrieval = (m.budget + m.max_proposal + 1) * d.kv_per_slot(nbytes)
    draft = 0
    if m.draft is not None:
        try:
            ckpt = m._draft_checkpoint()
            dd = Dims.of(ckpt.config)
            draft = dd.params() * nbytes + (m.draft_budget + m.gamma2 + 1) * dd.kv_per_slot(nbytes)
        except Exception:  # noqa: BLE001 - an unreadable draft is reported by check_target
            draft = 0
    return Buffers(retrieval + draft)


def _longspec(m, d: Dims, slots: int, nbytes: int, compiled: bool) -> Buffers:
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    attn = d.hidden * (q + 2 * kv) + (q + 2 * kv) + q * d.hidden
    layer = 2 * attn + 3 * d.hidden * d.intermediate + 3 * d.hidden  # self + cross attention, MLP, 3 norms
    window = 2 * m.window * kv * nbytes  # the draft's ring of self-attention KV
    return Buffers(layer * nbytes + window)


def _token_recycling(m, d: Dims, slots: int, nbytes: int, compiled: bool) -> Buffers:
    return Buffers(d.vocab * m.topk * 8)  # the adjacency matrix: top-k next ids of every token (int64)


# class name -> (decoder, dims, cache slots, dtype bytes, compiled) -> its Buffers
METHOD_BYTES = {
    "QuantSpecDecoder": _quantspec,
    "Int8KVReference": _int8_reference,
    "TriForceDecoder": _triforce,
    "LongSpecDecoder": _longspec,
    "TokenRecyclingDecoder": _token_recycling,
}


def method_buffers(decoder, config, slots: int, nbytes: int, compiled: bool) -> Buffers:
    """A decoder's :class:`Buffers`: its own ``plan_bytes(config, slots, nbytes, compiled)`` if it has one, else
    :data:`METHOD_BYTES`, else nothing beyond the engine's cache."""
    own = getattr(decoder, "plan_bytes", None)
    if callable(own):
        return own(config, slots, nbytes, compiled)
    fn = METHOD_BYTES.get(type(decoder).__name__)
    return fn(decoder, Dims.of(config), slots, nbytes, compiled) if fn else Buffers()


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
