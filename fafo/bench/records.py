"""Run records: ``samples.csv`` (one row per sample, turn and timing repeat) and ``outputs.jsonl`` (one line per
sample and turn), written by :class:`RecordWriter` and read by everything that reads a run (:func:`read_rows`,
:func:`read_outputs`). Rows are appended and fsynced one by one, each with a ``crc`` (CRC-32 of its other fields),
so a torn or garbled line is detectable anywhere in the file; an output line is valid JSON with its keys or torn.
An output line (:func:`output_line`) holds the method's tokens, text, accept lengths, forwards by kind and decode
forwards (``forward_log``; the reference's in ``ref_forward_log``), the prompt (``prompt_sha256``, the hash the
reference store keys on; ``prompt_ids`` up to :data:`PROMPT_IDS_MAX` tokens; ``prompt_head`` and ``prompt_tail``
decoded with special tokens, the whole prompt up to 256 tokens) and vanilla's answer (``ref_tokens``, ``ref_text``),
so a mismatch reads side by side with its prompt (``fafo.bench.tools.diff``; older runs lack them).
On resume the two files are reconciled per (sample, turn, repeat) before anything runs: torn lines are dropped; an
``ok`` row without its output, and an output without its ``ok`` row, are both redone (the output is written first);
a duplicated row keeps its first copy; a ``skipped: turn k failed`` row whose failed turn is gone is redone. The
repaired files replace the old ones by rename, and :meth:`RecordWriter.check` is the final consistency check.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import json
import os
import sys
import zlib
from dataclasses import asdict
from pathlib import Path

from fafo.errors import ConfigError

SAMPLE_COLUMNS = [
    "sample_id", "turn", "repeat", "category", "model", "method", "task",
    "prompt_tokens", "new_tokens", "forwards", "tau", "tau_with_prefill", "tau_all", "mean_accept",
    "prefill_forwards", "draft_forwards", "aux_forwards", "target_forwards", "target_tokens",
    "draft_model_forwards", "draft_model_params", "drafted", "accepted",
    "prefill_s", "decode_s", "total_s", "tokens_per_s", "verify_ms", "host_ms", "peak_mem_mb", "ref_peak_mem_mb",
    "mem_overhead_mb", "ref_new_tokens", "ref_total_s", "ref_decode_s", "eager_ref_total_s", "eager_ref_decode_s",
    "aa_total_s", "aa_decode_s", "speedup", "speedup_e2e", "speedup_decode",
    "exact_match", "first_mismatch", "mismatch_kind", "mismatch_gap",
    "ref_source", "seed", "compiles", "threads", "load", "status", "crc",
]
OUTPUT_KEYS = ("sample_id", "turn", "tokens", "text")
SKIPPED = "skipped: turn "
PROMPT_IDS_MAX = 8192  # ids stored in full up to this many prompt tokens (~50 KB of JSON a line)
HEAD_TOKENS = 64
TAIL_TOKENS = 192


def row_key(sample_id, turn, repeat) -> tuple[str, int, int]:
    """A row's key in its run: (sample id, turn, repeat)."""
    return str(sample_id), int(turn), int(repeat)


def turn_key(row: dict) -> tuple[str, int]:
    """The (sample id, turn) a row or an output line belongs to (its repeats share it)."""
    return str(row["sample_id"]), int(float(row["turn"]))


def read_rows(path: str | Path, repairs: list[str] | None = None) -> list[dict]:
    """The whole rows of a ``samples.csv`` under its own header (a run of an older version keeps its columns):
    a torn last line (a killed run), a garbled row and one whose ``crc`` does not match its fields are left out and
    counted in ``repairs``. Missing file: no rows."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, newline="", errors="replace") as f:  # garbage bytes: garbled rows, dropped
        text = f.read().replace("\0", "\ufffd")  # (csv refuses NUL bytes)
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):  # killed mid-line
        _said(repairs, f"samples.csv: dropped a torn last line ({len(lines[-1])} bytes)")
        lines = lines[:-1]
    reader = csv.DictReader(lines)
    header = reader.fieldnames or []
    rows, bad = [], 0
    for r in reader:
        if None in r or not r.get("status") or ("crc" in header and r.get("crc") != row_crc(r, header)):
            bad += 1  # garbled, too many fields, or a crc mismatch
            continue
        rows.append(r)
    if bad:
        _said(repairs, f"samples.csv: dropped {bad} torn or garbled rows")
    return rows


def read_outputs(path: str | Path, repairs: list[str] | None = None) -> dict[tuple[str, int], dict]:
    """The whole lines of an ``outputs.jsonl`` by (sample id, turn), the first of each kept: a torn last line, a
    garbled one or one without its keys is left out and counted in ``repairs``. Missing file: none."""
    path, out, bad = Path(path), {}, 0
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
            if (i == len(lines) - 1 and not text.endswith("\n")) or not all(k in rec for k in OUTPUT_KEYS):
                raise ValueError
            key = (str(rec["sample_id"]), int(rec["turn"]))
        except (ValueError, TypeError):
            bad += 1
            continue
        out.setdefault(key, rec)
    if bad:
        _said(repairs, f"outputs.jsonl: dropped {bad} torn or garbled lines")
    return out


def _said(repairs: list[str] | None, line: str) -> None:
    if repairs is not None:
        repairs.append(line)


def row_crc(row: dict, columns: list[str] = SAMPLE_COLUMNS) -> str:
    """CRC-32 (8 hex digits) of a row's fields as written under ``columns`` (its file's header), ``crc``
    excluded."""
    blob = "\x1f".join(str(row.get(c, "")) for c in columns if c != "crc")
    return f"{zlib.crc32(blob.encode()):08x}"


def _as_written(row: dict, columns: list[str] = SAMPLE_COLUMNS) -> dict:
    """The row as csv writes it under ``columns`` (strings, None -> ''), with its crc."""
    out = {c: "" if row.get(c) is None else str(row.get(c, "")) for c in columns if c != "crc"}
    out["crc"] = row_crc(out, columns)
    return out


def check_lock_free(run_dir: str | Path) -> None:
    """Raise ConfigError now (before a model loads) if another job holds ``run_dir``'s writer lock."""
    if (Path(run_dir) / ".lock").exists():
        with open(Path(run_dir) / ".lock") as f:
            _lock(f, run_dir)
            fcntl.flock(f, fcntl.LOCK_UN)


def _lock(f, run_dir) -> None:
    try:  # one writer per run directory; sweep jobs write to their own directories
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ConfigError(f"run directory {run_dir} is being written by another job; wait for it to finish "
                          "(re-running resumes it) or set bench.output_dir elsewhere") from None


class RecordWriter:
    """Appends rows to ``samples.csv`` and generations to ``outputs.jsonl`` in a run directory (one writer).
    ``extra``: columns after today's (a batched run's, :data:`fafo.bench.batch_run.BATCH_COLUMNS`), before ``crc``."""

    def __init__(self, run_dir: str | Path, extra: tuple[str, ...] | list[str] = ()):
        self.columns = columns = SAMPLE_COLUMNS[:-1] + list(extra) + SAMPLE_COLUMNS[-1:]
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.dir / ".lock", "w")
        _lock(self._lock, self.dir)
        self.samples_path, self.outputs_path = self.dir / "samples.csv", self.dir / "outputs.jsonl"
        self.repairs: list[str] = []
        rows = read_rows(self.samples_path, self.repairs)
        rewrite_csv = bool(self.repairs) or (self.samples_path.exists() and not rows) or any(
            list(r) != columns for r in rows[:1])  # torn, or written by an older version: today's columns
        rows = [_as_written(r, columns) if list(r) != columns else r for r in rows]
        n_repairs = len(self.repairs)
        outputs = read_outputs(self.outputs_path, self.repairs)
        rewrite_jsonl = len(self.repairs) > n_repairs
        self.rows, self.outputs, changed = self._reconcile(rows, outputs)
        if rewrite_csv or changed:
            self.rewrite(self.samples_path, _csv_text(self.rows, columns))
        if rewrite_jsonl or changed:
            self.rewrite(self.outputs_path, "".join(json.dumps(o) + "\n" for o in self.outputs.values()))
        new = not self.samples_path.exists()
        self._csv = open(self.samples_path, "a", newline="")
        self._writer = csv.DictWriter(self._csv, fieldnames=columns, extrasaction="ignore")
        if new:
            self._writer.writeheader()
            self._flush(self._csv)
        self._jsonl = open(self.outputs_path, "a")
        if self.repairs:
            print(f"records repaired in {self.dir}: " + "; ".join(self.repairs), file=sys.stderr, flush=True)

    @property
    def done(self) -> set[tuple[str, int, int]]:
        """Keys (sample_id, turn, repeat) already recorded, failed ones included."""
        return {row_key(r["sample_id"], r["turn"], r["repeat"]) for r in self.rows}

    def output(self, sample_id, turn) -> dict | None:
        """The recorded generation of a (sample, turn), e.g. to rebuild the next turn's prompt on resume."""
        return self.outputs.get((str(sample_id), int(turn)))

    def write(self, row: dict, output: dict | None = None) -> None:
        """Append ``output`` (first, so a kill in between leaves an output alone, redone on resume) and ``row``."""
        if output is not None:
            self._jsonl.write(json.dumps(output) + "\n")
            self._flush(self._jsonl)
            self.outputs[(str(output["sample_id"]), int(output["turn"]))] = output
        row = _as_written(row, self.columns)
        self._writer.writerow(row)
        self._flush(self._csv)
        self.rows.append(row)

    def check(self, expected: set[tuple[str, int, int]]) -> list[str]:
        """Final consistency check: every expected key has a row, every ok row its output and vice versa.

        Returns the problems found (empty when the records are whole).
        """
        problems = []
        keys = [row_key(r["sample_id"], r["turn"], r["repeat"]) for r in self.rows]
        if missing := sorted(expected - set(keys)):
            problems.append(f"{len(missing)} rows missing, e.g. {missing[:3]}")
        if len(keys) != len(set(keys)):
            problems.append(f"{len(keys) - len(set(keys))} duplicated rows")
        ok = {(r["sample_id"], int(r["turn"])) for r in self.rows if r["status"] == "ok"}
        if lonely := sorted(ok - set(self.outputs)):
            problems.append(f"{len(lonely)} ok rows without an output, e.g. {lonely[:3]}")
        if orphans := sorted(set(self.outputs) - ok):
            problems.append(f"{len(orphans)} outputs without an ok row, e.g. {orphans[:3]}")
        return problems

    def finish(self, expected: set[tuple[str, int, int]]) -> list[str]:
        """:meth:`check`, said on stderr when anything was repaired or is amiss, and :meth:`close`."""
        problems = self.check(expected)
        self.close()
        if self.repairs or problems:
            print(f"records check of {self.dir}: "
                  + (f"repaired on resume ({'; '.join(self.repairs)}); " if self.repairs else "")
                  + ("; ".join(problems) if problems else
                     f"now consistent ({len(self.rows)} rows, {len(self.outputs)} outputs)"), file=sys.stderr,
                  flush=True)
        return problems

    def close(self) -> None:
        self._csv.close()
        self._jsonl.close()
        self._lock.close()  # releases the flock

    @staticmethod
    def _flush(f) -> None:
        f.flush()
        os.fsync(f.fileno())

    @staticmethod
    def rewrite(path: Path, text: str) -> None:
        """Replace ``path``'s content whole (a temporary file renamed over it: never half-rewritten)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _reconcile(self, rows: list[dict], outputs: dict[tuple, dict]) -> tuple[list[dict], dict, bool]:
        """Rows and outputs that agree per (sample, turn, repeat); see the module docstring."""
        seen, kept = set(), []
        for r in rows:  # duplicates: keep the first
            key = row_key(r["sample_id"], r["turn"], r["repeat"])
            if key not in seen:
                seen.add(key)
                kept.append(r)
        if len(kept) < len(rows):
            self.repairs.append(f"samples.csv: dropped {len(rows) - len(kept)} duplicated rows")
        ok = {(r["sample_id"], int(r["turn"])) for r in kept if r["status"] == "ok"}
        lonely = [r for r in kept if r["status"] == "ok" and (r["sample_id"], int(r["turn"])) not in outputs]
        if lonely:
            ids = sorted({f"{r['sample_id']}/turn {r['turn']}" for r in lonely})
            self.repairs.append(f"{len(lonely)} rows without their output, redone: {', '.join(ids[:5])}")
        orphans = [k for k in outputs if k not in ok]
        if orphans:
            ids = sorted(f"{s}/turn {t}" for s, t in orphans)
            self.repairs.append(f"{len(orphans)} outputs without their row, redone: {', '.join(ids[:5])}")
        drop = {id(r) for r in lonely}
        kept = [r for r in kept if id(r) not in drop]
        outputs = {k: v for k, v in outputs.items() if k not in orphans}
        failed = {(r["sample_id"], int(r["turn"])) for r in kept
                  if r["status"] != "ok" and not r["status"].startswith(SKIPPED)}
        stale = [r for r in kept if r["status"].startswith(SKIPPED)
                 and not any((r["sample_id"], t) in failed for t in range(int(r["turn"])))]
        if stale:
            self.repairs.append(f"{len(stale)} 'skipped' rows whose failed turn is gone, redone")
            drop = {id(r) for r in stale}
            kept = [r for r in kept if id(r) not in drop]
        return kept, outputs, bool(lonely or orphans or stale or len(kept) < len(rows))


def _csv_text(rows: list[dict], columns: list[str] = SAMPLE_COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def first_mismatch(a: list[int], b: list[int]) -> int:
    """Index of the first differing token of two generations (a length difference counts), or -1 if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def compact(records) -> list[list]:
    """A generation's decode forwards (prefill excluded) grouped by everything but the prefix, as ``outputs.jsonl``
    keeps them: ``[kind, tokens, region_rows, region_len, share, count, prefix_sum, prefix_min, prefix_max]``."""
    groups: dict[tuple, list] = {}
    for r in records:
        if r.kind == "prefill":
            continue
        key = (r.kind, r.tokens, r.region_rows, r.region_len, round(r.share, 4))
        g = groups.setdefault(key, [*key, 0, 0, r.prefix, r.prefix])
        g[5], g[6], g[7], g[8] = g[5] + 1, g[6] + r.prefix, min(g[7], r.prefix), max(g[8], r.prefix)
    return list(groups.values())


def write_json_atomic(path: str | Path, obj) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    os.replace(tmp, path)


def prompt_hash(prompt: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt).encode()).hexdigest()


def prompt_fields(tokenizer, prompt: list[int]) -> dict:
    """The prompt's fields of an output line (module docstring)."""
    head = prompt[:HEAD_TOKENS]
    tail = prompt[max(HEAD_TOKENS, len(prompt) - TAIL_TOKENS):]
    return {"prompt_sha256": prompt_hash(prompt), "prompt_ids": list(prompt) if len(prompt) <= PROMPT_IDS_MAX else None,
            "prompt_head": tokenizer.decode(head), "prompt_tail": tokenizer.decode(tail) if tail else ""}


def reference_fields(tokenizer, ref_tokens: list[int] | None) -> dict:
    """Vanilla's answer of an output line (module docstring)."""
    if ref_tokens is None:
        return {"ref_tokens": None, "ref_text": None}
    return {"ref_tokens": list(ref_tokens), "ref_text": tokenizer.decode(ref_tokens, skip_special_tokens=True)}


def output_line(tokenizer, sample_id, turn: int, prompt: list[int], gen, log: list, ref: dict) -> dict:
    """The output line of a (sample, turn): the method's Generation ``gen`` and forward ``log``, the reference's
    state ``ref`` (its tokens and forward log)."""
    return {"sample_id": str(sample_id), "turn": turn, "prompt_tokens": len(prompt), "tokens": gen.tokens,
            "text": tokenizer.decode(gen.tokens, skip_special_tokens=True), "accept_lengths": gen.accept_lengths,
            "forwards": asdict(gen.forwards), "draft_model_forwards": gen.draft_model_forwards,
            "drafted": gen.drafted, "accepted": gen.accepted, "extras": gen.extras, "forward_log": log,
            "ref_forward_log": ref.get("forward_log"), **prompt_fields(tokenizer, prompt),
            **reference_fields(tokenizer, ref["tokens"])}
