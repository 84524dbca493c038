"""Reading a task's records from the Hugging Face hub or from local release files.

:class:`DataTask` is the base of every task that reads a public data set. It reads from ``hub_id`` (with
``hub_config``, ``split``, ``revision``) through ``datasets.load_dataset`` by default, and from a local
release when ``task.data_path`` is set:

* a **file**: ``.jsonl``, ``.json`` (a JSON array, one object, or JSON lines, as ``load_dataset("json")``
  accepts), ``.parquet``, ``.csv`` (pandas, ``keep_default_na=False`` so empty cells stay ``""``), each
  optionally gzipped (``.gz``, e.g. ``HumanEval.jsonl.gz``);
* a **directory** (e.g. a hub snapshot, LongBench's unzipped ``data/``, TriForce's ``data/pg19/``): the files
  matching the task's first matching glob in :attr:`DataTask.PATTERNS`, in **sorted** order (never
  ``os.listdir`` order) and read one after the other;
* a **.zip** (LongBench's ``data.zip``): the members matching the same globs, sorted.

Records are plain dicts in file order. Any failure is one :class:`~fafo.errors.ConfigError` naming
``task.data_path``: a missing, empty, truncated, binary or non-UTF-8 file (read through :mod:`fafo.files`), a
Parquet/gzip/zip file whose magic bytes or end are wrong, a directory without a matching file, or a hub data
set that cannot be loaded (offline, unknown id, a script-based repo that ``datasets >= 4`` no longer runs);
the message says which release file to download and to point ``task.data_path`` at it. ``datasets`` (the hub) and
``pyarrow`` (Parquet files) are the optional ``datasets`` extra, imported only when used.
"""

from __future__ import annotations

import csv
import fnmatch
import gzip
import io
import json
import os
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from fafo.errors import ConfigError
from fafo.extras import available, install_hint, require
from fafo.files import Source, decode_text, parse_jsonl, read_bytes, read_head
from tasks.base import Task

FORMATS = (".jsonl", ".json", ".parquet", ".csv")


def resolve_path(path: str) -> str:
    """Resolve a relative path against the original working directory when running under Hydra."""
    path = os.path.expanduser(str(path))
    try:
        from hydra.utils import to_absolute_path

        return to_absolute_path(path)
    except (ImportError, ValueError):
        return os.path.abspath(path)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _format_of(name: str) -> tuple[str, bool]:
    """(format extension, gzipped) of a file name; format '' when unsupported."""
    lower = name.lower()
    gz = lower.endswith(".gz")
    if gz:
        lower = lower[:-3]
    for ext in FORMATS:
        if lower.endswith(ext):
            return ext, gz
    return "", gz


def _parse_json(text: str, where: str, src: Source) -> list[dict]:
    """A JSON array, one object, or JSON lines (as ``load_dataset("json")`` accepts)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return parse_jsonl(text, where, src)
    return doc if isinstance(doc, list) else [doc]


DATA_SOURCE = "point task.data_path at an intact release file (download it again: an interrupted download?)"
MAGIC = {".parquet": (b"PAR1", "Parquet"), ".gz": (b"\x1f\x8b", "gzip"), ".zip": (b"PK", "zip")}


def _source(data_path: str) -> Source:
    return Source("task.data_path", str(data_path), DATA_SOURCE)


def _check_magic(data: bytes, kind: str, where: str, src: Source) -> None:
    magic, name = MAGIC[kind]
    if not data.startswith(magic):
        raise src.error(where, f"is not a {name} file (it does not start with {magic!r})")
    if kind == ".parquet" and not data.endswith(magic):
        raise src.error(where, "is truncated (a Parquet file ends with b'PAR1')")


def _check_csv_complete(text: str, where: str, src: Source) -> None:
    """A CSV cut inside its last record (no final newline, fewer fields than the header) is truncated."""
    if text.endswith(("\n", "\r")):
        return
    rows = list(csv.reader(io.StringIO(text)))
    if len(rows) > 1 and len(rows[-1]) < len(rows[0]):
        raise src.error(where, f"is truncated (its last line has {len(rows[-1])} of {len(rows[0])} fields and no "
                               "line end: an interrupted download?)")


def _read_bytes(data: bytes, name: str, where: str, src: Source | None = None) -> list[dict]:
    """Records of one file's content; ``name`` decides the format, ``where`` names it in errors."""
    src = src or _source(where)
    ext, gz = _format_of(name)
    if gz:
        _check_magic(data, ".gz", where, src)
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise src.error(where, f"is a damaged or truncated gzip file ({_one_line(exc)})") from None
    if not data.strip():
        raise src.error(where, "is empty (an interrupted download or copy?)")
    try:
        if ext == ".parquet":
            _check_magic(data, ".parquet", where, src)
            if not available("pyarrow"):
                raise src.error(where, "is a Parquet file, and reading it needs the pyarrow package",
                                install_hint("pyarrow"))
            import pyarrow.parquet as pq

            return pq.read_table(io.BytesIO(data)).to_pylist()
        if ext == ".csv":
            import pandas as pd

            text = decode_text(data, where, src)
            _check_csv_complete(text, where, src)
            frame = pd.read_csv(io.StringIO(text), keep_default_na=False)
            return frame.to_dict(orient="records")
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt parquet/csv: one clear line
        raise src.error(where, f"could not be read as {ext[1:]} ({_one_line(exc)})") from None
    text = decode_text(data, where, src)
    return parse_jsonl(text, where, src) if ext == ".jsonl" else _parse_json(text, where, src)


def read_file(path: str, src: Source | None = None) -> list[dict]:
    """Records of one local file (format from its name). Raises ConfigError when it cannot be read."""
    src = src or _source(path)
    ext, _ = _format_of(path)
    if not ext:
        raise src.error(path, "is not a .jsonl, .json, .parquet or .csv file (optionally .gz)",
                        "point task.data_path at the release file")
    records = _read_bytes(read_bytes(path, src), path, path, src)
    bad = next((r for r in records if not isinstance(r, dict)), None)
    if bad is not None:
        raise src.error(path, f"holds a {type(bad).__name__}, not JSON objects",
                        "point task.data_path at the release file with one record per object")
    return records


def match_files(names: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """The names (posix relative paths) matching the first pattern that matches any, sorted."""
    names = sorted(n for n in names if _format_of(n)[0])
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if hits:
            return hits
    return []


def read_local(data_path: str, patterns: tuple[str, ...], release: str) -> list[dict]:
    """Records from a local file, directory or zip (see the module docstring)."""
    path = resolve_path(data_path)
    shown = f"task.data_path={data_path!r}"
    src = _source(data_path)
    if not os.path.exists(path):
        raise ConfigError(f"{shown} does not exist; download {release} and point task.data_path at it")
    if os.path.isdir(path):
        root = Path(path)
        names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
        files = match_files(names, patterns)
        if not files:
            raise ConfigError(f"{shown} is a directory without a file matching {', '.join(patterns)}; "
                              f"download {release} and point task.data_path at it")
        return [r for name in files for r in read_file(str(root / name), src)]
    if path.lower().endswith(".zip"):
        _check_magic(read_head(path, src, 2), ".zip", path, src)
        try:
            with zipfile.ZipFile(path) as zf:
                members = match_files([i.filename for i in zf.infolist() if not i.is_dir()], patterns)
                if not members:
                    raise ConfigError(f"{shown} is a zip without a member matching {', '.join(patterns)}; "
                                      f"download {release} and point task.data_path at it")
                return [r for m in members for r in _read_bytes(zf.read(m), m, f"{path}:{m}", src)]
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise src.error(path, f"is a damaged or truncated zip file ({_one_line(exc)})") from None
    return read_file(path, src)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host answers a TCP connection within ``timeout`` (True when offline mode is set: then
    ``datasets`` reads its cache without network and fails fast on its own)."""
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(k, "0") not in ("0", "", "false") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return True
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def read_hub(hub_id: str, config: str | None, split: str, revision: str | None, release: str,
             note: str = "", rows: list[int] | None = None) -> tuple[list[dict], int]:
    """(records, split size) of a hub data set via ``datasets.load_dataset``; only ``rows``, if given, in order.

    Any failure is one ConfigError; rows past the end are dropped (the caller reports them).
    """
    where = f"{hub_id!r} ({f'config {config!r}, ' if config else ''}split {split!r})"
    require("datasets", f"task.data_path is not set and reading the hub dataset {where}",
            f"download {release} and point task.data_path at it")  # an optional extra; local files need none
    unreachable = not hub_reachable()
    try:
        import datasets

        if unreachable:  # no network: read the local cache at once instead of retrying for half a minute
            import huggingface_hub.constants

            datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
        ds = datasets.load_dataset(hub_id, config, split=split, revision=revision)
    except Exception as exc:  # noqa: BLE001 - offline, unknown id, script-based repo, ...: one clear line
        extra = f" ({note})" if note else ""
        extra += " (the Hugging Face hub is unreachable from here)" if unreachable else ""
        raise ConfigError(
            f"task.data_path is not set and the hub dataset {where} could not be loaded ({_one_line(exc)}){extra}; "
            f"download {release} and point task.data_path at it (or set task.hub_id to a copy you can reach)"
        ) from None
    total = len(ds)
    if rows is not None:
        ds = ds.select([r for r in rows if r < total])
    return ds.to_list(), total


@dataclass
class DataTask(Task):
    """A task over a public data set: the hub by default, ``data_path`` (file, directory, zip) when given.

    Args:
        hub_id: Hugging Face dataset id read when ``data_path`` is null.
        hub_config: its configuration (subset) name, or null.
        split: the split to read (also picks files like ``{split}-*.parquet`` in a snapshot directory).
        revision: hub revision (branch, tag or commit), or null for the default branch.
    """

    hub_id: str = ""
    hub_config: str | None = None
    split: str = "test"
    revision: str | None = None

    # What to download, named in errors (file and where it comes from).
    RELEASE: ClassVar[str] = "the task's release file"
    # Globs (relative posix paths; ``{split}``/``{subset}`` filled in) picking files in a data_path directory or
    # zip: the first glob with a match wins.
    PATTERNS: ClassVar[tuple[str, ...]] = ("*{split}-*.parquet", "*{split}/*.parquet", "*.jsonl", "*.json", "*.csv")
    # Extra words for hub errors (e.g. that the canonical repo is script-based and which mirror is used).
    HUB_NOTE: ClassVar[str] = ""

    def patterns(self) -> tuple[str, ...]:
        fields = {"split": self.split, "subset": getattr(self, "subset", "")}
        return tuple(p.format(**fields) for p in self.PATTERNS)

    def release(self) -> str:
        return self.RELEASE.format(split=self.split, subset=getattr(self, "subset", ""))

    def records(self, rows: list[int] | None = None, setting: str = "task.indices") -> list[dict]:
        """Every record of the source in order, or only the record at each of ``rows`` (see the module docstring).

        Raises:
            ConfigError: the source cannot be read, is empty, or lacks one of ``rows`` (named as ``setting``).
        """
        if self.data_path:
            records = read_local(str(self.data_path), self.patterns(), self.release())
            total = len(records)
            if rows is not None:
                records = [records[r] for r in rows if r < total]
        else:
            if not self.hub_id:
                raise ConfigError(f"task {self.name!r} has neither task.data_path nor task.hub_id; download "
                                  f"{self.release()} and point task.data_path at it")
            records, total = read_hub(self.hub_id, self.hub_config, self.split, self.revision, self.release(),
                                      self.HUB_NOTE.format(subset=getattr(self, "subset", "")), rows)
        if rows is not None and len(records) < len(rows):
            missing = [r for r in rows if r >= total]
            raise ConfigError(f"{setting} has rows {missing[:5]} past the end of {self.source()}; use the full "
                              f"{self.split} split or set {setting} to rows it has")
        if not records:
            raise ConfigError(f"task {self.name!r}: {self.source()} has no records; point task.data_path at "
                              f"{self.release()}")
        return records

    def source(self) -> str:
        """Where the records come from, for messages."""
        return f"task.data_path={self.data_path!r}" if self.data_path else f"hub dataset {self.hub_id!r}"

    def value(self, record: dict, index: int, *names: str, default: Any = ConfigError) -> Any:
        """The first of ``names`` present in ``record`` (the ``index``-th); ConfigError naming the source if none."""
        for name in names:
            if name in record and record[name] is not None:
                return record[name]
        if default is not ConfigError:
            return default
        raise ConfigError(
            f"task {self.name!r}: record {index} of {self.source()} has no field {' or '.join(map(repr, names))} "
            f"(fields: {', '.join(sorted(map(str, record))[:12])}); point task.data_path at {self.release()}"
        )

    def bad_record(self, index: int, problem: str) -> ConfigError:
        """A ConfigError for a malformed record (``problem`` says what is wrong with it)."""
        return ConfigError(f"task {self.name!r}: record {index} of {self.source()} {problem}; point "
                           f"task.data_path at {self.release()}")


def str_list(value: Any) -> list[str] | None:
    """``value`` as a list of str if it is a non-empty list of str (or a numpy array of them), else None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)
    return None
