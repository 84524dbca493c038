"""Rotary position embeddings computed with transformers' own rope init functions.

Every rope type transformers knows (default, linear, dynamic, yarn, llama3, longrope) comes from
`transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`, so a checkpoint's `rope_parameters` (or legacy
`rope_scaling`) mean exactly what they mean in Hugging Face. Positions are *logical* positions: what RoPE sees,
independent of the physical cache slot a token's KV lives in.
"""

from __future__ import annotations

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def rope_parameters(config) -> dict:
    """The rope dict of a transformers config (v5 `rope_parameters`, or v4-style `rope_theta`/`rope_scaling`)."""
    params = getattr(config, "rope_parameters", None)
    if params is None:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params = dict(params)
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def _default_inv_freq(config, head_dim: int) -> tuple[torch.Tensor, float]:
    base = rope_parameters(config)["rope_theta"]
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)), 1.0


class Rotary:
    """cos/sin tables for logical positions, float32 maths cast to the model dtype (as Hugging Face does).

    `dynamic` (NTK) and `longrope` recompute their frequencies from the largest position seen, like transformers'
    `dynamic_rope_update`; every other type is a fixed table.
    """

    def __init__(self, config, head_dim: int, device: torch.device | str = "cpu"):
        self.config = config
        self.head_dim = head_dim
        self.rope_type = rope_parameters(config)["rope_type"]
        self.original_max = rope_parameters(config).get(
            "original_max_position_embeddings", config.max_position_embeddings
        )
        self.device = torch.device(device)
        self.inv_freq, self.scaling = self._init(seq_len=None)
        self.original_inv_freq = self.inv_freq
        self._seq_len_cached = self.original_max

    def _init(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        if self.rope_type == "default":
            inv_freq, scaling = _default_inv_freq(self.config, self.head_dim)
        else:
            kwargs = {} if seq_len is None else {"seq_len": seq_len}
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[self.rope_type](self.config, self.device, **kwargs)
        return inv_freq.to(self.device, torch.float32), float(scaling)

    def _update_dynamic(self, positions: torch.Tensor) -> None:
        seq_len = int(positions.max()) + 1
        if self.rope_type == "dynamic":
            if seq_len > self._seq_len_cached:
                self.inv_freq, self.scaling = self._init(seq_len=seq_len)
                self._seq_len_cached = seq_len
            elif seq_len < self.original_max < self._seq_len_cached:
                self.inv_freq, self._seq_len_cached = self.original_inv_freq, self.original_max
        elif self.rope_type == "longrope":
            self.inv_freq, self.scaling = self._init(seq_len=seq_len)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [B, Q] long -> (cos, sin), each [B, 1, Q, head_dim] in `dtype`."""
        if self.rope_type in ("dynamic", "longrope"):
            self._update_dynamic(positions)
        freqs = positions[..., None].float() * self.inv_freq  # [B, Q, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.scaling, emb.sin() * self.scaling
        return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 half: torch.Tensor | None = None) -> torch.Tensor:
    """x: [B, H, Q, D]; cos/sin: [B, 1, Q, D]; ``half``: ``rotate_half(x)`` when the caller keeps it."""
    return x * cos + (rotate_half(x) if half is None else half) * sin
