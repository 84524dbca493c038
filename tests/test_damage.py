"""Self-healing records: tear samples.csv / outputs.jsonl at several offsets, rerun, get the undamaged run back."""

import json
import shutil

import pytest

from fafo.bench.records import RecordWriter, row_crc
from fafo.bench.runner import Runner
from fafo.bench.spec import resolve
from tests.helpers import make_cfg, read_rows, run_cli

ARGS = ["bench.max_new_tokens=6", "bench.warmup=0", "bench.repeats=2", "task.ids=[chat-01,multi-01,code-01]"]


def _records(run_dir):
    rows = sorted((r["sample_id"], r["turn"], r["repeat"], r["status"], r["new_tokens"], r["exact_match"])
                  for r in read_rows(run_dir))
    outputs = sorted((o["sample_id"], o["turn"], tuple(o["tokens"]))
                     for o in map(json.loads, (run_dir / "outputs.jsonl").read_text().splitlines()))
    return rows, outputs


@pytest.fixture(scope="module")
def undamaged(tmp_path_factory):
    root = tmp_path_factory.mktemp("undamaged")
    run_dir = root / "run"
    Runner().run(resolve(make_cfg(root, *ARGS), run_dir))
    return root, run_dir, _records(run_dir)


def _after_turn0_of_multi(text: str) -> int:
    """Offset just after the row of multi-01 turn 0 repeat 1 (the turn-1 rows are lost, their outputs kept)."""
    lines = text.splitlines(keepends=True)
    end = next(i for i, line in enumerate(lines) if line.startswith("multi-01,0,1,"))
    return sum(len(line) for line in lines[: end + 1])


# (file, where): a fraction of the file's length (mid-line tears), or a named line boundary
CASES = [("samples.csv", 0.3), ("samples.csv", 0.62), ("samples.csv", 0.97), ("samples.csv", "after-turn0"),
         ("outputs.jsonl", 0.2), ("outputs.jsonl", 0.5), ("outputs.jsonl", 0.9), ("outputs.jsonl", "line-2")]


@pytest.mark.parametrize("name,where", CASES)
def test_torn_records_are_repaired_on_rerun(undamaged, tmp_path, name, where):
    root, clean, expected = undamaged
    run_dir = tmp_path / "run"
    shutil.copytree(clean, run_dir)
    path = run_dir / name
    text = path.read_text()
    if where == "after-turn0":
        offset = _after_turn0_of_multi(text)
    elif where == "line-2":
        offset = sum(len(line) for line in text.splitlines(keepends=True)[:2])
    else:
        offset = int(len(text) * where)
    path.write_bytes(text.encode()[:offset])
    summary = Runner().run(resolve(make_cfg(root, *ARGS), run_dir))
    assert _records(run_dir) == expected  # same keys, statuses, token ids; nothing lost or duplicated
    assert summary["repaired"] and summary["records_check"] == "ok" and summary["n_failed"] == 0
    assert summary["n_turns"] == 4


def test_a_garbled_row_in_the_middle_is_caught_by_its_crc(undamaged, tmp_path):
    root, clean, expected = undamaged
    run_dir = tmp_path / "run"
    shutil.copytree(clean, run_dir)
    lines = (run_dir / "samples.csv").read_text().splitlines(keepends=True)
    row = lines[3].split(",")
    row[4] = "tiny-llamX"  # one flipped byte, every field still parses
    lines[3] = ",".join(row)
    (run_dir / "samples.csv").write_text("".join(lines))
    summary = Runner().run(resolve(make_cfg(root, *ARGS), run_dir))
    assert _records(run_dir) == expected
    assert any("garbled" in r for r in summary["repaired"])


def test_rows_written_by_an_older_version_are_kept_and_get_a_crc(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "samples.csv").write_text("sample_id,turn,repeat,status\na,0,0,error: boom\n")
    records = RecordWriter(run_dir)
    assert records.done == {("a", 0, 0)} and records.rows[0]["crc"] == row_crc(records.rows[0])
    records.close()
    assert read_rows(run_dir)[0]["crc"] == row_crc(read_rows(run_dir)[0])


@pytest.mark.slow
def test_cli_rerun_repairs_a_torn_outputs_file(tmp_path):
    args = ["bench.max_new_tokens=4", "bench.warmup=0", "task.ids=[chat-01,multi-01]", f"bench.output_dir={tmp_path}",
            "bench.progress=false", "wandb.mode=disabled"]
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    (outputs,) = tmp_path.glob("*/builtin/vanilla/*/outputs.jsonl")
    before = outputs.read_text()
    outputs.write_text(before[: len(before) // 2])  # torn mid-line: the tail generations are lost
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "records repaired" in again.stderr and "now consistent" in again.stderr
    assert sorted(before.splitlines()) == sorted(outputs.read_text().splitlines())
    summary = json.loads((outputs.parent / "summary.json").read_text())
    assert summary["repaired"] and summary["records_check"] == "ok"
    assert summary["threads"] >= 1 and summary["load_start"] is not None and summary["cpu_name"]
