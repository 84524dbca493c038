"""LongSpec's draft: one decoder layer over the target's own KV cache, in the released checkpoint format.

LongSpec (Yang et al., 2025, https://arxiv.org/abs/2502.17421; code ``sail-sg/LongSpec`` @ 15e4998, ``longspec/test/
llama_glide.py``: ``LlamaGlideDecoderLayer``, ``GlideAttention``). The draft shares the target's embeddings, LM head
and rotary, and owns one layer::

    h = embed(x)
    h = h + self_attn(input_layernorm(h))                 # sliding window over the draft's own KV (512 tokens)
    h = h + cross_attn(post_self_attention_layernorm(h))  # queries only; keys/values = the target's LAST layer
    h = h + mlp(post_cross_attention_layernorm(h))        #   post-RoPE KV cache, read in place (no copy)
    logits = lm_head(h)                                   # no final norm (as the release: lm_head on h directly)

Window rule: a draft query at position ``p`` sees its own keys at positions ``p - window <= k <= p`` (flash-attn's
``window_size=(512, -1)`` in the release); the committed draft KV lives in a ring of ``window`` slots
(:class:`WindowCache`). Being one layer, its self-attention keys depend only on (token, position), so the prompt's
draft "prefill" is the k/v projections of its last ``window`` tokens. The released format (key names, prefixes,
rope settings) is loaded as the official loader (transformers 4.46.3) does: docs/methods/longspec.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fafo.engine.model import RMSNorm
from fafo.engine.rope import apply_rotary
from fafo.errors import ConfigError
from fafo.files import Source, check_checkpoint, check_safetensors, read_json, weight_files

SHAPE_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
RELEASE_PREFIXES = ("model.", "glide.")  # base_model_prefix (stripped by from_pretrained); LlamaGlide's attribute
# transformers 4.46.3 (the official pin): ROPE_INIT_FUNCTIONS' rope types and the keys each one's validation requires
OFFICIAL_ROPE_KEYS = {"default": (), "linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
                      "longrope": ("short_factor", "long_factor"),
                      "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")}
ARCHITECTURES = {"llama": "LlamaGlideDecoderLayer", "qwen2": "Qwen2GlideDecoderLayer",
                 "mistral": "LlamaGlideDecoderLayer"}


class GlideAttention(nn.Module):
    """``GlideAttention`` parameters (q/k/v with bias, o without)."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.q_proj = nn.Linear(dim, n_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def heads(self, proj: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """[B, Q, dim] -> [B, H, Q, D]."""
        B, Q, _ = x.shape
        return proj(x).view(B, Q, -1, self.head_dim).transpose(1, 2)

    def forward(self, x, cos, sin, k, v, mask) -> torch.Tensor:
        """Queries of ``x`` [B, Q, dim] (rotary cos/sin) over k, v [B, Hkv, K, D] where ``mask`` [Q, K] allows (None:
        everywhere) -> the output projection [B, Q, dim]."""
        B, Q, _ = x.shape
        o = masked_attention(apply_rotary(self.heads(self.q_proj, x), cos, sin), k, v, mask, self.head_dim ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(B, Q, -1))


class GlideMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def masked_attention(q, k, v, mask, scale: float) -> torch.Tensor:
    """Exact attention with GQA; a query that sees no key outputs zeros (the release's training pads such rows
    with zeros). q: [B, Hq, Q, D]; k, v: [B, Hkv, K, D]; mask: [Q, K] bool or None -> [B, Hq, Q, D]."""
    B, Hq, Q, D = q.shape
    Hkv = k.shape[1]
    qg = q.reshape(B, Hkv, Hq // Hkv, Q, D)
    scores = torch.matmul(qg, k[:, :, None].transpose(-1, -2)).float() * scale  # [B, Hkv, G, Q, K]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = torch.matmul(probs.to(v.dtype), v[:, :, None])  # [B, Hkv, G, Q, D]
    return out.reshape(B, Hq, Q, D)


class GlideLayer(nn.Module):
    """The draft layer (``LlamaGlideDecoderLayer`` parameter names); see the module docstring.

    Args:
        dim, n_heads, n_kv_heads, intermediate_size, norm_eps: the target's sizes (the release copies its config).
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, intermediate_size: int, norm_eps: float):
        super().__init__()
        self.self_attn = GlideAttention(dim, n_heads, n_kv_heads)
        self.cross_attn = GlideAttention(dim, n_heads, n_kv_heads)
        self.mlp = GlideMLP(dim, intermediate_size)
        self.input_layernorm = RMSNorm(dim, norm_eps)
        self.post_self_attention_layernorm = RMSNorm(dim, norm_eps)
        self.post_cross_attention_layernorm = RMSNorm(dim, norm_eps)

    def self_kv(self, emb: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Self-attention keys (post-RoPE) and values of tokens: emb [B, Q, dim] -> 2 x [B, Hkv, Q, D]."""
        a = self.input_layernorm(emb)
        k = apply_rotary(self.self_attn.heads(self.self_attn.k_proj, a), cos, sin)
        return k, self.self_attn.heads(self.self_attn.v_proj, a)

    def forward(self, emb, cos, sin, self_k, self_v, self_mask, target_k, target_v, target_mask=None):
        """Hidden states of query rows.

        Args:
            emb: [B, Q, dim] the rows' token embeddings; cos/sin: their rotary ([B, 1, Q, D]).
            self_k, self_v: [B, Hkv, K, D] every draft key the rows may see (their own included).
            self_mask: [Q, K] bool (window and tree/causal visibility).
            target_k, target_v: [B, Hkv, S, D] the target's last-layer post-RoPE KV (a view of its cache).
            target_mask: [Q, S] bool or None (every row sees all S entries).
        Returns:
            [B, Q, dim] hidden states (``lm_head`` of them are the draft logits).
        """
        h = emb + self.self_attn(self.input_layernorm(emb), cos, sin, self_k, self_v, self_mask)
        h = h + self.cross_attn(self.post_self_attention_layernorm(h), cos, sin, target_k, target_v, target_mask)
        return h + self.mlp(self.post_cross_attention_layernorm(h))


class WindowCache:
    """The draft's committed self-attention KV: a ring of ``window`` slots (slot = position mod window).

    Never holds more than ``window`` entries: with the rule ``p - window <= k``, every later query (position
    >= the next uncommitted one) can only see the last ``window`` committed positions.
    """

    def __init__(self, window: int, n_kv_heads: int, head_dim: int, dtype, device):
        self.window = window
        self.k = torch.zeros(1, n_kv_heads, window, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.full((window,), -1, dtype=torch.long, device=device)  # -1: empty slot

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size() + self.pos.numel() * 8

    def reset(self) -> None:
        self.pos.fill_(-1)

    def append(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        """Commit entries at increasing ``positions`` ([Q] long; k, v: [1, Hkv, Q, D]); only the last window stay."""
        k, v, positions = k[:, :, -self.window:], v[:, :, -self.window:], positions[-self.window:]
        slots = positions % self.window
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        self.pos.index_copy_(0, slots, positions)


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """[Q, K] bool: key position within ``[q - window, q]`` (negative key positions = empty slots)."""
    d = q_pos[:, None] - k_pos[None, :]
    return (k_pos[None, :] >= 0) & (d >= 0) & (d <= window)


def dense_forward(layer: GlideLayer, emb, cos, sin, target_k, target_v, window: int, shift=1) -> torch.Tensor:
    """The draft over a whole sequence at once (training; also the reference the decoder is tested against).

    Row ``i`` sees its own keys ``i - window <= j <= i`` and the target's KV ``j <= i - shift`` (sequence indices).
    ``shift = 1`` is what decoding sees at a tree's root (the target has every earlier token); larger shifts are
    the paper's "flash noisy training" (the release draws ``shift`` in 1..4 per batch): deeper tree levels see
    target KV lagging by ``depth + 1``. Rows with no target key get a zero cross-attention output (as the release).

    Args:
        emb: [B, T, dim]; cos/sin: [B, 1, T, D] (any positions, e.g. anchor-offset ones); target_k/v:
            [B, Hkv, T, D] the target's last-layer post-RoPE KV of the same sequence.
    Returns:
        [B, T, dim] hidden states (``lm_head`` -> logits predicting token i + 1).
    """
    idx = torch.arange(emb.shape[1], device=emb.device)
    k, v = layer.self_kv(emb, cos, sin)
    d = idx[:, None] - idx[None, :]
    return layer(emb, cos, sin, k, v, (d >= 0) & (d <= window), target_k, target_v, d >= shift)


# ---------------------------------------------------------------------------------------------- released format
def new_draft(target_config, seed: int | None = 0, dtype=torch.float32, device="cpu") -> GlideLayer:
    """A randomly initialised draft for a target (the release's ``_init_weights``: normal(0, initializer_range)
    linears, zero biases, unit norms)."""
    check_shapes(target_config.to_dict(), target_config, "the target")
    layer = _build(target_config.to_dict())
    std = getattr(target_config, "initializer_range", 0.02)
    gen = torch.Generator().manual_seed(0 if seed is None else seed)
    with torch.no_grad():
        for m in layer.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * std)
                if m.bias is not None:
                    m.bias.zero_()
    return layer.to(device=device, dtype=dtype)


def _build(cfg: dict) -> GlideLayer:
    return GlideLayer(cfg["hidden_size"], cfg["num_attention_heads"],
                      cfg.get("num_key_value_heads") or cfg["num_attention_heads"], cfg["intermediate_size"],
                      cfg.get("rms_norm_eps", 1e-6))


def save_draft(layer: GlideLayer, target_config, out_dir: str | Path) -> Path:
    """Write ``config.json`` (the target's own config, naming the Glide layer class) + ``model.safetensors`` in the
    released format."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = target_config.to_dict()
    cfg["architectures"] = [ARCHITECTURES.get(cfg.get("model_type"), "LlamaGlideDecoderLayer")]
    (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    state = {k: v.detach().contiguous().cpu() for k, v in layer.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def resolve_draft(path: str, revision: str | None = None, weights: bool = True) -> Path:
    """A local directory for a draft hub id or directory (errors name ``method.draft.path``); ``weights=False``
    fetches only its config (enough to check it against the target)."""
    from fafo.engine.loader import resolve_checkpoint

    try:
        ckpt = resolve_checkpoint(path, revision, weights)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("model.path", "method.draft.path")) from None
    check_checkpoint(ckpt, _draft_source(path), tokenizer=False, weights=weights)  # the target's tokenizer is used
    if weights:
        check_draft_weights(ckpt, _draft_source(path))
    return ckpt


def check_draft_weights(ckpt: Path, src: Source) -> None:
    """The safetensors headers hold the Glide layer its config.json describes (names and shapes; nothing is
    loaded): a target checkpoint or another target's draft in ``method.draft.path`` is one line, before loading."""
    cfg = read_draft_config(ckpt)
    try:
        with torch.device("meta"):
            want = {n: tuple(t.shape) for n, t in _build(cfg).state_dict().items() if "rotary_emb" not in n}
    except (KeyError, TypeError, ValueError) as exc:
        raise src.error(Path(ckpt) / "config.json", f"is not a LongSpec draft config ({type(exc).__name__}: "
                                                    f"{exc})") from None
    files = weight_files(Path(ckpt), src)
    if any(f.suffix != ".safetensors" for f in files):
        return  # pickled weights are matched when they load (load_draft)
    names = [(release_key(n), tuple(i["shape"])) for f in files for n, i in check_safetensors(f, src).items()
             if n != "__metadata__"]
    have = {n: shape for n, shape in names if n is not None}
    if len(have) < sum(n is not None for n, _ in names):
        raise src.error(files[0] if len(files) == 1 else ckpt, "holds a weight both with and without a prefix "
                        f"({', '.join(RELEASE_PREFIXES)})", "keep one copy of each LongSpec Glide layer weight")
    missing, unexpected = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    shapes = sorted(n for n in set(want) & set(have) if want[n] != have[n])
    if missing or unexpected or shapes:
        raise src.error(files[0] if len(files) == 1 else ckpt,
                        f"holds weights that are not the LongSpec Glide layer its config.json describes (missing "
                        f"{missing[:2]}, unexpected {unexpected[:2]}, of another shape {shapes[:2]})",
                        "use a released sail/longspec-* draft or one from scripts/train_longspec_draft.py")


def release_key(name: str) -> str | None:
    """A released weight's name as a Glide layer parameter (``model.`` / ``glide.`` prefix dropped), or None for
    the rotary buffers older transformers saved (unused: the target's rotary is used)."""
    prefix = next((p for p in RELEASE_PREFIXES if name.startswith(p)), "")
    return None if "rotary_emb" in name else name[len(prefix) :]


def _draft_source(path) -> Source:
    return Source("method.draft.path", str(path), "re-download the LongSpec draft (or train one with "
                  "scripts/train_longspec_draft.py) and point method.draft.path at the complete directory")


def read_draft_config(ckpt: Path) -> dict:
    return read_json(Path(ckpt) / "config.json", _draft_source(ckpt))


def check_shapes(cfg: dict, target_config, where: str) -> None:
    """Refuse a draft config that does not fit the target (one line naming the field), before any weights load."""
    tcfg = target_config.to_dict()
    t_heads = tcfg["num_attention_heads"]
    t_head_dim = tcfg.get("head_dim") or tcfg["hidden_size"] // t_heads
    if tcfg["hidden_size"] != t_heads * t_head_dim:
        raise ConfigError(f"method=longspec: the target's head_dim {t_head_dim} x {t_heads} heads != hidden_size "
                          f"{tcfg['hidden_size']}; the Glide draft needs head_dim = hidden_size / heads")
    for key in SHAPE_KEYS:
        want = tcfg.get(key) or (t_heads if key == "num_key_value_heads" else None)
        got = cfg.get(key) or (cfg.get("num_attention_heads") if key == "num_key_value_heads" else None)
        if got != want:
            raise ConfigError(f"method.draft.path={where}: draft {key}={got} but the target has {want}; use the "
                              "LongSpec draft trained for this target (scripts/train_longspec_draft.py makes one)")
    check_release_rope(cfg, tcfg, where)


def check_release_rope(cfg: dict, tcfg: dict, where: str) -> None:
    """Refuse the draft config's ``rope_scaling`` where the official loader (transformers 4.46.3) would (not a
    mapping, no or an unknown rope type, a key its type requires missing; docs/methods/longspec.md)."""
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        return
    target = tcfg.get("rope_scaling") or tcfg.get("rope_parameters")
    fix = (f"set rope_scaling in the draft's config.json to the target's ({target}) or to null; the draft uses the "
           "target's rotary either way")
    if not isinstance(scaling, dict):
        raise ConfigError(f"method.draft.path={where}: the draft's config.json rope_scaling={scaling!r} is not a "
                          f"mapping (the official LongSpec loader cannot read it); {fix}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in OFFICIAL_ROPE_KEYS:
        raise ConfigError(f"method.draft.path={where}: the draft's config.json rope_scaling={scaling} has rope_type "
                          f"{kind!r}, which the official LongSpec loader (transformers 4.46) cannot build (known: "
                          f"{', '.join(OFFICIAL_ROPE_KEYS)}); {fix}")
    missing = [k for k in OFFICIAL_ROPE_KEYS[kind] if k not in scaling]
    if missing:
        raise ConfigError(f"method.draft.path={where}: the draft's config.json rope_scaling={scaling} lacks "
                          f"{', '.join(missing)}, required for rope_type {kind!r} (the official LongSpec loader "
                          f"refuses it); {fix}")


def load_draft(ckpt: Path, target_config, dtype, device) -> GlideLayer:
    """Load a released-format draft (strict key check: one clear error naming what is missing/unexpected)."""
    from fafo.engine.loader import _read_state_dict

    cfg = read_draft_config(ckpt)
    check_shapes(cfg, target_config, repr(str(ckpt)))
    with torch.device("meta"):
        layer = _build(cfg)
    files = weight_files(Path(ckpt), _draft_source(ckpt))
    state = {release_key(n): t for n, t in _read_state_dict(files, dtype, torch.device(device))}
    state.pop(None, None)
    missing, unexpected = layer.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ConfigError(f"method.draft.path={str(ckpt)!r}: weights are not a LongSpec Glide layer (missing "
                          f"{missing[:3]}, unexpected {unexpected[:3]}); use a released sail/longspec-* draft")
    return layer.eval().requires_grad_(False)
