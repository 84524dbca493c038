"""The supported stacks: the floor ``pyproject.toml`` states is the stack CI's compat tier runs (``make
test-compat``), and the GPU-image layout works: the wheels of ``scripts/gpu_wheels.sh`` installed with ``pip install
--no-index --no-deps --target`` into an empty folder, on top of a bare torch + transformers environment, run the
harness from this source tree by ``PYTHONPATH``.

The layout tests need that environment (``FAFO_COMPAT_PYTHON``, its wheel folder ``FAFO_GPU_WHEELS``): make
test-compat sets both and runs them; elsewhere they are deselected (tests/conftest.py), never skipped.
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from fafo.extras import install_hint
from tests.helpers import REPO

CORE_WHEELS = {"hydra_core", "omegaconf", "antlr4_python3_runtime"}
EXTRA_WHEELS = {"gguf", "bayesian_optimization"}  # pure Python, their dependencies on a GPU image
LIMIT = 5 * 1024 * 1024


def release(version: str) -> tuple[int, ...]:
    """``2.11`` and ``2.11.0`` alike: the numbers, trailing zeros dropped."""
    parts = [int(x) for x in version.split("+")[0].split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def floors() -> dict[str, tuple[int, ...]]:
    """The ``>=`` bounds of torch and transformers in pyproject.toml."""
    text = (REPO / "pyproject.toml").read_text()
    return {name: release(v) for name, v in re.findall(r'"(torch|transformers)>=([\d.]+)', text)}


def test_the_stated_floor_is_the_stack_the_compat_tier_tests():
    line = re.search(r"^COMPAT_STACK := (.*)$", (REPO / "Makefile").read_text(), re.M)[1]
    compat = dict(re.findall(r"(torch|transformers)==([\d.]+)", line))
    assert {name: release(v) for name, v in compat.items()} == floors() and len(compat) == 2
    readme = (REPO / "README.md").read_text()
    assert all(f"{name} {version}" in readme for name, version in compat.items())  # the tested versions, named
    pinned = re.search(r"^torch==([\d.]+)", (REPO / "constraints.txt").read_text(), re.M)[1]
    assert release(pinned) >= floors()["torch"]


@pytest.fixture(scope="module")
def layout():
    """(the compat interpreter, the wheel folder) that make test-compat names."""
    python, wheels = os.environ.get("FAFO_COMPAT_PYTHON"), os.environ.get("FAFO_GPU_WHEELS")
    assert python and Path(python).is_file(), "FAFO_COMPAT_PYTHON must name the compat environment's python"
    assert wheels and Path(wheels).is_dir(), "FAFO_GPU_WHEELS must name the folder scripts/gpu_wheels.sh filled"
    return python, Path(wheels)


def install(python: str, wheels: list[Path], site: Path) -> None:
    """The GPU node's install: no index, no dependency resolution, into an empty folder."""
    site.mkdir()
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    *map(str, wheels)], check=True, capture_output=True, text=True, timeout=300)


def run(python: str, site: Path, *args, cwd: Path, timeout=600) -> subprocess.CompletedProcess:
    """``python ARGS`` with only this tree and ``site`` on top of the bare environment."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{site}", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def project(name: str) -> str:
    return name.split("-")[0].lower()


@pytest.mark.slow
@pytest.mark.compat_env
def test_the_wheel_folder_is_small_and_pure_python(layout):
    _, wheels = layout
    files = sorted(wheels.glob("*.whl"))
    assert {project(f.name) for f in files} == CORE_WHEELS | EXTRA_WHEELS
    assert all(f.name.endswith(("-py3-none-any.whl", "-py2.py3-none-any.whl")) for f in files), files
    assert "antlr4_python3_runtime-4.9.3-py3-none-any.whl" in {f.name for f in files}  # built from the sdist
    assert sum(f.stat().st_size for f in files) < LIMIT


@pytest.mark.slow
@pytest.mark.compat_env
def test_the_core_wheels_alone_run_the_cli(layout, tmp_path):
    """No optional extra: the smoke run completes, exact, with W&B off and one note."""
    python, wheels = layout
    bare = subprocess.run([python, "-c", "import hydra"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ""}, check=False)
    assert bare.returncode != 0  # the environment itself lacks what the wheels bring
    site = tmp_path / "site"
    install(python, [f for f in wheels.glob("*.whl") if project(f.name) in CORE_WHEELS], site)
    out = tmp_path / "runs"
    proc = run(python, site, "-m", "fafo.bench", "experiment=smoke", "bench.max_samples=1", "bench.repeats=1",
               f"bench.output_dir={out}", "bench.progress=false", "wandb.mode=offline", cwd=tmp_path)  # not $WANDB_MODE
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("note: wandb is not installed, so W&B logging is off (wandb.mode=offline); to log: "
            + install_hint("wandb")) in proc.stderr.splitlines()
    summary = json.loads(next(out.rglob("summary.json")).read_text())
    assert summary["exact_match_rate"] == 1.0 and summary["n_samples"] == 1


@pytest.mark.slow
@pytest.mark.compat_env
def test_the_whole_wheel_set_imports_from_an_empty_folder(layout, tmp_path):
    python, wheels = layout
    site = tmp_path / "site"
    install(python, sorted(wheels.glob("*.whl")), site)
    proc = run(python, site, "-c", "import hydra, omegaconf, antlr4, gguf, bayes_opt, torch, transformers, "
               "fafo.bench.__main__, baselines.swift; print(torch.__version__, transformers.__version__)",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch_version, transformers_version = proc.stdout.split()
    assert (release(torch_version), release(transformers_version)) == (floors()["torch"], floors()["transformers"])


@pytest.mark.slow
@pytest.mark.compat_env
def test_gpu_check_quick_runs_from_the_wheel_layout(layout, tmp_path):
    python, wheels = layout
    site = tmp_path / "site"
    install(python, sorted(wheels.glob("*.whl")), site)
    out = tmp_path / "check"
    proc = run(python, site, "-m", "fafo.bench.gpu_check", "--device", "cpu", "--quick", "--out", str(out),
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(out.glob("*.md")), "the self-check wrote no report"
