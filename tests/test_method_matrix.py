"""The method matrix (tests/methods.py) covers every method config, and drives the cases every method shares: the
FlexAttention backend is token-identical to vanilla greedy, and ``python -m fafo.bench method=<name>`` on the tiny
model records exact-match rows."""

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from baselines.vanilla import VanillaDecoder
from fafo.engine.engine import Engine
from fafo.engine.tiny import tiny_checkpoint
from tests.helpers import cli_in_process
from tests.lossless import assert_lossless
from tests.methods import METHOD_CONF, METHODS

TINY = ["model=tiny_llama", "task=builtin", "bench.max_samples=2", "bench.max_new_tokens=8", "bench.warmup=0"]


class RepeatLast(VanillaDecoder):
    """A method class no entry of tests/methods.py covers."""


def target_of(path: Path) -> str:
    """A method config's ``_target_``, through the sibling config its ``defaults`` names first."""
    node = OmegaConf.load(path)
    parents = [d for d in node.get("defaults") or [] if isinstance(d, str) and d != "_self_"]
    return node.get("_target_") or target_of(path.parent / f"{parents[0]}.yaml")


def registry_problems(conf=METHOD_CONF) -> list[str]:
    """What tests/methods.py lacks for the method configs in ``conf``: an entry per YAML (with a host-ops budget) and
    a host-device traffic case per method class (lossy ones aside: the case checks tokens against vanilla's)."""
    yamls = {p.stem: target_of(p) for p in sorted(Path(conf).glob("*.yaml"))}
    problems = [f"{name}: no entry in tests/methods.py" for name in yamls if name not in METHODS]
    problems += [f"{name}: an entry without its conf/method/{name}.yaml" for name in METHODS if name not in yamls]
    problems += [f"{name}: no host-ops budget (ops)" for name, case in METHODS.items() if not case.ops]

    def classes(instances):
        return {f"{type(x).__module__}.{type(x).__name__}" for x in instances}

    traffic = classes(c.traffic_instance() for c in METHODS.values() if c.traffic)
    lossy = {yamls.get(n) for n, c in METHODS.items() if not c.lossless}
    return problems + [f"{target}: no traffic case (tests/methods.py, Traffic)"
                       for target in sorted(set(yamls.values()) - lossy - traffic)]


def test_every_method_config_has_an_entry():
    assert registry_problems() == []
    for name, case in METHODS.items():
        assert not case.variants or next(iter(case.variants)) == name, f"{name}: its first variant is its own"
        assert case.flex is None or case.variants, f"{name}: the FlexAttention case needs a small instance"


def test_a_new_method_config_without_its_entries_fails(tmp_path):
    """One more YAML, of a new method class: no entry and no traffic case, each named."""
    conf = tmp_path / "method"
    shutil.copytree(METHOD_CONF, conf)
    (conf / "repeat_last.yaml").write_text("_target_: tests.test_method_matrix.RepeatLast\nname: repeat-last\n")
    problems = registry_problems(conf)
    assert problems == ["repeat_last: no entry in tests/methods.py",
                        "tests.test_method_matrix.RepeatLast: no traffic case (tests/methods.py, Traffic)"]


@pytest.mark.parametrize("name", sorted(n for n, case in METHODS.items() if case.flex))
def test_flex_backend_is_token_identical(name, engine, ckpt_root):
    case = METHODS[name]
    model = case.flex.model
    eng = engine(model, "flex") if isinstance(model, str) else \
        Engine.from_pretrained(str(tiny_checkpoint(model, cache_dir=ckpt_root)), backend="flex")
    method = case.small()
    method.setup(eng)
    assert_lossless(method, eng, max_new=case.flex.max_new, prompts=list(case.flex.prompts))
    if case.flex.draft_model:  # the draft model ran, not only the target
        ids = eng.tokenizer(case.flex.prompts[0]).input_ids
        gen = method.generate(eng, ids, case.flex.max_new)
        assert gen.tokens == VanillaDecoder().generate(eng, ids, case.flex.max_new).tokens
        assert gen.draft_model_forwards > 0


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_runs_through_the_cli(name, tmp_path, monkeypatch, capsys):
    """In this process (the subprocess adds nothing here): exit 0, one row per (sample, turn), exact unless lossy."""
    code, lines = cli_in_process([f"method={name}", *METHODS[name].overrides, *TINY], monkeypatch, capsys,
                                 tmp_path, loads=True)
    assert code in (0, None), lines
    [summary] = [json.loads(p.read_text()) for p in tmp_path.rglob("summary.json") if "_reference" not in p.parts]
    assert summary["n_samples"] == 2 and summary["n_failed"] == 0
    if METHODS[name].lossless:
        assert summary["exact_match_rate"] == 1.0


REPEAT_LAST = '''"""Repeat-last: drafts the current token ``copies`` times (a trivial draftless method, for the README's guide)."""

from dataclasses import dataclass

from baselines.tree_drafting import DraftState, TreeDrafter, chain
from fafo.bounds import at_least


class _State(DraftState):
    def __init__(self, copies: int):
        self.copies = copies

    def draft(self, context, max_depth):
        return chain(context[-1], [context[-1]] * self.copies, max_depth)


@dataclass
class RepeatLastDecoder(TreeDrafter):
    copies: int = at_least(1, 3)

    def start(self, engine, prompt_ids, eos_ids):
        return _State(self.copies)

    def max_tree(self) -> int:
        return 1 + self.copies
'''


def test_adding_a_method_takes_one_file_one_yaml_and_one_matrix_entry(tmp_path, monkeypatch, capsys, engine):
    """The README's "Adding a method", done: a method file, its YAML, one ``Case``; then the CLI runs it, its bound
    refuses a bad value in one line, and the matrix's lossless case passes."""
    from tests.methods import Case

    (tmp_path / "repeat_last.py").write_text(REPEAT_LAST)
    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "repeat_last.yaml").write_text(
        "_target_: repeat_last.RepeatLastDecoder\nname: repeat-last\ncopies: 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    case = Case(variants={"repeat_last": lambda: __import__("repeat_last").RepeatLastDecoder(copies=2)})
    assert_lossless(case.small(), engine("llama_mha_rep"), max_new=16)
    extra = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "method=repeat_last"]
    with pytest.MonkeyPatch.context() as before_loading:  # its check that no model loads ends with the block
        code, lines = cli_in_process([*extra, "method.copies=0", *TINY], before_loading, capsys, tmp_path / "bad")
    assert code == 2 and lines == ["error: method.copies=0 must be an integer >= 1"], lines
    code, lines = cli_in_process([*extra, *TINY], monkeypatch, capsys, tmp_path / "runs", loads=True)
    assert code in (0, None), lines
    [summary] = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("summary.json")
                 if "_reference" not in p.parts]
    assert summary["method"] == "repeat-last" and summary["exact_match_rate"] == 1.0 and summary["n_failed"] == 0
