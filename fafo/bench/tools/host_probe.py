"""The host-work probe: what a method does around its model forwards, counted per decoding step.

On a GPU a 7B decode forward costs a few milliseconds and each eagerly launched op 5-10 us of host time; CUDA graphs
hide launches only inside the compiled forward. :class:`HostWork` counts, per decoding step, outside every model
call (:func:`fafo.engine.ledger.model_call`, where it is suspended):

* ``ops``: torch operators dispatched (ATen ops, views excluded): on a device each one on device data is a launch,
  and each costs host time (on host tensors too);
* ``h2d``: host values moved to the device (a tensor built from Python data with ``device=``, or ``.to(device)``
  of a host tensor; :meth:`fafo.engine.engine.Engine.upload` packs a forward's inputs into one);
* ``d2h``: device values read on the host (``.tolist()``, ``.item()``, ``int()``, ``.cpu()``...: a sync on CUDA).

The CPU stands in for the device (:class:`DeviceTraffic`): a tensor is "on the device" when it is a weight or a
cache buffer, was made with ``device=`` or moved with ``.to(device)``, came out of a model call, or was computed from
such a tensor. The probe suspends itself with torch's ``_pop_mode_temporarily`` helpers (``torch.overrides`` and
``torch.utils._python_dispatch``, the same in torch 2.11 and 2.13). The host table built on it:
:mod:`fafo.bench.tools.host_work`.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from fafo import decoding
from fafo.engine.ledger import MODEL_TIME

READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "randint", "rand", "randn",
             "zeros_like", "ones_like", "empty_like", "full_like"}
FROM_HOST = {"tensor", "as_tensor"}  # factories that copy host data
# not counted as ops: no-ops, and reads (counted as d2h)
NOT_OPS = {"aten::lift_fresh", "aten::detach", "aten::alias", "aten::item", "aten::_local_scalar_dense"}


class _Ops(TorchDispatchMode):
    """ATen operators, views and no-ops excluded, by name."""

    def __init__(self):
        super().__init__()
        self.names: Counter = Counter()
        self.paused = 0
        self.inside = 0  # > 0: inside a model call that is counted apart
        self.forward_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split(".")[0]  # aten::add.Tensor -> aten::add
        if not (func.is_view or name in NOT_OPS or self.paused):
            if self.inside:
                self.forward_ops += 1
            else:
                self.names[name] += 1
        return func(*args, **(kwargs or {}))


class DeviceTraffic(TorchFunctionMode):
    """Host-to-device copies (``h2d``) and device-to-host reads (``d2h``), following device values through torch
    calls from ``on_device`` (weights, caches). ``ops``: the op counter running beside it, paused while the probe
    makes a copy of its own (None: none)."""

    def __init__(self, on_device, ops: "_Ops | None" = None):
        super().__init__()
        self.on_device = WeakIdKeyDictionary({t: True for t in on_device})
        self.h2d = self.d2h = 0
        self.ops = ops

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        """The copy a device would make where the CPU, standing in for it, returns the tensor itself (counted as a
        transfer, not as an op)."""
        if self.ops is None:
            return t.clone()
        self.ops.paused += 1
        try:
            return t.clone()
        finally:
            self.ops.paused -= 1

    def mark(self, values) -> None:
        for t in tree_flatten(values)[0]:
            if isinstance(t, torch.Tensor):
                self.on_device[t] = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs, name = kwargs or {}, getattr(func, "__name__", "")
        out = func(*args, **kwargs)
        flat = tree_flatten((args, kwargs))[0]
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        on_device = [isinstance(x, torch.Tensor) and x in self.on_device for x in flat]
        if name in READS and first is not None and on_device[0]:
            self.d2h += 1
            return self._copy(out) if out is first else out  # on the CPU .cpu() returns the tensor itself
        if name in ("__setitem__", "copy_") and first is not None and not on_device[0] and any(on_device[1:]):
            self.d2h += 1
            return out
        to_device = kwargs.get("device") is not None or any(isinstance(a, (torch.device, str)) for a in args[1:2])
        if name in ("to", "as_tensor") and to_device and first is not None and not on_device[0]:
            self.h2d += 1
            if out is first:
                out = self._copy(out)
        elif name in FROM_HOST and kwargs.get("device") is not None and not isinstance(first, torch.Tensor):
            self.h2d += 1
        if (name in ("to", *FACTORIES) and to_device) or any(on_device):
            self.mark(out)
            if name.endswith("_") and first is not None:
                self.mark(first)
        return out


class HostWork:
    """Counts a generation's host work per decoding step (see the module docstring); use as a context manager
    around ``generate``. ``engines``: the engines whose weights and caches are on the device.

    After the context: :attr:`steps`, one ``{"ops", "h2d", "d2h", "forward_ops"}`` dict per decoding step (its
    commit included), and :attr:`names`, the operators counted in steps by name. ``forward_ops``: with
    ``forwards=True``, the ops inside the step's model calls when they run eagerly (what a compiled forward with
    CUDA graphs replays as one launch, and an eager one launches op by op); else 0.
    """

    def __init__(self, engines, forwards: bool = False):
        self.forwards = forwards
        seeds = [p for e in engines for p in e.model.parameters()]
        for e in engines:  # the shared cache, the decoder's own (a retrieval cache, a draft's), compiled steps' buffers
            seeds += [t for cache in (e.static_cache, *e.decoder_caches) if cache is not None for t in cache.tensors()]
            seeds += e.compiled.buffers() if e.compiled is not None else []
        self._ops = _Ops()
        self._io = DeviceTraffic(seeds, self._ops)
        self.steps: list[dict] = []
        self.names: Counter = Counter()
        self._last = None

    def _now(self) -> tuple:
        o, io = self._ops, self._io
        return sum(o.names.values()), io.h2d, io.d2h, o.forward_ops, Counter(o.names)

    def around(self, call):
        """Run one model call with the probe suspended (or, with ``forwards``, its ops counted apart); its
        outputs are device values."""
        from torch.overrides import _pop_mode_temporarily as pop_function_mode
        from torch.utils._python_dispatch import _pop_mode_temporarily as pop_dispatch_mode

        if self.forwards:
            transfers = self._io.h2d, self._io.d2h
            self._ops.inside += 1
            try:
                out = call()
            finally:
                self._ops.inside -= 1
                self._io.h2d, self._io.d2h = transfers
            self._io.mark(out)
            return out
        with pop_function_mode() as f, pop_dispatch_mode() as d:
            assert f is self._io and d is self._ops, "another probe was entered inside HostWork"
            out = call()
        self._io.mark(out)
        return out

    def _step(self) -> None:
        now = self._now()
        if self._last is not None:
            ops, h2d, d2h, forward_ops, names = (a - b for a, b in zip(now, self._last))
            self.steps.append({"ops": ops, "h2d": h2d, "d2h": d2h, "forward_ops": forward_ops})
            self.names += names
        self._last = now

    def start_steps(self) -> None:
        """Called when the prompt is processed: steps are counted from here."""
        self._last = self._now()

    def __enter__(self) -> "HostWork":
        self._io.__enter__()
        self._ops.__enter__()
        MODEL_TIME.probes.append(self)
        decoding.STEP_HOOKS.append(self._step)
        return self

    def __exit__(self, *exc) -> None:
        decoding.STEP_HOOKS.remove(self._step)
        MODEL_TIME.probes.remove(self)
        self._ops.__exit__(*exc)
        self._io.__exit__(*exc)

    def per_step(self, key: str) -> tuple[float, int]:
        """(mean, max) of ``key`` over the steps."""
        values = [s[key] for s in self.steps] or [0]
        return sum(values) / len(values), max(values)


class _PrefillMark:
    """A clock for ``generate`` that starts the probe's step count when the prompt is processed."""

    def __init__(self, probe: HostWork):
        self.probe = probe

    def mark(self, phase: str) -> None:
        if phase == "prefill":
            self.probe.start_steps()


def count_host_work(method, engine, prompt_ids: list[int], max_new_tokens: int, warmup: bool = True,
                    forwards: bool = False) -> HostWork:
    """One generation under :class:`HostWork` (after a warm-up generation: what is built once per shape is not
    per-step work). Cross-request state is restored before the counted run."""
    method.setup(engine)
    snapshot = method.snapshot()
    if warmup:
        method.generate(engine, prompt_ids, max_new_tokens, engine.eos_ids)
        method.restore(snapshot)
    probe = HostWork(method.engines(engine), forwards)
    with probe:
        gen = method.generate(engine, prompt_ids, max_new_tokens, engine.eos_ids, clock=_PrefillMark(probe))
    probe.generation = gen
    method.restore(snapshot)
    return probe
