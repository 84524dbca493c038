"""Every config in conf/ composes, and every `_target_` in it instantiates (the lightning-hydra-template check)."""

import re

import pytest
import yaml
from hydra.utils import get_class
from omegaconf import OmegaConf

from fafo.bench.spec import build, method_node
from fafo.bounds import field_defaults
from fafo.decoding import Decoder
from fafo.sampling import Sampling
from tests.helpers import CONF, PRESETS, compose_with, sweep_jobs

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


METHOD_FILES = sorted((CONF / "method").rglob("*.yaml"))


@pytest.mark.parametrize("path", METHOD_FILES, ids=[p.relative_to(CONF).as_posix() for p in METHOD_FILES])
def test_method_yaml_sets_only_what_differs_from_its_defaults(path):
    """A file with a ``_target_`` starts from its class's defaults (``class_defaults/<Class>``, registered from the
    dataclass by fafo.bench.naming) and one that extends another starts from that one; neither restates a value."""
    own = yaml.safe_load(path.read_text())
    first = own["defaults"][0]
    if "_target_" in own:
        cls = get_class(own["_target_"])
        assert first == {"/class_defaults@_here_": cls.__name__}, f"{path.name}: defaults must start with its class's"
        start = field_defaults(cls)
    else:
        start = OmegaConf.to_container(compose_with(f"method={first}").method)
    restated = {k: v for k, v in own.items() if k not in ("defaults", "_target_") and start.get(k, object()) == v}
    assert not restated, f"{path.name} restates {restated}"


@pytest.mark.parametrize("option,key,value", [("fafo_stream", "stagger", 2), ("swift", "seed", 7),
                                              ("fafo_quest", "compress.page_size", 8)])
def test_a_default_set_by_the_class_is_typed_without_plus(option, key, value):
    cfg = compose_with(f"method={option}", f"method.{key}={value}")
    method = build(method_node(cfg.method), "method")
    assert OmegaConf.select(cfg.method, key) == value
    assert getattr(method.compress if key.startswith("compress.") else method, key.split(".")[-1]) == value


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


OTHER_PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml") if p.stem not in PRESETS)


@pytest.mark.parametrize("preset", OTHER_PRESETS)
def test_non_paper_preset_keeps_the_one_exclude_list_and_its_jobs_apart(preset):
    """conf/config.yaml holds the only exclude_keys list; a sweep's jobs (equal_budget's rows of one method at three
    budgets) never share a run directory. The paper presets are checked in test_reproduce.py."""
    default = compose_with().hydra.job.config.override_dirname.exclude_keys
    base = compose_with(f"experiment={preset}")
    assert base.hydra.job.config.override_dirname.exclude_keys == default
    jobs = sweep_jobs(base)
    dirs = {compose_with(f"experiment={preset}", *job).hydra.sweep.subdir for job in jobs}
    assert len(dirs) == len(jobs), f"{preset}: two jobs of the sweep would write the same run directory"


@pytest.mark.parametrize("group,option", [o for o in OPTIONS if o[0] in ("model", "task")],
                         ids=[f"{g}/{o}" for g, o in OPTIONS if g in ("model", "task")])
def test_shared_keys_are_typed_without_plus(group, option):
    """The keys every model / task has come from conf/config.yaml (and conf/task/base/), not from each option file:
    each is still overridable on the command line as ``model.max_len=64``, without Hydra's ``+``."""
    shared = {"model": ["model.path=org/ckpt", "model.gguf_file=f.gguf", "model.revision=main", "model.tiny=null",
                        "model.attention=flex", "model.max_len=64"],
              "task": ["task.limit=1", "task.ids=[a]", "task.data_path=d.jsonl", "task.max_input_tokens=null",
                       "task.system=hi"]}[group]
    cfg = compose_with(f"{group}={option}", *shared)
    assert cfg[group].get("max_len", cfg[group].get("limit")) in (64, 1)
    if group == "task" and "hub_id" in cfg.task:  # a task over a public data set (tasks/sources.py DataTask)
        data = compose_with(f"task={option}", "task.revision=v1", "task.split=train", "task.hub_config=c").task
        assert (data.revision, data.split, data.hub_config) == ("v1", "train", "c")


@pytest.mark.slow  # a subprocess
def test_help_names_the_tool_its_examples_and_its_guides(tmp_path):
    """``fafo-bench --help``: the header's example commands name options that exist, the footer files that exist."""
    from tests.helpers import REPO, run_cli

    res = run_cli("--help", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0].startswith("fafo-bench: ") and "== Configuration groups ==" in lines
    examples = [line.split() for line in lines if line.startswith("  fafo-bench ")]
    assert len(examples) == 3
    for words in examples:
        for group, option in (w.split("=") for w in words if re.fullmatch(r"[a-z_/]+=\w+", w)):
            assert (CONF / group / f"{option}.yaml").is_file(), f"{group}={option}"
    guides = [w.rstrip(".") for line in lines[-4:] for w in line.split() if w.endswith((".md", ".md."))]
    assert len(guides) == 3 and all((REPO / g).is_file() for g in guides), guides
