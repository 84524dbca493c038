"""Optional features are optional: wandb, gguf, bayesian-optimization and datasets (with pyarrow) are imported only
by the feature that uses them. With the module made unimportable (``sys.modules[name] = None``, which is what
``import name`` on a machine without it raises), the default ``wandb.mode=offline`` runs with logging off and one
note, and every other feature stops before a model loads with one line naming the extra to install."""

import subprocess
import sys

import pytest

from fafo.bench.tools import wandb_log
from fafo.errors import ConfigError
from fafo.extras import EXTRAS, install_hint
from tests.helpers import ENV, REPO, cli_in_process, import_script

OPTIONAL = sorted(m for m in EXTRAS if m != "pyarrow")  # pandas imports pyarrow itself where it is installed
OTHER_EXTRAS = {"fafo.sampling_check": "dev (scipy)", "fafo.bench.tools.slurm": "slurm"}  # modules of other extras
NOTE = "note: wandb is not installed, so W&B logging is off (wandb.mode=offline); to log: " + install_hint("wandb")


@pytest.fixture
def without(monkeypatch):
    """without(module, ...): those modules (and their submodules) fail to import for the rest of the test."""

    def hide(*modules):
        for name in list(sys.modules):
            if name.split(".")[0] in modules:
                monkeypatch.delitem(sys.modules, name)
        for name in modules:
            monkeypatch.setitem(sys.modules, name, None)

    monkeypatch.setattr(wandb_log, "_noted", set())  # the note is once per process: this test is a new process
    return hide


@pytest.mark.slow
@pytest.mark.compat
def test_a_run_imports_no_optional_module():
    """The CLI, the runner, the comparison, every method and every task import none of the optional modules."""
    code = ("import pkgutil, sys, importlib\n"
            "import fafo.bench.__main__, fafo.bench.runner, fafo.bench.compare, fafo.bench.plan\n"
            "for pkg in ('baselines', 'tasks', 'fafo'):\n"
            "    for mod in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + '.'):\n"
            f"        if mod.name not in {sorted(OTHER_EXTRAS)!r}:\n"
            "            importlib.import_module(mod.name)\n"
            f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=ENV,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_wandb_offline_without_wandb_runs_with_one_note(tmp_path, monkeypatch, capsys, without):
    without("wandb")
    args = ["wandb.mode=offline", "experiment=smoke", "bench.max_samples=1", "bench.repeats=1",
            "compare.methods=[vanilla,prompt_lookup]"]
    code, err = cli_in_process(args, monkeypatch, capsys, tmp_path, loads=True)
    assert code == 0, err
    assert err.count(NOTE) == 1  # two methods, one note
    assert not list(tmp_path.rglob("wandb"))  # no W&B run directory was written


def test_wandb_online_without_wandb_fails_before_loading(tmp_path, monkeypatch, capsys, without):
    without("wandb")
    code, err = cli_in_process(["wandb.mode=online"], monkeypatch, capsys, tmp_path)
    assert (code, err) == (2, ["error: wandb.mode=online needs the wandb package; " + install_hint("wandb")])


def test_gguf_file_without_gguf_fails_before_loading(tmp_path, monkeypatch, capsys, without):
    without("gguf")
    monkeypatch.setenv("FAFO_CACHE", str(tmp_path / "cache"))  # not converted yet
    file = tmp_path / "tiny.gguf"
    file.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))  # a whole GGUF header, no tensors
    code, err = cli_in_process([f"model.gguf_file={file}"], monkeypatch, capsys, tmp_path)
    assert (code, err) == (2, ["error: model.gguf_file needs the gguf package; " + install_hint("gguf")])


def test_swift_bayes_without_bayes_opt_fails_before_loading(tmp_path, monkeypatch, capsys, without):
    from baselines.swift import SwiftDecoder

    without("bayes_opt")
    code, err = cli_in_process(["method=swift"], monkeypatch, capsys, tmp_path)
    assert (code, err) == (2, ["error: method.bayes=true needs the bayesian-optimization package; "
                               f"{install_hint('bayes_opt')} (or method.bayes=false: random search only)"])
    SwiftDecoder(bayes=False)  # random search only needs none


def test_hub_task_without_datasets_fails_before_loading(tmp_path, monkeypatch, capsys, without):
    without("datasets")
    code, err = cli_in_process(["task=gsm8k"], monkeypatch, capsys, tmp_path)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: task.data_path is not set and reading the hub dataset 'openai/gsm8k'")
    assert f"needs the datasets package; {install_hint('datasets')} (or download " in err[0]


def test_parquet_file_without_pyarrow_names_the_extra(tmp_path, without):
    from tasks.sources import read_file

    without("pyarrow")
    file = tmp_path / "test-00000.parquet"
    file.write_bytes(b"PAR1" + bytes(8) + b"PAR1")
    with pytest.raises(ConfigError) as err:
        read_file(str(file))
    assert str(err.value) == (f"task.data_path={str(file)!r} is a Parquet file, and reading it needs the pyarrow "
                              f"package; {install_hint('pyarrow')}")


def test_plot_without_wandb_refuses_online_and_notes_offline(tmp_path, capsys, without):
    plot = import_script("plot")
    without("wandb")
    with pytest.raises(SystemExit) as exit_:
        plot.main([str(tmp_path), "--wandb-mode", "online"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "error: --wandb-mode online needs the wandb package; " + install_hint("wandb"))
    fig = tmp_path / "figure.png"
    plot.log_wandb(fig, "figure", [], "k", "offline", "fafo-bench")
    assert capsys.readouterr().err.strip() == ("note: wandb is not installed, so the plot is not logged to W&B; "
                                               "to log: " + install_hint("wandb"))
