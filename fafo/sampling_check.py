"""Distribution checks for sampled decoding (used by tests/test_sampling.py and scripts/check_distribution.py).

The exact joint law of the first K sampled tokens is enumerated from the target model (vanilla sampling's law:
a tree of prefills over the support of each step's distribution, so keep top_k small), and a method's empirical
counts over many seeds are compared with it by a chi-square goodness-of-fit test (cells with expected count < 5
pooled) and the total-variation distance, for the joint and for each position's marginal.
"""

from __future__ import annotations

from collections import Counter

import torch

from fafo.engine.engine import Engine
from fafo.sampling import Sampling


def exact_joint(engine: Engine, prompt_ids: list[int], sampling: Sampling, k: int) -> dict[tuple, float]:
    """P(first k generated tokens = x) for every x with positive probability (vanilla sampling's law)."""
    out: dict[tuple, float] = {(): 1.0}
    for _ in range(k):
        nxt = {}
        for prefix, pr in out.items():
            ids = list(prompt_ids) + list(prefix)
            logits = engine.prefill(engine.cache(len(ids)), ids)[0, -1]
            p = sampling.probs(logits, ids)
            for t in torch.nonzero(p).flatten().tolist():
                nxt[prefix + (t,)] = pr * float(p[t])
        out = nxt
    return out


def marginal(joint: dict[tuple, float], pos: int) -> dict:
    m: Counter = Counter()
    for x, pr in joint.items():
        m[x[pos]] += pr
    return dict(m)


def chi_square(counts: Counter, probs: dict, min_expected: float = 5.0) -> tuple[float, float, float]:
    """(p-value, chi-square statistic, total variation) of ``counts`` against ``probs``; cells with expected
    count below ``min_expected`` (and outcomes outside the support, which make the p-value 0) are pooled."""
    from scipy.stats import chisquare

    n = sum(counts.values())
    outside = sum(c for x, c in counts.items() if x not in probs)
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for x, pr in sorted(probs.items(), key=lambda kv: -kv[1]):
        if pr * n >= min_expected:
            obs.append(counts.get(x, 0))
            exp.append(pr * n)
        else:
            pool_o += counts.get(x, 0)
            pool_e += pr * n
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    tv = 0.5 * (sum(abs(counts.get(x, 0) / n - pr) for x, pr in probs.items()) + outside / n)
    if outside:
        return 0.0, float("inf"), tv
    if len(obs) < 2:
        return 1.0, 0.0, tv
    total = sum(exp)
    exp = [e * n / total for e in exp]  # renormalise rounding
    stat, pvalue = chisquare(obs, exp)
    return float(pvalue), float(stat), tv


def run_many(decoder, engine: Engine, prompt_ids: list[int], sampling: Sampling, k: int, samples: int,
             eos_ids=(), batch_size: int = 1) -> tuple[list[tuple], float]:
    """The first k tokens of ``samples`` generations seeded 0..samples-1, and the step-weighted tau;
    ``batch_size`` > 1: decoded that many at a time (:func:`fafo.batch.decode_batch`, continuous batching)."""
    if batch_size > 1:
        from fafo.batch import Request, decode_batch

        requests = [Request(list(prompt_ids), k, tuple(eos_ids), sampling.generator(i)) for i in range(samples)]
        gens = decode_batch(decoder, engine, requests, batch_size, "continuous", sampling).generations
    else:
        gens = (decoder.generate(engine, prompt_ids, k, eos_ids, sampling, sampling.generator(i))
                for i in range(samples))
    seqs, new, forwards = [], 0, 0
    for g in gens:
        seqs.append(tuple(g.tokens[:k]))
        new += len(g.tokens)
        forwards += g.n_forwards + 1
    return seqs, new / forwards


def compare(seqs: list[tuple], joint: dict[tuple, float], k: int) -> list[dict]:
    """One row per test: 'joint' and each position's marginal, with p-value, chi-square and TV."""
    rows = []
    pv, stat, tv = chi_square(Counter(seqs), joint)
    rows.append({"test": f"joint[0:{k}]", "pvalue": pv, "chi2": stat, "tv": tv})
    for pos in range(k):
        pv, stat, tv = chi_square(Counter(s[pos] for s in seqs), marginal(joint, pos))
        rows.append({"test": f"token[{pos}]", "pvalue": pv, "chi2": stat, "tv": tv})
    return rows
