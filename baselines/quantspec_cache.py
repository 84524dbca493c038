"""QuantSpec's hierarchical 4/8-bit KV cache, in plain PyTorch (its 4-bit draft weights:
:mod:`baselines.quantspec_weights`).

Paper: QuantSpec (Tiwari et al., 2025, https://arxiv.org/abs/2502.10424), sections 4.1-4.3; first author's code
``rishabh-16/QuantSpec`` (``kernels/quantize/``, ``Engine/model_quantspec.py``), read to learn, not copied.

**Hierarchical quantization** of a group ``x`` (min/max over the group, asymmetric)::

    scale = (max - min) / 15            q_hi = clamp(round((x - min) / scale), 0, 15)
    scale_lo = scale / 16               q_lo = clamp(round((x - min - q_hi * scale) / scale_lo), -8, 7)
    INT4 view (draft)  = min + q_hi * scale
    INT8 view (target) = min + q_hi * scale + q_lo * scale_lo

``min`` and ``scale`` are rounded to the cache dtype first and the codes are computed (in float32) from those
stored values, so a dequantized view is exactly the formula applied to what is stored. A constant group
(scale 0) gets codes 0 and dequantizes to its value. Keys are grouped per channel over ``G`` tokens, values per
token over ``head_dim`` (KIVI). Codes are packed two per byte along ``head_dim`` (even element in the low
nibble); ``q_lo`` is stored as ``q_lo + 8``.

**Which tokens a query reads quantized** depends on its position only: a query at ``p`` sees ``[0, nq(p))``
quantized, ``nq(p) = max(0, (p - G) // G * G)``, and ``[nq(p), p]`` in full precision (the buffer), so drafts,
verification and the INT8-KV reference see the same view at every position. Storage, commits and chunked
attention: docs/methods/quantspec.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fafo.engine.cache import Cache
from fafo.engine.kernels import merge, reference_attention_lse


# ---------------------------------------------------------------------------------------------- quantization
def quantize(x: torch.Tensor, dim: int, lower: bool = True):
    """Hierarchical quantization of ``x`` in groups reduced over ``dim`` (see the module docstring).

    Returns ``(q_hi, q_lo, mn, scale)``: codes as uint8 (``q_hi`` in 0..15, ``q_lo + 8`` in 0..15, or ``None``
    when ``lower`` is false), ``mn`` and ``scale`` in ``x.dtype`` with ``dim`` kept as size 1.
    """
    mn = x.amin(dim, keepdim=True)
    scale = ((x.amax(dim, keepdim=True).float() - mn.float()) / 15).to(x.dtype)
    m, s = mn.float(), scale.float()
    safe = torch.where(s > 0, s, torch.ones_like(s))  # a constant group: codes 0, dequantizes to mn
    xf = x.float()
    q_hi = torch.where(s > 0, ((xf - m) / safe).round().clamp(0, 15), torch.zeros_like(xf))
    q_lo = None
    if lower:
        q_lo = torch.where(s > 0, ((xf - m - q_hi * s) / (safe / 16)).round().clamp(-8, 7), torch.zeros_like(xf))
        q_lo = (q_lo + 8).to(torch.uint8)
    return q_hi.to(torch.uint8), q_lo, mn, scale


def dequantize(q_hi, q_lo, mn, scale, dtype) -> torch.Tensor:
    """INT4 view (``q_lo is None``) or INT8 view of unpacked codes; ``mn``/``scale`` broadcast to the codes."""
    m, s = mn.float(), scale.float()
    out = m + q_hi.float() * s
    if q_lo is not None:
        out = out + (q_lo.float() - 8) * (s / 16)
    return out.to(dtype)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] uint8 codes in 0..15 -> [..., n] bytes (element 2i in the low nibble, 2i+1 in the high one)."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack`: [..., n] bytes -> [..., 2n] codes."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)


def _merge(acc, part):
    """Log-sum-exp merge of two partial attentions over disjoint key sets ((out, lse) pairs; ``acc`` may be None)."""
    if acc is None:
        return part
    (o1, l1), (o2, l2) = acc, part
    return merge(o1, l1, o2, l2), torch.logaddexp(l1, l2)


def quantized_count(position: int, group: int) -> int:
    """``nq(p)``: tokens a query at ``position`` reads quantized (whole groups, at least ``G`` recent left)."""
    return max(0, (position - group) // group * group)


def cache_bytes(args, slots: int, nbytes: int, group: int, scratch: int, lower: bool, full: bool) -> int:
    """Bytes a :class:`QuantKVCache` of ``slots`` positions holds for a model of architecture ``args``: the 4-bit
    planes (upper, and lower for INT8), per-group key and per-token value min/scale, the full-precision buffer
    unless a full cache stands in for it."""
    t = quantized_count(slots, group)
    per_head = 2 * t * args.head_dim // 2 * (2 if lower else 1)  # k and v upper (+ lower) 4-bit planes
    per_head += 2 * (t // group) * args.head_dim * nbytes + 2 * t * nbytes  # key min/scale, value min/scale
    if not full:
        per_head += 2 * (2 * group + scratch) * args.head_dim * nbytes  # the full-precision buffer
    return args.n_layers * args.n_kv_heads * per_head


# ---------------------------------------------------------------------------------------------- the cache
class QuantKVCache(Cache):
    """Packed hierarchical planes + a full-precision buffer; the model calls :meth:`attend` in every layer.

    Args:
        n_layers, batch, n_kv_heads, head_dim: the model's KV geometry (``head_dim`` even).
        capacity: positions this cache must serve (prompt + new tokens + a step's scratch).
        group: ``G`` (tokens per key group; also the buffer's unit).
        scratch: step tokens past the committed ones (``gamma + 1``).
        lower: keep the lower planes (the target reads INT8); false when the target keeps a full cache.
        full: ``target: fp16``: the target's full-precision :class:`~fafo.engine.cache.KVCache` (slot =
            position) doubles as the buffer, and this object only adds the upper planes for the draft.
        chunk: tokens of the quantized part dequantized at a time in attention.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, head_dim: int, capacity: int, group: int,
                 scratch: int, dtype: torch.dtype, device, lower: bool = True, full=None, chunk: int = 1024):
        if head_dim % 2:
            raise ValueError(f"head_dim={head_dim} must be even to pack two 4-bit codes per byte")
        self.group, self.lower, self.full, self.dtype = group, lower, full, dtype
        self.chunk = max(group, chunk // group * group)
        self.capacity = capacity
        self.max_quantized = quantized_count(capacity, group)
        B, H, D, T, G = batch, n_kv_heads, head_dim, self.max_quantized, group

        def planes(*shape):
            return [torch.zeros(shape, dtype=torch.uint8, device=device) for _ in range(n_layers)]

        def floats(*shape):
            return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]

        self.k_hi, self.v_hi = planes(B, H, T, D // 2), planes(B, H, T, D // 2)  # [B, Hkv, T, D/2]
        self.k_lo, self.v_lo = (planes(B, H, T, D // 2), planes(B, H, T, D // 2)) if lower else (None, None)
        self.k_min, self.k_scale = floats(B, H, T // G, D), floats(B, H, T // G, D)  # per channel per group
        self.v_min, self.v_scale = floats(B, H, T, 1), floats(B, H, T, 1)  # per token
        self.buf_len = 2 * G + scratch  # committed fp tokens stay < 2G between steps, plus a step's tokens
        if full is None:
            self.k_buf, self.v_buf = floats(B, H, self.buf_len, D), floats(B, H, self.buf_len, D)
        self.nq = 0  # stored quantized tokens (a multiple of G)
        self.view = "int8" if lower else "int4"  # what attend() reads: the decoder flips it per forward
        # compiled steps read the per-step quantities from tensors (static_plan): nq and the first query's position
        self.nq_t = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a compiled step reads or writes (CUDA graphs keep their addresses); not the full cache."""
        ts = self.k_hi + self.v_hi + self.k_min + self.k_scale + self.v_min + self.v_scale + [self.nq_t, self.position]
        ts += (self.k_lo + self.v_lo) if self.lower else []
        return ts + ((self.k_buf + self.v_buf) if self.full is None else [])

    def fits(self, capacity: int, full) -> bool:
        """Whether this cache can serve a generation of ``capacity`` positions over ``full`` (reuse across
        generations: compiled steps keep its buffers' addresses and shapes)."""
        return capacity <= self.capacity and full is self.full

    def reset(self) -> None:
        """Before a new generation on a reused cache: nothing stored (old planes are masked until rewritten)."""
        self._set_nq(0)

    def _set_nq(self, nq: int) -> None:
        if nq != self.nq:
            self.nq_t.fill_(nq)  # one op, only when a group is stored (every G tokens)
        self.nq = nq

    @property
    def nbytes(self) -> int:
        """Bytes this object holds (the full cache of ``target: fp16`` is not counted here)."""
        ts = self.k_hi + self.v_hi + self.k_min + self.k_scale + self.v_min + self.v_scale
        if self.lower:
            ts = ts + self.k_lo + self.v_lo
        if self.full is None:
            ts = ts + self.k_buf + self.v_buf
        return sum(t.numel() * t.element_size() for t in ts)

    # ------------------------------------------------------------------ storage
    def _store_groups(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize whole groups of full-precision k, v ([B, Hkv, n*G, D]) into positions [start, start + n*G)."""
        B, H, n, D = k.shape
        G, end = self.group, start + n
        kq_hi, kq_lo, kmn, ksc = quantize(k.view(B, H, n // G, G, D), dim=3, lower=self.lower)
        vq_hi, vq_lo, vmn, vsc = quantize(v, dim=3, lower=self.lower)
        self.k_hi[layer][:, :, start:end] = pack(kq_hi.view(B, H, n, D))
        self.v_hi[layer][:, :, start:end] = pack(vq_hi)
        if self.lower:
            self.k_lo[layer][:, :, start:end] = pack(kq_lo.view(B, H, n, D))
            self.v_lo[layer][:, :, start:end] = pack(vq_lo)
        self.k_min[layer][:, :, start // G:end // G] = kmn[:, :, :, 0]
        self.k_scale[layer][:, :, start // G:end // G] = ksc[:, :, :, 0]
        self.v_min[layer][:, :, start:end] = vmn
        self.v_scale[layer][:, :, start:end] = vsc

    def _fp(self, layer: int, lo: int, hi: int):
        """Full-precision K, V of positions [lo, hi) (lo >= nq)."""
        if self.full is not None:
            return self.full.keys[layer][:, :, lo:hi], self.full.values[layer][:, :, lo:hi]
        return self.k_buf[layer][:, :, lo - self.nq:hi - self.nq], self.v_buf[layer][:, :, lo - self.nq:hi - self.nq]

    def _write(self, layer: int, slots: torch.Tensor, first: int, k, v) -> None:
        """Write a step's KV at positions ``slots`` = ``first, first + 1, ...`` (``first`` known on the host: no
        device read); in a prefill the first ``nq`` go to the planes."""
        n = slots.shape[0]
        cut = min(n, max(0, self.nq - first))  # tokens below nq: only a prefill writes them
        if cut:
            if first != 0:
                raise RuntimeError("quantspec: only a prefill may write positions below the quantized count")
            self._store_groups(layer, 0, k[:, :, :cut], v[:, :, :cut])
        if self.full is not None:
            self.full.write(layer, slots[cut:n], k[:, :, cut:n], v[:, :, cut:n])
        elif cut < n:
            idx = slots[cut:n] - self.nq
            if first + n - self.nq > self.buf_len:
                raise RuntimeError(f"quantspec: buffer overflow ({first + n - self.nq} > {self.buf_len} slots)")
            self.k_buf[layer].index_copy_(2, idx, k[:, :, cut:n])
            self.v_buf[layer].index_copy_(2, idx, v[:, :, cut:n])

    def prefill_to(self, n_prompt: int) -> None:
        """Before a prefill of ``n_prompt`` tokens: its first ``nq(n_prompt)`` tokens are stored quantized."""
        self._set_nq(quantized_count(n_prompt, self.group))
        if self.nq > self.max_quantized:
            raise RuntimeError(f"quantspec: a {n_prompt}-token prompt exceeds the cache capacity {self.capacity}")

    def quantize_full_prefix(self) -> None:
        """``target: fp16`` after the target's prefill into the full cache: quantize its first ``nq`` tokens."""
        for layer in range(len(self.k_hi) if self.nq else 0):
            self._store_groups(layer, 0, self.full.keys[layer][:, :, :self.nq], self.full.values[layer][:, :, :self.nq])

    def advance(self, committed: int) -> None:
        """After a commit (``committed`` tokens have final KV): quantize the oldest buffer groups while
        ``nq(committed)`` asks for them; the buffer keeps ``G <= committed - nq < 2G`` tokens."""
        G = self.group
        while self.nq < quantized_count(committed, G):
            for layer in range(len(self.k_hi)):
                k, v = self._fp(layer, self.nq, self.nq + G)
                self._store_groups(layer, self.nq, k, v)
                if self.full is None:  # shift the buffer left by one group
                    for buf in (self.k_buf[layer], self.v_buf[layer]):
                        buf[:, :, :-G] = buf[:, :, G:].clone()
            self._set_nq(self.nq + G)

    # ------------------------------------------------------------------ reading
    def _dequant(self, layer: int, lo: int, hi: int, lower: bool):
        """K, V of stored positions [lo, hi) (whole groups) in the INT4 or INT8 view: [B, Hkv, hi - lo, D]."""
        G = self.group
        B, H, _, D2 = self.k_hi[layer].shape
        n = hi - lo
        k_lo = unpack(self.k_lo[layer][:, :, lo:hi]) if lower else None
        k = dequantize(unpack(self.k_hi[layer][:, :, lo:hi]).view(B, H, n // G, G, 2 * D2),
                       None if k_lo is None else k_lo.view(B, H, n // G, G, 2 * D2),
                       self.k_min[layer][:, :, lo // G:hi // G, None], self.k_scale[layer][:, :, lo // G:hi // G, None],
                       self.dtype).view(B, H, n, 2 * D2)
        v = dequantize(unpack(self.v_hi[layer][:, :, lo:hi]), unpack(self.v_lo[layer][:, :, lo:hi]) if lower else None,
                       self.v_min[layer][:, :, lo:hi], self.v_scale[layer][:, :, lo:hi], self.dtype)
        return k, v

    def _fake(self, k, v, lower: bool):
        """One group quantized and dequantized on the fly (the group a query is ahead of the stored planes)."""
        B, H, n, D = k.shape
        kh, kl, kmn, ksc = quantize(k.view(B, H, 1, n, D), dim=3, lower=lower)
        vh, vl, vmn, vsc = quantize(v, dim=3, lower=lower)
        return dequantize(kh, kl, kmn, ksc, self.dtype).view(B, H, n, D), dequantize(vh, vl, vmn, vsc, self.dtype)

    def _check_step(self, P: int, Q: int) -> None:
        """A step of ``Q`` queries from position ``P`` must find the planes in step with its positions and fit the
        buffer (host values only)."""
        G = self.group
        if quantized_count(P, G) < self.nq or quantized_count(P + Q - 1, G) > self.nq + G:
            raise RuntimeError(f"quantspec: stored planes ({self.nq}) out of step with positions {P}..{P + Q - 1}")
        if self.full is None and P + Q - self.nq > self.buf_len:
            raise RuntimeError(f"quantspec: buffer overflow ({P + Q - self.nq} > {self.buf_len} slots)")

    def attend(self, layer: int, q, k, v, slots, plan, scale: float, backend: str = "sdpa") -> torch.Tensor:
        """:meth:`fafo.engine.cache.Cache.attend` over the planes and the buffer (its own kernels: ``backend`` is
        not read).

        q: [B, Hq, Q, D] post-RoPE; k, v: [B, Hkv, Q, D]; the step is a causal chain: query ``i`` is at position
        ``plan.prefix + i`` and sees positions ``[0, prefix + i]``. Returns [B, Hq, Q, D]. A compiled step's plan
        (:meth:`static_plan`) carries the first position in ``prefix_length``: :meth:`_attend_static`.
        """
        if plan.prefix_lens is not None or plan.region_from is not None or plan.step_mask is not None:
            raise NotImplementedError("quantspec's cache serves causal chains only (no masks or regions)")
        if plan.prefix_length is not None:
            return self._attend_static(layer, q, k, v, slots, plan.prefix_length, scale)
        if slots is not None:
            self._write(layer, slots, plan.prefix, k, v)
        B, Hq, Q, D = q.shape
        Hkv, P, G = k.shape[1], plan.prefix, self.group
        if P == 0:  # prefill: full-precision causal attention over the prompt
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=Hq != Hkv)
        lower = self._lower()
        qg = q.view(B, Hkv, Hq // Hkv, Q, D)
        pos = torch.arange(P, P + Q, device=q.device)
        nq_q = ((pos - G).div(G, rounding_mode="floor") * G).clamp_min(0)  # [Q] nq(p) per query
        self._check_step(P, Q)
        acc = None
        for lo in range(0, self.nq, self.chunk):  # stored quantized tokens, seen by every query
            kc, vc = self._dequant(layer, lo, min(self.nq, lo + self.chunk), lower)
            acc = _merge(acc, reference_attention_lse(qg, kc, vc, None, scale))
        ahead = nq_q > self.nq  # [Q] queries that read the next group quantized too
        any_ahead = quantized_count(P + Q - 1, G) > self.nq  # nq(p) grows with p: on the host, no device read
        if any_ahead:
            kf, vf = self._fake(*self._fp(layer, self.nq, self.nq + G), lower)
            acc = _merge(acc, reference_attention_lse(qg, kf, vf, ahead[:, None].expand(Q, G), scale))
        if P > self.nq:  # full precision [nq, P); a query ahead skips the group it reads quantized
            kb, vb = self._fp(layer, self.nq, P)
            mask = torch.arange(self.nq, P, device=q.device)[None, :] >= nq_q[:, None]  # [Q, P - nq]
            acc = _merge(acc, reference_attention_lse(qg, kb, vb, mask if any_ahead else None, scale))
        causal = torch.ones(Q, Q, dtype=torch.bool, device=q.device).tril()
        acc = _merge(acc, reference_attention_lse(qg, k, v, causal, scale))
        return acc[0].view(B, Hq, Q, D).to(q.dtype)

    def _lower(self) -> bool:
        lower = self.view == "int8"
        if lower and not self.lower:
            raise RuntimeError("quantspec: the INT8 view needs the lower planes")
        return lower

    # ------------------------------------------------------------------ compiled steps
    def static_plan(self, plan, n_queries: int):
        """The plan of a compiled decode step over this cache (:class:`fafo.engine.compiled.CompiledStep`): the
        bounds checked on the host, the first query's position written to a ``[1]`` tensor passed as
        ``prefix_length``, ``prefix`` a constant (the graph guards on it, so it must not change per step)."""
        self._check_step(plan.prefix, n_queries)
        self.position.fill_(plan.prefix)
        return plan.replace(prefix=self.capacity, prefix_length=self.position, step_in_cache=False)

    def _window(self, layer: int):
        """Full-precision K, V of positions ``nq + [0, buf_len)``: the buffer itself, or (``target: fp16``) a
        gather from the full cache, positions past its end clamped (they lie past every query and are masked)."""
        if self.full is None:
            return self.k_buf[layer], self.v_buf[layer]
        keys, values = self.full.keys[layer], self.full.values[layer]
        idx = (self.nq_t + torch.arange(self.buf_len, device=keys.device)).clamp_max(keys.shape[2] - 1)
        return keys.index_select(2, idx), values.index_select(2, idx)

    def _attend_static(self, layer: int, q, k, v, slots, position: torch.Tensor, scale: float) -> torch.Tensor:
        """:meth:`attend` with static shapes (compiled steps, CUDA graphs): ``nq`` and the first query's position
        are read from tensors, so one graph per step shape and view serves every step. The same parts merged in
        the same order, each over a static key set masked to what the eager path slices: the stored planes over
        the whole quantized capacity, dequantized at once rather than by ``chunk`` (an unrolled chunk loop would
        grow the graph, and its compile time, with the capacity), masked past ``nq``; the next group quantized on
        the fly (masked for queries not ahead); the full-precision window ``nq + [0, buf_len)`` (masked to
        ``[nq(p), P)``); the step itself."""
        B, Hq, Q, D = q.shape
        Hkv, G, dev = k.shape[1], self.group, q.device
        nq = self.nq_t  # [1]
        if slots is not None:
            if self.full is not None:
                self.full.write(layer, slots, k, v)
            else:  # a decode step writes at or past nq: buffer slot = position - nq
                self.k_buf[layer].index_copy_(2, slots - nq, k)
                self.v_buf[layer].index_copy_(2, slots - nq, v)
        lower = self._lower()
        qg = q.view(B, Hkv, Hq // Hkv, Q, D)
        pos = position + torch.arange(Q, device=dev)  # [Q]
        nq_q = ((pos - G).div(G, rounding_mode="floor") * G).clamp_min(0)  # [Q] nq(p) per query
        acc = None
        if self.max_quantized:  # one dequantization of the whole capacity: a graph of its depth only
            kc, vc = self._dequant(layer, 0, self.max_quantized, lower)
            stored = (torch.arange(self.max_quantized, device=dev) < nq)[None, :]  # [1, T]
            acc = reference_attention_lse(qg, kc, vc, stored, scale)
        kw, vw = self._window(layer)  # [B, Hkv, buf_len, D] at positions nq + j
        kf, vf = self._fake(kw[:, :, :G], vw[:, :, :G], lower)
        acc = _merge(acc, reference_attention_lse(qg, kf, vf, (nq_q > nq)[:, None].expand(Q, G), scale))
        kpos = nq + torch.arange(self.buf_len, device=dev)  # [buf_len]
        visible = (kpos[None, :] < position) & (kpos[None, :] >= nq_q[:, None])  # [Q, buf_len]
        acc = _merge(acc, reference_attention_lse(qg, kw, vw, visible, scale))
        causal = torch.ones(Q, Q, dtype=torch.bool, device=dev).tril()
        acc = _merge(acc, reference_attention_lse(qg, k, v, causal, scale))
        return acc[0].view(B, Hq, Q, D).to(q.dtype)
