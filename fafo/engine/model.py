"""A lean decoder-only transformer for the Llama / Qwen2 / Mistral families.

One readable file in the spirit of gpt-fast. Parameter names match Hugging Face's ``*ForCausalLM`` so a
checkpoint's state dict loads as is. A forward takes new token ids, their logical positions, the physical cache
slots their KV is written to (``None``: scratch, used within the step only) and an
:class:`~fafo.engine.attention.AttentionPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fafo.engine.attention import AttentionPlan
from fafo.engine.cache import Cache, KVCache
from fafo.engine.rope import Rotary, apply_rotary

SUPPORTED_FAMILIES = ("llama", "qwen2", "mistral")


@dataclass
class ModelArgs:
    """The architecture, read from a transformers config."""

    family: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    qkv_bias: bool
    tie_embeddings: bool
    max_position_embeddings: int
    sliding_window: int | None

    @classmethod
    def from_hf(cls, config) -> "ModelArgs":
        n_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
        family = config.model_type
        sliding = getattr(config, "sliding_window", None)
        if family == "qwen2" and not getattr(config, "use_sliding_window", False):
            sliding = None
        return cls(
            family=family,
            vocab_size=config.vocab_size,
            dim=config.hidden_size,
            n_layers=config.num_hidden_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            norm_eps=config.rms_norm_eps,
            qkv_bias=family == "qwen2" or bool(getattr(config, "attention_bias", False)),
            tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=sliding,
        )

    def n_params(self) -> int:
        """Parameters of the transformer: embeddings, layers with their norms, final norm, LM head unless tied."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        attn = self.dim * (q + 2 * kv) + q * self.dim + ((q + 2 * kv) if self.qkv_bias else 0)
        layer = attn + 3 * self.dim * self.intermediate_size + 2 * self.dim
        return self.vocab_size * self.dim * (1 if self.tie_embeddings else 2) + self.n_layers * layer + self.dim

    def kv_bytes_per_slot(self, nbytes: int) -> int:
        """Bytes of one cache slot over every layer: keys and values of the KV heads (GQA: not the query heads)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * nbytes


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.layer, self.args = layer, args
        h, hkv, d = args.n_heads, args.n_kv_heads, args.head_dim
        self.q_proj = nn.Linear(args.dim, h * d, bias=args.qkv_bias)
        self.k_proj = nn.Linear(args.dim, hkv * d, bias=args.qkv_bias)
        self.v_proj = nn.Linear(args.dim, hkv * d, bias=args.qkv_bias)
        self.o_proj = nn.Linear(h * d, args.dim, bias=False)
        self.scale = d**-0.5

    def forward(self, x, cos, sin, cache: Cache, slots, plan: AttentionPlan, backend: str, queries: dict | None):
        B, Q, _ = x.shape
        d = self.args.head_dim
        q = self.q_proj(x).view(B, Q, -1, d).transpose(1, 2)  # [B, Hq, Q, D]
        k = self.k_proj(x).view(B, Q, -1, d).transpose(1, 2)  # [B, Hkv, Q, D]
        v = self.v_proj(x).view(B, Q, -1, d).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if queries is not None:  # the forward returns them (plan.capture_rows)
            queries[self.layer] = q[:, :, plan.capture_rows]
        out = cache.attend(self.layer, q, k, v, slots, plan.for_layer(self.layer), self.scale, backend)
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.self_attn = Attention(args, layer)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.dim, args.norm_eps)
        self.post_attention_layernorm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x, cos, sin, cache, slots, plan, backend, skip_attn=False, skip_mlp=False, queries=None):
        if not skip_attn:
            x = self.attention_part(x, cos, sin, cache, slots, plan, backend, queries)
        if not skip_mlp:
            x = self.mlp_part(x)
        return x

    def attention_part(self, x, cos, sin, cache, slots, plan, backend, queries=None):
        """The attention sub-layer with its norm and residual (what a skipped attention layer leaves out)."""
        return x + self.self_attn(self.input_layernorm(x), cos, sin, cache, slots, plan, backend, queries)

    def mlp_part(self, x):
        """The MLP sub-layer with its norm and residual."""
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """``model.*`` in Hugging Face naming: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, i) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)


class Transformer(nn.Module):
    """Decoder-only LM over a static :class:`KVCache`.

    Args:
        args: architecture.
        hf_config: the transformers config (rope parameters are read from it).
    """

    def __init__(self, args: ModelArgs, hf_config):
        super().__init__()
        self.args = args
        self.model = Backbone(args)
        self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.hf_config = hf_config
        self.rotary: Rotary | None = None  # built by setup_rotary once the weights' device is known

    def setup_rotary(self, device) -> None:
        self.rotary = Rotary(self.hf_config, self.args.head_dim, device)

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache:
        p = self.lm_head.weight
        return KVCache(self.args.n_layers, batch, self.args.n_kv_heads, max_len, self.args.head_dim,
                       p.dtype, p.device)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slots: torch.Tensor | None,
        plan: AttentionPlan,
        backend: str = "sdpa",
        logits: str | torch.Tensor = "all",
        skip: tuple[frozenset, frozenset] | None = None,
    ) -> torch.Tensor:
        """Run one step.

        Args:
            tokens: [B, Q] token ids.
            positions: [B, Q] or [Q] logical positions (RoPE).
            cache: the static cache; ``slots`` of it are written, ``plan.prefix`` slots of it are read.
            slots: [Q'] long physical slots for the KV of the step's first Q' tokens (Q' <= Q; the others are
                attended within the step only), [B, Q'] when each batch row has its own, or ``None`` to write
                nothing.
            plan: visibility of cached and step keys per query.
            backend: ``sdpa`` or ``flex``.
            logits: ``"all"``, ``"last"``, ``"none"`` (hidden states), a [K] index tensor of rows to project, or
                [B, K]: each batch row's own.
            skip: optional (attention layers, MLP layers) to skip (self-speculative drafting); a skipped
                attention layer writes no KV.

        Returns:
            [B, Q', V] logits (``Q'`` = rows asked for), or [B, Q, dim] hidden states for ``logits="none"``; with
            ``plan.capture_rows`` the pair (that, {layer: [B, H_q, R, D] post-RoPE queries of those rows}).
        """
        x, cos, sin = self.embed(tokens, positions)
        skip_attn, skip_mlp = skip or (frozenset(), frozenset())
        queries = {} if plan.capture_rows is not None else None
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, cache, slots, plan, backend, i in skip_attn, i in skip_mlp, queries)
        out = self.project(x, logits)
        return out if queries is None else (out, queries)

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step's input: embeddings [B, Q, dim] and the rotary cos, sin of its positions ([Q] or [B, Q])."""
        if positions.dim() == 1:
            positions = positions[None].expand(tokens.shape[0], -1)
        x = self.model.embed_tokens(tokens)
        return (x, *self.rotary.cos_sin(positions, x.dtype))

    def project(self, x: torch.Tensor, logits: str | torch.Tensor) -> torch.Tensor:
        """The last layer's output [B, Q, dim] -> the logits rows asked for (see :meth:`forward`)."""
        if isinstance(logits, str):
            if logits == "last":
                x = x[:, -1:]
        elif logits.dim() == 1:
            x = x[:, logits]
        else:  # [B, R]: each row's own logits rows
            x = x.gather(1, logits[..., None].expand(-1, -1, x.shape[-1]))
        return self.model.norm(x) if isinstance(logits, str) and logits == "none" else self.lm_head(self.model.norm(x))


def plan_is_plain_causal(plan: AttentionPlan) -> bool:
    """A decode step over the whole prefix, causal within the step (no tree, region or per-query lengths)."""
    return (plan.prefix > 0 and plan.step_mask is None and plan.prefix_lens is None and plan.region_from is None
            and plan.prefix_length is None and not plan.step_in_cache)
