"""``python -m fafo.bench.tools.diff RUN_A RUN_B``: what differs between two runs, and by how much.

Three parts, each on what both runs hold:

* **config**: every key of the two ``config.yaml`` files whose value differs (where output goes, progress bars and
  W&B left out), then the environment the summaries record (device, library versions, git commit, threads);
* **tokens**: per (sample, turn) both completed, whether the two methods' tokens are identical (and the two vanilla
  references', where ``outputs.jsonl`` stores them); for each that differs, the token index of the first
  divergence and both texts around the first character where they part;
* **metrics**: each headline figure on the (sample, turn)s both runs completed, A, B and B - A with the interval of
  the difference, paired by sample (:mod:`fafo.bench.metrics`: a 95 % bootstrap interval resampling the common
  samples with one set of indices for both runs from 10 samples, the lowest and highest per-sample difference with
  2-9, none with one). A difference whose interval spans 0 is within what these samples can tell apart.

A run directory is one a run wrote (``samples.csv``, ``outputs.jsonl``, ``config.yaml``); anything else is one
``error:`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fafo.bench import metrics
from fafo.bench.records import read_outputs, read_rows, turn_key
from fafo.bench.tools.report import load_yaml

NOISE = ("bench.output_dir", "bench.progress", "bench.reference_dir", "bench.plan", "wandb.")
ENVIRONMENT = ("device_name", "cpu_name", "gpu_name", "torch", "transformers", "fafo_bench", "git_sha", "python",
               "dtype", "attention", "step_attention", "threads", "checkpoint", "n_params")
METRICS = ("speedup", "speedup_e2e", "speedup_decode", "speedup_specbench", "tau", "tau_with_prefill", "tau_all",
           "exact_match_rate", "tokens_per_s", "peak_mem_mb")


class NotARun(Exception):
    pass


@dataclass
class RunFiles:
    path: Path
    rows: list[dict]
    outputs: dict[tuple[str, int], dict]
    config: dict
    summary: dict

    @property
    def label(self) -> str:
        r = self.rows[0] if self.rows else {}
        return " / ".join(str(r.get(k, "?")) for k in ("model", "method", "task"))


def load(path: str | Path) -> RunFiles:
    """A run directory's files; :class:`NotARun` (one line saying what to pass) for anything else."""
    path = Path(path)
    if not path.is_dir():
        raise NotARun(f"{path} is not a directory; pass a run directory (it holds samples.csv, outputs.jsonl, "
                      "config.yaml)")
    if not (path / "samples.csv").is_file():
        inside = sorted(p.parent for p in path.rglob("samples.csv"))
        hint = (f"; it holds {len(inside)} run{'s' * (len(inside) > 1)}: pass one, e.g. {inside[0]}" if inside else
                "; pass the directory a run wrote (it holds samples.csv, outputs.jsonl, config.yaml)")
        raise NotARun(f"{path} is not a run directory (no samples.csv){hint}")
    outputs = read_outputs(path / "outputs.jsonl")
    try:
        summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").exists() else {}
    except json.JSONDecodeError:
        summary = {}
    config = load_yaml(path / "config.yaml") or load_yaml(path / ".hydra" / "config.yaml")
    return RunFiles(path, read_rows(path / "samples.csv"), outputs, config, summary)


def flatten(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out |= flatten(v, f"{prefix}{k}.")
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def config_lines(a: RunFiles, b: RunFiles) -> list[str]:
    fa, fb = flatten(a.config), flatten(b.config)
    keys = sorted(k for k in fa.keys() | fb.keys() if fa.get(k, "∅") != fb.get(k, "∅") and not k.startswith(NOISE))
    lines = [f"  {k}: {fa.get(k, '(absent)')!r} -> {fb.get(k, '(absent)')!r}" for k in keys] or ["  (identical)"]
    env = [k for k in ENVIRONMENT if a.summary.get(k) != b.summary.get(k)]
    lines += [f"  environment {k}: {a.summary.get(k)!r} -> {b.summary.get(k)!r}" for k in env]
    return lines


def _around(text: str, at: int, width: int) -> str:
    lo = max(0, at - width)
    return ("…" if lo else "") + repr(text[lo:at])[1:-1] + "⟦" + repr(text[at:at + width])[1:-1] + "⟧"


def divergence(tokens_a, tokens_b, text_a: str, text_b: str, width: int) -> list[str]:
    """Where two answers part: the first differing token index and both texts around the first differing
    character (``⟦`` opens what differs)."""
    n = next((i for i, (x, y) in enumerate(zip(tokens_a, tokens_b)) if x != y), min(len(tokens_a), len(tokens_b)))
    c = next((i for i, (x, y) in enumerate(zip(text_a, text_b)) if x != y), min(len(text_a), len(text_b)))
    return [f"token {n} (A {len(tokens_a)}, B {len(tokens_b)} tokens), character {c}:",
            f"      A: {_around(text_a, c, width)}", f"      B: {_around(text_b, c, width)}"]


def token_lines(a: RunFiles, b: RunFiles, show: int, width: int) -> list[str]:
    common = [k for k in a.outputs if k in b.outputs]
    if not common:
        return ["  no (sample, turn) in both outputs.jsonl"]
    lines = []
    for who, tok, text in (("method", "tokens", "text"), ("vanilla", "ref_tokens", "ref_text")):
        pairs = [k for k in common if a.outputs[k].get(tok) is not None and b.outputs[k].get(tok) is not None]
        if not pairs:
            lines.append(f"  {who}: not stored in both runs")
            continue
        differ = [k for k in pairs if a.outputs[k][tok] != b.outputs[k][tok]]
        lines.append(f"  {who}: {len(pairs) - len(differ)} of {len(pairs)} (sample, turn)s identical")
        for k in differ[:show]:
            oa, ob = a.outputs[k], b.outputs[k]
            first, *rest = divergence(oa[tok], ob[tok], oa.get(text) or "", ob.get(text) or "", width)
            lines += [f"    {k[0]}/{k[1]}: {first}", *rest]
        if len(differ) > show:
            lines.append(f"    ... {len(differ) - show} more (--show N)")
    return lines


def _timed(per):
    return per[~metrics.no_decode(per).to_numpy()]


def paired_interval(name: str, per_a, per_b, n_boot: int, seed: int = 0) -> tuple[str, list[float] | None]:
    """(kind, interval) of ``STATS[name](B) - STATS[name](A)`` over the samples both hold (module docstring)."""
    if name.startswith("speedup"):
        per_a, per_b = _timed(per_a), _timed(per_b)
    sa, sb = metrics.per_sample(per_a), metrics.per_sample(per_b)
    ids_a = list(dict.fromkeys(per_a.index.get_level_values("sample_id")))
    ids_b = list(dict.fromkeys(per_b.index.get_level_values("sample_id")))
    ids = [s for s in ids_a if s in set(ids_b)]
    ia, ib = np.array([ids_a.index(s) for s in ids], int), np.array([ids_b.index(s) for s in ids], int)
    stat = metrics.STATS[name]
    kind = metrics.interval_kind(len(ids))
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "ci95":
            idx = np.random.default_rng(seed).integers(0, len(ids), size=(n_boot, len(ids)))  # [n_boot, n]
            d = stat({k: v[ib][idx] for k, v in sb.items()}) - stat({k: v[ia][idx] for k, v in sa.items()})
            d = d[np.isfinite(d)]
            return kind, [float(x) for x in np.percentile(d, [2.5, 97.5])] if len(d) else None
        if kind == "range":
            d = stat({k: v[ib][:, None] for k, v in sb.items()}) - stat({k: v[ia][:, None] for k, v in sa.items()})
            d = d[np.isfinite(d)]
            return kind, [float(d.min()), float(d.max())] if len(d) >= 2 else None
    return kind, None


def metric_lines(a: RunFiles, b: RunFiles, n_boot: int) -> list[str]:
    keys = {turn_key(r) for r in a.rows if r.get("status") == "ok"} & \
        {turn_key(r) for r in b.rows if r.get("status") == "ok"}
    if not keys:
        return ["  no (sample, turn) completed in both runs"]
    rows_a = [r for r in a.rows if turn_key(r) in keys]
    rows_b = [r for r in b.rows if turn_key(r) in keys]
    kind = a.summary.get("speedup_kind") or b.summary.get("speedup_kind") or "e2e"
    sa, sb = (metrics.summarize(rows, n_boot=0, speedup_kind=kind) for rows in (rows_a, rows_b))
    per_a, per_b = (metrics.per_turn(metrics.frame(rows)) for rows in (rows_a, rows_b))
    n_samples = len({k[0] for k in keys})
    lines = [f"  on the {len(keys)} (sample, turn)s of {n_samples} samples both completed"
             f" (A has {len({turn_key(r) for r in a.rows})}, B {len({turn_key(r) for r in b.rows})});"
             f" speedup = speedup_{kind}",
             f"  {'metric':<19}{'A':>10}{'B':>10}{'B - A':>10}  interval of B - A"]
    for name in METRICS:
        va, vb = sa.get(name), sb.get(name)
        if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)):
            continue
        stat = f"speedup_{kind}" if name == "speedup" else name
        text = "—"
        if stat in metrics.STATS:
            which, iv = paired_interval(stat, per_a, per_b, n_boot)
            if iv is not None:
                mark = "" if iv[0] <= 0 <= iv[1] else "  (excludes 0)"
                text = (f"[{iv[0]:+.3f}, {iv[1]:+.3f}] 95 %" if which == "ci95" else
                        f"{{{iv[0]:+.3f}, {iv[1]:+.3f}}} per-sample range") + mark
        lines.append(f"  {name:<19}{va:>10.3f}{vb:>10.3f}{vb - va:>+10.3f}  {text}")
    return lines


def diff(a: RunFiles, b: RunFiles, show: int = 5, width: int = 60, n_boot: int = 1000) -> str:
    return "\n".join([f"A: {a.path}  ({a.label})", f"B: {b.path}  ({b.label})", "config (A -> B):",
                      *config_lines(a, b), "tokens:", *token_lines(a, b, show, width), "metrics:",
                      *metric_lines(a, b, n_boot)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fafo.bench.tools.diff", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", help="a run directory (samples.csv, outputs.jsonl, config.yaml)")
    ap.add_argument("run_b", help="another run directory")
    ap.add_argument("--show", type=int, default=5, help="differing (sample, turn)s shown with their texts (5)")
    ap.add_argument("--width", type=int, default=60, help="characters of text shown either side (60)")
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of the paired interval (1000)")
    args = ap.parse_args(argv)
    try:
        a, b = load(args.run_a), load(args.run_b)
    except NotARun as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(diff(a, b, args.show, args.width, args.bootstrap))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
