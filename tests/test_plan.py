"""bench.plan: every paper preset checked against config-only checkpoints of its real models (hub cache layout,
no weights) and release-format data; context limits from rope scaling; memory against independent counts and a
measured CPU peak; LongSpec's length filter and a rope-scaled 16k context on a tiny model."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict
from transformers import AutoConfig

from fafo.bench.plan import GB, JobPlan, _fix, assess, memory
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.engine.context import context_limit, trained_context
from fafo.engine.engine import cache_slots
from fafo.engine.model import ModelArgs
from fafo.fafo import FAFODecoder
from tests.plan_hub import MODELS, config_json, text, write_data, write_hub
from tests.helpers import CONF, ENV, PRESETS, preset_jobs

REPO = Path(__file__).resolve().parents[1]
TRAINED = {  # hub id -> the length its model card states
    "meta-llama/Llama-2-7b-chat-hf": 4096, "lmsys/vicuna-7b-v1.3": 2048, "lmsys/vicuna-7b-v1.5-16k": 16384,
    "lmsys/vicuna-13b-v1.5-16k": 16384, "lmsys/longchat-7b-v1.5-32k": 32768, "lmsys/longchat-13b-16k": 16384,
    "togethercomputer/Llama-2-7B-32K-Instruct": 32768, "LargeWorldModel/LWM-Text-Chat-128K": 131072,
    "NousResearch/Yarn-Llama-2-7b-128k": 131072, "meta-llama/Meta-Llama-3-8B-Instruct": 8192,
    "meta-llama/Llama-3.1-8B-Instruct": 131072, "gradientai/Llama-3-8B-Instruct-262k": 262144,
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": 131072, "Qwen/Qwen2.5-7B-Instruct": 32768,
    "Qwen/Qwen2.5-32B-Instruct": 32768, "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": 131072, "JackFram/llama-68m": 2048,
}


def hf_config(hub_id):
    cfg = config_json(MODELS[hub_id])
    return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """(hub cache, task name -> data path), with huggingface_hub pointed at the cache for in-process plans."""
    import huggingface_hub.constants as constants

    root = tmp_path_factory.mktemp("plan")
    cache, paths = write_hub(root / "hub"), write_data(root / "data")
    saved = constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE
    constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = str(cache), True
    yield cache, paths
    constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = saved


def cli(*args, cache, cwd):
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": ENV["PYTHONPATH"], "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "fafo.bench", *args, f"bench.output_dir={cwd}/out",
                           "bench.plan=true"], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


# ------------------------------------------------------------------ context
def test_context_limit_of_every_preset_model_from_rope_scaling_and_max_sequence_length():
    assert set(TRAINED) == set(MODELS)
    for hub_id, length in TRAINED.items():
        assert trained_context(hf_config(hub_id)) == length, hub_id
    vicuna = hf_config("lmsys/vicuna-7b-v1.3")
    assert context_limit(vicuna) == (2048, None)
    assert context_limit(vicuna, 1024) == (1024, None)
    limit, warning = context_limit(vicuna, 4096)  # past the trained length: allowed, as transformers does
    assert limit == 4096 and "exceeds the 2048 positions" in warning


def test_engine_takes_the_rope_scaled_context(tmp_path):
    from fafo.engine.engine import Engine
    from fafo.engine.tiny import build_tiny_checkpoint

    build_tiny_checkpoint(tmp_path, max_position_embeddings=256,
                          rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    assert Engine.from_pretrained(str(tmp_path)).max_len == 1024
    assert Engine.from_pretrained(str(tmp_path), max_len=2048).max_len == 2048


# ------------------------------------------------------------------ every preset, in process
@pytest.mark.slow
def test_every_paper_preset_plans_on_its_real_models(hub):
    _, paths = hub
    plans = {}
    for preset in PRESETS:
        for job, cfg in preset_jobs(preset):
            with open_dict(cfg):
                cfg.task.data_path = paths[cfg.task.name]
            plan = assess(resolve(cfg, weights=False))
            assert plan.fits, f"{preset} {job}: {plan.problems}"
            assert plan.n_fit > 0 and 0 < plan.peak_gb <= 0.95 * plan.gpu_gb
            plans[(preset, *job)] = plan
    assert len(plans) > 200
    longspec = [p for k, p in plans.items() if k[0] == "longspec_table1"]
    # LongSpec: 1200 < tokens <= context - 2000, dropped (not truncated) and counted
    for p in longspec:
        assert p.n_filtered == (1 if p.context_limit > 30000 else 2) and p.max_needed <= p.context_limit
    assert {p.context_limit for p in longspec} == {16384, 32768, 262144}
    spec = [p for k, p in plans.items() if k[0] == "specbench"]
    assert all(p.n_beyond_trained >= 2 and p.trained_context == 2048 for p in spec)
    scbench = plans[("table7", "task=scbench_mf")]  # a Math.Find context past the 128k cap, every turn fits
    assert scbench.context_limit == 131072 and 126000 < scbench.max_needed <= 131072


# ------------------------------------------------------------------ through the CLI
def test_cli_plan_passes_a_sweep_and_writes_plan_json(hub, tmp_path):
    cache, paths = hub
    res = cli("-m", "experiment=longspec_table1", "experiment/rows/longspec_table1@_global_=vicuna7b",
              "method=longspec", f"task.data_path={paths['longbench_gov_report']}", cache=cache, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "== fafo-bench plan: 5 jobs, 0 would fail ==" in res.stdout
    found = sorted((tmp_path / "out").rglob("plan.json"))
    assert len(found) == 5
    for f in found:
        plan = json.loads(f.read_text())
        assert {"n_samples", "n_fit", "n_dropped", "n_fail", "context_limit", "max_needed", "weights_gb", "kv_gb",
                "method_gb", "peak_gb", "gpu_gb", "fits", "problems"} <= set(plan)
        assert plan["fits"] and plan["context_limit"] == 16384 and plan["n_filtered"] == 2
        assert plan["gpu_gb"] == 80 and 13 < plan["weights_gb"] < 14.5


@pytest.mark.slow  # the CLI in a subprocess: the full tier
def test_cli_plan_fails_with_one_line_per_problem(hub, tmp_path):
    cache, paths = hub
    res = cli("model=vicuna_7b_v13", "task=spec_bench", f"task.data_path={paths['spec_bench']}",
              "method=fafo_stream", "task.template=vicuna", cache=cache, cwd=tmp_path)
    assert res.returncode == 1
    problems = [line for line in res.stdout.splitlines() if line.startswith("  problem: ")]
    assert res.stdout.startswith("FAIL  vicuna-7b-v1.3 / fafo-stream / spec_bench")
    assert len(problems) == 3 and all("> context 2048" in p and "model.max_len" in p for p in problems)
    assert any("sample '81' turn 1" in p for p in problems)  # turn 2 holds the longest first answer
    plan = json.loads(next((tmp_path / "out").rglob("plan.json")).read_text())
    assert plan["n_fail"] == 3 and not plan["fits"] and plan["problems"] == [p[11:] for p in problems]

    res = cli("-m", "experiment=table7", "task=scbench_mf", f"task.data_path={paths['scbench_mf']}",
              "bench.gpu_mem_gb=24", cache=cache, cwd=tmp_path)
    assert res.returncode == 1 and "1 would fail" in res.stdout
    assert "problem: memory: peak" in res.stdout and "24 GB GPU" in res.stdout
    assert "error: 1 of 1 jobs would fail" in res.stderr


@pytest.mark.slow
def test_cli_run_drops_unfit_samples_before_timing_and_counts_them(tmp_path):
    """A normal run plans its own job: with bench.drop_unfit=true the samples that cannot fit are never timed and
    the summary counts them; without it the run refuses to start, naming the sample and the fix."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "fafo.bench", "task=builtin", "bench.max_new_tokens=8", "model.max_len=160",
            "bench.warmup=0", "bench.bootstrap=0", "bench.progress=false", "task.ids=[chat-01,code-01,long-01]"]
    res = subprocess.run(args + [f"bench.output_dir={tmp_path}/a", "bench.drop_unfit=true"], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    (summary,) = [json.loads(p.read_text()) for p in (tmp_path / "a").rglob("summary.json")]
    import pandas as pd

    rows = pd.read_csv(next((tmp_path / "a").rglob("samples.csv")), dtype=str)
    assert summary["n_dropped"] == summary["n_dropped_unfit"] >= 1 and summary["context_limit"] == 160
    assert len(set(rows["sample_id"])) == 3 - summary["n_dropped"] and set(rows["status"]) == {"ok"}
    assert "samples dropped before timing" in res.stderr
    res = subprocess.run(args + [f"bench.output_dir={tmp_path}/b"], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=600)
    assert res.returncode == 2 and "> context 160" in res.stderr and "bench.drop_unfit=true" in res.stderr
    assert not list((tmp_path / "b").rglob("samples.csv"))


@pytest.mark.slow
def test_cli_plan_of_a_comparison_plans_every_method(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "fafo.bench", "compare.methods=[vanilla,fafo_stream]", "bench.plan=true",
                          "task.ids=[chat-01]", f"bench.output_dir={tmp_path}"], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    plans = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.rglob("plan.json")}
    assert set(plans) == {"vanilla", "fafo_stream"} and all(p["fits"] for p in plans.values())
    assert plans["fafo_stream"]["max_needed"] - plans["vanilla"]["max_needed"] == 241  # FAFO's scratch slots


@pytest.mark.slow
def test_cli_plan_warns_that_the_greedy_point_of_a_temperature_sweep_ignores_top_p(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "fafo.bench", "-m", "sampling=llama_default",
                          "sampling.temperature=0,0.6", "bench.plan=true", "task.ids=[chat-01]",
                          f"bench.output_dir={tmp_path}"], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    warned = [line for line in res.stdout.splitlines() if "unused" in line]
    assert warned == ["  warning: sampling.top_p=0.9 unused: sampling.temperature=0 is greedy argmax; set "
                      "sampling.temperature > 0 to sample with them"]  # the T=0.6 job warns of nothing
    plans = [json.loads(p.read_text()) for p in tmp_path.rglob("plan.json")]
    assert sorted(len(p["warnings"]) for p in plans) == [0, 1]


@pytest.mark.slow
def test_cli_plan_of_a_job_stopped_by_its_data_names_it_as_a_run_would_and_counts_nothing(tmp_path):
    """A job stopped before its samples (its data file missing) is not shown with zero samples and a 0 GB peak as if
    measured, and its method is named as a resolved run names it (fafo-quest, not the config's fafo-{compress})."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "fafo.bench", "method=fafo_quest", "task=prompts", "bench.plan=true",
                          f"task.data_path={tmp_path / 'missing.jsonl'}", f"bench.output_dir={tmp_path}"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert res.returncode == 1
    assert res.stdout.splitlines()[:2] == [
        "FAIL  tiny-llama / fafo-quest / prompts  not assessed: the problem below stops it before its samples and "
        "memory", f"  problem: task.data_path='{tmp_path / 'missing.jsonl'}' does not exist; point task.data_path at a "
        "jsonl file whose lines have `id` and `text` or `turns`"]


def test_plan_estimates_gpu_hours_from_a_cost_curve(hub, tmp_path):
    cache, paths = hub
    curve = tmp_path / "curve.csv"
    curve.write_text("context,step_tokens,median_ms\n256,1,20\n256,64,22\n65536,1,40\n65536,64,44\n")
    res = cli("model=llama2_7b_chat", "task=mt_bench", f"task.data_path={paths['mt_bench']}",
              f"bench.cost_curve={curve}", cache=cache, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
    plan = json.loads(next((tmp_path / "out").rglob("plan.json")).read_text())
    # 2 questions x 2 turns x 1024 tokens x (reference + method) x about 20 ms
    assert 2 * 2 * 1024 * 2 * 0.020 / 3600 <= plan["est_gpu_hours"] <= 2 * 2 * 1024 * 2 * 0.021 / 3600
    assert "GPU h" in res.stdout


def test_an_overflowing_scratch_names_the_method_settings_that_size_it():
    spec = SimpleNamespace(method=FAFODecoder(n=40, k=6), context=2048)  # 1 + n * k = 241 scratch slots
    assert _fix(spec, 900, 1024, 241, 2048) == "lower method.n or method.k, or raise model.max_len to 2165"
    assert _fix(spec, 1900, 1024, 241, 4096).startswith("raise model.max_len to 3165, lower bench.max_new_tokens")


# ------------------------------------------------------------------ memory
def test_memory_agrees_with_independent_counts():
    llama2, llama3 = (ModelArgs.from_hf(hf_config(f"meta-llama/{name}"))
                      for name in ("Llama-2-7b-chat-hf", "Meta-Llama-3-8B-Instruct"))
    assert abs(llama2.n_params() / 6.74e9 - 1) < 0.1 and abs(llama3.n_params() / 8.03e9 - 1) < 0.1  # model cards
    assert llama2.kv_bytes_per_slot(2) == 2 * 32 * 32 * 128 * 2 == 2**19  # 0.5 MB per token, MHA
    assert llama3.kv_bytes_per_slot(2) == 2 * 32 * 8 * 128 * 2 == 2**17  # GQA: 8 KV heads
    from baselines.vanilla import VanillaDecoder

    spec = SimpleNamespace(dtype="float16", compile=True, method=VanillaDecoder(), reference=VanillaDecoder(),
                           ckpt=SimpleNamespace(config=hf_config("meta-llama/Llama-3.1-8B-Instruct")))
    plan = JobPlan(cache_slots=100_000)
    memory(plan, spec, 99_000)
    assert abs(plan.kv_gb * 1e9 / (cache_slots(100_000) * 2**17) - 1) < 0.1
    assert abs(plan.weights_gb * 1e9 / (8.03e9 * 2) - 1) < 0.1


def test_memory_holds_a_fafo_compressions_state_per_request():
    """FAFO-Quest's page bounds and per-head bookkeeping at Llama-2-7B's widths after 32K positions (2.7 GB),
    SnapKV's picks: the method's per-request bytes; StreamingLLM's one row of bookkeeping: none."""
    from baselines.vanilla import VanillaDecoder
    from fafo.compress.quest import Quest
    from fafo.compress.snapkv import SnapKV
    from fafo.compress.stream import StreamingLLM

    config = hf_config("meta-llama/Llama-2-7b-chat-hf")
    args, slots = ModelArgs.from_hf(config), cache_slots(32_768)
    for compress, low, high in ((Quest(), 2.6, 2.8), (SnapKV(), 0.5, 0.6), (StreamingLLM(), 0, 0)):
        plans = []
        for rows in (1, 4):
            spec = SimpleNamespace(dtype="float16", compile=True, method=FAFODecoder(compress=compress),
                                   reference=VanillaDecoder(), ckpt=SimpleNamespace(config=config))
            plans.append(JobPlan(cache_slots=32_768, batch_size=rows))
            memory(plans[-1], spec, 30_000)
        one, four = plans
        assert one.method_gb * GB == pytest.approx(compress.state_bytes(args, slots)) and low <= one.method_gb <= high
        assert four.method_gb == pytest.approx(4 * one.method_gb)  # one state per request of a batch


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_gqa", "llama_bias"])  # biases, tied embeddings, head_dim
def test_parameter_count_matches_the_built_model(engine, name):
    eng = engine(name)
    assert ModelArgs.from_hf(eng.model.hf_config).n_params() == sum(p.numel() for p in eng.model.parameters())


def _compose(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"bench.output_dir={tmp_path}", "wandb.mode=disabled",
                                           "bench.progress=false", "bench.warmup=0", "bench.bootstrap=0",
                                           *overrides])


def test_the_plan_keeps_each_decoders_own_need_beside_the_shared_caches(tmp_path):
    """The shared cache holds the larger need; the method's and the reference's own (the slots each is charged in
    peak memory) differ by the method's scratch slots."""
    spec = resolve(_compose(tmp_path, "method=fafo_stream", "task.ids=[chat-01,long-01]"), tmp_path / "run")
    method, reference = spec.plan.own_slots
    assert spec.plan.cache_slots == method == reference + spec.method.extra_slots(128) and reference > 0


@pytest.mark.parametrize("method", [["method=vanilla"], ["method=quantspec", "method.group_size=16",
                                                         "method.weight_group=16", "method.gamma=2",
                                                         "bench.reference._target_=baselines.quantspec.Int8KVReference",
                                                         "+bench.reference.group_size=16"]])
def test_memory_estimate_matches_the_measured_cpu_peak(tmp_path, method):
    """CPU peak = weights + the cache the method held + its buffers (QuantSpec: no full-precision cache)."""
    cfg = _compose(tmp_path, "task=builtin", "task.ids=[chat-01,code-01]", "bench.max_new_tokens=8", *method)
    spec = resolve(cfg, tmp_path / "run")
    plan, runner = spec.plan, Runner()
    summary = runner.run(spec, report=False)
    import pandas as pd

    peak = pd.read_csv(tmp_path / "run" / "samples.csv")["peak_mem_mb"].max() * 2**20 / 1e9
    estimate = plan.peak_gb - plan.act_gb  # the CPU count has no activations
    assert abs(estimate / peak - 1) < 0.1, (estimate, peak)
    assert summary["n_dropped"] == 0 and summary["context_limit"] == 8192
    if "quantspec" in method[0]:
        assert plan.kv_gb == 0  # the engine's fp cache is released: neither decoder reads it
        assert runner.engine.static_cache is None


# ------------------------------------------------------------------ LongSpec at a rope-scaled 16k context
def test_longspec_on_a_vicuna_16k_shaped_tiny_model_takes_a_10k_prompt_and_drops_by_length(tmp_path):
    from tests.plan_hub import jsonl

    words = {"short": 150, "mid": 3700, "long": 5600}  # < 1200 tokens, about 10k, past 16384 - 2000
    data = jsonl(tmp_path / "data" / "gov_report.jsonl", [
        {"input": "", "context": text(n, i), "answers": ["x"], "_id": key} for i, (key, n) in enumerate(words.items())])
    tiny = ("{family: llama, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 2, "
            "intermediate_size: 64, max_position_embeddings: 4096, max_sequence_length: 16384, "
            "rope_parameters: {rope_type: linear, factor: 4.0, rope_theta: 10000.0}, vocab_size: 1024}")
    cfg = _compose(tmp_path, "task=longbench_gov_report", f"task.data_path={data}", "task.min_input_tokens=1200",
                   "task.max_kept_tokens=14384", "method=longspec", "method.draft.path=null",
                   "method.draft.random_seed=0", "method.tree_shape=[2,2]", "bench.max_new_tokens=4",
                   f"++model.tiny={tiny}")
    spec = resolve(cfg, tmp_path / "run")
    assert spec.context == 16384 and [s.id for s in spec.samples] == ["mid"]
    summary = Runner().run(spec, report=False)
    assert summary["n_dropped"] == 2 and summary["n_dropped_filter"] == 2 and summary["n_failed"] == 0
    import pandas as pd

    rows = pd.read_csv(tmp_path / "run" / "samples.csv")
    assert list(rows["status"]) == ["ok"] and 9000 < rows["prompt_tokens"][0] <= 14384


def test_memory_at_batch_b_holds_b_cache_rows_and_b_request_states():
    """bench.batch_size B: the shared cache and each decoder's per-request (transient) state B times; the weights
    and what a decoder keeps across requests (e.g. Token Recycling's matrix) once."""
    from fafo.decoding import Buffers

    class Stub:  # a decoder whose declared buffers are known: 1 GB kept, 0.5 GB per generation
        def plan_bytes(self, args, slots, nbytes, compiled):
            return Buffers(kept=10**9, transient=5 * 10**8)

        def forward_tokens(self):
            return (16,)

        def extra_slots(self, max_new):
            return 0

    spec = SimpleNamespace(dtype="float16", compile=True, method=Stub(), reference=Stub(),
                           ckpt=SimpleNamespace(config=hf_config("meta-llama/Llama-2-7b-chat-hf")))
    one, eight = JobPlan(cache_slots=4096), JobPlan(cache_slots=4096, batch_size=8)
    memory(one, spec, 1000)
    memory(eight, spec, 1000)
    assert eight.kv_gb == pytest.approx(8 * one.kv_gb) and eight.weights_gb == one.weights_gb
    assert one.method_gb == pytest.approx(2 * 1.0 + 0.5) and eight.method_gb == pytest.approx(2 * 1.0 + 8 * 0.5)
    assert eight.peak_gb > one.peak_gb + 7 * one.kv_gb


@pytest.mark.slow  # the CLI in a subprocess: the full tier
def test_cli_plan_refuses_a_batch_that_does_not_fit_and_accepts_a_small_one(hub, tmp_path):
    """Llama-2-7B (13.5 GB of weights, 0.5 MB of KV per token): 64 rows of a few hundred slots do not fit a 24 GB
    GPU, 2 rows do."""
    cache, _ = hub
    args = ("model=llama2_7b_chat", "method=prompt_lookup", "task=builtin", "task.ids=[chat-01,code-01]",
            "bench.gpu_mem_gb=24")
    res = cli(*args, "bench.batch_size=64", cache=cache, cwd=tmp_path)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.startswith("FAIL") and "batch 64" in res.stdout
    assert "problem: memory: peak" in res.stdout and "for bench.batch_size=64 rows" in res.stdout
    assert "lower bench.batch_size" in res.stdout
    (tmp_path / "small").mkdir()
    res = cli(*args, "bench.batch_size=2", cache=cache, cwd=tmp_path / "small")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.startswith("ok") and "batch 2" in res.stdout
