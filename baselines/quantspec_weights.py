"""QuantSpec's draft MLP: the target's gated MLP with 4-bit weights, in plain PyTorch.

Paper: QuantSpec (Tiwari et al., 2025, https://arxiv.org/abs/2502.10424), section 4.1 (the draft is the target with
4-bit weights and the 4-bit view of its hierarchical KV cache) and section 5.3 (what the weights' and the cache's
quantization each add). The first author's code loads GPTQ checkpoints (4 bits, groups of 128) run by a Marlin
kernel, for the draft's MLP only; here the MLP's weights are rounded to nearest, asymmetric per group of inputs, with
the cache's ``quantize`` and ``pack`` (:mod:`baselines.quantspec_cache`), and attention projections stay full
precision, as there. A draft forward runs the target's model with each block's MLP swapped for its
4-bit twin (:func:`swapped_mlps`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from baselines.quantspec_cache import dequantize, pack, quantize, unpack


class Int4Linear(nn.Module):
    """A bias-free linear layer with round-to-nearest asymmetric 4-bit weights, ``group`` inputs per group.

    Storage: ``[out, in_pad / 2]`` uint8 codes + ``[out, in_pad / group]`` min and scale (``in_pad``: the input
    size padded with zeros to whole groups). The weight is dequantized per call (plain PyTorch), or once and kept
    (``resident``: the same values, faster on CPU, full-precision memory).
    """

    def __init__(self, weight: torch.Tensor, group: int = 128, resident: bool = False):
        super().__init__()
        out_f, in_f = weight.shape
        self.in_features, self.group = in_f, min(group, in_f + in_f % 2)
        pad = -in_f % self.group
        w = F.pad(weight.detach(), (0, pad)).view(out_f, -1, self.group)  # [out, n_groups, group]
        q, _, mn, scale = quantize(w, dim=2, lower=False)
        self.register_buffer("codes", pack(q.view(out_f, -1)))
        self.register_buffer("mn", mn)
        self.register_buffer("scale", scale)
        self.resident: torch.Tensor | None = None  # the dequantized weight, kept only when asked
        if resident:  # plain-PyTorch speed, full-precision bytes (counted in nbytes)
            self.resident = self.weight()

    @property
    def nbytes(self) -> int:
        ts = (self.codes, self.mn, self.scale) + ((self.resident,) if self.resident is not None else ())
        return sum(t.numel() * t.element_size() for t in ts)

    def weight(self) -> torch.Tensor:
        if self.resident is not None:
            return self.resident
        out_f = self.codes.shape[0]
        q = unpack(self.codes).view(out_f, -1, self.group)
        return dequantize(q, None, self.mn, self.scale, self.mn.dtype).view(out_f, -1)[:, : self.in_features]

    def forward(self, x):
        return F.linear(x, self.weight())


class Int4MLP(nn.Module):
    """The draft's MLP: the target's gated MLP with 4-bit gate/up/down weights."""

    def __init__(self, mlp: nn.Module, group: int, resident: bool = False):
        super().__init__()
        gate, up, down = mlp.weights()  # fused or not
        self.gate_proj = Int4Linear(gate, group, resident)
        self.up_proj = Int4Linear(up, group, resident)
        self.down_proj = Int4Linear(down, group, resident)

    @property
    def nbytes(self) -> int:
        return self.gate_proj.nbytes + self.up_proj.nbytes + self.down_proj.nbytes

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@contextmanager
def swapped_mlps(model, mlps: list[nn.Module] | None):
    """Run ``model`` with its blocks' MLPs replaced by ``mlps`` (None: unchanged, nothing swapped); restored on
    exit. Twice per decoding step, so through the model's own registry write (``Transformer.swap_mlps``): under a
    microsecond a layer, where ``nn.Module.__setattr__`` takes 1-3 us."""
    if mlps is None:
        yield
        return
    saved = model.swap_mlps(mlps)
    try:
        yield
    finally:
        model.swap_mlps(saved)
