"""The metrics mean what docs/metrics.md ("Metric definitions") defines: recomputable from samples.csv alone,
tau by the paper's definition, tau_all charging self-drafts, token-normalised speedups, no state leaking between
generations, fp32-classified mismatches."""

import json
import shutil
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from baselines.lookahead import LookaheadDecoder
from baselines.longspec import LongSpecDecoder
from baselines.prompt_lookup import PromptLookupDecoder
from baselines.quantspec import QuantSpecDecoder
from baselines.sam_decoding import SAMDecoder
from baselines.suffix_decoding import SuffixDecoder
from baselines.swift import SwiftDecoder
from baselines.token_recycling import TokenRecyclingDecoder
from baselines.triforce import TriForceDecoder
from baselines.vanilla import VanillaDecoder, _VanillaState
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.compress.stream import StreamingLLM
from fafo.decoding import Step, decode
from fafo.fafo import FAFODecoder
from fafo.sampling import GREEDY
from tests.lossless import PROMPTS
from tests.helpers import make_cfg, read_rows

REPO = Path(__file__).resolve().parents[1]


def recompute(rows: list[dict]) -> dict:
    """The summary's definitions, by hand: counts of each (sample, turn)'s first repeat, median times."""
    turns = defaultdict(list)
    for r in rows:
        if r["status"] == "ok":
            turns[r["sample_id"], r["turn"]].append(r)
    per = []
    for (sid, _), reps in turns.items():
        first = reps[0]
        per.append({"sid": sid, **{k: int(first[k]) for k in ("new_tokens", "forwards", "target_forwards",
                                                              "ref_new_tokens")},
                    **{k: statistics.median(float(r[k]) for r in reps)
                       for k in ("total_s", "decode_s", "ref_total_s", "ref_decode_s")}})
    s = {k: sum(p[k] for p in per) for k in per[0] if k != "sid"}
    n = len(per)
    by_sample = defaultdict(lambda: defaultdict(float))
    for p in per:
        for k in ("new_tokens", "total_s", "ref_new_tokens", "ref_total_s"):
            by_sample[p["sid"]][k] += p[k]
    mean_rate = statistics.mean(b["new_tokens"] / b["total_s"] for b in by_sample.values())
    mean_ref_rate = statistics.mean(b["ref_new_tokens"] / b["ref_total_s"] for b in by_sample.values())
    return {
        "tau": (s["new_tokens"] - n) / s["forwards"],
        "tau_with_prefill": s["new_tokens"] / (s["forwards"] + n),
        "tau_all": s["new_tokens"] / s["target_forwards"],
        "speedup_e2e": (s["new_tokens"] / s["total_s"]) / (s["ref_new_tokens"] / s["ref_total_s"]),
        "speedup_decode": ((s["new_tokens"] - n) / s["decode_s"]) / ((s["ref_new_tokens"] - n) / s["ref_decode_s"]),
        "speedup_specbench": mean_rate / mean_ref_rate,
    }


KEYS = ("tau", "tau_with_prefill", "tau_all", "speedup_e2e", "speedup_decode", "speedup_specbench")


def test_summary_is_recomputed_from_samples_csv_alone(tmp_path):
    run_dir = tmp_path / "run"
    cfg = make_cfg(tmp_path, "method=fafo_2forward", "method.n=4", "method.k=3", "bench.repeats=2",
                   "bench.max_new_tokens=10", "task.ids=[chat-01,multi-01,code-01]", "bench.speedup_kind=decode")
    summary = Runner().run(resolve(cfg, run_dir))
    rows = read_rows(run_dir)
    want = recompute(rows)
    for key in KEYS:
        assert summary[key] == pytest.approx(want[key], rel=1e-9), key
        lo, hi = summary[f"{key}_range"]  # 3 samples: the per-sample range (no "95 %" interval below 10)
        assert lo <= hi and (lo <= summary[key] <= hi or key.startswith("speedup_specbench"))
        assert f"{key}_ci95" not in summary
    assert summary["speedup"] == summary["speedup_decode"] and summary["speedup_kind"] == "decode"
    assert summary["tau_all"] < summary["tau_with_prefill"] <= summary["tau"]  # fumble passes and prefill charged
    assert summary["draft_forwards"] == summary["verify_forwards"] > 0  # one fumble pass per step
    assert summary["target_forwards"] == sum(summary[k] for k in ("prefill_forwards", "verify_forwards",
                                                                  "draft_forwards", "aux_forwards"))
    assert summary["n_turns"] == 4 and summary["n_failed"] == 0 and summary["mem_overhead_mb"] >= 0


def tiny_with_frequent_eos(checkpoint, tmp_path, name: str = "llama_mha_rep") -> Path:
    """A copy of a repetitive tiny model whose EOS is the token its greedy text repeats most: sampled
    generations (T = 0.8, top-k 3: its top tokens are few) then stop at different lengths."""
    src = checkpoint(name)
    dst = tmp_path / "frequent_eos"
    shutil.copytree(src, dst)
    from fafo.engine.engine import Engine

    eng = Engine.from_pretrained(str(dst))
    ids = eng.tokenizer(PROMPTS[0]).input_ids
    tokens = VanillaDecoder().generate(eng, ids, 40).tokens
    eos = Counter(tokens).most_common(1)[0][0]
    (dst / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return dst


@pytest.mark.slow
def test_sampled_run_compares_throughputs_of_different_lengths(checkpoint, tmp_path):
    model = tiny_with_frequent_eos(checkpoint, tmp_path)
    out = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "fafo.bench", f"model.path={model}", "method=prompt_lookup", "sampling=random",
         "sampling.temperature=0.8", "sampling.top_k=3", "bench.max_new_tokens=40", "bench.max_samples=6", "bench.warmup=0",
         f"bench.output_dir={out}", "wandb.mode=disabled", "bench.progress=false"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (summary_path,) = out.glob("**/summary.json")
    summary, rows = json.loads(summary_path.read_text()), read_rows(summary_path.parent)
    assert any(r["new_tokens"] != r["ref_new_tokens"] for r in rows)  # the lengths really differ
    want = recompute(rows)
    assert summary["speedup"] == summary["speedup_e2e"] == pytest.approx(want["speedup_e2e"], rel=1e-9)
    summed_times = sum(float(r["ref_total_s"]) for r in rows) / sum(float(r["total_s"]) for r in rows)
    assert summary["speedup_e2e"] != pytest.approx(summed_times, rel=1e-6)  # the old, length-blind ratio
    assert all(r["exact_match"] == "" and r["mismatch_kind"] == "" for r in rows)  # sampling: no exactness
    # ... so none is claimed: no mismatch counts of 0, and the printed summary says why the rate is absent
    assert summary["exact_match_rate"] is None
    assert all(summary[f"n_mismatch_{kind}"] is None for kind in ("tie", "divergence", "unchecked"))
    printed = {line.split()[0]: line.split(None, 1)[1] for line in proc.stdout.splitlines() if line.strip()
               and line.startswith(("exact_match_rate", "n_mismatch"))}
    assert printed == {"exact_match_rate": "n/a (sampled at T=0.8: lossless in distribution, not token by token; "
                                           "scripts/check_distribution.py tests it)"}


# ------------------------------------------------------------------ the forward ledger, method by method
def _small(name):
    return {
        "fafo": lambda: FAFODecoder(compress=StreamingLLM(sink=2, local=6), n=6, k=3),
        "fafo-2forward": lambda: FAFODecoder(compress=StreamingLLM(sink=2, local=6), n=6, k=3, fused=False),
        "lookahead": lambda: LookaheadDecoder(level=3, window=4, guess_set=3),
        "swift": lambda: SwiftDecoder(),
        "quantspec": lambda: QuantSpecDecoder(group_size=16, gamma=4, weight_group=32, chunk_size=32),
        "triforce": lambda: TriForceDecoder(draft=None, budget=16, chunk_size=4, gamma2=4),
        "prompt-lookup": lambda: PromptLookupDecoder(),
        "token-recycling": lambda: TokenRecyclingDecoder(),
        "suffix-decoding": lambda: SuffixDecoder(),
        "sam-decoding": lambda: SAMDecoder(n_predicts=8),
        "longspec": lambda: LongSpecDecoder(draft={"path": None, "random_seed": 0}, tree_shape=[4, 8, 8]),
    }[name]()


def test_fafo_2forward_pays_for_its_fumble_pass_in_tau_all(engine):
    eng = engine("llama_mha_rep")
    ids = eng.tokenizer(PROMPTS[2]).input_ids
    fused, split = (_small(m).generate(eng, ids, 40) for m in ("fafo", "fafo-2forward"))
    assert fused.tokens == split.tokens and fused.tau == split.tau > 1  # same streams, pool and candidates
    assert split.tau_all < fused.tau_all and split.forwards.draft == split.n_forwards and fused.forwards.draft == 0


@pytest.mark.parametrize("name", ["swift", "quantspec", "triforce"])
def test_self_drafting_methods_report_their_drafts_in_tau_all(name, engine):
    eng = engine("llama_mha_rep")
    ids = eng.tokenizer(PROMPTS[0] * 3).input_ids
    method = _small(name)
    method.setup(eng)
    gen = method.generate(eng, ids, 40)
    f = gen.forwards
    assert f.draft > 0 and f.prefill == 1 and f.verify == gen.n_forwards == len(gen.accept_lengths)
    assert gen.tau_all == len(gen.tokens) / f.total < gen.tau
    assert gen.drafted > 0 and 0 <= gen.accepted <= gen.drafted


@pytest.mark.parametrize("name", ["fafo", "lookahead", "prompt-lookup", "token-recycling", "suffix-decoding",
                                  "sam-decoding", "longspec", "swift", "quantspec", "triforce"])
def test_every_drafting_method_reports_an_acceptance_rate(name, engine):
    eng = engine("llama_mha_rep")
    ids = eng.tokenizer(PROMPTS[2] * 2).input_ids
    method = _small(name)
    method.setup(eng)
    gen = method.generate(eng, ids, 40)
    assert gen.drafted is not None and gen.drafted > 0 and 0 <= gen.accepted <= gen.drafted
    assert sum(gen.accept_lengths) == len(gen.tokens) - 1 and gen.forwards.verify == len(gen.accept_lengths)
    assert VanillaDecoder().generate(eng, ids, 40).drafted is None  # vanilla drafts nothing


def test_decode_loop_counts_engine_forwards_by_kind(engine):
    eng = engine("llama_gqa")
    ids = eng.tokenizer(PROMPTS[1]).input_ids
    gen = VanillaDecoder().generate(eng, ids, 9)
    assert (gen.forwards.prefill, gen.forwards.verify, gen.forwards.draft, gen.forwards.aux) == (1, 8, 0, 0)
    assert gen.forwards.tokens == len(ids) + 8 and gen.tau == gen.tau_with_prefill == gen.tau_all == 1.0

    class TwoAtOnce(_VanillaState):  # commits two tokens per step: the loop cuts at max_new_tokens
        def step(self, remaining):
            return Step(super().step(remaining).tokens * 2)

    cut = decode(eng, TwoAtOnce(eng, ids, 5, GREEDY, None), 5)
    assert len(cut.tokens) == 5 and cut.accept_lengths == [2, 2] and cut.forwards.verify == 2


# ------------------------------------------------------------------ no cross-request state leaks
@pytest.mark.parametrize("method", ["suffix_decoding", "token_recycling"])
def test_every_timing_repeat_starts_from_the_same_state(method, checkpoint, tmp_path):
    common = [f"method={method}", f"model.path={checkpoint('llama_mha_rep')}", "bench.max_new_tokens=24",
              "task.ids=[chat-01,code-01,multi-01]", "bench.max_spread=1000"]
    Runner().run(resolve(make_cfg(tmp_path, *common, "bench.repeats=3", "bench.warmup=1"), tmp_path / "r3"))
    Runner().run(resolve(make_cfg(tmp_path, *common, "bench.repeats=1", "bench.warmup=0"), tmp_path / "r1"))
    rows = read_rows(tmp_path / "r3")
    counts = ("new_tokens", "forwards", "tau", "drafted", "accepted", "mean_accept")
    by_turn = defaultdict(list)
    for r in rows:
        by_turn[r["sample_id"], r["turn"]].append(tuple(r[k] for k in counts))
    assert len(by_turn) == 4 and all(len(v) == 3 and len(set(v)) == 1 for v in by_turn.values())
    # and the warm-up left nothing behind: the same as a run without warm-up or repeats
    single = {(r["sample_id"], r["turn"]): tuple(r[k] for k in counts) for r in read_rows(tmp_path / "r1")}
    assert {k: v[0] for k, v in by_turn.items()} == single
    # a repetitive model: drafts are accepted, so a leaked earlier repeat would have changed the counts
    assert all(int(r["accepted"]) > 0 for r in rows)


# ------------------------------------------------------------------ mismatches in half precision
@dataclass
class RunnerUp(VanillaDecoder):
    """Vanilla that, at the step whose two best tokens are closest, commits the runner-up (what rounding can do
    to a lossless method: a near-tie) or, with ``worst``, the least likely token there (a broken verifier)."""

    worst: bool = False

    def generate(self, engine, prompt_ids, max_new_tokens, eos_ids=(), sampling=None, generator=None, clock=None):
        ref = VanillaDecoder().generate(engine, prompt_ids, max_new_tokens, eos_ids, sampling, generator, clock)
        ids = list(prompt_ids) + ref.tokens
        logits = engine.prefill(engine.cache(len(ids) + 1), ids, logits="all")[0].float()  # [T, V]
        rows = logits[len(prompt_ids) - 1 : len(ids) - 1]  # the rows that chose each new token
        top2 = rows.topk(2).values
        at = int((top2[:, 0] - top2[:, 1]).argmin())
        ref.tokens = ref.tokens[:at] + [int(rows[at].argmin() if self.worst else rows[at].topk(2).indices[1])]
        return ref


@pytest.mark.parametrize("worst,kind", [(False, "tie"), (True, "divergence")])
def test_bf16_mismatches_are_classified_in_fp32(worst, kind, tmp_path):
    margin = 0.25
    cfg = make_cfg(tmp_path, "bench.dtype=bfloat16", "bench.max_new_tokens=16", "task.ids=[chat-01,code-01]",
                   "bench.warmup=0", f"bench.tie_margin={margin}")
    OmegaConf.update(cfg, "method._target_", "tests.test_metrics_definitions.RunnerUp")
    OmegaConf.update(cfg, "method.worst", worst, force_add=True)
    summary = Runner().run(resolve(cfg, tmp_path / "run"))
    rows = read_rows(tmp_path / "run")
    assert all(int(r["first_mismatch"]) >= 0 and r["mismatch_kind"] == kind for r in rows), rows
    gaps = [float(r["mismatch_gap"]) for r in rows]
    assert all(g <= margin for g in gaps) if kind == "tie" else all(g > margin for g in gaps)
    assert summary[f"n_mismatch_{kind}"] == 2 and summary["exact_match_rate"] == 0.0
    assert summary["tie_margin"] == margin and summary["mismatch_check"].startswith("float32 copy")


def test_the_tie_check_never_holds_a_copy_on_the_device_and_cannot_fail_a_row(tmp_path, monkeypatch):
    """The float32 copy is loaded on the CPU (bench.tie_check=cpu) or loaded and freed around each check
    (device); a check that cannot run leaves the row ok, its mismatch ``unchecked`` and the reason in the summary."""
    from fafo.bench.mismatch import MismatchJudge
    from fafo.engine.engine import Engine

    def run(name, *extra):
        cfg = make_cfg(tmp_path, "bench.dtype=bfloat16", "bench.max_new_tokens=12", "task.ids=[chat-01,code-01]",
                       "bench.warmup=0", *extra)
        OmegaConf.update(cfg, "method._target_", "tests.test_metrics_definitions.RunnerUp")
        return Runner().run(resolve(cfg, tmp_path / name), report=False), read_rows(tmp_path / name)

    loads = []
    real_load = Engine.load.__func__

    def counting_load(cls, *args, **kwargs):
        loads.append(str(kwargs.get("device")))
        return real_load(cls, *args, **kwargs)

    monkeypatch.setattr(Engine, "load", classmethod(counting_load))
    summary, _ = run("cpu")
    assert loads[1:] == ["cpu"] and "on the CPU" in summary["mismatch_check"]  # one copy for the run, on the CPU
    loads.clear()
    summary, _ = run("device", "bench.tie_check=device")
    assert loads[1:] == ["cpu", "cpu"] and "loaded and freed around each check" in summary["mismatch_check"]
    monkeypatch.setattr(MismatchJudge, "_load", lambda self, device: (_ for _ in ()).throw(MemoryError("no room")))
    summary, rows = run("unchecked")
    assert all(r["status"] == "ok" and r["mismatch_kind"] == "unchecked" and float(r["total_s"]) > 0 for r in rows)
    assert summary["n_mismatch_unchecked"] == 2 and summary["n_failed"] == 0
    assert summary["mismatch_check"].startswith("float32 tie check not run: MemoryError: no room")
