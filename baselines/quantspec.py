"""QuantSpec: self-speculative decoding with a hierarchical 4/8-bit KV cache (Tiwari et al., 2025,
https://arxiv.org/abs/2502.10424), greedy.

The target model drafts for itself: ``gamma`` tokens, one forward each, reading the **INT4 view** of the cache
(upper 4-bit planes) with its MLP weights in 4 bits, then one verification forward of the target over
``[current | drafts]`` commits the longest argmax-matching prefix plus the target's next token. The verifier reads
the INT8 view (``target: int8kv``, the paper: exact against :class:`Int8KVReference`, the autoregressive decoder on
the same INT8 cache, not against full-precision vanilla) or a full-precision cache kept beside the draft's planes
(``fp16``: token-identical to vanilla, no memory saving). One cache serves both (:mod:`baselines.quantspec_cache`);
the draft's 4-bit MLPs are :mod:`baselines.quantspec_weights`.
The first author's code (``rishabh-16/QuantSpec``) was read to learn the layout; this is our own implementation.
Choices where the paper is silent, memory accounting and ``extras``: docs/methods/quantspec.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from baselines.quantspec_cache import QuantKVCache, cache_bytes
from baselines.quantspec_weights import Int4MLP, swapped_mlps
from fafo.decoding import Buffers, Clock, Decoder, Generation, Step, StepState, decode
from fafo.engine.attention import causal_plan
from fafo.engine.batching import greedy_chain
from fafo.engine.engine import Engine
from fafo.bounds import at_least, check_bounds, one_of
from fafo.errors import ConfigError
from fafo.sampling import Sampling


@dataclass
class QuantSpecDecoder(Decoder):
    """QuantSpec, greedy (paper defaults: G = 128, gamma 6 of its best 4-6, 4-bit draft MLP weights).

    Attributes:
        gamma: draft tokens per verification, >= 1 (the reference's 0, no draft, is Int8KVReference).
        target: ``int8kv`` (the verifier reads the INT8 view, the paper) or ``fp16`` (full-precision cache for
            the verifier: lossless against vanilla, no memory saving).
        group_size: ``G``: tokens per key group; the buffer holds G..2G recent tokens. Must exceed gamma + 1.
        weight_bits: 4 (the draft's MLP weights in 4 bits, round-to-nearest; the paper uses GPTQ) or null (full
        precision).
        weight_group: inputs per 4-bit weight group (paper: 128). Even.
        resident_weights: keep the draft's 4-bit MLP weights dequantized (identical values, much faster in plain
            PyTorch on CPU, full-precision ``weight_bytes``); false = dequantize per forward (the int4 kernels' memory).
        chunk_size: quantized tokens dequantized at a time in attention (rounded down to whole groups).
    """

    batch_refusal: ClassVar[str] = "its INT8/INT4 caches and self-drafts are one request's (not batched)"
    gamma: int = at_least(1, 6)  # 0 only inside Int8KVReference (autoregressive on the INT8 cache)
    target: str = one_of(("int8kv", "fp16"), "int8kv", why="int8kv = the paper's INT8 verifier, fp16 = a "
                         "full-precision verifier, lossless against vanilla")
    group_size: int = at_least(2, 128)
    weight_bits: int | None = one_of((4, None), 4, why="RTN 4-bit draft MLP weights or full precision")
    weight_group: int = at_least(2, 128)
    resident_weights: bool = False
    chunk_size: int = at_least(1, 1024)
    _mlps: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _kept: tuple | None = field(default=None, init=False, repr=False, compare=False)  # (engine, QuantKVCache)

    def __post_init__(self):
        check_bounds(self, "method")
        if self.group_size % 2 or self.gamma + 1 >= self.group_size:
            raise ConfigError(f"method.group_size={self.group_size} must be even and larger than method.gamma + 1 "
                              f"= {self.gamma + 1} (a step may cross at most one group boundary)")
        if self.weight_group % 2:
            raise ConfigError(f"method.weight_group={self.weight_group} must be even (two codes per byte)")

    def check_sampling(self, sampling: Sampling) -> None:
        if not sampling.greedy:
            raise ConfigError("method=quantspec decodes greedily (the paper's setting); use sampling=greedy")

    def check_target(self, hf_config, tokenizer, weights: bool = True) -> None:
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        if head_dim % 2:
            raise ConfigError(f"method=quantspec needs an even head_dim (two 4-bit codes per byte); the model has "
                              f"{head_dim}")

    def extra_slots(self, max_new_tokens: int) -> int:
        return self.gamma + 1  # [current | drafts] past the committed tokens

    def plan_bytes(self, args, slots: int, nbytes: int, compiled: bool) -> Buffers:
        """The quantized cache (freed after each generation) and the 4-bit draft MLPs (codes and per-group
        min/scale, plus the dequantized copy with ``resident_weights``); ``int8kv`` releases the engine's cache
        unless steps are compiled."""
        int8 = self.target == "int8kv"
        cache = cache_bytes(args, slots, nbytes, self.group_size, self.gamma + 1, lower=int8, full=not int8)
        weights = 0
        if self.weight_bits is not None and self.gamma > 0:
            n = 3 * args.dim * args.intermediate_size
            weights = args.n_layers * (n // 2 + 2 * (n // self.weight_group) * nbytes
                                       + (n * nbytes if self.resident_weights else 0))
        return Buffers(weights, cache, uses_engine_cache=not int8, releases_engine_cache=int8 and not compiled)

    # ---------------------------------------------------------------- state reused across generations
    def _draft_mlps(self, engine: Engine):
        """The 4-bit MLPs of the draft, built once per engine (None: full-precision draft MLPs)."""
        if self.weight_bits is None or self.gamma == 0:
            return None
        if self._mlps is None or self._mlps[0] is not engine:
            self._mlps = (engine, [Int4MLP(b.mlp, self.weight_group, self.resident_weights)
                                   for b in engine.model.model.layers])
        return self._mlps[1]

    def _new_cache(self, engine: Engine, capacity: int, full) -> QuantKVCache:
        """The quantized cache of one generation. Eager: a new one, freed with the generation (the decoder timed
        next, the INT8 reference or this one, holds only its own). Compiled: one cache kept across generations at
        the static cache's size (compiled graphs are specialised to its shapes, CUDA graphs to its addresses), as
        the engine keeps its own; the runner frees it when the run ends (:meth:`release`)."""
        a = engine.model.args

        def new(slots: int) -> QuantKVCache:
            return QuantKVCache(a.n_layers, 1, a.n_kv_heads, a.head_dim, slots, self.group_size, self.gamma + 1,
                                engine.dtype, engine.device, lower=self.target == "int8kv", full=full,
                                chunk=self.chunk_size)

        if engine.compiled is None:
            return new(capacity)
        if self._kept is None or self._kept[0] is not engine or not self._kept[1].fits(capacity, full):
            self._kept = None  # free the old one first
            static = engine.static_cache
            with torch.inference_mode(False):  # written in place by every later generation
                kv = new(max(capacity, static.max_len if static is not None else 0))
            engine.keep_address(kv)
            self._kept = (engine, kv)
        self._kept[1].reset()
        return self._kept[1]

    def weight_bytes(self) -> int:
        """Bytes of the 4-bit draft MLPs (0 before they are built, or without them)."""
        return sum(m.nbytes for m in self._mlps[1]) if self._mlps is not None and self._mlps[1] else 0

    def held_bytes(self) -> int:
        """The 4-bit draft MLPs and, under compiled steps, the quantized cache kept for the next generation."""
        return self.weight_bytes() + (self._kept[1].nbytes if self._kept is not None else 0)

    # ---------------------------------------------------------------- decoding
    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        if sampling is not None:
            self.check_sampling(sampling)
        capacity = len(prompt_ids) + max_new_tokens + self.extra_slots(max_new_tokens)
        full = None
        if self.target == "fp16":
            full = engine.cache(capacity)
        elif engine.compiled is None:
            engine.release_cache()  # not used: release it, so peak memory is this method's own
        state = _QuantSpecState(self, engine, prompt_ids, self._new_cache(engine, capacity, full), eos_ids)
        return decode(engine, state, max_new_tokens, eos_ids, clock)


class _QuantSpecState(StepState):
    """One generation: the hierarchical cache (and the full one for ``target: fp16``), the INT4 draft MLPs."""

    def __init__(self, cfg: QuantSpecDecoder, engine: Engine, prompt_ids: list[int], kv: QuantKVCache, eos_ids):
        self.cfg, self.engine, self.kv, self.eos_ids = cfg, engine, kv, eos_ids
        self.mlps = cfg._draft_mlps(engine)
        self.prompt = list(prompt_ids)
        self.N = len(self.prompt)  # committed tokens with KV; cur sits at position N
        self.fp_tokens: list[int] = []  # committed full-precision tokens after the prefill and each commit
        self.chain = torch.empty(cfg.gamma, dtype=torch.long, device=engine.device)  # drafts where a device left them

    def _verify_cache(self):
        if self.kv.full is not None:
            return self.kv.full
        self.kv.view = "int8"
        return self.kv

    def prefill(self) -> int:
        """Full-precision attention over the prompt, then its KV goes to the planes and the buffer."""
        idx = list(range(self.N))
        self.kv.prefill_to(self.N)
        logits = self.engine.forward(self._verify_cache(), self.prompt, idx, idx, causal_plan(0), logits="last",
                                     eager=True, kind="prefill")
        if self.kv.full is not None:
            self.kv.quantize_full_prefix()
        self.cur = int(logits[0, -1].argmax())
        self.fp_tokens.append(self.N - self.kv.nq)
        return self.cur

    def step(self, remaining: int) -> Step:
        """Up to gamma INT4 self-drafts (drafts past the budget would be cut), then one verification."""
        engine, kv, N = self.engine, self.kv, self.N
        want = min(self.cfg.gamma, remaining - 1)
        drafts: list[int] = []
        if want > 0:
            kv.view = "int4"

            def draft(feed, i, into):  # its own KV to scratch slot N + i (the verification rewrites it)
                p = N + i
                return engine.forward(kv, feed, [p], [p], causal_plan(p), logits="last", kind="draft", greedy=True,
                                      into=into)

            with swapped_mlps(engine.model, self.mlps):  # on a device, one read for the drafts (greedy_chain)
                drafts = greedy_chain(draft, [self.cur], want, self.chain, stop=self.eos_ids)
        feed = [self.cur] + drafts
        pos = list(range(N, N + len(feed)))
        y = engine.forward(self._verify_cache(), feed, pos, pos, causal_plan(N), logits="all", greedy=True,
                           pad_to=self.cfg.gamma + 1)[0].tolist()  # one step shape under compiled steps
        a = next((i for i, (d, t) in enumerate(zip(drafts, y)) if d != t), len(drafts))  # accepted prefix
        return Step(drafts[:a] + [y[a]], len(drafts))

    def commit(self, step: Step) -> None:
        """[cur | accepted drafts] now have final KV; rejected drafts' slots are scratch."""
        self.N += step.accepted + 1
        self.cur = step.tokens[-1]
        self.kv.advance(self.N)
        self.fp_tokens.append(self.N - self.kv.nq)

    def extras(self) -> dict:
        kv, weight_bytes = self.kv, self.cfg.weight_bytes()
        full_bytes = kv.full.nbytes if kv.full is not None else 0
        return {
            "quantized_tokens": kv.nq,
            "fp_tokens_min": min(self.fp_tokens),
            "fp_tokens_max": max(self.fp_tokens),
            "kv_bytes": kv.nbytes + full_bytes,
            "weight_bytes": weight_bytes,
            "buffer_bytes": kv.nbytes + weight_bytes,  # the runner adds the engine's cache (fp16: the full one)
        }


@dataclass
class Int8KVReference(Decoder):
    """The reference for ``target: int8kv``, set as ``bench.reference`` (the ``experiment=quantspec_table3`` preset
    does): ``exact_match`` is then exactness against autoregressive greedy decoding on QuantSpec's INT8 cache
    (``kv: int8``, QuantSpecDecoder with gamma 0 and no draft), or agreement with full-precision vanilla (``kv:
    fp``; speedups are then over vanilla, as the paper's).

    Attributes:
        kv: ``int8`` or ``fp``.
        group_size, chunk_size: the method's (``G``: the same view at every position).
    """

    batch_refusal: ClassVar[str] = "its INT8/INT4 caches and self-drafts are one request's (not batched)"
    kv: str = one_of(("int8", "fp"), "int8", why="int8 = INT8-KV autoregressive, fp = vanilla")
    group_size: int = at_least(4, 128, why="the method's G, even and above its gamma + 1 >= 2")
    chunk_size: int = at_least(1, 1024)
    _inner: Decoder | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_bounds(self, "bench.reference")
        if self.kv == "int8":
            self._inner = QuantSpecDecoder(gamma=1, target="int8kv", group_size=self.group_size, weight_bits=None,
                                           chunk_size=self.chunk_size)
            self._inner.gamma = 0  # no draft: autoregressive on the INT8 cache (a gamma users cannot set)
        else:
            from baselines.vanilla import VanillaDecoder

            self._inner = VanillaDecoder()

    def check_sampling(self, sampling: Sampling) -> None:
        self._inner.check_sampling(sampling)

    def held_bytes(self) -> int:
        return self._inner.held_bytes()

    def extra_slots(self, max_new_tokens: int) -> int:
        return self._inner.extra_slots(max_new_tokens)

    def plan_bytes(self, args, slots: int, nbytes: int, compiled: bool) -> Buffers:
        if self.kv == "fp":
            return Buffers()
        cache = cache_bytes(args, slots, nbytes, self.group_size, 1, lower=True, full=False)
        return Buffers(0, cache, uses_engine_cache=False, releases_engine_cache=not compiled)

    def generate(self, engine: Engine, prompt_ids: list[int], max_new_tokens: int, eos_ids=(),
                 sampling: Sampling | None = None, generator=None, clock: Clock | None = None) -> Generation:
        return self._inner.generate(engine, prompt_ids, max_new_tokens, eos_ids, sampling, generator, clock)
