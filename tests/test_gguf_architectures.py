"""GGUF files of each architecture the conversion reads, written here as llama.cpp's converter writes them.

The embedded real model covers a quantized Llama GGUF (tests/test_real_model.py). These files hold float32 tensors
of a tiny random checkpoint, so the conversion has to give back that checkpoint bit for bit: Qwen2 with its q/k/v
biases, Llama with the q/k row permutation llama.cpp applies to it (and transformers undoes), MHA and GQA. The
layout follows llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel.permute``; ``Qwen2Model`` permutes nothing) and
its tensor names gguf-py's own map (``gguf.get_tensor_name_map``); the tokenizer is the tiny byte-level BPE as a
``gpt2`` vocabulary with its merges.
"""

import json

import gguf  # the gguf extra: in both tiers' environments (make install; the compat tier's wheels)
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from fafo.engine.gguf import gguf_checkpoint
from fafo.engine.tiny import build_tiny_checkpoint
from fafo.engine.tiny_tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tiny_tokenizer
from fafo.errors import ConfigError
from tests.helpers import run_cli

CASES = {  # name: (family, num_key_value_heads, bias_std)
    "llama_mha": ("llama", 4, 0.0),
    "llama_gqa": ("llama", 2, 0.0),
    "qwen2_gqa": ("qwen2", 2, 0.3),  # non-zero q/k/v biases, so a bias lost or misplaced shows
}
ADD_BOS = {"llama": True, "qwen2": False}  # tokenizer.ggml.add_bos_token as in llama.cpp's files of each family


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for its rope: within each head, the two halves of the rotary pairs interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(ckpt, path) -> None:
    """The checkpoint directory ``ckpt`` (a tiny model and the tiny tokenizer) as a float32 GGUF file ``path``."""
    cfg = json.loads((ckpt / "config.json").read_text())
    family, layers = cfg["model_type"], cfg["num_hidden_layers"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(path), family)
    writer.add_block_count(layers)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])

    tok = build_tiny_tokenizer(cfg["vocab_size"])
    bpe = json.loads(tok.backend_tokenizer.to_str())["model"]
    vocab = [t for t, _ in sorted(bpe["vocab"].items(), key=lambda kv: kv[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(vocab)
    writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in bpe["merges"]])
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    writer.add_pad_token_id(tok.pad_token_id)
    writer.add_add_bos_token(ADD_BOS[family])
    writer.add_chat_template(CHAT_TEMPLATE)

    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == family)
    names = gguf.get_tensor_name_map(arch, layers)
    for key, tensor in load_file(str(ckpt / "model.safetensors")).items():
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        data = tensor.float().numpy()
        if family == "llama" and name.split(".")[-2] in ("attn_q", "attn_k"):
            data = llama_cpp_permute(data, heads if name.split(".")[-2] == "attn_q" else kv_heads)
        writer.add_tensor(name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """{case: (checkpoint directory, GGUF file written from it)}."""
    root = tmp_path_factory.mktemp("gguf")
    files = {}
    for case, (family, kv_heads, bias_std) in CASES.items():
        ckpt = build_tiny_checkpoint(root / case, family=family, num_key_value_heads=kv_heads, bias_std=bias_std,
                                     seed=5)
        write_gguf(ckpt, root / f"{case}.gguf")
        files[case] = ckpt, root / f"{case}.gguf"
    return files


@pytest.mark.parametrize("case", CASES)
def test_conversion_gives_back_the_checkpoint_it_was_written_from(case, gguf_files, tmp_path, monkeypatch):
    monkeypatch.setenv("FAFO_CACHE", str(tmp_path))
    ckpt, file = gguf_files[case]
    out = gguf_checkpoint(str(file))
    assert out.parent == tmp_path / "gguf"
    want, got = load_file(str(ckpt / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(want)
    assert [k for k in want if not torch.equal(got[k], want[k])] == []  # bitwise: float32 in, float32 out
    if CASES[case][2]:
        assert want["model.layers.0.self_attn.q_proj.bias"].abs().sum() > 0
    cfg, src = json.loads((out / "config.json").read_text()), json.loads((ckpt / "config.json").read_text())
    keys = ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
            "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings")
    assert {k: cfg[k] for k in keys} == {k: src[k] for k in keys}
    assert cfg["rope_parameters"]["rope_theta"] == src["rope_parameters"]["rope_theta"]
    assert cfg["rms_norm_eps"] == pytest.approx(src["rms_norm_eps"], rel=1e-6)  # stored as float32 in the file

    from transformers import AutoTokenizer

    tok, mine = AutoTokenizer.from_pretrained(out), build_tiny_tokenizer(src["vocab_size"])
    text = "def add(a, b):\n    return a + b  # naïve sum"  # BOS prepended as the file's flag says
    assert tok(text).input_ids == mine(text, add_special_tokens=ADD_BOS[src["model_type"]]).input_ids
    # transformers gives a qwen2 file Qwen2's pre-tokenizer (digits one by one): other ids for numbers, same text
    numbers = "total 12.5% of 2024"
    assert tok.decode(tok(numbers).input_ids, skip_special_tokens=True) == numbers
    assert tok.chat_template == CHAT_TEMPLATE


def test_a_mistral_architecture_gguf_is_one_clear_error_before_converting(tmp_path, monkeypatch):
    """llama.cpp writes Mistral 7B as ``llama``; a file that says ``mistral`` is refused by name, not half-read."""
    monkeypatch.setenv("FAFO_CACHE", str(tmp_path / "cache"))
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "mistral")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"holds a 'mistral' model; the engine supports llama, qwen2 GGUF files "
                                          r"\(llama.cpp writes Mistral 7B .* as llama\)"):
        gguf_checkpoint(str(tmp_path / "m.gguf"))
    assert list((tmp_path / "cache").glob("gguf/*/config.json")) == []  # nothing converted


@pytest.mark.slow
def test_cli_runs_a_method_on_a_qwen2_gguf_token_identically(gguf_files, tmp_path):
    """``model.gguf_file=F`` as a user types it, on the Qwen2 file: converted once, named after the file, exact."""
    _, file = gguf_files["qwen2_gqa"]
    proc = run_cli(f"model.gguf_file={file}", "method=prompt_lookup", f"bench.output_dir={tmp_path / 'out'}",
                   "bench.max_samples=2", "bench.max_new_tokens=12", "bench.warmup=0", "bench.progress=false",
                   cwd=tmp_path, env={"FAFO_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (summary_path,) = (tmp_path / "out").glob("qwen2_gqa/builtin/prompt_lookup/*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["model"] == "qwen2_gqa" and summary["n_samples"] == 2 and summary["exact_match_rate"] == 1.0
    (config,) = (tmp_path / "cache").glob("gguf/*/config.json")  # converted once, into the given cache
    assert json.loads(config.read_text())["model_type"] == "qwen2"
