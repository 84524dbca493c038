"""python -m fafo.bench.specbench_export writes answer files that Spec-Bench's own evaluation/speed.py arithmetic
reads into the run's speedup_specbench (mean over questions of tokens/s, method over vanilla)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_runs import read, write_run  # noqa: E402

from fafo.bench.metrics import summarize  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
MT_BENCH = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


class WordTokenizer:
    """A tokenizer that prepends one BOS and splits on spaces (the test's texts are one word per token)."""

    def __call__(self, text):
        return type("Encoding", (), {"input_ids": [1] + text.split()})()


def _load(path, task):
    data = []
    with open(path, encoding="utf-8") as file:
        for line in file:
            obj = json.loads(line)
            if task == "overall" or (task == "mt_bench" and obj["category"] in MT_BENCH) or obj["category"] == task:
                data.append(obj)
    return data


def speed(jsonl_file, jsonl_file_base, tokenizer, task="overall"):
    """hemingkx/Spec-Bench evaluation/speed.py ``speed()`` (fd2c1cd), its arithmetic line by line; the tokenizer is
    passed in instead of loaded with AutoTokenizer.from_pretrained."""
    speeds, accept_lengths_list = [], []
    for datapoint in _load(jsonl_file, task):
        tokens = sum(datapoint["choices"][0]["new_tokens"])
        times = sum(datapoint["choices"][0]["wall_time"])
        accept_lengths_list.extend(datapoint["choices"][0]["accept_lengths"])
        speeds.append(tokens / times)
    speeds0 = []
    for datapoint in _load(jsonl_file_base, task):
        answer = datapoint["choices"][0]["turns"]
        tokens = 0
        for i in answer:
            tokens += len(tokenizer(i).input_ids) - 1
        times = sum(datapoint["choices"][0]["wall_time"])
        speeds0.append(tokens / times)
    speedup_ratio = np.array(speeds).mean() / np.array(speeds0).mean()
    return np.array(speeds).mean(), np.array(speeds0).mean(), speedup_ratio, accept_lengths_list


def expected_specbench(rows, task=None) -> float:
    """The contract's speedup_specbench from the rows: per question sum(new tokens) / sum(median total_s over
    repeats), mean over questions, method over vanilla (ref_* columns)."""
    per: dict[str, dict[int, list[dict]]] = {}
    for r in rows:
        if r["status"] == "ok" and (task is None or r["category"] == task):
            per.setdefault(r["sample_id"], {}).setdefault(int(r["turn"]), []).append(r)
    ours, base = [], []
    for turns in per.values():
        ours.append(sum(int(rs[0]["new_tokens"]) for rs in turns.values())
                    / sum(np.median([float(r["total_s"]) for r in rs]) for rs in turns.values()))
        base.append(sum(int(rs[0]["ref_new_tokens"]) for rs in turns.values())
                    / sum(np.median([float(r["ref_total_s"]) for r in rs]) for rs in turns.values()))
    return float(np.mean(ours) / np.mean(base))


@pytest.mark.slow
def test_export_is_read_by_spec_bench_speed_into_speedup_specbench(tmp_path):
    run_dir, rows = write_run(tmp_path, "run", "vicuna-7b", "lookahead", "spec_bench", seed=21, fail={"s1"},
                              turns=2, repeats=3)
    rows = [{**r, "exact_match": "False"} if r["sample_id"] == "s3" and r["turn"] == "1" else r for r in rows]
    with open(run_dir / "samples.csv", "w", newline="") as f:  # s3's second turn did not match vanilla
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    proc = subprocess.run([sys.executable, "-m", "fafo.bench.specbench_export", str(run_dir), "--out",
                           str(tmp_path / "answers")], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "3 questions" in proc.stdout and "left out: s1" in proc.stderr and "1 baseline answers" in proc.stderr
    method, base = tmp_path / "answers" / "vicuna-7b-lookahead.jsonl", tmp_path / "answers" / "vicuna-7b-vanilla.jsonl"
    lines = [json.loads(x) for x in method.read_text().splitlines()]
    assert [x["question_id"] for x in lines] == ["s0", "s2", "s3"] and lines[0]["category"] == "chat"
    for x in lines:
        assert set(x) == {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
        choice = x["choices"][0]
        assert choice["index"] == 0 and len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"])
    noted = [json.loads(x) for x in base.read_text().splitlines()]
    assert ["fafo_note" in x for x in noted] == [False, False, True]
    assert all(set(x["choices"][0]["accept_lengths"]) == {1} for x in noted)
    expected = expected_specbench(read(run_dir))
    for task in ("overall", "chat", "code"):
        _, _, ratio, _ = speed(method, base, WordTokenizer(), task)
        assert ratio == pytest.approx(expected if task == "overall" else expected_specbench(read(run_dir), task))
    _, _, _, accepts = speed(method, base, WordTokenizer(), "overall")
    ok = [r for r in read(run_dir) if r["status"] == "ok" and r["repeat"] == "0"]
    assert np.mean(accepts) == pytest.approx(sum(int(r["new_tokens"]) - 1 for r in ok)
                                             / sum(int(r["forwards"]) for r in ok))
    summary = summarize(read(run_dir))
    # the summary's own estimator (metrics contract) agrees with speed.py's
    assert summary["speedup_specbench"] == pytest.approx(expected)


@pytest.mark.slow
def test_export_refuses_a_directory_without_samples(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fafo.bench.specbench_export", str(tmp_path)],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error:") and "samples.csv" in proc.stderr
