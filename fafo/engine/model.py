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
SILU_NAMES = ("silu", "swish")  # transformers' ACT2FN maps both to SiLU


def unimplemented_settings(config) -> list[str]:
    """The config.json settings of a supported family that this transformer does not compute (it would run another
    model): an MLP activation other than SiLU, biases in the MLP (Llama's ``mlp_bias``)."""
    out = []
    act = getattr(config, "hidden_act", "silu")
    if act not in SILU_NAMES:
        out.append(f"hidden_act={act!r} (the MLP here is SiLU-gated)")
    if config.model_type == "llama" and getattr(config, "mlp_bias", False):
        out.append("mlp_bias=true (the MLP here has no biases)")
    return out


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
    o_bias: bool
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
        # as transformers' models: Llama's attention_bias biases q, k, v and o; Qwen2 biases q, k, v; Mistral none
        llama_bias = family == "llama" and bool(getattr(config, "attention_bias", False))
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
            qkv_bias=family == "qwen2" or llama_bias,
            o_bias=llama_bias,
            tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_position_embeddings=config.max_position_embeddings,
            sliding_window=sliding,
        )

    def n_params(self) -> int:
        """Parameters of the transformer: embeddings, layers with their norms, final norm, LM head unless tied."""
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        attn = (self.dim * (q + 2 * kv) + q * self.dim + ((q + 2 * kv) if self.qkv_bias else 0)
                + (self.dim if self.o_bias else 0))
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


def fuse_linears(parts: list[nn.Linear]) -> nn.Linear:
    """One linear layer whose output is the parts' outputs side by side (weights and biases concatenated along the
    output axis): one matrix product where there were several, over the same input."""
    bias = parts[0].bias is not None
    w = parts[0].weight
    fused = nn.Linear(parts[0].in_features, sum(p.out_features for p in parts), bias=bias, device="meta")
    fused.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=w.requires_grad)
    if bias:
        fused.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=w.requires_grad)
    return fused


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.layer, self.args = layer, args
        h, hkv, d = args.n_heads, args.n_kv_heads, args.head_dim
        self.widths = (h * d, hkv * d, hkv * d)
        self.q_proj = nn.Linear(args.dim, h * d, bias=args.qkv_bias)
        self.k_proj = nn.Linear(args.dim, hkv * d, bias=args.qkv_bias)
        self.v_proj = nn.Linear(args.dim, hkv * d, bias=args.qkv_bias)
        self.o_proj = nn.Linear(h * d, args.dim, bias=args.o_bias)
        self.qkv_proj = None  # q, k and v in one matrix (fuse)
        self.scale = d**-0.5

    def fuse(self) -> None:
        """q, k and v projected by one ``[Hq D + 2 Hkv D, dim]`` matrix (gpt-fast's ``wqkv``)."""
        if self.qkv_proj is None:
            self.qkv_proj = fuse_linears([self.q_proj, self.k_proj, self.v_proj])
            del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x, cos, sin, cache: Cache, slots, plan: AttentionPlan, backend: str, queries: list | None):
        B, Q, _ = x.shape
        d = self.args.head_dim
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split(self.widths, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, Q, -1, d).transpose(1, 2)  # [B, Hq, Q, D]
        k = k.view(B, Q, -1, d).transpose(1, 2)  # [B, Hkv, Q, D]
        v = v.view(B, Q, -1, d).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if queries is not None:  # the forward returns them, every layer's in order (plan.capture_rows)
            queries.append(q[:, :, plan.capture_rows])
        out = cache.attend(self.layer, q, k, v, slots, plan.for_layer(self.layer), self.scale, backend)
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.dim, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.dim, bias=False)
        self.gate_up_proj = None  # gate and up in one matrix (fuse)

    def fuse(self) -> None:
        """gate and up projected by one ``[2 I, dim]`` matrix (gpt-fast's ``w1``/``w3`` as one)."""
        if self.gate_up_proj is None:
            self.gate_up_proj = fuse_linears([self.gate_proj, self.up_proj])
            del self.gate_proj, self.up_proj

    def weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The gate, up and down weights ``[I, dim], [I, dim], [dim, I]``, fused or not (views)."""
        gate, up = (self.gate_up_proj.weight.chunk(2) if self.gate_up_proj is not None
                    else (self.gate_proj.weight, self.up_proj.weight))
        return gate, up, self.down_proj.weight

    def forward(self, x):
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
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

    def swap_mlp(self, mlp: nn.Module) -> nn.Module:
        """Put ``mlp`` in this block's MLP place, registered as ``self.mlp = mlp`` would, and return the one it held.
        The registry is written directly: ``nn.Module.__setattr__``'s checks cost 1-3 us a call, which a method
        that drafts with other MLPs pays per layer twice per step. Compiled steps see the change: dynamo guards the
        registry's contents (``torch._dynamo.config.guard_nn_modules``, torch 2.11 and 2.13)."""
        held = self._modules["mlp"]
        self._modules["mlp"] = mlp
        return held


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

    def fuse_projections(self) -> None:
        """Every layer's q/k/v and gate/up projections as one matrix each (:func:`fuse_linears`): per layer four
        matrix products instead of seven, the fused ones wider (the engine does this on CUDA). Under transformers'
        names the weights are then read from :meth:`hf_state_dict`."""
        for block in self.model.layers:
            block.self_attn.fuse()
            block.mlp.fuse()

    def swap_mlps(self, mlps: list[nn.Module]) -> list[nn.Module]:
        """Every block's MLP replaced by the one ``mlps`` lists for it (:meth:`Block.swap_mlp`); returns those
        replaced, in order: swapping them back restores the model."""
        if len(mlps) != self.args.n_layers:
            raise ValueError(f"swap_mlps: {len(mlps)} MLPs for {self.args.n_layers} layers")
        return [block.swap_mlp(mlp) for block, mlp in zip(self.model.layers, mlps)]

    @property
    def fused(self) -> bool:
        return self.model.layers[0].self_attn.qkv_proj is not None

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The parameters under transformers' names; fused projections as views of their parts (no copy)."""
        out = {}
        for name, t in self.state_dict().items():
            if ".qkv_proj." in name:
                widths = self.model.layers[0].self_attn.widths
                for part, view in zip(("q_proj", "k_proj", "v_proj"), t.split(widths)):
                    out[name.replace("qkv_proj", part)] = view
            elif ".gate_up_proj." in name:
                for part, view in zip(("gate_proj", "up_proj"), t.chunk(2)):
                    out[name.replace("gate_up_proj", part)] = view
            else:
                out[name] = t
        return out

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
        greedy: bool = False,
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
            greedy: return each logits row's argmax token instead of the row: ``[B, Q']`` long, computed in the
                forward (inside a compiled step's graph: no launch of its own, and a few bytes to copy out of it).

        Returns:
            [B, Q', V] logits (``Q'`` = rows asked for; ``[B, Q']`` tokens when ``greedy``), or [B, Q, dim] hidden
            states for ``logits="none"``; with
            ``plan.capture_rows`` the pair (that, [L, B, H_q, R, D]: every layer's post-RoPE queries of those rows,
            stacked in the forward: one tensor to copy out of a CUDA graph and to slice, whatever the depth).
        """
        x, cos, sin = self.embed(tokens, positions)
        skip_attn, skip_mlp = skip or (frozenset(), frozenset())
        queries = [] if plan.capture_rows is not None else None
        if queries is not None and skip_attn:
            raise ValueError("a forward that captures queries (plan.capture_rows) runs every attention layer")
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, cache, slots, plan, backend, i in skip_attn, i in skip_mlp, queries)
        out = self.project(x, logits)
        out = out.argmax(-1) if greedy else out
        return out if queries is None else (out, torch.stack(queries))

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
