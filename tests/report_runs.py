"""Synthetic run directories for the report and paper-table tests, written as the runner writes them
(samples.csv with the columns of the metrics contract, outputs.jsonl, summary.json, config.yaml), from seeded
random timings."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import yaml
from omegaconf import OmegaConf

from fafo.bench.metrics import summarize
from fafo.bench.records import SAMPLE_COLUMNS, read_rows, row_crc

# samples.csv as written before the forward ledger (fafo/bench/records.py SAMPLE_COLUMNS at that time)
OLD_COLUMNS = [
    "sample_id", "turn", "repeat", "category", "model", "method", "task",
    "prompt_tokens", "new_tokens", "forwards", "tau", "mean_accept",
    "prefill_s", "decode_s", "total_s", "tokens_per_s", "peak_mem_mb",
    "ref_new_tokens", "ref_total_s", "ref_decode_s", "speedup",
    "exact_match", "first_mismatch", "ref_source", "seed", "compiles", "threads", "load", "status", "crc",
]
NEW_COLUMNS = ["prefill_forwards", "draft_forwards", "aux_forwards", "target_forwards", "target_tokens",
               "draft_model_forwards", "draft_model_params", "tau_with_prefill", "tau_all", "drafted", "accepted",
               "speedup_e2e", "speedup_decode", "ref_peak_mem_mb", "mem_overhead_mb", "verify_ms", "mismatch_kind",
               "mismatch_gap"]
SAMPLES = [("s0", "chat"), ("s1", "chat"), ("s2", "code"), ("s3", "code")]
OOM = "error: CUDA out of memory (tried to allocate 2.00 GiB)"


def split(total: int, parts: int, rng) -> list[int]:
    """``parts`` positive integers summing to ``total`` (accept lengths of the steps after the prefill token)."""
    cuts = sorted(rng.choice(np.arange(1, total), size=parts - 1, replace=False)) if parts > 1 else []
    return [int(b - a) for a, b in zip([0, *cuts], [*cuts, total])]


def make_rows(model, method, task, seed, fail=(), turns=1, repeats=1, old=False, sampled=False):
    """(rows, outputs) of one run over :data:`SAMPLES`; samples in ``fail`` get a failed row (status = OOM);
    ``sampled`` rows (T > 0) have no exact-match columns, as the runner writes them."""
    rng = np.random.default_rng(seed)
    rows, outputs = [], []
    for sid, cat in SAMPLES:
        for turn in range(turns):
            base = {"sample_id": sid, "turn": turn, "category": cat, "model": model, "method": method, "task": task}
            n = int(rng.integers(8, 40))
            verify = n - 1 if method == "vanilla" else int(rng.integers(max(1, (n - 1) // 3), n))
            lengths = split(n - 1, verify, rng)
            prefill, step = float(rng.uniform(0.01, 0.05)), float(rng.uniform(0.01, 0.02))
            peak, ref_peak = float(rng.uniform(100, 120)), float(rng.uniform(90, 100))
            for rep in range(repeats):
                if sid in fail:
                    rows.append({**base, "repeat": rep, "status": OOM})
                    continue
                decode, ref_decode = verify * step * rng.uniform(0.9, 1.1), (n - 1) * 0.012 * rng.uniform(0.9, 1.1)
                total, ref_total = prefill + decode, prefill + ref_decode
                row = {**base, "repeat": rep, "prompt_tokens": 20, "new_tokens": n, "forwards": verify,
                       "tau": (n - 1) / verify, "mean_accept": (n - 1) / verify, "prefill_s": prefill,
                       "decode_s": decode, "total_s": total, "tokens_per_s": n / total, "peak_mem_mb": peak,
                       "ref_new_tokens": n, "ref_total_s": ref_total, "ref_decode_s": ref_decode,
                       "speedup": ref_total / total, "exact_match": "True", "first_mismatch": -1,
                       "ref_source": "interleaved", "seed": 0, "compiles": 0, "threads": 2, "load": 0.1,
                       "status": "ok"}
                if sampled:
                    row |= {"exact_match": "", "first_mismatch": ""}
                if not old:
                    row |= {"prefill_forwards": 1, "draft_forwards": 0, "aux_forwards": 0,
                            "target_forwards": verify + 1, "target_tokens": 20 + n, "draft_model_forwards": 0,
                            "draft_model_params": 0, "tau_with_prefill": n / (verify + 1), "tau_all": n / (verify + 1),
                            "drafted": "" if method == "vanilla" else 4 * verify,
                            "accepted": "" if method == "vanilla" else n - 1 - verify,
                            "speedup_e2e": ref_total / total, "speedup_decode": ref_decode / decode,
                            "ref_peak_mem_mb": ref_peak, "mem_overhead_mb": peak - ref_peak,
                            "verify_ms": 1000 * decode / verify, "mismatch_kind": "", "mismatch_gap": ""}
                rows.append(row)
            if sid not in fail:
                outputs.append({"sample_id": sid, "turn": turn, "tokens": list(range(n)),
                                "text": " ".join(f"w{i}" for i in range(n)), "accept_lengths": lengths})
    return rows, outputs


def contract_keys(rows: list[dict], outputs: list[dict]) -> dict:
    """The newer summary keys, computed here from the rows (independently of fafo.bench.metrics)."""
    ok = [r for r in rows if r["status"] == "ok"]
    hist: dict[str, int] = {}
    for o in outputs:
        for n in o["accept_lengths"]:
            hist[str(n)] = hist.get(str(n), 0) + 1
    return {"speedup_kind": "e2e", "tau_all": sum(r["new_tokens"] for r in ok) / sum(r["forwards"] + 1 for r in ok),
            "ref_peak_mem_mb": max(r["ref_peak_mem_mb"] for r in ok),
            "mem_overhead_mb": max(r["mem_overhead_mb"] for r in ok),
            "verify_ms": 1000 * sum(r["decode_s"] for r in ok) / sum(r["forwards"] for r in ok),
            "n_mismatch_tie": 0, "n_mismatch_divergence": 0, "accept_hist": dict(sorted(hist.items()))}


def write_run(root: Path, rel: str, model: str, method: str, task: str = "builtin", seed: int = 0, fail=(),
              config: dict | None = None, old: bool = False, summary: bool = True, **kw) -> tuple[Path, list[dict]]:
    """A run directory as the runner leaves it; returns (its path, its rows)."""
    d = Path(root) / rel
    d.mkdir(parents=True)
    rows, outputs = make_rows(model, method, task, seed, fail=fail, old=old, **kw)
    columns = OLD_COLUMNS if old else OLD_COLUMNS[:-1] + NEW_COLUMNS + ["crc"]
    with open(d / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(with_crc(rows, columns))
    (d / "outputs.jsonl").write_text("".join(json.dumps(o) + "\n" for o in outputs))
    if summary:
        s = {"model": model, "method": method, "task": task, **summarize(read(d), n_boot=200)}
        (d / "summary.json").write_text(json.dumps(s if old else {**s, **contract_keys(rows, outputs)}))
    (d / "config.yaml").write_text(yaml.safe_dump({"bench": {"bootstrap": 200}, **(config or {})}))
    return d, read(d)


def with_crc(rows: list[dict], columns: list[str]) -> list[dict]:
    """Rows with the checksum the runner gives each (over their fields as csv writes them)."""
    written = [{c: "" if r.get(c) is None else str(r.get(c, "")) for c in columns} for r in rows]
    return [{**w, "crc": row_crc(w, columns)} for w in written]


def read(run_dir: Path) -> list[dict]:
    """samples.csv rows as every reader of a run reads them (strings, checksums checked)."""
    return read_rows(Path(run_dir) / "samples.csv")


# ------------------------------------------------------------------ paper-table trees (tests/test_reproduce.py)
def write_paper_run(root: Path, rel: str, summary: dict | None, config: dict, samples: list[dict] | None = None,
               error: str | None = None):
    d = root / rel
    d.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config), d / "config.yaml")
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if samples is not None:
        with open(d / "samples.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=SAMPLE_COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows(with_crc(samples, SAMPLE_COLUMNS))
    if error is not None:
        (d / "error.txt").write_text(error + "\n")


def paper_summary(model, method, task, speedup, tau, peak, exact, n_samples, n_turns):
    return {"model": model, "method": method, "task": task, "speedup": speedup, "tau": tau, "peak_mem_mb": peak,
            "exact_match_rate": exact, "n_samples": n_samples, "n_turns": n_turns, "speedup_mean": speedup}


def synthetic_table2(root: Path) -> Path:
    """A table2 tree: finished runs, a smaller duplicate, a row the paper lacks, a killed run, a failed one."""
    cfg = {"paper": {"table": "table2"}}
    write_paper_run(root, "llama2_7b_chat/mt_bench/fafo_stream/default",
                   paper_summary("llama2-7b-chat", "fafo-stream", "mt_bench", 1.8, 2.25, 14000.5, 1.0, 80, 160), cfg)
    write_paper_run(root, "llama2_7b_chat/mt_bench/fafo_stream/bench.max_samples=2",  # a smaller duplicate: not shown
                   paper_summary("llama2-7b-chat", "fafo-stream", "mt_bench", 9.9, 9.9, 1.0, 1.0, 2, 4), cfg)
    write_paper_run(root, "llama2_7b_chat/gsm8k/fafo_stream/default",
                   paper_summary("llama2-7b-chat", "fafo-stream", "gsm8k", 1.7, 2.71, 13900.0, 1.0, 1319, 1319), cfg)
    write_paper_run(root, "llama2_7b_chat/mt_bench/lookahead/default",
                   paper_summary("llama2-7b-chat", "lookahead", "mt_bench", 1.5, 1.7, 14100.0, 0.9875, 80, 160), cfg)
    write_paper_run(root, "qwen25_7b_instruct/mt_bench/lookahead/default",  # a row the paper does not have
                   paper_summary("qwen2.5-7b-instruct", "lookahead", "mt_bench", 1.3, 2.0, 15000.0, 1.0, 80, 160), cfg)
    base = {"model": "llama3-8b-instruct", "method": "swift", "task": "humaneval", "category": "code", "repeat": 0,
            "turn": 0, "prompt_tokens": 100, "status": "ok", "exact_match": "True", "first_mismatch": -1}
    samples = [{**base, "sample_id": "HumanEval/0", "new_tokens": 100, "forwards": 40, "tau": 100 / 41,
                "total_s": 2.0, "ref_total_s": 3.0, "peak_mem_mb": 15500.0, "prefill_s": 0.1, "decode_s": 1.9},
                   {**base, "sample_id": "HumanEval/1", "new_tokens": 50, "forwards": 24, "tau": 50 / 25,
                "total_s": 1.0, "ref_total_s": 1.2, "peak_mem_mb": 15600.0, "prefill_s": 0.1, "decode_s": 0.9}]
    write_paper_run(root, "llama3_8b_instruct/humaneval/swift/default", None, cfg, samples=samples)  # killed mid-run
    write_paper_run(root, "llama31_8b_instruct/gsm8k/swift/default", None, cfg,
               error="error: model.path 'meta-llama/Llama-3.1-8B-Instruct' is not available offline")
    return root


def synthetic_table11(root: Path) -> Path:
    """A table11 tree: FAFO-Stream at k = 4, 5, 6."""
    for k, speedup, tau in [(4, 0.95, 1.92), (5, 1.2, 2.0), (6, 1.85, 2.12)]:
        write_paper_run(root, f"llama2_7b_chat/mt_bench/fafo_stream/method.k={k}",
                   paper_summary("llama2-7b-chat", "fafo-stream", "mt_bench", speedup, tau, 14000.0, 1.0, 80, 160),
                   {"paper": {"table": "table11"}, "method": {"k": k, "n": 40}})
    return root
