"""The vanilla reference store: one JSON file per reference generation, shared across runs.

A reference is reusable only when everything that decides its tokens and its speed is the same: the checkpoint,
dtype, device name, attention backend, the exact prompt token ids, max_new_tokens, stop ids, sampling settings,
the software versions, torch's thread count, the host and the engine's git commit. All of that goes into the key
(:func:`run_reference_key`), so reuse can never compare against a mismatched baseline.
Files are written atomically (temp + rename), so concurrent sweep jobs cannot corrupt each other.

Reusing a stored reference's *timing* is off by default (``bench.reuse_reference=false``): the reference is then
timed in the same process, interleaved with the method sample by sample, so both see the same machine. With
``bench.reuse_reference=true`` a stored timing is reused only when :func:`timing_reusable` accepts it: at least
:data:`MIN_STORED_REPEATS` repeats whose max/min stays within ``bench.reuse_max_spread`` (1.1), taken on a machine
that was not busy; otherwise the reference is timed again, interleaved, and the row's ``ref_source`` says which.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from dataclasses import asdict
from pathlib import Path

import torch

from fafo.bench.records import write_json_atomic


def reference_key(**fields) -> str:
    """A stable hash of the fields that determine a reference generation (lists of ids are hashed too)."""
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def run_reference_key(spec, engine, env: dict, eos, prompt: list[int], max_new: int) -> str:
    """The key of the reference generation of ``prompt`` in the run ``spec`` on ``engine`` (``env``:
    :func:`fafo.bench.timing.environment`)."""
    return reference_key(
        model=spec.ckpt.identity, dtype=spec.dtype, device=env["device_name"], backend=engine.backend,
        prompt=hashlib.sha256(json.dumps(prompt).encode()).hexdigest(), max_new_tokens=max_new, eos=eos,
        sampling=asdict(spec.sampling), decoder=repr(spec.reference), context=spec.context,
        **({"compile": asdict(spec.compile)} if spec.compile else {}),  # eager keys stay as they were
        versions=[env["torch"], env["transformers"], env["fafo_bench"]],
        threads=torch.get_num_threads(), host=socket.gethostname(), engine_commit=env["git_sha"])


MIN_STORED_REPEATS = 3


def timing_reusable(record: dict, max_spread: float, busy_load: float) -> tuple[bool, str]:
    """Whether a stored reference timing may stand in for an interleaved one, and why not when it may not."""
    times = [t for t in record.get("total_s", []) if t and t > 0]
    if len(times) < MIN_STORED_REPEATS:
        return False, f"stored with {len(times)} repeats (< {MIN_STORED_REPEATS})"
    spread = max(times) / min(times)
    if spread > max_spread:
        return False, f"stored repeats spread {spread:.2f}x (> bench.max_spread={max_spread})"
    load, cores = record.get("load"), record.get("cpu_count") or 1
    if load is not None and load / cores > busy_load:
        return False, f"stored on a busy machine (load {load:.2f} on {cores} cores)"
    return True, ""


class ReferenceStore:
    """Reads and writes reference generations under ``root/<key[:2]>/<key>.json``.

    A damaged entry (empty, truncated, garbage, not a record) reads as absent: its reference is generated again
    and the entry rewritten, so a store torn by a killed job heals on the next run. ``bench.reference_dir`` itself
    is checked before anything loads (:func:`fafo.bench.settings.check_config`)."""

    def __init__(self, root: str | Path | None):
        self.root = Path(root) if root else None

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        if self.root is None:
            return None
        path = self._path(key)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):  # absent, or damaged: timed again, rewritten
            return None
        return record if isinstance(record, dict) and isinstance(record.get("tokens"), list) else None

    def put(self, key: str, record: dict) -> None:
        if self.root is None:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, record)


class ReferenceTimings:
    """A run's use of the store: each (sample, turn) starts from a stored timing when ``reuse`` is on and
    :func:`timing_reusable` accepts it (else from a fresh state, the refusal counted in :attr:`refused`), and its
    interleaved timing replaces the stored one unless that one has more repeats and still qualifies."""

    def __init__(self, store: ReferenceStore, reuse: bool, max_spread: float, busy_load: float):
        self.store, self.reuse, self.max_spread, self.busy_load = store, reuse, max_spread, busy_load
        self.refused: dict = {"n": 0, "examples": []}  # stored timings that could not be reused, and why

    def start(self, key: str) -> dict:
        """The reference state of one (sample, turn): a stored timing (``stored_ok``) when it may be reused."""
        fresh = {"tokens": None, "total_s": [], "decode_s": [], "stored": self.store.get(key)}
        stored = fresh["stored"]
        if not self.reuse or stored is None:
            return fresh
        ok, why = timing_reusable(stored, self.max_spread, self.busy_load)
        if not ok:
            self.refused["n"] += 1
            self.refused["examples"] = (self.refused["examples"] + [why])[:3]
            return fresh
        return {**stored, "stored_ok": True}

    def keep(self, key: str, ref: dict, machine: dict) -> None:
        """Store ``ref`` (with ``machine``: device, load, cpu_count, threads) when it is at least as good as what
        the store holds."""
        old = ref.get("stored")
        keep_old = old is not None and len(old.get("total_s", [])) > len(ref["total_s"]) and timing_reusable(
            old, self.max_spread, self.busy_load)[0]
        if not keep_old:
            self.store.put(key, {"tokens": ref["tokens"], "total_s": ref["total_s"], "decode_s": ref["decode_s"],
                                 "peak_mem_mb": ref.get("peak_mem_mb"), **machine, "time": time.time()})
