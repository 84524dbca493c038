"""Every config in conf/ composes, and every `_target_` in it instantiates (the lightning-hydra-template check)."""


import pytest

from fafo.bench.setup import build, method_node
from fafo.decoding import Decoder
from fafo.sampling import Sampling
from tests.helpers import CONF, compose_with

GROUPS = ["model", "method", "task", "sampling", "bench", "experiment"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]


def test_every_group_has_options():
    for group in ["model", "method", "task", "sampling", "bench", "experiment"]:
        assert any(g == group for g, _ in OPTIONS), f"conf/{group}/ is empty"


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}/{o}" for g, o in OPTIONS])
def test_config_composes_and_instantiates(group, option):
    cfg = compose_with(f"{group}={option}")
    assert cfg.hydra.run.dir.endswith("/default") or group in ("experiment", "sampling")
    assert isinstance(build(method_node(cfg.method), "method"), Decoder)
    assert isinstance(build(cfg.bench.reference, "bench.reference"), Decoder)
    assert isinstance(build(cfg.sampling, "sampling"), Sampling)
    task = build(cfg.task, "task")
    assert task.name == cfg.task.name
    assert cfg.model.name and (cfg.model.get("path") or cfg.model.get("gguf_file") or cfg.model.get("tiny")), \
        f"model/{option} needs a path, a gguf_file or a tiny spec"
    assert cfg.model.attention in ("sdpa", "flex")


COMPRESS = sorted(p.stem for p in (CONF / "method" / "compress").glob("*.yaml"))


@pytest.mark.parametrize("option", COMPRESS)
def test_compression_group_composes_under_fafo(option):
    from fafo.compress.base import Compression

    cfg = compose_with("method=fafo_stream", f"method/compress={option}")
    method = build(method_node(cfg.method), "method")
    assert isinstance(method.compress, Compression) and method.compress.budget > 0


def test_run_dir_depends_only_on_config():
    a = compose_with("method=vanilla", "bench.max_new_tokens=8")
    b = compose_with("bench.max_new_tokens=8", "method=vanilla")
    assert a.hydra.run.dir == b.hydra.run.dir
    assert a.hydra.run.dir != compose_with("bench.max_new_tokens=9").hydra.run.dir
