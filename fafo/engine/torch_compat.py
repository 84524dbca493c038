"""The torch APIs the engine uses whose names or arguments differ between supported torch versions.

Read from torch's own sources; the engine is tested on torch 2.11 and 2.13 in CI (2.14.1 and 2.15.0 passed the
suite by hand), the paths for older versions follow the sources of the release that introduced each API (named
below). Where a newer torch has the better API it is used, and the older path stays beside it, selected by a feature
check (never a version number) and tested by forcing it (tests/test_torch_compat.py).

* ``flex_attention(..., return_aux=AuxRequest(lse=True))`` (torch 2.9+) returns the log-sum-exp in an
  ``AuxOutput``; before it ``return_lse=True`` returned ``(out, lse)`` (deprecated since 2.9).
* FlexAttention's kernel choice: ``kernel_options={"BACKEND": "TRITON"}`` (``FlexKernelOptions.BACKEND``, in 2.11
  to 2.15) selects the main template; older releases only have ``FORCE_USE_FLEX_ATTENTION: True``. Both are read
  by ``torch/_inductor/kernel/flex/flex_attention.py: flex_attention`` (the lowering), and the two may not be
  combined (``torch/nn/attention/flex_attention.py: _apply_kernel_options``).
* ``torch._dynamo.config.recompile_limit`` (2.7+) was ``cache_size_limit`` before.
* ``torch.fx.experimental._config.use_duck_shape`` switches duck sizing off (two equal sizes stay two symbols).

Not version dependent in 2.11 ... 2.15 (checked, used directly): ``BlockMask.from_kv_blocks(seq_lengths=)``
(2.6+), ``aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask, scale)``,
``aten._scaled_dot_product_efficient_attention``, ``torch.compiler.cudagraph_mark_step_begin``,
``torch._dynamo.mark_dynamic(t, dim, min=, max=)``, ``torch._dynamo.config.fail_on_recompile_limit_hit``.
``create_block_mask(..., separate_full_blocks=)`` exists from 2.13: the engine builds its block masks from block
indices instead (:mod:`fafo.engine.block_masks`).
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention import flex_attention as _fa

HAS_AUX_REQUEST = hasattr(_fa, "AuxRequest")
HAS_BACKEND_OPTION = "BACKEND" in getattr(getattr(_fa, "FlexKernelOptions", None), "__annotations__", {})


def flex_attention_lse(fn, q, k, v, block_mask, scale: float, kernel_options: dict | None = None):
    """``fn`` (``flex_attention`` or a compiled wrapper of it) returning ``(out, lse)``: out ``[B, Hq, Q, D]`` in
    q's dtype, lse ``[B, Hq, Q]`` float32 (natural log)."""
    kw = dict(block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1],
              kernel_options=kernel_options or None)
    if HAS_AUX_REQUEST:
        out, aux = fn(q, k, v, return_aux=_fa.AuxRequest(lse=True), **kw)
        return out, aux.lse
    return fn(q, k, v, return_lse=True, **kw)


_STACKS = ("_len_torch_function_stack", "_len_torch_dispatch_stack")


def modes_active() -> bool:
    """Whether a torch function or dispatch mode is on the stack (torch 2.11 and 2.13 keep both counts in
    ``torch._C``; a torch without them counts as a mode being active, so the device path runs). Host shortcuts
    for CPU tensors (numpy reads, compacted index lists) check it: a probe counting what a device launches and
    reads (:mod:`fafo.bench.tools.host_probe`) runs under a mode and sees the device path."""
    if _MODE_COUNTS is None:
        return True
    functions, dispatches = _MODE_COUNTS
    return bool(functions() or dispatches())


_MODE_COUNTS = (None if not all(hasattr(torch._C, name) for name in _STACKS)  # asked at every decode step: once
                else tuple(getattr(torch._C, name) for name in _STACKS))


def main_template_option() -> dict:
    """kernel_options that send a flex_attention call to the main (flex-attention) Triton template."""
    return {"BACKEND": "TRITON"} if HAS_BACKEND_OPTION else {"FORCE_USE_FLEX_ATTENTION": True}


def raise_recompile_limit(at_least: int, config=None) -> None:
    """Let dynamo keep ``at_least`` graphs per frame, and fail (never fall back to eager) past the limit."""
    config = config if config is not None else torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), at_least))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def no_duck_shapes() -> None:
    """Symbolic sizes that happen to be equal stay distinct symbols (torch.compile's duck sizing off)."""
    import torch.fx.experimental._config as fx_config

    fx_config.use_duck_shape = False


def inference_mode():
    """``torch.inference_mode()`` as a context for one call: the C++ guard it enters (``torch._C._InferenceMode``,
    torch/autograd/grad_mode.py in 2.11 and 2.13) without the decorator's per-call object, about 1 us less on the
    CPU; ``torch.inference_mode()`` itself on a torch without it."""
    return _INFERENCE_MODE(True)


_INFERENCE_MODE = getattr(torch._C, "_InferenceMode", None) or torch.inference_mode


def in_inference_mode(fn):
    """``fn`` run in :func:`inference_mode` (what ``@torch.inference_mode()`` does, by the guard alone)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with inference_mode():
            return fn(*args, **kwargs)

    return wrapper
