"""Every count of every method, compression and task has a declared bound, and 0 / negative values are refused
where the method cannot run with them (``fafo.bounds``): one line naming the setting, before anything loads."""

import dataclasses

import pytest
from hydra._internal.utils import _locate
from omegaconf import OmegaConf

from fafo.bench.spec import build, method_node
from fafo.bounds import at_least, bound_of, check_bound, check_bounds, one_of
from fafo.errors import ConfigError
from tests.helpers import CONF, cli_in_process, compose_with


# integer fields that count nothing: any value runs
NOT_COUNTS = {
    "seed": "a random seed",
}
# counts for which 0 is a meaningful setting, and what it means
ZERO_OK = {
    ("FAFODecoder", "stagger"): "every stream starts at P + 1",
    ("LookaheadDecoder", "guess_set"): "no n-gram guesses: the lookahead window alone",
    ("SwiftDecoder", "max_opt_iter"): "no skip-set search: the starting set is kept",
    ("SwiftDecoder", "max_tolerance_iter"): "the search stops at the first iteration without improvement",
    ("SAMDecoder", "len_bias"): "the static automaton's match length counts in full",
    ("SuffixDecoder", "max_cached_outputs"): "no earlier outputs in the global tree: the prompt's tree only",
    ("TriForceDecoder", "draft_start"): "a draft window without sink tokens",
    ("StreamingLLM", "sink"): "the recent window alone",
    ("Quest", "dense_layers"): "every layer reads only the selected pages",
    ("LongBenchTask", "min_input_tokens"): "no minimum prompt length",
}


def _configs():
    """(prefix, config node with _target_, how to rebuild it with one key changed) for every method, compression
    and task config, and the INT8-KV reference."""
    out = []
    for p in sorted((CONF / "method").glob("*.yaml")):
        out.append(("method", method_node(compose_with(f"method={p.stem}").method)))
    for p in sorted((CONF / "method" / "compress").glob("*.yaml")):
        node = method_node(compose_with("method=fafo_stream", f"method/compress={p.stem}").method)
        out.append(("method.compress", node))
    for p in sorted((CONF / "task").glob("*.yaml")):
        out.append(("task", compose_with(f"task={p.stem}").task))
    out.append(("bench.reference", OmegaConf.create({"_target_": "baselines.quantspec.Int8KVReference"})))
    return out


def _target(prefix, node):
    return node.compress if prefix == "method.compress" else node


def _int_fields(cls):
    for f in dataclasses.fields(cls):
        kind = str(f.type)
        if f.init and "int" in kind and not any(w in kind for w in ("list", "tuple", "dict")):
            yield f.name


def _cases():
    seen, cases = set(), []
    for prefix, node in _configs():
        cls = _locate(_target(prefix, node)["_target_"])
        for name in _int_fields(cls):
            if (cls, name) not in seen and name not in NOT_COUNTS:
                seen.add((cls, name))
                cases.append(pytest.param(prefix, node, cls, name, id=f"{cls.__name__}.{name}"))
    return cases


CASES = _cases()


def _build_with(prefix, node, name, value):
    node = OmegaConf.create(OmegaConf.to_container(node, resolve=True))
    _target(prefix, node)[name] = value
    return build(node, "method" if prefix == "method.compress" else prefix)


def test_the_walk_finds_every_method_compression_and_task_count():
    names = {c.id for c in CASES}
    assert len(names) >= 40
    for expected in ("FAFODecoder.n", "QuantSpecDecoder.gamma", "TriForceDecoder.gamma1", "LongSpecDecoder.gamma",
                     "StreamingLLM.local", "SnapKV.window", "BuiltinTask.limit", "PG19Task.prefix_tokens",
                     "SCBenchTask.max_turns", "Int8KVReference.group_size"):
        assert expected in names, expected
    assert {f"{c}.{n}" for c, n in ZERO_OK} <= names  # every exception is a real field


@pytest.mark.parametrize("prefix,node,cls,name", CASES)
def test_every_count_has_a_declared_bound_and_refuses_degenerate_values(prefix, node, cls, name):
    bound = bound_of(cls, name)
    assert bound is not None, f"{cls.__name__}.{name} counts something but declares no bound (fafo.bounds.at_least)"
    zero_ok = (cls.__name__, name) in ZERO_OK
    if "choices" in bound:  # a count with a few meaningful values (one_of)
        zero_ok = 0 in bound["choices"]
    else:
        assert bound["ge"] == 0 if zero_ok else bound["ge"] >= 1, (cls.__name__, name, bound)
    refused = [-1] if zero_ok else [0, -1]
    for value in refused:
        with pytest.raises(ConfigError) as excinfo:
            _build_with(prefix, node, name, value)
        msg = str(excinfo.value)
        assert msg.startswith(f"{prefix}.{name}={value} must be") and "\n" not in msg, msg
    if zero_ok:
        _build_with(prefix, node, name, 0)  # a meaningful setting: accepted


def test_the_issues_case_a_zero_draft_length_is_refused_through_the_cli(tmp_path, monkeypatch, capsys):
    for overrides, setting in (("method=quantspec method.gamma=0", "method.gamma=0"),
                               ("method=prompt_lookup method.num_tokens=0", "method.num_tokens=0"),
                               ("task.max_new_tokens=0", "task.max_new_tokens=0")):
        code, lines = cli_in_process(overrides.split(), monkeypatch, capsys, tmp_path / "runs")
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {setting} must be an integer"), lines


def test_objects_built_in_python_are_checked_too():
    from baselines.quantspec import Int8KVReference, QuantSpecDecoder
    from fafo.fafo import FAFODecoder
    from tasks.builtin import BuiltinTask

    with pytest.raises(ConfigError, match=r"^method.k=0 must be an integer >= 1$"):
        FAFODecoder(k=0)
    with pytest.raises(ConfigError, match=r"^method.gamma=0 must be an integer >= 1$"):
        QuantSpecDecoder(gamma=0)
    assert Int8KVReference()._inner.gamma == 0  # the reference's own autoregressive decoder: not a user setting
    with pytest.raises(ConfigError, match=r"^task.limit=0 must be null or an integer >= 1$"):
        BuiltinTask(limit=0).samples()


@dataclasses.dataclass
class _Base:
    n: int = at_least(1, 4)
    m: int | None = at_least(2, None, high=8, why="a reason")


@dataclasses.dataclass
class _Child(_Base):
    n: int = 9  # a new default keeps the bound declared above


def test_bounds_are_inherited_and_null_follows_the_annotation():
    check_bounds(_Child(), "x")
    with pytest.raises(ConfigError, match=r"^x.n=0 must be an integer >= 1$"):
        check_bounds(_Child(n=0), "x")
    with pytest.raises(ConfigError, match=r"^x.n=True must be an integer >= 1$"):
        check_bound(_Child, "n", True, "x.n")
    with pytest.raises(ConfigError, match=r"^x.n=None must be an integer >= 1$"):
        check_bound(_Child, "n", None, "x.n")
    check_bound(_Child, "m", None, "x.m")
    with pytest.raises(ConfigError, match=r"^x.m=9 must be null or an integer >= 2 and <= 8 \(a reason\)$"):
        check_bound(_Child, "m", 9, "x.m")


@dataclasses.dataclass
class _Choices:
    pooling: str = one_of(("max", "avg"), "max", why="how votes pool")
    bits: int | None = one_of((None, 4), 4)


def test_choices_are_declared_once_and_refused_in_one_line():
    check_bounds(_Choices(), "x")
    check_bounds(_Choices(pooling="avg", bits=None), "x")
    with pytest.raises(ConfigError, match=r"^x.pooling='min' must be one of max, avg \(how votes pool\)$"):
        check_bounds(_Choices(pooling="min"), "x")
    with pytest.raises(ConfigError, match=r"^x.bits=8 must be one of null, 4$"):
        check_bounds(_Choices(bits=8), "x")
    with pytest.raises(ConfigError, match=r"^x.bits=4.0 must be one of null, 4$"):
        check_bound(_Choices, "bits", 4.0, "x.bits")
    with pytest.raises(AssertionError):
        one_of(("a",), "b")


def test_a_bool_field_takes_only_true_or_false():
    from baselines.lookahead import LookaheadDecoder
    from baselines.swift import SwiftDecoder

    with pytest.raises(ConfigError, match=r"^method.bonus_token=1 must be true or false$"):
        LookaheadDecoder(bonus_token=1)
    with pytest.raises(ConfigError, match=r"^method.bayes='yes' must be true or false$"):
        SwiftDecoder(bayes="yes")
