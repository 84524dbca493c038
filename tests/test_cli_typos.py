"""A misspelt group option or setting on the real command line: one ``error:`` line naming the closest valid name,
exit status 2, before Hydra's own multi-line error and before any model loads (fafo/bench/cli_check.py)."""

import pytest

from tests.helpers import run_cli

CASES = [
    (["method=fafo_steam"], "method=fafo_steam", "did you mean method=fafo_stream?"),
    (["-m", "method=vanilla,fafo_steam"], "method=fafo_steam", "did you mean method=fafo_stream?"),
    (["model=tiny_lama"], "model=tiny_lama", "did you mean model=tiny_llama?"),
    (["method=fafo_stream", "method/compress=quets"], "method/compress=quets", "did you mean method/compress=quest?"),
    (["bench.max_new_token=5"], "bench.max_new_token", "did you mean bench.max_new_tokens?"),
    (["+bench.max_new_token=5"], "+bench.max_new_token", "did you mean bench.max_new_tokens?"),
    (["methd=vanilla"], "methd", "did you mean method?"),
    (["method=fafo_stream", "method.stager=2"], "method.stager", "did you mean method.stagger?"),
]


@pytest.mark.slow
@pytest.mark.parametrize("args,setting,hint", CASES)
def test_a_misspelling_is_one_line_with_the_right_name(args, setting, hint, tmp_path):
    proc = run_cli(*args, f"bench.output_dir={tmp_path}", cwd=tmp_path, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {setting}") and hint in lines[0], lines
    assert proc.stdout == "" and not list(tmp_path.rglob("*")), "nothing may run or be written"


def test_valid_settings_pass_the_check():
    """What the check must not refuse: a setting a swept method has, an added key its dataclass declares, a node
    without a schema, a preset's own sweep, deletions and forced adds."""
    from fafo.bench.cli_check import check_command_line

    for argv in (["-m", "method=vanilla,fafo_stream", "method.k=4"], ["+sampling.min_p=0.1"],
                 ["+bench.reference.group_size=16"], ["compare.methods=[vanilla]", "+compare.overrides.vanilla=[]"],
                 ["-m", "experiment=table2", "bench.plan=true"], ["~model.name"], ["++model.tiny.seed=3"],
                 ["hydra/launcher=slurm"], ["--help"], ["-m", "bench.max_new_tokens=4,6", "method=prompt_lookup"]):
        check_command_line(argv)
