"""The engine every decoder shares: one model, one tokenizer, one reusable static cache.

A fair race needs identical kernels, so vanilla and every method run on this object.
"""

from __future__ import annotations

import functools
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from fafo.engine.attention import BACKENDS, AttentionPlan, causal_plan
from fafo.engine.batching import host_logits
from fafo.engine.cache import Cache, KVCache
from fafo.engine.compiled import CompiledStep, CompileOptions
from fafo.engine.context import context_limit
from fafo.engine.flex_masks import FlexMasks
from fafo.engine.kernels import GatheredMask
from fafo.engine.ledger import ForwardLedger, model_call
from fafo.engine.loader import load_hf_config, load_model, load_tokenizer, resolve_checkpoint
from fafo.engine.model import Transformer, plan_is_plain_causal
from fafo.engine.static_shapes import pad_step
from fafo.engine.torch_compat import inference_mode
from fafo.engine.upload import host_gathered, upload
from fafo.errors import ConfigError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CACHE_BLOCK = 256  # the shared cache is allocated in whole blocks of this many slots


def cache_slots(needed: int) -> int:
    """Slots the shared cache is allocated with for ``needed`` (rounded up to whole :data:`CACHE_BLOCK` blocks)."""
    return -(-needed // CACHE_BLOCK) * CACHE_BLOCK


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(f"bench.dtype={name!r} is not supported; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ConfigError(f"model.attention={name!r} is not an attention backend; use one of {', '.join(BACKENDS)}")
    return name


@dataclass
class Engine:
    """Model + tokenizer + static cache on one device.

    Attributes:
        model: the transformer.
        tokenizer: the checkpoint's tokenizer (with its chat template).
        backend: attention backend name (``sdpa`` or ``flex``).
        eos_ids: token ids that end a generation (tokenizer eos + generation_config eos).
        max_len: the model's usable context (:func:`fafo.engine.context.context_limit`).
        static_shapes: every decode-step forward must have a shape that depends only on the method's
            hyperparameters (trees, guess sets and verification windows padded to their maximum: ``pad_to`` of
            :meth:`forward`), so compiled steps never recompile; set when steps are compiled (``bench.compile``).
        ledger: every forward of this engine's weights by kind (:mod:`fafo.engine.ledger`).
        fuse_projections: each layer's q/k/v and gate/up projections as one matrix each
            (:meth:`Transformer.fuse_projections`): ``None`` = on a GPU (fewer, wider matrix products per decode
            step); off on the CPU, where the token-exact suites run on the checkpoint's own matrices.
    """

    model: Transformer
    tokenizer: object
    backend: str = "sdpa"
    eos_ids: tuple[int, ...] = ()
    max_len: int = 0
    name: str = ""
    static_shapes: bool = False
    compiled: CompiledStep | None = field(default=None, repr=False)
    _cache: KVCache | None = field(default=None, repr=False)
    ledger: ForwardLedger = field(default_factory=ForwardLedger, repr=False)
    _flex: FlexMasks | None = field(default=None, repr=False)
    fuse_projections: bool | None = None
    _device: tuple | None = field(default=None, init=False, repr=False)
    # the caches new_cache made for decoders (a probe of device traffic counts them as device memory)
    decoder_caches: weakref.WeakSet = field(default_factory=weakref.WeakSet, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.fuse_projections is None:
            self.fuse_projections = self.device.type == "cuda"
        if self.fuse_projections:
            self.model.fuse_projections()

    @classmethod
    def from_pretrained(cls, path: str, *, device="cpu", dtype="float32", backend="sdpa",
                        revision: str | None = None, max_len: int | None = None, name: str = "",
                        fuse_projections: bool | None = None) -> "Engine":
        """Load a hub id or a local checkpoint directory."""
        check_backend(backend)
        parse_dtype(dtype) if isinstance(dtype, str) else dtype
        ckpt = resolve_checkpoint(path, revision)
        config = load_hf_config(ckpt)
        return cls.load(ckpt, config, load_tokenizer(ckpt), device=device, dtype=dtype, backend=backend,
                        max_len=max_len, name=name or path, fuse_projections=fuse_projections)

    @classmethod
    def load(cls, ckpt, config, tokenizer, *, device="cpu", dtype="float32", backend="sdpa",
             max_len: int | None = None, name: str = "", fuse_projections: bool | None = None) -> "Engine":
        """Load the weights of an already resolved checkpoint directory (config and tokenizer read)."""
        torch_dtype = parse_dtype(dtype) if isinstance(dtype, str) else dtype
        model = load_model(ckpt, config, torch_dtype, torch.device(device))
        context, _ = context_limit(config, max_len)  # rope scaling, max_sequence_length, sliding window
        return cls(model, tokenizer, check_backend(backend), eos_token_ids(ckpt, config, tokenizer), context,
                   name or str(ckpt), fuse_projections=fuse_projections)

    @property
    def device(self) -> torch.device:
        """The model's device, read once per model (an engine never moves its model; reading it through the
        modules costs about 2 us of host time, and every forward asks for it)."""
        if self._device is None or self._device[0] is not self.model:
            self._device = (self.model, self.model.lm_head.weight.device)
        return self._device[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    @property
    def weights_nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @property
    def step_backend(self) -> str:
        """The attention backend of decode steps (compiled steps pick their own, see ``CompileOptions``)."""
        return self.compiled.attention if self.compiled is not None else self.backend

    def enable_compile(self, options: CompileOptions | None = None) -> None:
        """Compile decode steps from now on (see :mod:`fafo.engine.compiled`); decoders pad to static shapes."""
        self.compiled = CompiledStep(self.model, options or CompileOptions(), self.device)
        # the compiled graph alone is the model call: what CompiledStep prepares around it is host work
        self.compiled.fn = functools.partial(model_call, self.compiled.fn, device=self.device)
        self.compiled.skip_fn = functools.partial(model_call, self.compiled.skip_fn, device=self.device)
        self.static_shapes = True
        self._cache = None  # reallocated (with static addresses for CUDA graphs) at the next request

    def release(self) -> None:
        """Drop the static cache and the compiled steps (the weights stay): with
        :func:`~fafo.engine.compiled.reset_compiled_state` the device holds only the weights afterwards."""
        self._cache, self.compiled, self.static_shapes, self._flex = None, None, False, None

    def release_cache(self) -> None:
        """Free the shared static cache (a decoder that reads a cache of its own: its peak is then its own)."""
        self._cache = None

    @property
    def static_cache(self) -> KVCache | None:
        """The shared static cache, None while none is allocated (:meth:`cache` allocates it)."""
        return self._cache

    @property
    def cache_nbytes(self) -> int:
        return self._cache.nbytes if self._cache is not None else 0

    @contextmanager
    def eager_steps(self):
        """Decode steps run eagerly inside on an engine whose steps are compiled: the static cache is kept (compiled
        graphs are specialised to its address), only the compiled step and static padding are off."""
        compiled, static, cache = self.compiled, self.static_shapes, self._cache
        self.compiled, self.static_shapes = None, False
        try:
            yield
        finally:
            self.compiled, self.static_shapes, self._cache = compiled, static, cache

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache:
        """A cache of its own for a decoder (e.g. a retrieval cache); CUDA graphs may keep its address. Always a
        normal tensor, even when allocated inside ``torch.inference_mode`` (e.g. by a decoder whose ``generate``
        runs in it): an inference tensor cannot be written in place outside that mode, which the next decoder on
        the shared engine does."""
        with torch.inference_mode(False):
            cache = self.model.new_cache(max_len, batch)
        self.keep_address(cache)
        self.decoder_caches.add(cache)
        return cache

    def keep_address(self, cache: KVCache) -> None:
        """Mark a cache (or a view of some of its rows) static for CUDA graphs, which then read it in place."""
        if self.compiled is not None and self.compiled.options.cudagraphs:
            for t in cache.tensors():
                torch._dynamo.mark_static_address(t)

    def cache(self, min_len: int, batch: int = 1) -> KVCache:
        """The shared static cache of ``batch`` rows, (re)allocated only when a sample needs more slots than it
        has (or another number of rows).

        Compiled steps are specialised to its size: the runner requests the largest size of a run before warm-up.
        """
        if self._cache is None or self._cache.max_len < min_len or self._cache.batch != batch:
            self._cache = None  # free the old one first
            self._cache = self.new_cache(cache_slots(min_len), batch)
        return self._cache

    def tensor(self, values, dtype=torch.long) -> torch.Tensor:
        """Python values (or a tensor on another device) as one tensor on the device (a non-blocking copy)."""
        if isinstance(values, torch.Tensor) and values.device == self.device:
            return values.to(dtype)
        return self.upload(values, dtype=dtype)[0]

    def upload(self, *values, dtype=torch.long) -> list:
        """:func:`upload` on this engine's device, counted in :attr:`ForwardLedger.uploads` (a decode step's
        host-to-device copies)."""
        out = upload(values, self.device, dtype)
        self.ledger.uploads += out is not values
        return out

    def forward(self, cache: Cache, tokens, positions, slots, plan: AttentionPlan, logits="all", skip=None,
                eager: bool = False, kind: str = "verify", pad_to: int | None = None, queries: bool = False,
                greedy: bool = False, into: torch.Tensor | None = None):
        """One model step (see :meth:`Transformer.forward`); tokens/positions/slots may be lists or tensors.
        ``kind`` is what the forward is for, recorded in :attr:`ledger` (``prefill``, ``verify``, ``draft``,
        ``aux``: :mod:`fafo.engine.ledger`). ``queries=True``: returns ``(logits, queries)``, the post-RoPE queries
        of the rows ``plan.capture_rows`` names, ``[L, B, H_q, R, D]`` (None when it names none). ``greedy=True``:
        each logits row's argmax token instead of the row, ``[B, Q']`` long (a greedy decoder reads nothing else): a
        compiled step computes it in its graph; eagerly it is one op after the forward, or numpy's argmax where the
        logits are host memory (:func:`~fafo.engine.batching.host_logits`). ``into``: a ``[B, Q']`` long tensor the
        tokens are written to and returned in, except where read by numpy (:func:`~fafo.engine.batching.greedy_chain`'s
        buffer: no op of its own).

        ``pad_to``: the most rows this kind of step can have (host inputs only). Under :attr:`static_shapes` the
        step is padded to it (:mod:`fafo.engine.static_shapes`) and only the real rows come back.

        ``plan.step_mask`` may be a numpy bool array: a mask built on the host for this step (a tree's). Its
        per-query key lists (:class:`~fafo.engine.kernels.GatheredMask`) are then computed on the host too and
        travel with the step's inputs in one copy: nothing is read back from the device to size them.

        Decode steps (``plan.prefix > 0``) run compiled when :meth:`enable_compile` was called (layer-skipping
        ones a graph per sub-layer: :mod:`fafo.engine.skipping_step`); prefill and ``eager=True`` forwards (e.g. a
        chunked prefill, whose lengths vary) run eagerly.

        A batched step (several requests, one per cache row: :func:`fafo.engine.batching.forward_rows` builds it)
        passes ``[B, Q]`` host tokens, positions and slots, and each row's prefix (and region) length as host
        arrays in ``plan.prefix_length`` (``plan.region_length``), ``plan.prefix`` (``region_len``) their largest.
        """
        with inference_mode():  # the C++ guard torch.inference_mode enters: 1 us less per forward
            n_real = None
            if pad_to is not None and self.static_shapes:
                tokens, positions, slots, plan, n_real = pad_step(tokens, positions, slots, plan, pad_to)
                if isinstance(logits, str) and logits == "last":
                    logits = [n_real - 1]  # the last real row, uploaded with the step's inputs
            prefix = plan.prefix  # committed slots read (what the ledger records)
            lengths = [None, None]  # a batched step's prefix and region length per row (host arrays)
            if isinstance(plan.prefix_length, np.ndarray):
                region = plan.region_length
                lengths = [plan.prefix_length, region if isinstance(region, np.ndarray) else None]
                # each row's own vanilla step reads its token from the cache
                if appends_one_token_rows(tokens, slots, plan):
                    lengths[0] = lengths[0] + 1  # the token's own slot counted, as compiled steps count it
                    plan = plan.replace(prefix=plan.prefix + 1, step_in_cache=True)
            elif appends_one_token_host(tokens, slots, plan):  # decided on host values: no device read
                plan = plan.replace(step_in_cache=True)
            device, mask, index, valid = self.device, plan.step_mask, None, None
            if isinstance(mask, np.ndarray):  # a compiled sdpa step takes one of two widths (gather_width)
                index, valid = host_gathered(mask, self.compiled is not None and self.compiled.attention == "sdpa")
            elif mask is not None and mask.device == device:
                mask = None  # already there
            rows = logits if isinstance(logits, (list, np.ndarray)) else None
            tokens, positions, slots, mask, rows, index, valid, *lengths = self.upload(
                tokens, positions, slots, mask, rows, index, valid, *lengths)
            if mask is not None:  # a tree's mask built on the host travels in the same copy
                gathered = None
                if index is not None:
                    gathered = GatheredMask.__new__(GatheredMask)
                    gathered.index, gathered.valid, gathered.width = index, valid, index.shape[-1]
                plan = plan.replace(step_mask=mask, step_gather=gathered)
            if lengths[0] is not None:
                plan = plan.replace(prefix_length=lengths[0],
                                    region_length=lengths[1] if lengths[1] is not None else plan.region_length)
            logits = logits if rows is None else rows
            if tokens.dim() == 1:
                tokens = tokens[None]
            region_rows = tokens.shape[-1] - plan.region_from if plan.region_from is not None else 0
            share = 1 - (len(skip[0]) + len(skip[1])) / (2 * self.model.args.n_layers) if skip is not None else 1.0
            self.ledger.record(kind, tokens.shape[-1], prefix, region_rows, plan.region_len, share, tokens.shape[0])
            if self.compiled is not None and plan.prefix > 0 and not eager:
                out = self.compiled(tokens, positions, cache, slots, plan, logits, skip, greedy, into)  # timed inside
                greedy = False  # computed in the graph
            else:
                if self.backend == "flex":  # the block masks the plan implies, built once (fafo.engine.flex_masks)
                    self._flex = self._flex or FlexMasks(device)
                    plan = self._flex.fill(plan, tokens.shape[-1])
                out = model_call(self.model, tokens, positions, cache, slots, plan, self.backend, logits, skip,
                                 device=device)
            out, captured = out if isinstance(out, tuple) else (out, None)
            if greedy:
                if host_logits([out]):
                    out = torch.from_numpy(out.numpy().argmax(-1))
                else:
                    out = torch.argmax(out, -1, out=into) if into is not None else out.argmax(-1)
            out = out[:, :n_real] if n_real is not None and isinstance(logits, str) else out
            return (out, captured) if queries else out

    def prefill(self, cache: KVCache, prompt_ids: list[int], logits="last") -> torch.Tensor:
        """Write the prompt's KV to slots ``[0, T)`` at positions ``[0, T)``; returns its logits rows."""
        idx = torch.arange(len(prompt_ids), device=self.device)
        return self.forward(cache, prompt_ids, idx, idx, causal_plan(0), logits, kind="prefill")


def appends_one_token_host(tokens, slots, plan: AttentionPlan) -> bool:
    """Vanilla's decode step, seen on the host values the decoder passed (no device read): one token (a host value,
    or a device tensor of one element) whose KV goes to the slot right after the prefix of a plain causal plan. Its
    attention is then one kernel call over the cache (``AttentionPlan.step_in_cache``), on every device."""
    if isinstance(slots, torch.Tensor) or slots is None:
        return False
    slots = [slots] if isinstance(slots, int) else slots
    if len(slots) != 1 or int(slots[0]) != plan.prefix or not plan_is_plain_causal(plan):
        return False
    if isinstance(tokens, torch.Tensor):  # a token fed where a forward left it (its shape is host metadata)
        return tokens.numel() == 1
    if isinstance(tokens, np.ndarray):
        return (tokens.shape[-1] if tokens.ndim else 1) == 1
    return isinstance(tokens, int) or len(tokens[0] if tokens and isinstance(tokens[0], (list, tuple)) else tokens) == 1


def appends_one_token_rows(tokens: np.ndarray, slots, plan: AttentionPlan) -> bool:
    """:func:`appends_one_token_host` for a batched step: every row's one token goes to the slot right after its
    own prefix (``plan.prefix_length``, host values) in a plan that is causal otherwise."""
    if slots is None or isinstance(slots, torch.Tensor) or isinstance(tokens, torch.Tensor) or \
            np.shape(tokens)[-1] != 1 or np.shape(slots)[-1] != 1:
        return False
    return (plan.step_mask is None and plan.prefix_lens is None and plan.region_from is None
            and bool((np.asarray(slots)[:, 0] == plan.prefix_length).all()))


def eos_token_ids(ckpt, config, tokenizer) -> tuple[int, ...]:
    """All ids that end a turn: the tokenizer's eos plus generation_config's (Llama-3 lists ``<|eot_id|>``)."""
    ids: list[int] = []

    def add(v):
        for x in v if isinstance(v, (list, tuple)) else [v]:
            if x is not None and int(x) not in ids:
                ids.append(int(x))

    add(tokenizer.eos_token_id)
    add(getattr(config, "eos_token_id", None))
    try:
        from transformers import GenerationConfig

        add(GenerationConfig.from_pretrained(ckpt).eos_token_id)
    except OSError:
        pass
    return tuple(ids)
