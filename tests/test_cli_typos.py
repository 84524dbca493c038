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
    (["method=fafo_stream", "method.compres.local=3"], "method.compres.local", "did you mean method.compress.local?"),
    (["method=lookahead", "method.n=4"], "method.n", "method (LookaheadDecoder) has: level, window, guess_set"),
]


@pytest.mark.slow
@pytest.mark.parametrize("args,setting,hint", CASES)
def test_a_misspelling_is_one_line_with_the_right_name(args, setting, hint, tmp_path):
    proc = run_cli(*args, f"bench.output_dir={tmp_path}", cwd=tmp_path, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {setting}") and hint in lines[0], lines
    assert proc.stdout == "" and not list(tmp_path.rglob("*")), "nothing may run or be written"


def test_an_unknown_setting_is_matched_against_its_own_node_only():
    """Under a node that exists, the hint is that node's closest setting or, with none close, its settings and the
    class that takes them; never a name from elsewhere in the config (``method.compress._target_`` for a budget)."""
    from fafo.bench.cli_check import check_command_line
    from fafo.errors import ConfigError

    for argv, hint in ((["method=fafo_stream", "method.compress.token_budget=48"],
                        "; method.compress (StreamingLLM) has: sink, local ("),
                       (["-m", "method=vanilla,lookahead", "method.nn=3"],
                        "; method (VanillaDecoder, LookaheadDecoder) has: name, level, window"),
                       (["bench.foo=1"], "; bench has: max_samples, max_new_tokens, "),
                       (["+bench.foo=1"], "; bench has: max_samples, max_new_tokens, "),
                       (["method=fafo_stream", "+method.compress.token_budget=48"],
                        "; method.compress (StreamingLLM) has: sink, local ("),
                       (["bnech.max_new_tokens=5"], "; did you mean bench.max_new_tokens?")):
        with pytest.raises(ConfigError) as err:
            check_command_line(argv)
        assert hint in str(err.value), (argv, str(err.value))
        assert "_target_" not in str(err.value)


def test_valid_settings_pass_the_check():
    """What the check must not refuse: a setting every swept method has, an added key its dataclass declares, a node
    without a schema, a preset's own sweep, deletions and forced adds."""
    from fafo.bench.cli_check import check_command_line

    for argv in (["-m", "method=fafo_quest,fafo_stream", "method.k=4"], ["+sampling.min_p=0.1"],
                 ["+bench.reference.group_size=16"], ["compare.methods=[vanilla]", "+compare.overrides.vanilla=[]"],
                 ["-m", "experiment=table2", "bench.plan=true"], ["~model.name"], ["++model.tiny.seed=3"],
                 ["hydra/launcher=slurm"], ["--help"], ["-m", "bench.max_new_tokens=4,6", "method=prompt_lookup"]):
        check_command_line(argv)


def test_an_empty_file_or_name_setting_is_refused_in_a_sweep_too():
    """``bench.output_dir=$OUT`` with OUT unset would write under the filesystem's root; ``model.path=$CKPT`` would
    benchmark the group's tiny model. Empty alone, quoted or as one swept value: refused; null and text pass."""
    from fafo.bench.cli_check import check_command_line
    from fafo.errors import ConfigError

    for argv, key in ((["bench.output_dir="], "bench.output_dir"), (["-m", "model.path='',/ckpt/a"], "model.path"),
                      (["method=triforce", 'method.draft.path=""'], "method.draft.path"),
                      (["+model.revision= "], "model.revision")):
        with pytest.raises(ConfigError, match=f"^{key} is empty \\(an unset shell variable\\?\\)"):
            check_command_line(argv)
    for argv in (["model.path=null"], ["-m", "model.path=/ckpt/a,/ckpt/b"], ["hydra.run.dir=/tmp/x"],
                 ["~model.name"], ["bench.reference_dir=/tmp/ref"]):
        check_command_line(argv)
    from fafo.bench.tools.sweep import check_output_dir

    with pytest.raises(ConfigError, match="bench.output_dir is empty"):  # a config composed in Python
        check_output_dir("")


COMPARED = [(["experiment=demo", "method.compress.token_budget=48"], "method.compress.token_budget=48: a comparison"),
            (["compare.methods=[vanilla,lookahead]", "method.window=3"], "method.window=3: a comparison")]


@pytest.mark.slow
@pytest.mark.parametrize("args,start", COMPARED)
def test_a_method_override_in_a_comparison_is_one_line_with_where_it_goes(args, start, tmp_path):
    """A comparison composes each method from its own name: a command-line method setting would reach none of them
    (and the default method may not have it), so it is refused with the per-method form, before a model loads."""
    proc = run_cli(*args, "model=tiny_llama", f"bench.output_dir={tmp_path}", cwd=tmp_path, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {start}") and "compare.overrides.<method>" in lines[0]
    assert proc.stdout == "" and not list(tmp_path.rglob("*")), "nothing may run or be written"


def test_method_overrides_are_refused_only_in_a_comparison():
    from fafo.bench.cli_check import check_command_line
    from fafo.errors import ConfigError

    for argv in (["experiment=demo", "method=fafo_quest"], ["experiment=demo", "method/compress=quest"],
                 ["experiment=demo", "+method.foo=1"], ["-m", "experiment=demo", "method.n=4,8"],
                 ["compare.methods=[vanilla,fafo_stream]", "method=fafo_stream", "method.n=4"]):
        with pytest.raises(ConfigError, match=r"a comparison \(compare\.methods\) composes every method"):
            check_command_line(argv)
    for argv in (["method=fafo_quest", "method.n=4"], ["experiment=demo", "compare.methods=[]", "method=fafo_quest",
                                                      "method.n=4"], ["experiment=demo", "task.ids=[chat-01]"],
                 ["experiment=demo", "++compare.overrides.vanilla=['method.name=x']"]):
        check_command_line(argv)


def test_a_comparison_refuses_a_method_override_that_reaches_hydra():
    """The same rule where the command line's check steps aside (a user's own config directory): the comparison's
    composition refuses a method override instead of dropping it."""
    from hydra import compose, initialize_config_dir

    from fafo.bench.compare import method_configs
    from fafo.bench.naming import CONF
    from fafo.errors import ConfigError

    command = ["experiment=demo", "compare.methods=[vanilla,fafo_quest]"]
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=command)
        assert list(method_configs(cfg, command)) == ["vanilla", "fafo_quest"]
        for bad in ("method.n=4", "method=fafo_stream", "~method.compress"):
            with pytest.raises(ConfigError, match=rf"^{bad}: a comparison"):
                method_configs(cfg, [*command, bad])
