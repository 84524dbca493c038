"""A run's answers in Spec-Bench's answer-file format, for Spec-Bench's own ``evaluation/speed.py``.

Spec-Bench (Xia et al., ACL 2024 Findings; https://github.com/hemingkx/Spec-Bench, read at commit fd2c1cd) writes
one JSON line per question (``evaluation/eval.py`` ``get_model_answers``; ``evaluation/inference_baseline.py`` for
vanilla, whose ``accept_lengths`` are all 1)::

    {"question_id", "category", "answer_id", "model_id", "tstamp",
     "choices": [{"index": 0, "turns": [text per turn], "decoding_steps": [...], "new_tokens": [per turn],
                  "wall_time": [seconds per turn], "accept_lengths": [every step's accepted length, all turns]}]}

``evaluation/speed.py`` ``speed()`` keeps a subtask's lines by ``category`` (``mt_bench``: the eight MT-Bench
categories ``writing`` ... ``humanities``; any other subtask: equality; ``overall``: all), then divides the mean over
questions of ``sum(new_tokens) / sum(wall_time)`` of the method by the mean over questions of ``tokens /
sum(wall_time)`` of the baseline, where ``tokens`` is NOT the baseline's ``new_tokens``: it re-tokenizes each turn's
text, ``len(tokenizer(text).input_ids) - 1``. Its "#Mean accepted tokens" is the mean of the method's
``accept_lengths``. This harness's ``speedup_specbench`` is the same estimator on the tokens vanilla generated.

What the export writes, so that speed.py's arithmetic gives ours:

* ``category``: the task's own (``tasks/spec_bench.py`` keeps the release file's names);
* per turn the median over timing repeats of ``total_s`` (method) and ``ref_total_s`` (vanilla), ``new_tokens``
  and ``ref_new_tokens``, and the method's accept lengths from ``outputs.jsonl`` (prefill excluded: speed.py's
  "#Mean accepted tokens" is then our ``tau``; vanilla's are ``[1] * tokens``, as Spec-Bench's baseline writes);
* the text of each turn decoded **with special tokens kept** (an answer's closing EOS is in it, which Spec-Bench's
  own files strip), vanilla's from its own tokens (``ref_tokens``; runs recorded before they were stored: the
  method's where the turn matched exactly, else the method's with a ``fafo_note``). A tokenizer that prepends one
  BOS then re-counts every turn exactly as generated, unless the text does not re-tokenize to the same length;
  one that prepends none (SmolLM2, Qwen2.5, Llama-3) is counted one token short per turn, so speed.py's
  baseline is slower by (its turns)/(its tokens) per question and its speedup higher by about as much;
* the tokenizer itself, saved in ``<out>/tokenizer`` (speed.py loads ``AutoTokenizer.from_pretrained`` of a path),
  and ``specbench_export.json``: the command, the tokenizer's source, and per subtask our ``speedup_specbench``
  beside the value speed.py will print, computed here with that very tokenizer.

A question with a failed turn is left out of both files (speed.py needs every turn) and listed in ``skipped``.
speed.py's ``__main__`` always runs ``get_mean_speedup()`` on its authors' paths (``--mean-report`` is
``store_true`` with ``default=True``), so it is called as a function from a Spec-Bench checkout::

    python -m fafo.bench.tools.specbench_export RUN_DIR [--out DIR] [--tokenizer PATH]
    cd Spec-Bench && python -c "from evaluation.speed import get_single_speedup as s; s('M.jsonl', 'B.jsonl', 'TOK')"
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
import uuid
from pathlib import Path

from fafo.bench.records import read_outputs, read_rows, turn_key
from fafo.bench.tools.report import load_yaml

SPEC_BENCH_COMMIT = "fd2c1cd"
SUBTASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "overall")  # speed.py order
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


class ExportError(Exception):
    """A run directory that cannot be exported (one ``error:`` line)."""


def _qid(sample_id: str):
    return int(sample_id) if sample_id.isdigit() else sample_id  # Spec-Bench's question ids are integers


def selects(category: str, subtask: str) -> bool:
    """Whether speed.py's ``speed(..., task=subtask)`` keeps a line of ``category``."""
    return subtask == "overall" or (category in MT_BENCH if subtask == "mt_bench" else category == subtask)


def run_tokenizer(run_dir: Path):
    """(tokenizer, source) of the checkpoint the run used, resolved from its ``config.yaml`` and Hydra overrides as
    the runner resolves it (:func:`fafo.bench.naming.checkpoint`; no weights read)."""
    from omegaconf import OmegaConf

    from fafo.bench.naming import Job, checkpoint

    if not (run_dir / "config.yaml").exists():
        raise ExportError(f"{run_dir} has no config.yaml to find its tokenizer; pass --tokenizer PATH (the "
                          "checkpoint's directory or hub id)")
    cfg = OmegaConf.load(run_dir / "config.yaml")
    hydra_dir = next((d / ".hydra" for d in (run_dir, run_dir.parent) if (d / ".hydra").is_dir()), None)
    overrides = [str(o) for o in load_yaml(hydra_dir / "overrides.yaml") or []] if hydra_dir else []
    choice = ((load_yaml(hydra_dir / "hydra.yaml").get("hydra") or {}).get("runtime", {}).get("choices", {})
              .get("model")) if hydra_dir else None
    try:
        if cfg.get("model") is None:
            raise ExportError("its config.yaml names no model")
        ckpt = checkpoint(cfg.model, Job(tuple(overrides), {"model": choice}), weights=False)
    except Exception as exc:  # noqa: BLE001 - offline, moved, not downloaded here: one line
        raise ExportError(f"the run's tokenizer could not be loaded here ({str(exc).splitlines()[0][:200]}); pass "
                          "--tokenizer PATH (a directory holding the checkpoint's tokenizer files)") from None
    return ckpt.tokenizer, ckpt.source


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001
        raise ExportError(f"--tokenizer {path}: could not be loaded ({str(exc).splitlines()[0][:200]}); give a "
                          "directory holding tokenizer files (tokenizer.json / tokenizer.model) or a cached hub id")


def answers(run_dir: str | Path, tokenizer) -> tuple[list[dict], list[dict], list[str]]:
    """(method lines, baseline lines, skipped question ids) of a run directory, in sample order (module doc)."""
    run_dir = Path(run_dir)
    rows, outputs = read_rows(run_dir / "samples.csv"), read_outputs(run_dir / "outputs.jsonl")
    questions: dict[str, dict[int, list[dict]]] = {}
    for r in rows:
        sid, turn = turn_key(r)
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
            ref_tokens = o.get("ref_tokens")
            if ref_tokens is None:  # recorded before vanilla's tokens were stored
                ref_tokens = o["tokens"]
                if str(r.get("exact_match")) != "True":
                    notes.append(f"turn {t}: vanilla's text is not stored (not an exact match); the method's is "
                                 "written")
            ref_n = int(float(r["ref_new_tokens"]))
            m["turns"].append(tokenizer.decode(o["tokens"], skip_special_tokens=False))
            m["decoding_steps"].append(len(lengths))
            m["new_tokens"].append(int(float(r["new_tokens"])))
            m["wall_time"].append(statistics.median(float(x["total_s"]) for x in rs))
            m["accept_lengths"] += lengths
            b["turns"].append(tokenizer.decode(ref_tokens, skip_special_tokens=False))
            b["decoding_steps"].append(ref_n)
            b["new_tokens"].append(ref_n)
            b["wall_time"].append(statistics.median(float(x["ref_total_s"]) for x in rs))
            b["accept_lengths"] += [1] * ref_n
        common = {"question_id": _qid(sid), "category": first.get("category") or "", "tstamp": time.time()}
        model = re.sub(r"[^\w.-]+", "_", str(first.get("model") or "model"))
        method.append({**common, "answer_id": uuid.uuid4().hex[:22], "model_id": f"{model}-{first.get('method')}",
                       "choices": [{"index": 0, **m}]})
        base.append({**common, "answer_id": uuid.uuid4().hex[:22], "model_id": f"{model}-vanilla",
                     "choices": [{"index": 0, **b}], **({"fafo_note": "; ".join(notes)} if notes else {})})
    return method, base, skipped


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def predictions(method: list[dict], base: list[dict], tokenizer) -> dict[str, dict]:
    """Per subtask (speed.py's seven): our ``speedup_specbench`` on the exported questions, the value speed.py
    will print (its re-tokenized baseline counts, with ``tokenizer`` as it loads it), its "#Mean accepted tokens",
    and the baseline tokens generated and as speed.py counts them."""
    counted = [[len(tokenizer(text).input_ids) - 1 for text in b["choices"][0]["turns"]] for b in base]
    out = {}
    for name in SUBTASKS:
        keep = [i for i, m in enumerate(method) if selects(m["category"], name)]
        if not keep:
            continue
        mc, bc = [method[i]["choices"][0] for i in keep], [base[i]["choices"][0] for i in keep]
        speed = _mean([sum(c["new_tokens"]) / sum(c["wall_time"]) for c in mc])
        ours = speed / _mean([sum(c["new_tokens"]) / sum(c["wall_time"]) for c in bc])
        theirs = speed / _mean([sum(counted[i]) / sum(c["wall_time"]) for i, c in zip(keep, bc)])
        accepts = [n for c in mc for n in c["accept_lengths"]]
        out[name] = {"questions": len(keep), "turns": sum(len(c["turns"]) for c in bc),
                     "speedup_specbench": ours, "speed_py": theirs,
                     "mean_accepted": _mean(accepts), "baseline_tokens": sum(sum(c["new_tokens"]) for c in bc),
                     "speed_py_baseline_tokens": sum(sum(counted[i]) for i in keep)}
    return out


def export(run_dir: str | Path, out_dir: str | Path | None = None, tokenizer_path: str | None = None) -> dict:
    """Write ``<model>-<method>.jsonl``, ``<model>-vanilla.jsonl``, ``tokenizer/`` and ``specbench_export.json`` to
    ``out_dir`` (default ``<run_dir>/specbench``); returns what ``specbench_export.json`` holds."""
    run_dir = Path(run_dir)
    if not (run_dir / "samples.csv").exists():
        raise ExportError(f"{run_dir} has no samples.csv; pass a run directory (it holds samples.csv, "
                          "outputs.jsonl, summary.json)")
    tokenizer, source = (load_tokenizer(tokenizer_path), tokenizer_path) if tokenizer_path else run_tokenizer(run_dir)
    method, base, skipped = answers(run_dir, tokenizer)
    if not method:
        raise ExportError(f"{run_dir} has no question whose every turn finished; nothing to export")
    out = Path(out_dir) if out_dir else run_dir / "specbench"
    out.mkdir(parents=True, exist_ok=True)
    files = {"method": out / f"{method[0]['model_id']}.jsonl", "baseline": out / f"{base[0]['model_id']}.jsonl"}
    for key, lines in (("method", method), ("baseline", base)):
        files[key].write_text("".join(json.dumps(x) + "\n" for x in lines))
    tokenizer.save_pretrained(out / "tokenizer")
    saved = load_tokenizer(str(out / "tokenizer"))  # what speed.py will load: the counts below are its counts
    adds_bos = saved.bos_token_id is not None and saved("a").input_ids[:1] == [saved.bos_token_id]
    paths = [str(p.resolve()) for p in (files["method"], files["baseline"], out / "tokenizer")]
    summary = {}
    if (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
    done = {
        "spec_bench_commit": SPEC_BENCH_COMMIT, "run_dir": str(run_dir.resolve()),
        "method_file": paths[0], "baseline_file": paths[1], "tokenizer_path": paths[2], "tokenizer_source": source,
        "tokenizer_adds_bos": adds_bos,
        "command": "python -c \"from evaluation.speed import get_single_speedup as s; s({!r}, {!r}, {!r})\"".format(
            *paths),
        "questions": len(method), "skipped": skipped, "not_exact_unstored": sum(1 for b in base if "fafo_note" in b),
        "summary_speedup_specbench": summary.get("speedup_specbench"),
        "subtasks": predictions(method, base, saved),
    }
    (out / "specbench_export.json").write_text(json.dumps(done, indent=1) + "\n")
    return done


def report(done: dict) -> str:
    """What the CLI prints: the files, the command, and per subtask ours beside what speed.py will print."""
    lines = [f"wrote {done['method_file']}", f"  and {done['baseline_file']} ({done['questions']} questions), "
             f"tokenizer {done['tokenizer_path']}",
             f"Spec-Bench ({done['spec_bench_commit']}) evaluation/speed.py, from a Spec-Bench checkout:",
             f"  {done['command']}",
             f"{'subtask':<15}{'questions':>10}{'ours':>9}{'speed.py':>10}{'mean accepted':>15}  baseline tokens "
             "(generated / as speed.py counts)"]
    for name, s in done["subtasks"].items():
        lines.append(f"{name:<15}{s['questions']:>10}{s['speedup_specbench']:>9.4f}{s['speed_py']:>10.4f}"
                     f"{s['mean_accepted']:>15.4f}  {s['baseline_tokens']} / {s['speed_py_baseline_tokens']}")
    return "\n".join(lines)


def notes(done: dict) -> list[str]:
    out = []
    overall = done["subtasks"]["overall"]
    if done["skipped"]:
        out.append(f"note: {len(done['skipped'])} questions with a failed turn left out: "
                   f"{', '.join(done['skipped'][:10])}")
    if done["not_exact_unstored"]:
        out.append(f"note: {done['not_exact_unstored']} baseline answers carry the method's text (a run recorded "
                   "before vanilla's tokens were stored; see fafo_note): speed.py re-tokenizes the baseline's text")
    short = overall["baseline_tokens"] - overall["speed_py_baseline_tokens"]
    if short:
        bos = 0 if done["tokenizer_adds_bos"] else overall["turns"]
        why = [f"{bos} for the start token speed.py subtracts and this tokenizer does not prepend (one per turn)"] \
            if bos else []
        if short != bos:
            why.append(f"{short - bos} where a turn's text re-tokenizes to another length")
        out.append(f"note: speed.py counts the baseline's {overall['baseline_tokens']} tokens as "
                   f"{overall['speed_py_baseline_tokens']} ({'; '.join(why)}): its speedup reads "
                   f"{overall['speed_py'] / overall['speedup_specbench'] - 1:+.2%} against ours overall")
    ours, theirs = done["summary_speedup_specbench"], overall["speedup_specbench"]
    if isinstance(ours, (int, float)) and abs(ours - theirs) > 1e-9 * abs(theirs):
        out.append(f"note: summary.json's speedup_specbench {ours:.4f} covers other (sample, turn)s (one-token "
                   f"answers and compiled turns are left out there; skipped questions here): {theirs:.4f} here")
    return out


def main(argv=None) -> int:
    """``python -m fafo.bench.tools.specbench_export RUN_DIR [--out DIR] [--tokenizer PATH]``."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run directory (samples.csv + outputs.jsonl)")
    ap.add_argument("--out", help="output directory (default: RUN_DIR/specbench)")
    ap.add_argument("--tokenizer", help="the checkpoint's tokenizer (directory or cached hub id); default: the "
                                        "run's own, resolved from its config.yaml")
    args = ap.parse_args(argv)
    try:
        done = export(args.run_dir, args.out, args.tokenizer)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report(done))
    for line in notes(done):
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
