"""The vanilla reference store: one JSON file per reference generation, shared across runs and written atomically
(concurrent sweep jobs cannot corrupt it). Everything that decides a reference's tokens and speed is in its key
(:func:`reference_key`: checkpoint, dtype, device, backend, prompt ids, max_new_tokens, stop ids, sampling,
versions, threads, host, engine commit), so reuse never compares against a mismatched baseline. Reusing a stored
*timing* is off by default (``bench.reuse_reference=false``: vanilla is timed beside the method, sample by sample);
when on, only a timing :func:`timing_reusable` accepts is reused (at least :data:`MIN_STORED_REPEATS` repeats within
``bench.reuse_max_spread``, taken on a machine that was not busy), and each row's ``ref_source`` says which.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from dataclasses import asdict
from pathlib import Path

import torch

from fafo.bench.records import prompt_hash, write_json_atomic


def reference_key(spec, engine, env: dict, eos, prompt: list[int], max_new: int) -> str:
    """A stable hash of everything that determines the reference generation of ``prompt`` in the run ``spec`` on
    ``engine`` (``env``: :func:`fafo.bench.timing.environment`)."""
    fields = dict(
        model=spec.ckpt.identity, dtype=spec.dtype, device=env["device_name"], backend=engine.backend,
        prompt=prompt_hash(prompt), max_new_tokens=max_new, eos=eos,
        sampling=asdict(spec.sampling), decoder=repr(spec.reference), context=spec.context,
        **({"compile": asdict(spec.compile)} if spec.compile else {}),  # eager keys stay as they were
        versions=[env["torch"], env["transformers"], env["fafo_bench"]],
        threads=torch.get_num_threads(), host=socket.gethostname(), engine_commit=env["git_sha"])
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:24]


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
    """Reference generations under ``root/<key[:2]>/<key>.json`` and a run's use of them: each (sample, turn)
    starts from a stored timing when ``reuse`` is on and :func:`timing_reusable` accepts it (else from a fresh state,
    the refusal counted in :attr:`refused`), and its interleaved timing replaces the stored one unless that one has
    more repeats and still qualifies. A damaged entry reads as absent and is rewritten: a store torn by a killed job
    heals on the next run."""

    def __init__(self, root: str | Path | None, reuse: bool = False, max_spread: float = 1.1,
                 busy_load: float = 0.75):
        self.root = Path(root) if root else None
        self.reuse, self.max_spread, self.busy_load = reuse, max_spread, busy_load
        self.refused: dict = {"n": 0, "examples": []}  # stored timings that could not be reused, and why

    def get(self, key: str) -> dict | None:
        try:
            record = json.loads((self.root / key[:2] / f"{key}.json").read_text(encoding="utf-8"))
        except (TypeError, OSError, UnicodeDecodeError, json.JSONDecodeError):  # no store, absent, or damaged
            return None
        return record if isinstance(record, dict) and isinstance(record.get("tokens"), list) else None

    def put(self, key: str, record: dict) -> None:
        if self.root is not None:
            (self.root / key[:2]).mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.root / key[:2] / f"{key}.json", record)

    def start(self, key: str) -> dict:
        """The reference state of one (sample, turn): a stored timing (``stored_ok``) when it may be reused."""
        fresh = {"tokens": None, "total_s": [], "decode_s": [], "stored": self.get(key)}
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
            self.put(key, {"tokens": ref["tokens"], "total_s": ref["total_s"], "decode_s": ref["decode_s"],
                           "peak_mem_mb": ref.get("peak_mem_mb"), **machine, "time": time.time()})
