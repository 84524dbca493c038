"""LongSpec drafts in the official release layouts: the key names of sail-sg/LongSpec's ``LlamaGlideDecoderLayer``
(``longspec/test/llama_glide.py`` @ 15e4998), bare or under the ``model.`` prefix its ``from_pretrained`` strips, a
transformers-4.46 ``config.json`` (``rope_scaling``, ``rope_theta``); rope settings checked as that loader does."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from baselines.longspec import LongSpecDecoder
from baselines.longspec_draft import load_draft
from baselines.vanilla import VanillaDecoder
from fafo.engine.tiny import tiny_checkpoint
from fafo.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def official_tensors(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """A LlamaGlideDecoderLayer state_dict written out by hand from the official class (not from ours): GlideAttention
    q/k/v Linear(bias=True), o Linear(bias=False), LlamaMLP, three LlamaRMSNorm."""
    g = torch.Generator().manual_seed(seed)
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, inter, hd = cfg["num_key_value_heads"], cfg["intermediate_size"], d // h
    out = {}
    for attn in ("self_attn", "cross_attn"):
        for proj, rows in (("q", h * hd), ("k", kv * hd), ("v", kv * hd)):
            out[f"{attn}.{proj}_proj.weight"] = torch.randn(rows, d, generator=g) * 0.1
            out[f"{attn}.{proj}_proj.bias"] = torch.randn(rows, generator=g) * 0.01
        out[f"{attn}.o_proj.weight"] = torch.randn(d, h * hd, generator=g) * 0.1
    out["mlp.gate_proj.weight"] = torch.randn(inter, d, generator=g) * 0.1
    out["mlp.up_proj.weight"] = torch.randn(inter, d, generator=g) * 0.1
    out["mlp.down_proj.weight"] = torch.randn(d, inter, generator=g) * 0.1
    for norm in ("input_layernorm", "post_self_attention_layernorm", "post_cross_attention_layernorm"):
        out[f"{norm}.weight"] = 1 + torch.randn(d, generator=g) * 0.01
    return out


def release_config(target_config, rope_scaling=None, rope_theta=10000.0) -> dict:
    """The target's config as transformers 4.46 wrote it (the release's config.json): rope_scaling + rope_theta."""
    cfg = {k: v for k, v in target_config.to_dict().items() if k != "rope_parameters"}
    return {**cfg, "architectures": ["LlamaGlideDecoderLayer"], "rope_scaling": rope_scaling,
            "rope_theta": rope_theta, "transformers_version": "4.46.3"}


def write_release(out: Path, cfg: dict, prefix: str = "", inv_freq: bool = False) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = official_tensors(cfg)
    if inv_freq:  # older transformers saved the rotary buffer
        tensors["self_attn.rotary_emb.inv_freq"] = torch.ones(cfg["hidden_size"] // cfg["num_attention_heads"] // 2)
    save_file({prefix + k: v for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("prefix,inv_freq", [("", False), ("model.", False), ("model.", True), ("glide.", False)])
def test_release_layouts_load_with_the_official_names(prefix, inv_freq, engine, tmp_path):
    eng = engine("llama_gqa")
    path = write_release(tmp_path / "draft", release_config(eng.model.hf_config), prefix, inv_freq)
    layer = load_draft(path, eng.model.hf_config, torch.float32, "cpu")
    want = official_tensors(json.loads((path / "config.json").read_text()))
    assert set(layer.state_dict()) == set(want)
    for name, tensor in want.items():
        assert torch.equal(layer.state_dict()[name], tensor), name
    method = LongSpecDecoder(draft={"path": str(path)}, tree_shape=[2, 2])
    method.check_target(eng.model.hf_config, eng.tokenizer)
    ids = eng.tokenizer("The quick brown fox jumps over the lazy dog").input_ids
    assert method.generate(eng, ids, 16).tokens == VanillaDecoder().generate(eng, ids, 16).tokens


def test_a_weight_under_both_names_is_refused(engine, tmp_path):
    eng = engine("llama_gqa")
    path = write_release(tmp_path / "draft", release_config(eng.model.hf_config))
    tensors = official_tensors(release_config(eng.model.hf_config))
    twice = {**tensors, "model.mlp.up_proj.weight": tensors["mlp.up_proj.weight"].clone()}
    save_file(twice, str(path / "model.safetensors"))
    with pytest.raises(ConfigError, match="both with and without a prefix"):
        LongSpecDecoder(draft={"path": str(path)}).check_target(eng.model.hf_config, None)


@pytest.mark.parametrize("rope_scaling,rope_theta", [
    ({"type": "linear", "factor": 2.0}, 10000.0),  # the target has none: the official loader still builds it
    ({"rope_type": "dynamic", "factor": 4.0}, 500000.0),
    (None, 1e6),
])
def test_rope_differing_from_the_target_is_accepted_as_officially(rope_scaling, rope_theta, engine, tmp_path):
    """Every official draft call takes its rotary from the target (``self.model.rotary_emb``): a draft config
    whose rope differs loads, and the draft runs on the target's rope (the same tokens as vanilla)."""
    eng = engine("llama_gqa")
    cfg = release_config(eng.model.hf_config, rope_scaling, rope_theta)
    path = write_release(tmp_path / "draft", cfg, "model.")
    method = LongSpecDecoder(draft={"path": str(path)}, tree_shape=[2, 2])
    method.check_target(eng.model.hf_config, eng.tokenizer)
    ids = eng.tokenizer("Once upon a time").input_ids
    assert method.generate(eng, ids, 12).tokens == VanillaDecoder().generate(eng, ids, 12).tokens


REFUSED = [  # rope_scaling the official loader (transformers 4.46.3) cannot build, and what the error names
    ({"type": "yarn"}, "lacks factor"),  # rope_config_validation: KeyError, missing required keys
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, "high_freq_factor"),
    ({"type": "su", "factor": 2.0}, "rope_type 'su'"),  # LlamaRotaryEmbedding: no init function
    ({"factor": 2.0}, "rope_type None"),  # no type at all: ROPE_INIT_FUNCTIONS[None]
    ("linear", "not a mapping"),
]


@pytest.mark.parametrize("rope_scaling,named", REFUSED)
def test_rope_the_official_loader_refuses_is_one_line(rope_scaling, named, engine, tmp_path):
    eng = engine("llama_gqa")
    path = write_release(tmp_path / "draft", release_config(eng.model.hf_config, rope_scaling))
    with pytest.raises(ConfigError) as err:
        LongSpecDecoder(draft={"path": str(path)}).check_target(eng.model.hf_config, None, weights=False)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("method.draft.path=") and "rope_scaling" in msg and named in msg
    assert "set rope_scaling in the draft's config.json to the target's" in msg


@pytest.mark.slow  # the CLI in a subprocess: the full tier
def test_cli_loads_a_prefixed_release_and_refuses_a_bad_rope_before_loading(tmp_path):
    """`python -m fafo.bench method=longspec method.draft.path=<release>`: a ``model.``-prefixed release runs
    token-identically; one whose rope_scaling the official loader refuses is one line, exit 2 (the runner checks the
    draft against the target's config before it loads the target model)."""
    from omegaconf import OmegaConf
    from transformers import AutoConfig

    cache = tmp_path / "cache"
    spec = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "tiny_llama.yaml").tiny)
    target = tiny_checkpoint(spec, cache_dir=cache)  # the checkpoint model=tiny_llama builds

    good = write_release(tmp_path / "good", release_config(AutoConfig.from_pretrained(target)), "model.")
    bad = write_release(tmp_path / "bad", release_config(AutoConfig.from_pretrained(target), {"type": "yarn"}),
                        "model.")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO),
           "FAFO_CACHE": str(cache)}
    common = ["-m", "fafo.bench", "model=tiny_llama", "method=longspec", "method.tree_shape=[2,2]",
              "bench.max_samples=2", "bench.max_new_tokens=10", f"bench.output_dir={tmp_path / 'runs'}",
              "wandb.mode=disabled", "bench.progress=false"]

    def run(draft):
        return subprocess.run([sys.executable, *common, f"method.draft.path={draft}"], check=False,
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)

    proc = run(bad)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: method.draft.path=") and "rope_scaling" in lines[0] and "factor" in lines[0]
    proc = run(good)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(next((tmp_path / "runs").glob("**/summary.json")).read_text())
    assert summary["exact_match_rate"] == 1.0 and summary["n_samples"] == 2
