"""Sampling (temperature > 0): every method with a sampling case in the method matrix (tests/methods.py) is lossless
in distribution.

The statistical tests draw many seeded generations of the first 3 tokens and compare them with the exact law of
vanilla sampling (enumerated from the model) by chi-square at significance 0.001; the seeds are fixed, so the
tests are deterministic. The setting is chosen so the test has power: a repetitive tiny model whose own greedy
output is the prompt (so prompt n-grams are accepted: tau > 1), temperature 0.1 and top-k 4 (few categories, a
top token near 0.6); a deliberately biased verifier (accept any candidate in the target's top 2) must FAIL.
"""

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baselines.vanilla import VanillaDecoder
from fafo.errors import ConfigError
from fafo.sampling import Sampling, residual
from fafo.sampling_check import compare, run_many
from tests.methods import sampling_cases
from tests.sampling_law import BIASED, K, SAMPLES, SAMPLING, passes

METHODS = sampling_cases()  # tests/methods.py: {method: (model, decoder factory)}; TriForce drafts with the target


def test_vanilla_matches_exact_law(law):
    eng, ids, joint = law("rep2")
    seqs, tau = run_many(VanillaDecoder(), eng, ids, SAMPLING, K, SAMPLES)
    assert tau == 1.0 and passes(compare(seqs, joint, K))


def _make(name, eng):
    method = METHODS[name][1]()
    method.setup(eng)
    return method


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_matches_vanilla_law(name, law):
    eng, ids, joint = law(METHODS[name][0])
    seqs, tau = run_many(_make(name, eng), eng, ids, SAMPLING, K, SAMPLES)
    assert tau > 1.1, f"{name}: too few accepted guesses (tau {tau:.3f}) for the test to mean anything"
    rows = compare(seqs, joint, K)
    assert passes(rows), rows


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(METHODS))
def test_biased_verifier_fails(name, law, monkeypatch):
    """Negative control: the same test, the same seeds, with a verifier biased towards the top 2 tokens."""
    eng, ids, joint = law(METHODS[name][0])
    for attr, fn in BIASED.items():
        monkeypatch.setattr(Sampling, attr, staticmethod(fn))
    seqs, tau = run_many(_make(name, eng), eng, ids, SAMPLING, K, SAMPLES)
    assert tau > 1.1
    assert not passes(compare(seqs, joint, K))


@pytest.mark.parametrize("name", ["vanilla", *sorted(METHODS)])
@pytest.mark.parametrize("sampling", [Sampling(temperature=1e-4, seed=5), Sampling(temperature=1.0, top_k=1, seed=5)])
def test_limits_equal_greedy(name, sampling, law):
    eng, ids, _ = law(METHODS.get(name, ("rep2",))[0])
    ref = VanillaDecoder().generate(eng, ids, 30).tokens
    method = _make(name, eng) if name in METHODS else VanillaDecoder()
    assert method.generate(eng, ids, 30, (), sampling, sampling.generator(0)).tokens == ref


P_TARGET = torch.tensor([0.5, 0.3, 0.15, 0.05])
Q_PROPOSAL = torch.tensor([0.1, 0.6, 0.1, 0.2])


def empirical_law(draw, seed: int, n: int = 20000) -> torch.Tensor:
    """Frequencies of the tokens ``draw(generator)`` emits over n seeded draws, for a 4-token vocabulary."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(4)
    for _ in range(n):
        counts[draw(g)] += 1
    return counts / n


def test_accept_deterministic_is_exact():
    def draw(g):
        t, ok = Sampling.accept_deterministic(P_TARGET, [1, 1, 3, 0], g)
        assert ok == (t in (1, 3, 0))
        return t

    assert (empirical_law(draw, seed=0) - P_TARGET).abs().max() < 0.015


def test_speculative_accept_is_exact():
    p, q = P_TARGET, Q_PROPOSAL

    def draw(g):
        return Sampling.speculative_accept(p, q, int(torch.multinomial(q, 1, generator=g)), g)[0]

    assert (empirical_law(draw, seed=0) - p).abs().max() < 0.015
    assert torch.allclose(residual(p, q), torch.tensor([0.4, 0.0, 0.05, 0.0]) / 0.45)


def test_min_p_and_repetition_penalty_match_hf():
    from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(1, 50) * 3
    hist = torch.tensor([[3, 7, 7, 20]])
    s = Sampling(temperature=0.7, min_p=0.1, repetition_penalty=1.3)
    x = RepetitionPenaltyLogitsProcessor(1.3)(hist, logits.clone())
    x = MinPLogitsWarper(0.1)(hist, TemperatureLogitsWarper(0.7)(hist, x))
    assert torch.allclose(s.probs(logits, hist[0].tolist()), torch.softmax(x, -1), atol=1e-6)


def test_greedy_names_the_sampling_settings_it_leaves_unused():
    assert Sampling().ignored() is None and Sampling(temperature=0.6, top_p=0.9, top_k=20).ignored() is None
    assert Sampling(from_generation_config=True, top_p=0.5).ignored() is None  # resolved from the checkpoint later
    text = Sampling(top_p=0.9, min_p=0.05).ignored()
    assert text.startswith("sampling.top_p=0.9, sampling.min_p=0.05 unused: sampling.temperature=0 is greedy")


def test_model_default_reads_generation_config(checkpoint, tmp_path):
    import shutil

    from transformers import GenerationConfig

    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint("llama_mha"), ckpt)
    (ckpt / "generation_config.json").unlink(missing_ok=True)
    placeholder = Sampling(from_generation_config=True, seed=4)
    with pytest.raises(ConfigError, match="generation_config"):
        placeholder.resolve(ckpt)
    config = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    config.save_pretrained(ckpt)
    s = placeholder.resolve(ckpt)
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty, s.seed) == (0.7, 0.8, 20, 1.05, 4)
    assert not s.greedy and not s.from_generation_config
    GenerationConfig(do_sample=False).save_pretrained(ckpt)
    assert placeholder.resolve(ckpt).greedy


def test_accept_siblings_is_exact():
    p, q = P_TARGET, Q_PROPOSAL

    def draw(g):
        siblings = torch.multinomial(q, 2, replacement=False, generator=g).tolist()
        return Sampling.accept_siblings(p, q, siblings, g)[0]

    assert (empirical_law(draw, seed=1) - p).abs().max() < 0.015


def test_runner_resolves_model_default(checkpoint, tmp_path):
    """sampling=model_default: the runner reads the checkpoint's generation_config once the model is known and
    records seeds, tau and speedup (exact_match is blank when sampling)."""
    import csv
    import shutil

    from transformers import GenerationConfig

    from fafo.bench.runner import Runner
    from fafo.bench.spec import resolve
    from tests.helpers import make_cfg

    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint("llama_gqa"), ckpt)
    GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9).save_pretrained(ckpt)
    cfg = make_cfg(tmp_path, "sampling=model_default", f"model.path={ckpt}", "model.tiny=null",
                   "method=fafo_stream", "method.n=4", "method.k=3", "bench.max_new_tokens=6",
                   "bench.max_samples=2")
    spec = resolve(cfg, tmp_path / "run")
    assert (spec.sampling.temperature, spec.sampling.top_p) == (0.6, 0.9)
    summary = Runner().run(spec)
    with open(tmp_path / "run" / "samples.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["exact_match"] == "" and r["seed"] != "" and float(r["tau"]) >= 1 for r in rows)
    assert summary["speedup"] > 0


@pytest.mark.slow
def test_check_distribution_script_through_its_command_line(tmp_path):
    """The documented check (docs/metrics.md, "Sampling") runs from its command line, and a misspelt method is one
    error line before any model loads."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "check_distribution.py"
    out = tmp_path / "law.csv"
    proc = subprocess.run([sys.executable, str(script), "--method", "prompt_lookup", "--samples", "60", "--tokens", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = list(csv.DictReader(out.open()))
    assert [(r["method"], r["test"]) for r in rows] == [
        (m, t) for m in ("vanilla", "prompt_lookup") for t in ("joint[0:2]", "token[0]", "token[1]")]
    assert all(r["samples"] == "60" and 0 <= float(r["pvalue"]) <= 1 for r in rows)
    proc = subprocess.run([sys.executable, str(script), "--method", "fafo_strem"], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        "check_distribution.py: error: argument --method: invalid choice: 'fafo_strem' (choose from 'fafo_2forward',")
