"""Every shell block of README.md after its set-up block, run as a new user types it: in a fresh ``bash`` with the
project's environment activated as the README says after it (``. .venv/bin/activate``; the test activates the
environment running it: ``.venv`` under ``make test``), from a scratch directory holding the repository's
``scripts/`` (so that ``results/`` is written there, not into the checkout).

What the test changes so that each block runs offline in seconds on the tiny model, and nothing else:

- ``model=<preset>`` of a checkpoint from the hub becomes ``model=tiny_llama``, and ``model.path=<a path that is not
  there>`` a tiny checkpoint's directory;
- every ``fafo-bench`` / ``python -m fafo.bench`` line gets ``bench.max_samples=1 bench.repeats=1 bench.warmup=0
  bench.progress=false`` (a key the line sets itself is left as typed), before its comment.

A block right after ``<!-- readme-test: skip (why) -->`` needs what a test machine lacks (a GPU, a network, SLURM).
"""

import os
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from tests.helpers import CONF, REPO

SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((.+?)\)\s*-->")
TINY = {"bench.max_samples": "1", "bench.repeats": "1", "bench.warmup": "0", "bench.progress": "false"}
ACTIVATE = ". .venv/bin/activate"


def blocks(text: str) -> list[tuple[str, str | None]]:
    """The README's ``bash`` blocks in order: (body, why it is skipped or None)."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            j = lines.index("```", i + 1)
            before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            skip = SKIP.search(before)
            out.append(("\n".join(lines[i + 1:j]), skip.group(1) if skip else None))
            i = j
        i += 1
    return out


def hub_only(option: str) -> bool:
    path = CONF / "model" / f"{option}.yaml"
    return path.exists() and not (OmegaConf.load(path).get("tiny") or OmegaConf.load(path).get("gguf_file"))


def tiny_line(line: str, tiny_path: str) -> str:
    """One README line as the test runs it (the module docstring)."""
    code, _, comment = line.partition(" #")
    words = code.split()
    if not words or not (words[0] == "fafo-bench" or words[:3] == ["python", "-m", "fafo.bench"]):
        return line
    for i, word in enumerate(words):
        key, _, value = word.partition("=")
        if key == "model" and hub_only(value):
            words[i] = "model=tiny_llama"
        elif key == "model.path" and not os.path.exists(value):
            words[i] = f"model.path={tiny_path}"
    given = {w.lstrip("+").partition("=")[0] for w in words}
    words += [f"{k}={v}" for k, v in TINY.items() if k not in given]
    return " ".join(words) + (f"  #{comment}" if comment else "")


README = (REPO / "README.md").read_text()
SETUP, *AFTER = blocks(README)
CASES = [pytest.param(body, id=f"block{i + 2}") for i, (body, why) in enumerate(AFTER)
         if why is None and body.strip() != ACTIVATE]  # the test activates the environment running it


def test_the_setup_block_installs_then_activates():
    lines = [line.partition("#")[0].strip() for line in SETUP[0].splitlines()]
    assert lines == ["make run", "make test"]  # exactly the two set-up commands
    assert AFTER[0][0].strip() == ACTIVATE  # then the environment, activated for every command after it
    assert len(CASES) >= 2  # the quick start and the sweep-table-plot blocks
    assert all("fafo.bench -m experiment=" in body or "gpu_wheels" in body or "slurm" in body
               for body, why in AFTER if why is not None)  # only what needs a GPU, a network or SLURM is not run


@pytest.mark.slow
@pytest.mark.parametrize("body", CASES)
def test_a_readme_block_runs_as_typed(body, tmp_path):
    from fafo.engine.tiny import tiny_checkpoint

    tiny = tiny_checkpoint(OmegaConf.to_container(OmegaConf.load(CONF / "model" / "tiny_llama.yaml").tiny))
    (tmp_path / "scripts").symlink_to(REPO / "scripts")
    script = tmp_path / "block.sh"
    script.write_text("\n".join(["set -e", f". {sys.prefix}/bin/activate",
                                 *(tiny_line(line, str(tiny)) for line in body.splitlines())]) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(["bash", "--noprofile", "--norc", str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"{script.read_text()}\n--- stderr:\n{proc.stderr[-4000:]}"
    assert not [line for line in proc.stderr.splitlines() if line.startswith("error:")], proc.stderr[-4000:]


def test_reproduce_sh_finds_the_project_environment(tmp_path):
    """``scripts/reproduce.sh`` run from a shell where nothing is activated uses ``.venv/bin/python``."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "reproduce.sh").write_bytes((REPO / "scripts" / "reproduce.sh").read_bytes())
    (tmp_path / "scripts" / "reproduce.sh").chmod(0o755)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text('#!/bin/sh\necho "venv python $*" >> "$LOG"\n')
    (tmp_path / ".venv" / "bin" / "python").chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "LOG": str(tmp_path / "log")}
    proc = subprocess.run([str(tmp_path / "scripts" / "reproduce.sh"), "table2"], cwd="/", env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "log").read_text().splitlines() == [
        "venv python -m fafo.bench -m experiment=table2",
        "venv python scripts/make_tables.py results/runs/table2 --table table2"]
