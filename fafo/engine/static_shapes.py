"""Static-shape padding of a decode step, done by the engine (:meth:`fafo.engine.engine.Engine.forward`).

Compiled steps (``bench.compile``) specialise a graph, and on CUDA record a CUDA graph, per step shape: a method
whose steps vary in size (a tree, a guess set, a verification window) would compile inside timed samples. A
decoder therefore names the largest size its hyperparameters allow (``pad_to``) and, when the engine has
``static_shapes`` set, the engine pads the step to it:

* padding rows repeat the last real token at the last real position;
* their KV goes to the slots right after the last real one (the decoder's scratch holds ``pad_to`` slots);
* with a step mask (a tree, a guess set) each padding row sees only the prefix and itself and no real row sees it;
  without one (a causal chain) they come after every real row, which therefore never sees them;
* only the real rows' logits are returned.

The real rows' logits are those of the unpadded step, so tokens and statistics do not depend on the padding.
"""

from __future__ import annotations

import numpy as np
import torch


def pad_step(tokens, positions, slots, plan, pad_to: int):
    """The step's host inputs padded to ``pad_to`` rows: ``(tokens, positions, slots, plan, n_real)``.

    tokens, positions, slots: host values (lists, ranges or CPU tensors) of the ``n_real`` real rows; ``plan``
    an :class:`~fafo.engine.attention.AttentionPlan` whose ``step_mask``, if any, is a host ``[n_real, n_real]``
    bool array or CPU tensor (padded as a numpy array, without a torch op).
    """
    for name, v in (("tokens", tokens), ("positions", positions), ("slots", slots), ("step_mask", plan.step_mask)):
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            raise TypeError(f"pad_to pads host inputs; {name} is already on {v.device}")
    tokens, positions, slots = (v.tolist() if isinstance(v, torch.Tensor) else list(v)
                                for v in (tokens, positions, slots))
    n_real, pad = len(tokens), pad_to - len(tokens)
    if pad < 0:
        raise ValueError(f"a step of {n_real} tokens does not fit pad_to={pad_to}")
    if pad == 0:
        return tokens, positions, slots, plan, n_real
    tokens = tokens + tokens[-1:] * pad
    positions = positions + positions[-1:] * pad
    slots = slots + list(range(slots[-1] + 1, slots[-1] + 1 + pad))
    if plan.step_mask is not None:
        mask = np.eye(pad_to, dtype=bool)
        mask[:n_real, :n_real] = np.asarray(plan.step_mask)
        plan = plan.replace(step_mask=mask)
    return tokens, positions, slots, plan, n_real
