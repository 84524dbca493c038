"""The embedded default models: seeded random Llama / Qwen2 checkpoints built in-process.

They are written with transformers' own ``save_pretrained`` into a directory and then loaded through exactly the
code path a hub checkpoint takes, so the offline default exercises the real loader. A random model's speed numbers
are a smoke test only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

FAMILIES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}


def default_cache_dir() -> Path:
    return Path(os.environ.get("FAFO_CACHE", Path.home() / ".cache" / "fafo-bench"))


def build_tiny_checkpoint(out_dir: str | Path, family: str = "llama", seed: int = 0, hidden_size: int = 64,
                          num_hidden_layers: int = 2, num_attention_heads: int = 4, num_key_value_heads: int = 2,
                          intermediate_size: int = 128, max_position_embeddings: int = 8192,
                          initializer_range: float = 0.2, vocab_size: int = 1024,
                          rope_parameters: dict | None = None, tie_word_embeddings: bool = False,
                          max_sequence_length: int | None = None, attention_bias: bool | None = None,
                          bias_std: float = 0.0, head_dim: int | None = None) -> Path:
    """Write a random ``family`` model and the tiny tokenizer to ``out_dir`` (safetensors + tokenizer files).

    ``initializer_range`` is large on purpose: default-init random models collapse into repeating one token,
    while 0.2 gives varied text, so acceptance is not trivially high for every method. transformers initialises
    biases to zero; ``bias_std`` > 0 draws them from N(0, bias_std), so a bias the engine dropped would show
    (Qwen2's q/k/v biases, Llama's ``attention_bias``).
    """
    import transformers

    from fafo.engine.tiny_tokenizer import build_tiny_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(vocab_size)
    config_cls = getattr(transformers, FAMILIES[family])
    extra = {} if rope_parameters is None else {"rope_parameters": dict(rope_parameters)}
    if max_sequence_length is not None:  # FastChat's long-context releases state their length here
        extra["max_sequence_length"] = max_sequence_length
    if attention_bias is not None:
        extra["attention_bias"] = attention_bias
    if head_dim is not None:  # other than hidden_size / num_attention_heads
        extra["head_dim"] = head_dim
    config = config_cls(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range, tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **extra,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if bias_std > 0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0.0, bias_std)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_checkpoint(spec: dict, cache_dir: str | Path | None = None) -> Path:
    """The directory of the tiny model described by ``spec`` (kwargs of :func:`build_tiny_checkpoint`), built once
    and reused: the directory name is a hash of the spec, written atomically so concurrent runs cannot collide."""
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / "tiny" / f"{spec.get('family', 'llama')}-{key}"
    if (target / "config.json").is_file():
        return target
    tmp = root / "tiny" / f".tmp-{key}-{os.getpid()}"
    build_tiny_checkpoint(tmp, **spec)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; its copy is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target
