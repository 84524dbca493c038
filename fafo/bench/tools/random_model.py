"""Random-weight models built in memory on the device, for engine benchmarks (no checkpoint, nothing on disk).

A Llama-2-7B-shaped model in float16 is 13.5 GB: written to disk in float32 first it would be 27 GB and minutes
of I/O before anything is timed. Here the weights are drawn on the device in the benchmark's dtype, and
:func:`transformers_twin` hands the very same tensors to a transformers ``LlamaForCausalLM``, so a race against
transformers runs both on identical weights at no extra memory.

Random weights time like real ones (the same shapes, the same kernels); their tokens mean nothing.
"""

from __future__ import annotations

import torch

from fafo.engine.context import context_limit
from fafo.engine.engine import DTYPES, Engine
from fafo.engine.model import ModelArgs, Transformer

# transformers LlamaConfig fields of each named shape
SHAPES = {
    # Llama-2-7B (MHA, 32 layers, vocab 32000); positions to 8192 so a 4096 context plus a 512-token step fits
    "llama2-7b": dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, intermediate_size=11008, max_position_embeddings=8192),
    # a 156M Llama with GQA 16/4 (the CPU races against transformers)
    "156m": dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                 num_key_value_heads=4, intermediate_size=2816, max_position_embeddings=8192),
    # 4 layers, GQA 8/2: a smoke test of a benchmark, in seconds on a CPU
    "embedded": dict(vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                     num_key_value_heads=2, intermediate_size=688, max_position_embeddings=65536),
    # the 7B shape scaled down for a CPU run of the GPU self-check: MHA, head_dim 128, Llama-2's vocabulary
    "llama2-7b-toy": dict(vocab_size=32000, hidden_size=256, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=2, intermediate_size=688, max_position_embeddings=8192),
}


def llama_config(shape: str | dict, **overrides):
    """A transformers ``LlamaConfig`` of a named shape (:data:`SHAPES`) or of explicit fields, plus overrides."""
    import transformers

    fields = dict(SHAPES[shape]) if isinstance(shape, str) else dict(shape)
    fields.update(overrides)
    return transformers.LlamaConfig(**fields, initializer_range=0.02, eos_token_id=None, bos_token_id=None,
                                    pad_token_id=None)


@torch.no_grad()
def random_engine(config, device="cpu", dtype: str | torch.dtype = "float32", backend: str = "sdpa",
                  seed: int = 0, name: str = "") -> Engine:
    """An :class:`Engine` whose weights are drawn on ``device`` in ``dtype``: N(0, 0.02) matrices (transformers'
    Llama initialisation), unit norms, zero biases. It has no tokenizer (``None``) and no EOS."""
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    device = torch.device(device)
    args = ModelArgs.from_hf(config)
    with torch.device("meta"):
        model = Transformer(args, config).to(torch_dtype)
    model = model.to_empty(device=device)
    gen = torch.Generator(device).manual_seed(seed)
    for pname, p in model.named_parameters():
        if pname.endswith("norm.weight"):
            p.fill_(1.0)
        elif pname.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, config.initializer_range, generator=gen)
    if args.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.setup_rotary(device)
    model = model.eval().requires_grad_(False)
    context, _ = context_limit(config, None)
    return Engine(model, None, backend, (), context, name or "random")


def transformers_twin(engine: Engine, attn_implementation: str = "sdpa"):
    """A transformers ``*ForCausalLM`` of the engine's config whose parameters ARE the engine's tensors (same
    names, loaded with ``assign=True``): no copy, identical weights. Greedy ``generate`` needs no EOS."""
    import copy

    import transformers

    config = copy.deepcopy(engine.model.hf_config)  # the engine's own config stays as it is
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=engine.dtype,
                                                           attn_implementation=attn_implementation)
    missing, unexpected = hf.load_state_dict(engine.model.hf_state_dict(), strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and engine.model.args.tie_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"transformers twin: parameter names differ (missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]})")
    if engine.model.args.tie_embeddings:
        hf.tie_weights()
    with torch.device(engine.device):  # its inv_freq was computed on the meta device: build it again here
        hf.model.rotary_emb = type(hf.model.rotary_emb)(config=config)
    meta = [n for n, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if meta:
        raise RuntimeError(f"transformers twin: tensors left on the meta device: {meta[:3]}")
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.eval()
