"""python -m fafo.bench.tools.specbench_export writes answer files that Spec-Bench's own evaluation/speed.py reads into
the run's speedup_specbench, subtask by subtask, MT-Bench included, with the tokenizer it needs beside them."""

import csv
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_runs import read, write_run  # noqa: E402

from fafo.bench.metrics import summarize  # noqa: E402
from fafo.bench.records import row_crc  # noqa: E402

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
SUBTASKS = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "overall"]


def speed(jsonl_file, jsonl_file_base, tokenizer, task=None, report=True):
    """hemingkx/Spec-Bench evaluation/speed.py ``speed()`` at commit fd2c1cd, step by step: the tokenizer loaded
    from its path, the lines kept by category (``overall`` all, ``mt_bench`` the eight MT-Bench categories, else
    equality), the method's tokens from ``new_tokens``, the baseline's by re-tokenizing each turn's text minus one
    start token, and the ratio of the two means of per-question tokens/s. Returns what it returns."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    mt_bench_list = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]

    def load(path):
        data = []
        with open(path, "r", encoding="utf-8") as file:
            for line in file:
                json_obj = json.loads(line)
                if task == "overall":
                    data.append(json_obj)
                elif task == "mt_bench":
                    if json_obj["category"] in mt_bench_list:
                        data.append(json_obj)
                else:
                    if json_obj["category"] == task:
                        data.append(json_obj)
        return data

    speeds, accept_lengths_list = [], []
    for datapoint in load(jsonl_file):
        tokens = sum(datapoint["choices"][0]["new_tokens"])
        times = sum(datapoint["choices"][0]["wall_time"])
        accept_lengths_list.extend(datapoint["choices"][0]["accept_lengths"])
        speeds.append(tokens / times)
    speeds0 = []
    for datapoint in load(jsonl_file_base):
        answer = datapoint["choices"][0]["turns"]
        tokens = 0
        for i in answer:
            tokens += (len(tokenizer(i).input_ids) - 1)
        times = sum(datapoint["choices"][0]["wall_time"])
        speeds0.append(tokens / times)
    with warnings.catch_warnings():  # an empty subtask: NaN, as speed.py prints it
        warnings.simplefilter("ignore", RuntimeWarning)
        tokens_per_second = np.array(speeds).mean()
        tokens_per_second_baseline = np.array(speeds0).mean()
        speedup_ratio = np.array(speeds).mean() / np.array(speeds0).mean()
    return tokens_per_second, tokens_per_second_baseline, speedup_ratio, accept_lengths_list


EOS = 65


def word_tokenizer(path: Path, bos: bool) -> Path:
    """A word-level tokenizer (``w0`` .. ``w63``, ``<s>`` 64, ``</s>`` 65): every text of its words round-trips;
    ``bos``: it prepends ``<s>`` as Llama-2's does, else nothing (as SmolLM2's, Qwen2.5's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)} | {"<s>": 64, "</s>": EOS, "<unk>": 66},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 64)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(path)
    return path


def spec_bench_run(tmp_path):
    """A finished 2-turn, 3-repeat run over four Spec-Bench questions (one failed); every answer ends in EOS.
    Question s3's second turn did not match vanilla (vanilla's own tokens stored); s2's was recorded before
    vanilla's tokens were stored and did not match either (the export writes the method's, with a note)."""
    run_dir, rows = write_run(tmp_path, "run", "vicuna-7b", "lookahead", "spec_bench", seed=21, fail={"s1"},
                              turns=2, repeats=3)
    category = {"s0": "writing", "s1": "roleplay", "s2": "translation", "s3": "coding"}
    missed = {("s2", "1"), ("s3", "1")}
    rows = [{**r, "category": category[r["sample_id"]],
             **({"exact_match": "False"} if (r["sample_id"], r["turn"]) in missed else {})} for r in rows]
    rows = [{**r, "crc": row_crc(r, list(r))} if "crc" in r else r for r in rows]  # edited rows re-signed
    with open(run_dir / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    outputs = [json.loads(x) for x in (run_dir / "outputs.jsonl").read_text().splitlines()]
    for o in outputs:
        n = len(o["tokens"])
        o["tokens"] = list(range(n - 1)) + [EOS]
        o["ref_tokens"] = list(range(1, n)) + [EOS] if (o["sample_id"], str(o["turn"])) in missed else o["tokens"]
        if (o["sample_id"], o["turn"]) == ("s2", 1):
            del o["ref_tokens"]
    (run_dir / "outputs.jsonl").write_text("".join(json.dumps(o) + "\n" for o in outputs))
    return run_dir


def export(run_dir, out, *args):
    return subprocess.run([sys.executable, "-m", "fafo.bench.tools.specbench_export", str(run_dir), "--out", str(out),
                           *args], capture_output=True, text=True, env=ENV, timeout=120)


@pytest.mark.slow
def test_spec_bench_speed_reads_the_export_into_our_speedup_specbench(tmp_path):
    run_dir = spec_bench_run(tmp_path)
    proc = export(run_dir, tmp_path / "answers", "--tokenizer", str(word_tokenizer(tmp_path / "tok", bos=True)))
    assert proc.returncode == 0, proc.stderr
    assert "(3 questions)" in proc.stdout and "left out: s1" in proc.stderr and "1 baseline answers" in proc.stderr
    done = json.loads((tmp_path / "answers" / "specbench_export.json").read_text())
    method, base, tok = done["method_file"], done["baseline_file"], done["tokenizer_path"]
    assert (Path(method).name, Path(base).name) == ("vicuna-7b-lookahead.jsonl", "vicuna-7b-vanilla.jsonl")
    assert done["tokenizer_path"] == str((tmp_path / "answers" / "tokenizer").resolve()) and done["tokenizer_adds_bos"]
    assert f"s({method!r}, {base!r}, {tok!r})" in done["command"] and done["command"] in proc.stdout
    lines = [json.loads(x) for x in Path(method).read_text().splitlines()]
    assert [(x["question_id"], x["category"]) for x in lines] == [("s0", "writing"), ("s2", "translation"),
                                                                   ("s3", "coding")]
    for x in lines:
        assert set(x) == {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"}
        choice = x["choices"][0]
        assert choice["index"] == 0 and len(choice["turns"]) == len(choice["new_tokens"]) == len(choice["wall_time"])
        assert all(t.endswith("</s>") for t in choice["turns"])  # the closing EOS is in the text speed.py counts
    noted = [json.loads(x) for x in Path(base).read_text().splitlines()]
    assert ["fafo_note" in x for x in noted] == [False, True, False]
    assert noted[2]["choices"][0]["turns"][1].startswith("w1 ")  # vanilla's own answer, not the method's
    assert all(set(x["choices"][0]["accept_lengths"]) == {1} for x in noted)
    rows = read(run_dir)
    summary = summarize(rows)
    for task in SUBTASKS:
        ratio = speed(method, base, tok, task)[2]
        if task in ("summarization", "qa", "math_reasoning", "rag"):  # not in this run: NaN, as in speed.py
            assert np.isnan(ratio) and task not in done["subtasks"]
            continue
        part = summarize([r for r in rows if task == "overall" or r["category"] in
                          {"mt_bench": ("writing", "coding"), "translation": ("translation",)}[task]])
        assert ratio == pytest.approx(part["speedup_specbench"], rel=1e-12), task  # exactly ours, MT-Bench included
        assert ratio == pytest.approx(done["subtasks"][task]["speed_py"], rel=1e-12)
    assert done["subtasks"]["overall"]["speedup_specbench"] == pytest.approx(summary["speedup_specbench"], rel=1e-12)
    accepts = speed(method, base, tok, "overall")[3]
    assert np.mean(accepts) == pytest.approx(summary["tau"])  # speed.py's "#Mean accepted tokens" is our tau
    assert np.mean(accepts) != pytest.approx(summary["tau_with_prefill"], rel=1e-6)
    assert "reads" not in proc.stderr  # no count bias to report


@pytest.mark.slow
def test_a_tokenizer_without_bos_is_counted_one_token_short_per_turn_and_said(tmp_path):
    run_dir = spec_bench_run(tmp_path)
    proc = export(run_dir, tmp_path / "answers", "--tokenizer", str(word_tokenizer(tmp_path / "tok", bos=False)))
    assert proc.returncode == 0, proc.stderr
    done = json.loads((tmp_path / "answers" / "specbench_export.json").read_text())
    overall = done["subtasks"]["overall"]
    assert not done["tokenizer_adds_bos"] and overall["speed_py_baseline_tokens"] == overall["baseline_tokens"] - 6
    ratio = speed(done["method_file"], done["baseline_file"], done["tokenizer_path"], "overall")[2]
    assert ratio == pytest.approx(overall["speed_py"], rel=1e-12)
    rows = [r for r in read(run_dir) if r["status"] == "ok"]
    short = summarize([{**r, "ref_new_tokens": str(int(r["ref_new_tokens"]) - 1)} for r in rows])
    assert ratio == pytest.approx(short["speedup_specbench"], rel=1e-12) and ratio > overall["speedup_specbench"]
    assert f"{ratio / overall['speedup_specbench'] - 1:+.2%} against ours" in proc.stderr
    assert "6 for the start token speed.py subtracts and this tokenizer does not prepend" in proc.stderr
    assert "another length" not in proc.stderr  # every text of this tokenizer round-trips


@pytest.mark.slow
def test_export_refuses_a_directory_without_samples_and_a_missing_tokenizer(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fafo.bench.tools.specbench_export", str(tmp_path)],
                          capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error:") and "samples.csv" in proc.stderr
    run_dir = spec_bench_run(tmp_path)  # its config.yaml names no model: the tokenizer must be given
    proc = export(run_dir, tmp_path / "answers")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: the run's tokenizer could not be loaded") and "--tokenizer" in proc.stderr
    proc = export(run_dir, tmp_path / "answers", "--tokenizer", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: --tokenizer") and "--tokenizer" in proc.stderr
