"""A run's answers in Spec-Bench's answer-file format, for Spec-Bench's own ``evaluation/speed.py``.

Spec-Bench (Xia et al., 2024, https://github.com/hemingkx/Spec-Bench, read at commit fd2c1cd) writes one JSON line
per question (``evaluation/eval.py`` ``run_eval``; ``evaluation/inference_baseline.py`` for vanilla, whose
``accept_lengths`` are all 1)::

    {"question_id", "category", "answer_id", "model_id", "tstamp",
     "choices": [{"index": 0, "turns": [text per turn], "decoding_steps": [...], "new_tokens": [per turn],
                  "wall_time": [seconds per turn], "accept_lengths": [every step's accepted length, all turns]}]}

and ``evaluation/speed.py`` computes, per subtask, ``mean over questions of sum(new_tokens) / sum(wall_time)`` for
the method and ``mean over questions of tokens / sum(wall_time)`` for the baseline, then their ratio. For the
baseline it counts ``tokens`` by re-tokenizing each turn's text (``len(tokenizer(text).input_ids) - 1``), not from
``new_tokens``; that equals our ``ref_new_tokens`` when the tokenizer prepends one BOS and the text round-trips.
This harness's ``speedup_specbench`` is the same estimator on ``ref_new_tokens``.

From a run directory (``samples.csv`` + ``outputs.jsonl``): the method's file has, per turn, the median over timing
repeats of ``total_s``, its ``new_tokens`` and the accept lengths of ``outputs.jsonl``; the baseline's (vanilla
timed beside the method) has ``ref_total_s``, ``ref_new_tokens`` and accept lengths of 1. Vanilla's tokens are not
stored per row: its text is the method's where the turn matched vanilla exactly; elsewhere the method's text is
written in its place and the line carries ``fafo_note`` (speed.py would count the method's tokens for it). A
question with a failed turn is left out of both files (speed.py needs every turn) and listed in ``skipped``.

    python -m fafo.bench.specbench_export RUN_DIR [--out DIR]        # then, in a Spec-Bench checkout:
    python evaluation/speed.py --file-path DIR/<model>-<method>.jsonl --base-path DIR/<model>-vanilla.jsonl \
        --tokenizer-path <model>
"""

from __future__ import annotations

import json
import re
import statistics
import time
import uuid
from pathlib import Path

from fafo.bench.report import read_rows, row_key


def _outputs(run_dir: Path) -> dict[tuple[str, int], dict]:
    out = {}
    path = run_dir / "outputs.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            o = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line
        out[(str(o["sample_id"]), int(o["turn"]))] = o
    return out


def _qid(sample_id: str):
    return int(sample_id) if sample_id.isdigit() else sample_id  # Spec-Bench's question ids are integers


def answers(run_dir: str | Path) -> tuple[list[dict], list[dict], list[str]]:
    """(method lines, baseline lines, skipped question ids) of a run directory, in sample order."""
    run_dir = Path(run_dir)
    rows, outputs = read_rows(run_dir / "samples.csv"), _outputs(run_dir)
    questions: dict[str, dict[int, list[dict]]] = {}
    for r in rows:
        sid, turn = row_key(r)
        questions.setdefault(sid, {}).setdefault(turn, []).append(r)
    method, base, skipped = [], [], []
    for sid, turns in questions.items():
        ok = {t: [r for r in rs if r.get("status") == "ok"] for t, rs in sorted(turns.items())}
        if any(not rs or len(rs) != len(turns[t]) or (sid, t) not in outputs or not rs[0].get("ref_total_s")
               for t, rs in ok.items()):
            skipped.append(sid)
            continue
        first = next(iter(ok.values()))[0]
        m = {"turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [], "accept_lengths": []}
        b = {"turns": [], "decoding_steps": [], "new_tokens": [], "wall_time": [], "accept_lengths": []}
        notes = []
        for t, rs in ok.items():
            o, r = outputs[(sid, t)], rs[0]
            lengths = [int(n) for n in o.get("accept_lengths") or []]
            ref_tokens = int(float(r["ref_new_tokens"]))
            m["turns"].append(o["text"])
            m["decoding_steps"].append(len(lengths))
            m["new_tokens"].append(int(float(r["new_tokens"])))
            m["wall_time"].append(statistics.median(float(x["total_s"]) for x in rs))
            m["accept_lengths"] += lengths
            b["turns"].append(o["text"])
            b["decoding_steps"].append(ref_tokens)
            b["new_tokens"].append(ref_tokens)
            b["wall_time"].append(statistics.median(float(x["ref_total_s"]) for x in rs))
            b["accept_lengths"] += [1] * ref_tokens
            if str(r.get("exact_match")) != "True":
                notes.append(f"turn {t}: vanilla's text is not stored (not an exact match); the method's is written")
        common = {"question_id": _qid(sid), "category": first.get("category") or "", "tstamp": time.time()}
        model = re.sub(r"[^\w.-]+", "_", str(first.get("model") or "model"))
        method.append({**common, "answer_id": uuid.uuid4().hex[:22], "model_id": f"{model}-{first.get('method')}",
                       "choices": [{"index": 0, **m}]})
        base.append({**common, "answer_id": uuid.uuid4().hex[:22], "model_id": f"{model}-vanilla",
                     "choices": [{"index": 0, **b}], **({"fafo_note": "; ".join(notes)} if notes else {})})
    return method, base, skipped


def export(run_dir: str | Path, out_dir: str | Path | None = None) -> dict:
    """Write ``<model>-<method>.jsonl`` and ``<model>-vanilla.jsonl`` to ``out_dir`` (default
    ``<run_dir>/specbench``); returns the two paths, the question count and the skipped question ids."""
    run_dir = Path(run_dir)
    if not (run_dir / "samples.csv").exists():
        raise SystemExit(f"error: {run_dir} has no samples.csv; pass a run directory (it holds samples.csv, "
                         "outputs.jsonl, summary.json)")
    method, base, skipped = answers(run_dir)
    if not method:
        raise SystemExit(f"error: {run_dir} has no question whose every turn finished; nothing to export")
    out = Path(out_dir) if out_dir else run_dir / "specbench"
    out.mkdir(parents=True, exist_ok=True)
    paths = {"method": out / f"{method[0]['model_id']}.jsonl", "baseline": out / f"{base[0]['model_id']}.jsonl"}
    for key, lines in (("method", method), ("baseline", base)):
        paths[key].write_text("".join(json.dumps(x) + "\n" for x in lines))
    not_exact = sum(1 for b in base if "fafo_note" in b)
    return {**paths, "questions": len(method), "skipped": skipped, "not_exact": not_exact}


def main(argv=None) -> int:
    """``python -m fafo.bench.specbench_export RUN_DIR [--out DIR]``: writes both files; notes go to stderr."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run directory (samples.csv + outputs.jsonl)")
    ap.add_argument("--out", help="output directory (default: RUN_DIR/specbench)")
    args = ap.parse_args(argv)
    try:
        done = export(args.run_dir, args.out)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"wrote {done['method']} and {done['baseline']} ({done['questions']} questions)")
    if done["skipped"]:
        print(f"note: {len(done['skipped'])} questions with a failed turn left out: "
              f"{', '.join(done['skipped'][:10])}", file=sys.stderr)
    if done["not_exact"]:
        print(f"note: {done['not_exact']} baseline answers carry the method's text (vanilla's was not stored; "
              "see fafo_note): speed.py re-tokenizes the baseline's text", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
