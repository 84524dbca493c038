"""Host time per step with the model's forwards replayed: the host's own work, without the CPU cache misses that
running the forwards on the same CPU causes.

On a CPU the forwards run on the cores that then run the method's host work, and a forward of a few dozen layers
evicts the caches that work was using: the same ``Engine.forward`` preparation that takes about 30 us with the
model stubbed takes about 190 us between real forwards (``scripts/bench_engine.py host``, a 32-layer model). A
GPU host does not pay that (the device runs the forwards), so the live CPU figure overstates it.

:class:`ReplayedForwards` records every model call's outputs (:func:`fafo.engine.ledger.model_call`: the target's
forwards, a draft model's, LongSpec's draft layer) in one generation, then serves them back in order in a second
generation of the same method from the same state, without running the model. Every decision a decoder takes comes
from those outputs, so the replay takes the same steps and ends with the same tokens (checked); the KV cache is not
written while replaying, so what a method computes from cached keys outside its forwards (SnapKV's and Quest's
scores, TriForce's chunk selection) runs its ops on stale values: the same work, possibly another selection.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils._pytree import tree_map

from fafo.engine.ledger import MODEL_TIME


def _copy(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


class ReplayedForwards:
    """A model-call probe (``MODEL_TIME.probes``): :meth:`recording` keeps each call's outputs, :meth:`replaying`
    returns them in the same order without calling the model."""

    def __init__(self):
        self.outputs: list = []
        self.served = 0
        self._replay = False

    def around(self, call):
        if not self._replay:
            out = call()
            self.outputs.append(tree_map(_copy, out))
            return out
        if self.served >= len(self.outputs):
            raise RuntimeError(f"the replayed generation made more model calls than the {len(self.outputs)} recorded")
        self.served += 1
        return tree_map(_copy, self.outputs[self.served - 1])  # a decoder may write into what it is given

    @contextmanager
    def _probe(self, replay: bool):
        self._replay = replay
        MODEL_TIME.probes.append(self)
        try:
            yield self
        finally:
            MODEL_TIME.probes.remove(self)

    def recording(self):
        self.outputs, self.served = [], 0
        return self._probe(False)

    def replaying(self):
        self.served = 0
        return self._probe(True)


def live_and_replayed(method, engine, prompt_ids: list[int], new_tokens: int, snapshot) -> tuple[float, float]:
    """Host ms per step of one generation (live forwards, outputs recorded) and of its replay from the same
    cross-request state (``method.restore(snapshot)`` before each). Raises when the replay does not end with the
    same tokens after the same model calls."""
    probe = ReplayedForwards()
    with probe.recording():
        live = method.generate(engine, prompt_ids, new_tokens, engine.eos_ids)
    method.restore(snapshot)
    with probe.replaying():
        replayed = method.generate(engine, prompt_ids, new_tokens, engine.eos_ids)
    method.restore(snapshot)
    if replayed.tokens != live.tokens or probe.served != len(probe.outputs):
        raise RuntimeError(f"{type(method).__name__}: the replay took other steps than the recorded generation "
                           f"({probe.served} of {len(probe.outputs)} model calls served)")
    return live.host_ms_per_step, replayed.host_ms_per_step
