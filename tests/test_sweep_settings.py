"""A setting under a swept group on a sweep's real command line (``-m method=fafo_quest,fafo_stream method.k=4``).

Hydra sets a sweep's settings in a base config composed with the swept groups at their defaults (vanilla, which has
no ``method.k``) before any job, so such a sweep failed with Hydra's multi-line error although every job has the
setting. The command line's check passes it as a one-value sweep, which reaches each job as typed; a setting that
some job lacks is one ``error:`` line naming that job (fafo/bench/cli_check.py)."""

import json

import pytest
import yaml

from fafo.bench.cli_check import check_command_line
from fafo.errors import ConfigError
from tests.helpers import run_cli

QUICK = ["bench.max_samples=1", "bench.max_new_tokens=4", "bench.warmup=0", "bench.progress=false"]
RUN = "bench.max_new_tokens=4,bench.max_samples=1,bench.warmup=0,method.k=4"  # a single run's (progress: not named)


@pytest.mark.slow
def test_a_setting_every_swept_method_has_reaches_each_job_as_typed(tmp_path):
    out = tmp_path / "runs"
    proc = run_cli("-m", "method=fafo_quest,fafo_stream", "method.k=4", *QUICK, f"bench.output_dir={out}",
                   cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== fafo-bench sweep: 2 jobs over method into" in proc.stderr  # k is not a swept key
    for method in ("fafo_quest", "fafo_stream"):
        run = out / "tiny_llama" / "builtin" / method / RUN
        assert yaml.safe_load((run / "config.yaml").read_text())["method"]["k"] == 4
        assert "method.k=4" in yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
    alone = run_cli("method=fafo_stream", "method.k=4", *QUICK, f"bench.output_dir={out}", cwd=tmp_path, timeout=300)
    assert alone.returncode == 0 and "nothing left to run" in alone.stdout + alone.stderr, "the same run directory"


@pytest.mark.slow
def test_a_setting_a_swept_method_lacks_is_one_line_naming_that_job(tmp_path):
    proc = run_cli("-m", "method=vanilla,fafo_stream", "method.k=4", f"bench.output_dir={tmp_path}", cwd=tmp_path,
                   timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: method.k=4: the sweep's job with method=vanilla has no "
                                                   "method.k"), lines
    assert proc.stdout == "" and not list(tmp_path.rglob("*")), "nothing may run or be written"


@pytest.mark.slow
def test_a_multirun_flag_after_an_override_still_sweeps(tmp_path):
    """``fafo-bench bench.max_samples=1 -m bench.max_new_tokens=2,3``: Hydra's parser alone stops at "unrecognized
    arguments"; the flag is moved first, so the sweep typed runs."""
    proc = run_cli("bench.max_samples=1", "-m", "bench.max_new_tokens=2,3", "bench.warmup=0", "bench.progress=false",
                   f"bench.output_dir={tmp_path}", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and "== fafo-bench sweep: 2 jobs over bench.max_new_tokens" in proc.stderr, \
        proc.stderr[-3000:]


@pytest.mark.parametrize("argv,hydra_gets", [
    (["-m", "method=fafo_quest,fafo_stream", "method.k=4", "bench.max_new_tokens=8"],
     ["-m", "method=fafo_quest,fafo_stream", "method.k=choice(4)", "bench.max_new_tokens=8"]),
    (["hydra.mode=MULTIRUN", "method=fafo_quest,fafo_stream", "method.k=4"],
     ["hydra.mode=MULTIRUN", "method=fafo_quest,fafo_stream", "method.k=choice(4)"]),
    (["-m", "method=fafo_quest,fafo_stream", "method.m=null"],  # null would not come back from choice() as typed
     ["-m", "method=fafo_quest,fafo_stream", "++method.m=null"]),
    (["-m", "method=fafo_quest,fafo_stream", "method.k=4,5"], None),  # swept already: set per job by Hydra
    (["-m", "method=fafo_stream", "method.k=4"], None),  # the base config has it
    (["method=fafo_quest", "method.k=4"], None),  # not a sweep
    (["-m", "method=fafo_quest,fafo_stream", "++method.k=4"], None),  # a forced add reaches the base config
    (["method=fafo_quest", "-m", "method.k=4,5"], ["-m", "method=fafo_quest", "method.k=4,5"]),  # -m moved first
])
def test_only_a_setting_the_base_config_lacks_is_rewritten(argv, hydra_gets):
    assert check_command_line(argv) == (hydra_gets or argv)


def test_a_preset_sweep_job_that_lacks_the_setting_is_named():
    with pytest.raises(ConfigError, match=r"^method\.n=3: the sweep's job with experiment/rows/table2@_global_="
                                          r"llama2_7b_chat-lookahead task=mt_bench has no method\.n"):
        check_command_line(["-m", "experiment=table2", "method.n=3"])


def test_the_fetch_list_expands_the_same_sweep(capsys):
    from fafo.bench.tools import fetch_list

    assert fetch_list.main(["-m", "method=fafo_quest,fafo_stream", "method.k=4", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["jobs"] == 2 and listing["overrides"] == ["method=fafo_quest,fafo_stream", "method.k=4"]
