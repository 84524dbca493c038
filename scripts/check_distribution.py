"""Losslessness in distribution for sampled decoding: run a method (and vanilla) many times, seeded 0..N-1, and
compare the first K generated tokens with the exact law of vanilla sampling (enumerated from the model over the
support of each step, so keep top_k small) by chi-square goodness of fit and total variation, for the joint and
for each position's marginal. Prints one line per test and writes a CSV.

    python scripts/check_distribution.py --method fafo_stream --model tiny_llama --samples 2000 --tokens 3 \\
        --override sampling.temperature=0.1 sampling.top_k=4 method.n=4 method.k=3 method.pool_from_prompt=true

Sampling: the config's ``sampling`` node, temperature 0.1 and top-k 4 unless overridden. The prompt defaults to
a built-in text followed by the model's own greedy continuation (so n-gram methods find their guesses in it and
actually accept tokens: tau is printed). Offline, CPU by default.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configs = {group: sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml")) for group in ("method", "model")}
    ap.add_argument("--method", default="fafo_stream", choices=configs["method"], metavar="METHOD",
                    help="a conf/method name")
    ap.add_argument("--model", default="tiny_llama", choices=configs["model"], metavar="MODEL",
                    help="a conf/model name")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=3, help="K: the first K tokens are tested")
    ap.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog. The quick brown fox")
    ap.add_argument("--greedy-prefix", type=int, default=40, help="append the model's greedy continuation")
    ap.add_argument("--alpha", type=float, default=0.001)
    ap.add_argument("--override", nargs="*", default=[], help="Hydra overrides, e.g. method.n=4 sampling.top_k=2")
    ap.add_argument("--out", default="results/check_distribution.csv")
    args = ap.parse_args(argv)

    import torch
    from hydra import compose, initialize_config_dir

    from baselines.vanilla import VanillaDecoder
    from fafo.bench.naming import checkpoint
    from fafo.bench.spec import build, method_node
    from fafo.engine.engine import Engine
    from fafo.sampling_check import compare, exact_joint, run_many

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=[f"method={args.method}", f"model={args.model}", "sampling.temperature=0.1",
                                           "sampling.top_k=4", *args.override])
    sampling = build(cfg.sampling, "sampling")
    method = build(method_node(cfg.method), "method")
    method.check_sampling(sampling)
    ckpt = checkpoint(cfg.model)
    method.check_target(ckpt.config, ckpt.tokenizer)
    engine = Engine.load(ckpt.path, ckpt.config, ckpt.tokenizer, device="cpu", dtype=torch.float32,
                         backend=cfg.model.get("attention", "sdpa"))
    if hasattr(method, "setup"):
        method.setup(engine)
    ids = engine.tokenizer(args.prompt).input_ids
    if args.greedy_prefix:
        ids = ids + VanillaDecoder().generate(engine, ids, args.greedy_prefix).tokens
    joint = exact_joint(engine, ids, sampling, args.tokens)
    rows, ok = [], True
    for name, dec in (("vanilla", VanillaDecoder()), (args.method, method)):
        seqs, tau = run_many(dec, engine, ids, sampling, args.tokens, args.samples)
        for r in compare(seqs, joint, args.tokens):
            r.update(method=name, tau=round(tau, 4), samples=args.samples, reject=r["pvalue"] <= args.alpha)
            ok &= not r["reject"]
            rows.append(r)
            print(f"{name:>16} tau={tau:.3f} {r['test']:>12}  chi2={r['chi2']:9.2f}  p={r['pvalue']:.4g}  "
                  f"TV={r['tv']:.4f}  {'REJECT' if r['reject'] else 'ok'}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["method", "test", "samples", "tau", "chi2", "pvalue", "tv", "reject"])
        w.writeheader()
        w.writerows(rows)
    print(f"{'all consistent with vanilla sampling' if ok else 'REJECTED'} at alpha={args.alpha}; wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
