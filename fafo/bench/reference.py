"""The vanilla reference store: one JSON file per reference generation, shared across runs.

A reference is reusable only when everything that decides its tokens and its speed is the same: the checkpoint,
dtype, device name, attention backend, the exact prompt token ids, max_new_tokens, stop ids, sampling settings
and the software versions. All of that goes into the key, so reuse can never compare against a mismatched
baseline. Files are written atomically (temp + rename), so concurrent sweep jobs cannot corrupt each other.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fafo.bench.records import write_json_atomic


def reference_key(**fields) -> str:
    """A stable hash of the fields that determine a reference generation (lists of ids are hashed too)."""
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class ReferenceStore:
    """Reads and writes reference generations under ``root/<key[:2]>/<key>.json``."""

    def __init__(self, root: str | Path | None):
        self.root = Path(root) if root else None

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        if self.root is None:
            return None
        path = self._path(key)
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def put(self, key: str, record: dict) -> None:
        if self.root is None:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, record)
