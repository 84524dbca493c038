"""Run records: ``samples.csv`` (one row per sample, turn and timing repeat) and ``outputs.jsonl``.

Rows are appended and flushed as they are produced, so a killed run loses nothing it wrote; a restarted run reads
what is there and skips it. A half-written last line (killed mid-write) is dropped on resume.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
from pathlib import Path

from fafo.errors import ConfigError

SAMPLE_COLUMNS = [
    "sample_id", "turn", "repeat", "category", "model", "method", "task",
    "prompt_tokens", "new_tokens", "forwards", "tau", "mean_accept",
    "prefill_s", "decode_s", "total_s", "tokens_per_s", "peak_mem_mb",
    "ref_new_tokens", "ref_total_s", "ref_decode_s", "speedup",
    "exact_match", "first_mismatch", "ref_source", "seed", "compiles", "status",
]


def row_key(sample_id, turn, repeat) -> tuple[str, int, int]:
    return str(sample_id), int(turn), int(repeat)


class RecordWriter:
    """Appends rows to ``samples.csv`` and generations to ``outputs.jsonl`` in a run directory."""

    def __init__(self, run_dir: str | Path):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.dir / ".lock", "w")
        try:  # one writer per run directory; sweep jobs write to their own directories
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise ConfigError(f"run directory {self.dir} is being written by another job; wait for it to finish "
                              "(re-running resumes it) or set bench.output_dir elsewhere") from None
        self.samples_path = self.dir / "samples.csv"
        self.outputs_path = self.dir / "outputs.jsonl"
        self.rows: list[dict] = self._read_rows()
        self.outputs: dict[tuple, dict] = self._read_outputs()
        self._rewrite_if_torn()
        new = not self.samples_path.exists()
        self._csv = open(self.samples_path, "a", newline="")
        self._writer = csv.DictWriter(self._csv, fieldnames=SAMPLE_COLUMNS, extrasaction="ignore")
        if new:
            self._writer.writeheader()
            self._flush(self._csv)
        self._jsonl = open(self.outputs_path, "a")

    @property
    def done(self) -> set[tuple[str, int, int]]:
        """Keys (sample_id, turn, repeat) already recorded, failed ones included."""
        return {row_key(r["sample_id"], r["turn"], r["repeat"]) for r in self.rows}

    def output(self, sample_id, turn) -> dict | None:
        """The recorded generation of a (sample, turn), e.g. to rebuild the next turn's prompt on resume."""
        return self.outputs.get((str(sample_id), int(turn)))

    def write(self, row: dict, output: dict | None = None) -> None:
        if output is not None:
            self._jsonl.write(json.dumps(output) + "\n")
            self._flush(self._jsonl)
            self.outputs[(str(output["sample_id"]), int(output["turn"]))] = output
        self._writer.writerow(row)
        self._flush(self._csv)
        self.rows.append({k: row.get(k, "") for k in SAMPLE_COLUMNS})

    def close(self) -> None:
        self._csv.close()
        self._jsonl.close()
        self._lock.close()  # releases the flock

    @staticmethod
    def _flush(f) -> None:
        f.flush()
        os.fsync(f.fileno())

    def _read_rows(self) -> list[dict]:
        if not self.samples_path.exists():
            return []
        with open(self.samples_path, newline="") as f:
            text = f.read()
        self._torn_csv = bool(text) and not text.endswith("\n")
        lines = text.splitlines(keepends=True)
        if self._torn_csv:
            lines = lines[:-1]
        reader = csv.DictReader(lines)
        return [r for r in reader if r.get("status")]

    def _read_outputs(self) -> dict[tuple, dict]:
        out = {}
        self._torn_jsonl = False
        if self.outputs_path.exists():
            for line in self.outputs_path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    self._torn_jsonl = True
                    continue
                out[(str(rec["sample_id"]), int(rec["turn"]))] = rec
        return out

    def _rewrite_if_torn(self) -> None:
        if getattr(self, "_torn_csv", False):
            with open(self.samples_path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=SAMPLE_COLUMNS, extrasaction="ignore")
                w.writeheader()
                w.writerows(self.rows)
        if self._torn_jsonl:
            with open(self.outputs_path, "w") as f:
                f.writelines(json.dumps(o) + "\n" for o in self.outputs.values())


def first_mismatch(a: list[int], b: list[int]) -> int:
    """Index of the first differing token of two generations (a length difference counts), or -1 if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def write_json_atomic(path: str | Path, obj) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)
