"""TriForce's retrieval cache rebuilt at a fixed interval of generated tokens (paper Sec. 4.3, App. B.2), still
token-identical to vanilla; ``retrieval_covers_prompt`` (the budget held the whole prompt) per generation and its
count in the run summary, through the CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from baselines.triforce import TriForceDecoder, TriForceState
from baselines.triforce_cache import RetrievalCache
from baselines.vanilla import VanillaDecoder
from fafo.sampling_check import compare, run_many
from tests.compiled_cases import compiled_engine
from tests.helpers import DRAFT_SPEC
from tests.lossless import LONG_PROMPTS as LONG, assert_lossless
from tests.methods import TRIFORCE_SAMPLING as TRIFORCE, TRIFORCE_SMALL as SMALL
from tests.sampling_law import ALPHA, SAMPLES, SAMPLING, K

REPO = Path(__file__).resolve().parents[1]


def expected_rebuild_points(accept_lengths: list[int], interval: int) -> list[int]:
    """Generated tokens with full-cache KV at each rebuild: a commit follows every step but the last, and step i
    gives KV to ``accept_lengths[i]`` tokens (the previous bonus and the accepted guesses); a rebuild follows the
    first commit that reaches each multiple of ``interval`` (one rebuild when a commit passes several)."""
    points, g, mark = [], 0, 0
    for n in accept_lengths[:-1]:
        g += n
        if g // interval > mark:
            points.append(g)
            mark = g // interval
    return points


@pytest.fixture
def builds(monkeypatch):
    """Records, for every RetrievalCache.build, how many generated tokens had full-cache KV (0: the prefill's)."""
    seen: list[tuple[int, int]] = []  # (aligned, n_committed)
    original = RetrievalCache.build

    def spy(self, full, aligned, queries, n_committed):
        seen.append((aligned, n_committed))
        return original(self, full, aligned, queries, n_committed)

    monkeypatch.setattr(RetrievalCache, "build", spy)
    return seen


@pytest.mark.parametrize("name,interval,draft", [("qwen2_gqa_rep", 3, True), ("llama_mha_rep", 5, False),
                                                 ("llama_gqa", 4, True), ("qwen2_gqa_rep", None, True)])
def test_rebuilds_happen_at_the_interval(name, interval, draft, engine, builds, ckpt_root):
    from fafo.engine.tiny import tiny_checkpoint

    eng = engine(name)
    path = str(tiny_checkpoint(DRAFT_SPEC, cache_dir=ckpt_root)) if draft else None
    method = TriForceDecoder(**SMALL, gamma2=4, rebuild_interval=interval, draft={"path": path} if draft else None)
    ids = eng.tokenizer(LONG[1]).input_ids
    gen = method.generate(eng, ids, 48)
    assert gen.tokens == VanillaDecoder().generate(eng, ids, 48).tokens
    want = expected_rebuild_points(gen.accept_lengths, interval) if interval else []
    assert [n - len(ids) for _, n in builds] == [0, *want]  # the prefill's build, then one per interval
    assert gen.extras["rebuilds"] == len(want)
    if interval:
        assert len(want) >= 48 // (interval + max(gen.accept_lengths)) > 0  # the interval was met many times


def test_default_interval_is_the_official_generation_length_and_official_preset_never_rebuilds():
    from tests.helpers import compose_with

    assert TriForceDecoder.__dataclass_fields__["rebuild_interval"].default == 256
    base, official = (compose_with(f"method={name}").method for name in ("triforce", "triforce_official"))
    assert base.rebuild_interval == 256 and official.rebuild_interval is None


@pytest.mark.parametrize("name,kw,draft", [
    ("llama_gqa", dict(SMALL, gamma1=2, rebuild_interval=1), True),  # a rebuild after every verification
    ("qwen2_gqa", dict(SMALL, gamma1=1, rebuild_interval=5, gqa_reduce="max"), True),
    ("llama_mha_rep", dict(SMALL, gamma2=4, rebuild_interval=3), False),
])
def test_rebuilds_stay_token_identical_to_vanilla(name, kw, draft, engine, ckpt_root):
    from fafo.engine.tiny import tiny_checkpoint

    path = str(tiny_checkpoint(DRAFT_SPEC, cache_dir=ckpt_root)) if draft else None
    method = TriForceDecoder(**kw, draft={"path": path} if draft else None)
    assert_lossless(method, engine(name), prompts=LONG[:2])


@pytest.mark.parametrize("n_tokens,covers", [
    (5, True),    # 1 whole chunk: the middle level reads the full cache
    (16, True),   # 4 chunks = the budget: every chunk retrieved
    (19, True),   # 4 chunks + a 3-token tail (the tail is "recent"): still the whole prompt
    (20, False),  # 5 chunks > the budget: a real retrieval
    (90, False),
])
def test_retrieval_covers_prompt_flag(n_tokens, covers, engine):
    eng = engine("llama_mha")
    ids = (eng.tokenizer(LONG[2]).input_ids * 2)[:n_tokens]
    method = TriForceDecoder(**SMALL, draft=None)  # budget 16, chunk 4
    gen = method.generate(eng, ids, 6)
    assert gen.extras["retrieval_covers_prompt"] is covers
    state = TriForceState(method, eng, ids, 6)
    assert (state.retrieval is None or state.retrieval.budget == state.aligned) is covers


@pytest.mark.slow  # the CLI in a subprocess: the full tier
def test_cli_counts_prompts_the_budget_covered_and_rebuilds(tmp_path):
    """`python -m fafo.bench method=triforce`: exact, rebuilds at the interval, summary.json counts the prompts the
    budget held whole (the builtin chat prompts are 53-71 tokens: a 64-slot budget splits them)."""
    out = tmp_path / "runs"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO),
           "FAFO_CACHE": str(tmp_path / "cache")}
    args = ["-m", "fafo.bench", "method=triforce", "method.budget=64", "method.chunk_size=4",
            "method.rebuild_interval=4", "method.draft.path=null",
            "method.draft.tiny={family: llama, hidden_size: 32, num_hidden_layers: 1}",
            "bench.max_samples=4", "bench.max_new_tokens=16", f"bench.output_dir={out}", "wandb.mode=disabled",
            "bench.progress=false"]
    proc = subprocess.run([sys.executable, *args], check=False, capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = next(out.glob("**/summary.json")).parent
    summary = json.loads((run / "summary.json").read_text())
    outputs = [json.loads(line) for line in (run / "outputs.jsonl").read_text().splitlines()]
    assert summary["exact_match_rate"] == 1.0 and len(outputs) == 4
    covered = [o["prompt_tokens"] // 4 * 4 <= 64 for o in outputs]
    assert [o["extras"]["retrieval_covers_prompt"] for o in outputs] == covered
    assert summary["flag_counts"]["retrieval_covers_prompt"] == sum(covered)
    assert 0 < sum(covered) < len(outputs)  # both kinds of prompt occurred
    for o in outputs:
        assert o["extras"]["rebuilds"] == len(expected_rebuild_points(o["accept_lengths"], 4)) > 0


def test_sampled_with_rebuilds_matches_the_vanilla_law(law):  # noqa: F811 (the imported fixture)
    """Sampling (T > 0) with a rebuild after every verification: the first K tokens' joint law is the target's."""
    eng, ids, joint = law("rep2")
    method = TriForceDecoder(**TRIFORCE, draft=None, rebuild_interval=1)
    seqs, tau = run_many(method, eng, ids, SAMPLING, K, SAMPLES)
    assert tau > 1.1 and min(r["pvalue"] for r in compare(seqs, joint, K)) > ALPHA
    gen = method.generate(eng, ids, 12, sampling=SAMPLING, generator=SAMPLING.generator(0))
    assert gen.extras["rebuilds"] == len(gen.accept_lengths) - 1  # one per commit


def test_compiled_rebuilds_do_not_recompile(engine, checkpoint, fresh_dynamo):  # noqa: F811
    """A warm-up too short to rebuild compiles every graph a later, rebuilding generation needs (the verification
    captures its queries every round when rebuilds are on), and the tokens stay vanilla's."""
    from fafo.engine.compiled import CompileOptions, compile_stats

    compiled = compiled_engine(checkpoint, "llama_mha_rep", CompileOptions(backend="aot_eager", attention="flex"))
    method = TriForceDecoder(draft=None, budget=16, chunk_size=4, gamma2=4, rebuild_interval=12)
    ids = compiled.tokenizer(LONG[0]).input_ids
    assert method.generate(compiled, ids, 8).extras["rebuilds"] == 0  # the warm-up
    warm = compile_stats()["graphs"]
    gen = method.generate(compiled, ids, 40)
    assert gen.extras["rebuilds"] >= 2 and compile_stats()["graphs"] == warm
    assert gen.tokens == VanillaDecoder().generate(engine("llama_mha_rep"), ids, 40).tokens
