"""Damaged files: every kind of file the harness reads, broken in every usual way, is one line naming the setting.

The matrix (kind of file x way of breaking it) runs the checks in this process, through the function the runner
calls for that setting; one case per kind then runs through the CLI (``python -m fafo.bench`` via ``runpy``, with
``Engine.load`` replaced by a test failure), and the three headline cases (a truncated
``model.safetensors``, a checkpoint without tokenizer files, a binary prompts file) run in a real subprocess.
"""

import gzip
import json
import random
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest
from omegaconf import OmegaConf

from fafo.errors import ConfigError
from tests.helpers import REPO, cli_in_process

GARBAGE = random.Random(0).randbytes(4096)  # NUL bytes and invalid UTF-8
LATIN1 = '{"id": "q1", "text": "caf\u00e9 cr\u00e8me"}\n'.encode("latin-1")  # text, but not UTF-8
RECORDS = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": f"#### {2 * i}", "text": f"t{i}"}
           for i in range(6)]
WAYS = ("missing", "empty", "truncated", "garbage", "wrong_format", "wrong_encoding")


def damage(path, how, wrong=b"[1, 2, 3]\n"):
    """Break ``path`` in one of the usual ways (``wrong``: a file of another kind in its place)."""
    data = path.read_bytes()
    if how == "missing":
        path.unlink()
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":  # an interrupted download: about the first two thirds, cut inside a line
        cut = data[: len(data) * 2 // 3]
        while cut[-1:] in (b"\n", b"}", b"]"):  # never exactly at the end of a record
            cut = cut[:-1]
        path.write_bytes(cut)
    elif how == "garbage":
        path.write_bytes(GARBAGE)
    elif how == "wrong_format":
        path.write_bytes(wrong)
    elif how == "wrong_encoding":
        path.write_bytes(LATIN1)
    else:
        raise AssertionError(how)


def one_line(excinfo, setting, name):
    msg = str(excinfo.value)
    assert "\n" not in msg and setting in msg and name in msg, msg
    return msg


# ------------------------------------------------------------------------------------------ checkpoints
@pytest.fixture
def ckpt(checkpoint, tmp_path):
    """A fresh copy of a tiny saved checkpoint (config, safetensors, tokenizer and generation files)."""
    return shutil.copytree(checkpoint("llama_mha"), tmp_path / "ckpt")


def resolve(path, setting="model.path"):
    from fafo.bench.naming import checkpoint

    try:
        return checkpoint(OmegaConf.create({"path": str(path), "revision": None, "tiny": None}))
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("model.path", setting)) from None


# (file in the checkpoint, ways, what stands in for it under wrong_format)
CHECKPOINT_FILES = [
    ("config.json", WAYS, b"[1, 2, 3]\n"),
    ("model.safetensors", WAYS[:5], b'{"weights": "in JSON?"}\n'),
    ("tokenizer.json", WAYS, b"[1, 2, 3]\n"),
    ("tokenizer_config.json", WAYS[1:], b'"a string"\n'),
    ("generation_config.json", WAYS[1:], b"[1, 2, 3]\n"),
    ("chat_template.jinja", ("garbage", "wrong_encoding"), b""),
]


@pytest.mark.parametrize("name,how,wrong", [(n, h, w) for n, ways, w in CHECKPOINT_FILES for h in ways])
def test_a_damaged_checkpoint_file_is_one_line_naming_model_path(ckpt, name, how, wrong):
    damage(ckpt / name, how, wrong)
    with pytest.raises(ConfigError) as excinfo:
        resolve(ckpt)
    msg = one_line(excinfo, "model.path=", str(ckpt))
    if how != "missing" or name != "config.json":
        assert name in msg or "tokenizer files" in msg or "weights" in msg, msg


def _shard(ckpt):
    """Turn the checkpoint into the sharded layout (an index naming every tensor's file)."""
    header_len = struct.unpack("<Q", (ckpt / "model.safetensors").read_bytes()[:8])[0]
    header = json.loads((ckpt / "model.safetensors").read_bytes()[8: 8 + header_len])
    (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00002.safetensors")
    weight_map = {n: "model-00001-of-00002.safetensors" for n in header if n != "__metadata__"}
    weight_map[next(iter(weight_map))] = "model-00002-of-00002.safetensors"
    shutil.copy(ckpt / "model-00001-of-00002.safetensors", ckpt / "model-00002-of-00002.safetensors")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("name,how", [("model.safetensors.index.json", h) for h in ("empty", "truncated", "garbage",
                                                                                     "wrong_format")]
                         + [("model-00002-of-00002.safetensors", h) for h in ("missing", "truncated")])
def test_a_damaged_sharded_checkpoint_is_one_line(ckpt, name, how):
    _shard(ckpt)
    resolve(ckpt)  # intact: accepted
    damage(ckpt / name, how)
    with pytest.raises(ConfigError) as excinfo:
        resolve(ckpt)
    assert name in one_line(excinfo, "model.path=", str(ckpt))


@pytest.mark.parametrize("removed", [("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"),
                                     ("tokenizer.json",), ("model.safetensors",), ("config.json",)])
def test_a_partial_checkpoint_directory_is_one_line(ckpt, removed):
    for name in removed:
        (ckpt / name).unlink()
    with pytest.raises(ConfigError) as excinfo:
        resolve(ckpt)
    one_line(excinfo, "model.path=", str(ckpt))


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage", "wrong_format"])
def test_damaged_pytorch_bin_weights_and_sentencepiece_files_are_one_line(ckpt, how):
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(str(ckpt / "model.safetensors")), ckpt / "pytorch_model.bin")
    (ckpt / "model.safetensors").unlink()
    (ckpt / "tokenizer.model").write_bytes(b"\n\x0bsentencepiece")
    resolve(ckpt)  # intact: accepted
    damage(ckpt / "pytorch_model.bin", how, wrong=b"PK\x03\x04 a zip of something else")
    with pytest.raises(ConfigError) as excinfo:
        resolve(ckpt)
    assert "pytorch_model.bin" in one_line(excinfo, "model.path=", str(ckpt))
    if how == "empty":
        torch.save({}, ckpt / "pytorch_model.bin")  # intact weights again, but an empty sentencepiece model
        (ckpt / "tokenizer.model").write_bytes(b"")
        with pytest.raises(ConfigError) as excinfo:
            resolve(ckpt)
        assert "tokenizer.model is empty" in one_line(excinfo, "model.path=", str(ckpt))


@pytest.mark.parametrize("other", ["llama_gqa", "qwen2_gqa"])
def test_weights_of_another_model_in_the_right_place_are_one_line(ckpt, checkpoint, other):
    shutil.copy(checkpoint(other) / "model.safetensors", ckpt / "model.safetensors")  # intact, but not this model's
    with pytest.raises(ConfigError) as excinfo:
        resolve(ckpt)
    msg = one_line(excinfo, "model.path=", "model.safetensors holds weights that do not match config.json")
    assert "of another shape" in msg and "re-download" in msg


def test_weights_are_checked_from_the_header_without_loading(ckpt, monkeypatch):
    import safetensors

    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: pytest.fail("weights were opened"))
    from fafo.files import Source, check_safetensors

    header = check_safetensors(ckpt / "model.safetensors", Source("model.path", str(ckpt), "fix"))
    assert "model.embed_tokens.weight" in header
    size = (ckpt / "model.safetensors").stat().st_size
    with open(ckpt / "model.safetensors", "r+b") as f:
        f.truncate(size - 1)  # one byte short of the last tensor
    with pytest.raises(ConfigError, match=r"is truncated \(\d+ bytes; its header declares \d+"):
        check_safetensors(ckpt / "model.safetensors", Source("model.path", str(ckpt), "fix"))


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_damaged_draft_checkpoint_names_method_draft_path(ckpt, how):
    from baselines.longspec_draft import resolve_draft
    from baselines.triforce import TriForceDecoder

    damage(ckpt / "model.safetensors", how)
    with pytest.raises(ConfigError) as excinfo:
        resolve_draft(str(ckpt))  # LongSpec: config and weights, no tokenizer needed
    one_line(excinfo, "method.draft.path=", "model.safetensors")
    with pytest.raises(ConfigError) as excinfo:
        TriForceDecoder(draft={"path": str(ckpt)}).check_target(None, None)
    one_line(excinfo, "method.draft.path=", "model.safetensors")


def test_a_longspec_draft_is_checked_without_a_tokenizer_and_against_its_config(ckpt, tmp_path):
    from baselines.longspec_draft import new_draft, resolve_draft, save_draft
    from fafo.engine.loader import load_hf_config

    config = load_hf_config(ckpt)
    draft = save_draft(new_draft(config), config, tmp_path / "draft")  # config.json + model.safetensors only
    assert resolve_draft(str(draft)) == draft
    with pytest.raises(ConfigError) as excinfo:
        resolve_draft(str(ckpt))  # a whole target checkpoint where the draft belongs
    one_line(excinfo, "method.draft.path=", "holds weights that are not the LongSpec Glide layer")
    damage(draft / "config.json", "wrong_encoding")
    with pytest.raises(ConfigError) as excinfo:
        resolve_draft(str(draft))
    assert "not UTF-8" in one_line(excinfo, "method.draft.path=", "config.json")


# ------------------------------------------------------------------------------------------------- GGUF
def _gguf(path, tensor=True):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    if tensor:
        writer.add_tensor("token_embd.weight", np.arange(4096, dtype=np.float32).reshape(64, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("how", WAYS[:5] + ("header",))
def test_a_damaged_gguf_file_is_one_line(tmp_path, monkeypatch, how):
    from fafo.engine.gguf import gguf_checkpoint

    monkeypatch.setenv("FAFO_CACHE", str(tmp_path / "cache"))
    file = _gguf(tmp_path / "m.gguf")
    if how == "header":  # cut inside the fixed header
        file.write_bytes(file.read_bytes()[:10])
    else:
        damage(file, how, wrong=b'{"a GGUF file": "in JSON?"}\n')
    with pytest.raises(ConfigError) as excinfo:
        gguf_checkpoint(str(file))
    one_line(excinfo, "model.gguf_file=", "m.gguf")


def test_a_gguf_files_digest_is_remembered_whole(tmp_path, monkeypatch):
    """The digest that names a GGUF file's conversion is written atomically (concurrent jobs, e.g. test workers,
    hash the same file) and then read instead of rehashing."""
    import hashlib

    from fafo.engine.gguf import file_digest

    monkeypatch.setenv("FAFO_CACHE", str(tmp_path / "cache"))
    file = _gguf(tmp_path / "m.gguf")
    assert file_digest(file) == hashlib.sha256(file.read_bytes()).hexdigest()
    (memo,) = (tmp_path / "cache" / "gguf" / "digests").iterdir()  # no partial file left beside it
    memo.write_text("remembered\n")
    assert file_digest(file) == "remembered"


# ------------------------------------------------------------------------------------------- task data
def _write_data(path):
    """The same records in the format the name says (jsonl, json, csv, parquet, .gz, .zip, directory)."""
    import pandas as pd

    name = path.name
    if name.endswith(".zip"):
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("data/test.jsonl", "".join(json.dumps(r) + "\n" for r in RECORDS))
    elif name.endswith(".gz"):
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in RECORDS).encode()))
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    elif name.endswith(".json"):
        path.write_text(json.dumps(RECORDS, indent=1))
    elif name.endswith(".csv"):
        pd.DataFrame(RECORDS).to_csv(path, index=False)
    elif name.endswith(".parquet"):
        pd.DataFrame(RECORDS).to_parquet(path)
    return path


DATA_FILES = ["test.jsonl", "test.json", "test.csv", "test.parquet", "test.jsonl.gz", "data.zip"]
TEXT_DATA = ("test.jsonl", "test.json", "test.csv")
WRONG = {"test.jsonl": b"[1, 2, 3]\n", "test.json": b"[1, 2, 3]\n", "test.csv": b"PAR1\x15\x04\x00\x00PAR1",
         "test.parquet": b"id,question\nq1,what\n", "test.jsonl.gz": b'{"id": 1}\n', "data.zip": b'{"id": 1}\n'}


def read_data(path):
    from tasks.sources import read_local

    return read_local(str(path), ("*test*.jsonl", "*.jsonl", "*.json", "*.csv", "*.parquet"), "the release file")


@pytest.mark.parametrize("name,how", [(n, h) for n in DATA_FILES for h in WAYS
                                      if h != "wrong_encoding" or n in TEXT_DATA])
def test_a_damaged_task_data_file_is_one_line_naming_task_data_path(tmp_path, name, how):
    path = _write_data(tmp_path / name)
    assert len(read_data(path)) == len(RECORDS)  # intact: read
    damage(path, how, WRONG[name])
    with pytest.raises(ConfigError) as excinfo:
        read_data(path)
    one_line(excinfo, "task.data_path=", name)


@pytest.mark.parametrize("how", ["garbage", "wrong_encoding", "truncated", "partial"])
def test_a_damaged_file_in_a_task_data_directory_is_named(tmp_path, how):
    root = tmp_path / "snapshot"
    root.mkdir()
    _write_data(root / "a-test.jsonl")
    _write_data(root / "b-test.jsonl")
    assert len(read_data(root)) == 2 * len(RECORDS)
    if how == "partial":  # a directory of the wrong files
        for f in root.iterdir():
            f.rename(f.with_suffix(".txt"))
    else:
        damage(root / "b-test.jsonl", how)
    with pytest.raises(ConfigError) as excinfo:
        read_data(root)
    one_line(excinfo, "task.data_path=", "snapshot" if how == "partial" else "b-test.jsonl")


@pytest.mark.parametrize("how", WAYS)
def test_a_damaged_prompts_file_is_one_line(tmp_path, how):
    from tasks.prompts import PromptsTask

    path = _write_data(tmp_path / "prompts.jsonl")
    assert len(PromptsTask(data_path=str(path)).samples()) == len(RECORDS)
    damage(path, how)
    with pytest.raises(ConfigError) as excinfo:
        PromptsTask(data_path=str(path)).samples()
    one_line(excinfo, "task.data_path", "prompts.jsonl")


# -------------------------------------------------------------------------- cost curves, corpora, references
CURVE = "context,step_tokens,median_ms,device_name\n256,1,1.0,cpu\n256,8,2.5,cpu\n1024,1,1.2,cpu\n1024,8,3.0,cpu\n"


@pytest.mark.parametrize("how", WAYS)
def test_a_damaged_cost_curve_is_one_line(tmp_path, how):
    from fafo.bench.tools.cost_curve import CostCurve

    path = tmp_path / "curve.csv"
    path.write_text(CURVE)
    assert CostCurve.load(path).latency(1, 256) == 1.0
    damage(path, how, wrong=b'{"context": 256}\n')
    with pytest.raises(ConfigError) as excinfo:
        CostCurve.load(path)
    one_line(excinfo, "bench.cost_curve=", "curve.csv")


@pytest.mark.parametrize("how", WAYS)
def test_a_damaged_corpus_is_one_line(tmp_path, how):
    from baselines.sam_decoding import read_corpus

    path = _write_data(tmp_path / "corpus.jsonl")
    assert len(read_corpus(str(path))) == len(RECORDS)
    damage(path, how, wrong=b"[1, 2]\n")
    with pytest.raises(ConfigError) as excinfo:
        read_corpus(str(path))
    one_line(excinfo, "method.corpus_path=", "corpus.jsonl")


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage", "wrong_format", "wrong_encoding"])
def test_a_damaged_reference_entry_reads_as_absent_and_is_rewritten(tmp_path, how):
    from fafo.bench.reference import ReferenceStore

    store = ReferenceStore(tmp_path / "refs")
    record = {"tokens": [1, 2, 3], "total_s": [0.1, 0.1, 0.1], "decode_s": [0.1, 0.1, 0.1]}
    store.put("abcdef", record)
    assert store.get("abcdef") == record
    damage(tmp_path / "refs" / "ab" / "abcdef.json", how)
    assert store.get("abcdef") is None  # generated and timed again, never a crash
    store.put("abcdef", record)
    assert store.get("abcdef") == record


@pytest.mark.parametrize("name", ["samples.csv", "outputs.jsonl"])
def test_binary_garbage_appended_to_a_runs_records_is_dropped_not_a_crash(tmp_path, name):
    """(Tears at line boundaries are tests/test_damage.py's; this is bytes that are not text at all.)"""
    from fafo.bench.records import RecordWriter

    records = RecordWriter(tmp_path)
    for sid in ("a", "b"):
        records.write({"sample_id": sid, "turn": 0, "repeat": 0, "status": "ok"},
                      {"sample_id": sid, "turn": 0, "tokens": [1, 2], "text": "hi"})
    records.close()
    with open(tmp_path / name, "ab") as f:
        f.write(GARBAGE + b"\n")
    again = RecordWriter(tmp_path)
    assert again.done == {("a", 0, 0), ("b", 0, 0)} and any("garbled" in r for r in again.repairs), again.repairs
    again.close()


# ------------------------------------------------------------------------------------- through the CLI
@pytest.fixture
def files(ckpt, tmp_path):
    """One damaged file of every kind, for the CLI cases ({name} in the overrides below)."""
    out = {"ckpt": ckpt}
    trunc = shutil.copytree(ckpt, tmp_path / "truncated_ckpt")
    damage(trunc / "model.safetensors", "truncated")
    out["truncated_ckpt"] = trunc
    notok = shutil.copytree(ckpt, tmp_path / "no_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (notok / name).unlink()
    out["no_tokenizer"] = notok
    latin = shutil.copytree(ckpt, tmp_path / "latin1_config")
    damage(latin / "generation_config.json", "wrong_encoding")
    out["latin1_config"] = latin
    draft = shutil.copytree(ckpt, tmp_path / "draft")
    damage(draft / "model.safetensors", "garbage")
    out["draft"] = draft
    for name, how in (("garbage.jsonl", "garbage"), ("cut.parquet", "truncated"), ("curve.csv", "garbage"),
                      ("corpus.jsonl", "wrong_encoding"), ("data.zip", "truncated")):
        path = _write_data(tmp_path / name)
        damage(path, how)
        out[name.split(".")[0]] = path
    out["gguf"] = tmp_path / "m.gguf"
    out["gguf"].write_bytes(GARBAGE)
    out["afile"] = tmp_path / "afile"
    out["afile"].write_text("a regular file\n")
    return out


CLI_CASES = [
    ("model.path={truncated_ckpt}", "model.path", "model.safetensors is truncated"),
    ("model.path={no_tokenizer}", "model.path", "no tokenizer files"),
    ("model.path={latin1_config}", "model.path", "generation_config.json is not UTF-8"),
    ("model.gguf_file={gguf} model.name=g", "model.gguf_file", "GGUF"),
    ("task=prompts task.data_path={garbage}", "task.data_path", "binary"),
    ("task=gsm8k task.data_path={cut}", "task.data_path", "truncated"),
    ("task=longbench_qasper task.data_path={data}", "task.data_path", "zip"),
    ("method=longspec method.draft.path={draft}", "method.draft.path", "not a safetensors file"),
    ("method=triforce method.draft.path={draft}", "method.draft.path", "not a safetensors file"),
    ("bench.cost_curve={curve}", "bench.cost_curve", "binary"),
    ("method=sam_decoding method.corpus_path={corpus}", "method.corpus_path", "not UTF-8"),
    ("bench.reference_dir={afile}/refs", "bench.reference_dir", "is a file"),
]


@pytest.mark.parametrize("overrides,setting,what", CLI_CASES)
def test_each_kind_of_damaged_file_through_the_cli(files, tmp_path, monkeypatch, capsys, overrides, setting, what):
    code, lines = cli_in_process(overrides.format(**files).split(), monkeypatch, capsys, tmp_path / "runs")
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith(f"error: {setting}") and what in lines[0], lines


@pytest.mark.slow
@pytest.mark.parametrize("case", [0, 1, 4], ids=["truncated-weights", "no-tokenizer", "binary-prompts"])
def test_the_issues_cases_in_a_real_subprocess(files, tmp_path, case):
    overrides, setting, what = CLI_CASES[case]
    proc = subprocess.run([sys.executable, "-m", "fafo.bench", *overrides.format(**files).split(),
                           f"bench.output_dir={tmp_path / 'runs'}", "wandb.mode=disabled", "bench.progress=false"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Writing model shards" not in line]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {setting}") and what in lines[0], lines
    assert not list((tmp_path / "runs").rglob("samples.csv"))  # nothing timed, no model loaded
