"""Every file the harness reads, opened and checked before a model loads or a clock starts.

Interrupted downloads, partial copies and the wrong file in the right place are the usual ways a benchmark run
meets a damaged file; each of them here is one :class:`~fafo.errors.ConfigError` line naming the setting that led
to the file, the file, what is wrong with it and the fix (``error: model.path='ckpt': ckpt/model.safetensors is
truncated ...; re-download the checkpoint``), never a traceback from a parser deep in a loader.

The cases every reader refuses: a missing file, an empty one, a directory where a file belongs, a truncated one
(safetensors: the tensors' byte ranges in the header against the file size; zip, gzip and Parquet: their own end
markers; GGUF: its fixed header), binary garbage or another encoding where UTF-8 text belongs, the wrong format
(a JSON list where an object belongs, a CSV named ``.parquet``), and a checkpoint directory with pieces missing
(weights without a tokenizer, an index naming a shard that is not there).

Weights are checked by reading the safetensors header (an 8-byte little-endian length, then that many bytes of
JSON: ``{name: {dtype, shape, data_offsets: [begin, end]}}``, offsets relative to the end of the header), never by
loading them: a 16 GB checkpoint is checked in milliseconds. The same headers tell weights of another model in the
right place (:func:`fafo.engine.loader.check_weights_match`, which knows the tensors a config needs).

Who calls what: :func:`fafo.engine.loader.open_checkpoint` (``model.path``, ``model.gguf_file``, the tiny models and
TriForce's ``method.draft``), :func:`baselines.longspec_draft.resolve_draft` (``method.draft.path``),
:mod:`tasks.sources` and :mod:`tasks.prompts` (``task.data_path``), :class:`fafo.bench.tools.cost_curve.CostCurve`
(``bench.cost_curve``), :func:`baselines.sam_decoding.read_corpus` (``method.corpus_path``) and
:func:`fafo.bench.settings.check_config` (``bench.reference_dir``); all of them run before a model loads.
"""

from __future__ import annotations

import json
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fafo.errors import ConfigError


@dataclass(frozen=True)
class Source:
    """Where a file came from, for the error line: the setting (``model.path``), its value as typed, the fix."""

    setting: str
    given: str
    fix: str

    def error(self, file, what: str, fix: str | None = None) -> ConfigError:
        """``<setting>=<given>: <file> <what>; <fix>`` (the file left out when it is the given path itself)."""
        head = f"{self.setting}={self.given!r}"
        name = str(file)
        same = name in (self.given, str(Path(self.given).expanduser()))
        body = f"{head} {what}" if same else f"{head}: {name} {what}"
        return ConfigError(f"{body}; {fix or self.fix}")


def check_file(file, src: Source, *, empty_ok: bool = False) -> int:
    """The size of a file that exists, is not a directory, can be opened and (unless ``empty_ok``) is not empty."""
    path = Path(file)
    if not path.exists():
        raise src.error(path, "does not exist")
    if path.is_dir():
        raise src.error(path, "is a directory, not a file")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise src.error(path, f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    size = path.stat().st_size
    if not size and not empty_ok:
        raise src.error(path, "is empty (an interrupted download or copy?)")
    return size


def read_head(file, src: Source, n: int) -> bytes:
    """The first ``n`` bytes of a checked file (large binaries are never read whole)."""
    check_file(file, src)
    with open(file, "rb") as f:
        return f.read(n)


def read_bytes(file, src: Source, *, empty_ok: bool = False) -> bytes:
    """The bytes of a checked file (see :func:`check_file`)."""
    check_file(file, src, empty_ok=empty_ok)
    return Path(file).read_bytes()


# bytes that text files do not hold (controls other than tab, line ends and form feed): their presence says binary
_BINARY = bytes(set(range(32)) - {9, 10, 12, 13})


def decode_text(data: bytes, file, src: Source) -> str:
    """UTF-8 text of ``data`` (a BOM is dropped): binary garbage and other encodings are one line each."""
    head = data[:1 << 16]
    if b"\0" in head or sum(head.count(b) for b in _BINARY) > len(head) // 100:
        raise src.error(file, "is binary, not text (control bytes such as NUL: a wrong or damaged file)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise src.error(file, f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}: another "
                              "encoding, or damaged)", f"save it as UTF-8, or {src.fix}") from None


def read_text(file, src: Source, *, empty_ok: bool = False) -> str:
    """A UTF-8 text file (see :func:`read_bytes` and :func:`decode_text`)."""
    return decode_text(read_bytes(file, src, empty_ok=empty_ok), file, src)


def parse_json(text: str, file, src: Source, kind: type | None = dict):
    """``json.loads(text)``, refusing invalid JSON and (with ``kind``) a document of another type."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise src.error(file, f"is not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
    if kind is not None and not isinstance(doc, kind):
        want = "a JSON object" if kind is dict else f"a JSON {kind.__name__}"
        raise src.error(file, f"holds a JSON {type(doc).__name__}, not {want}")
    return doc


def read_json(file, src: Source, kind: type | None = dict):
    """A UTF-8 JSON file holding a ``kind`` (object by default)."""
    return parse_json(read_text(file, src), file, src, kind)


def parse_jsonl(text: str, file, src: Source) -> list:
    """One JSON value per non-blank line; a bad line is named by its number."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise src.error(f"{file}:{lineno}", f"is not valid JSON ({exc.msg})") from None
    return out


# bytes per element of the safetensors dtypes (an unknown dtype is not size-checked)
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
                      "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own limit


def check_safetensors(file, src: Source) -> dict:
    """The tensor table of a safetensors file, checked against the file size without reading the tensors."""
    path = Path(file)
    size = check_file(path, src)
    if size < 8:
        raise src.error(path, f"is truncated ({size} bytes, not even a safetensors header length)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_SAFETENSORS_HEADER:
            raise src.error(path, "is not a safetensors file (its first 8 bytes do not give a header length)")
        if 8 + n > size:
            raise src.error(path, f"is truncated inside its header ({size} bytes, the header alone needs {8 + n})")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise src.error(path, "is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise src.error(path, "is not a safetensors file (its header is not a JSON object)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in info["data_offsets"])
            count = 1
            for d in info["shape"]:
                count *= int(d)
            width = SAFETENSORS_DTYPES.get(info["dtype"])
        except (TypeError, KeyError, ValueError):
            raise src.error(path, f"is not a safetensors file (tensor {name!r} has no dtype/shape/offsets)") from None
        if stop < begin or (width is not None and stop - begin != count * width):
            raise src.error(path, f"is damaged (tensor {name!r} declares {stop - begin} bytes for shape "
                                  f"{list(info['shape'])} of {info['dtype']})")
        end = max(end, stop)
    if 8 + n + end > size:
        raise src.error(path, f"is truncated ({size} bytes; its header declares {8 + n + end}: an interrupted "
                              "download or copy)")
    return header


def check_torch_bin(file, src: Source) -> None:
    """A ``pytorch_model*.bin``: a zip archive (``torch.save``) whose directory is intact, or a legacy pickle."""
    path = Path(file)
    data = read_head(path, src, 2)
    if data[:1] == b"\x80":  # legacy pickle: only its first byte can be checked without unpickling
        return
    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, OSError):
        what = "is truncated" if data == b"PK" else "is not a PyTorch weights file"
        raise src.error(path, f"{what} (no intact torch.save archive)") from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
              "generation_config.json", "chat_template.json", "vocab.json")
TEXT_FILES = ("chat_template.jinja", "merges.txt", "vocab.txt")
BINARY_FILES = ("tokenizer.model", "spiece.model")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def weight_files(ckpt, src: Source) -> list[Path]:
    """The weight files of a checkpoint directory (the shards an index names, or the single file), each checked."""
    ckpt = Path(ckpt)
    for index_name in WEIGHT_INDEXES:
        index = ckpt / index_name
        if index.exists():
            weight_map = read_json(index, src).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise src.error(index, "has no weight_map (not a sharded-weights index)")
            files = [ckpt / s for s in sorted(set(map(str, weight_map.values())))]
            break
    else:
        files = [ckpt / name for name in WEIGHTS if (ckpt / name).exists()][:1]
    if not files:
        raise src.error(ckpt, "has no model.safetensors / pytorch_model.bin weights (nor a sharded index)",
                        "copy the weights too, or re-download the checkpoint")
    for f in files:
        if f.suffix == ".safetensors":
            check_safetensors(f, src)
        else:
            check_torch_bin(f, src)
    return files


def check_checkpoint(ckpt, src: Source, *, tokenizer: bool = True, weights: bool = True) -> dict:
    """A Hugging Face checkpoint directory: config, weights, tokenizer and generation files. Returns config.json.

    Every JSON file present is parsed and every text file decoded; a tokenizer (``tokenizer.json``,
    ``tokenizer.model`` or a vocabulary) is required when ``tokenizer`` is set (drafts sharing the target's
    tokenizer need none).
    """
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        raise src.error(ckpt, "is not a directory")
    config = read_json(ckpt / "config.json", src)
    if weights:
        weight_files(ckpt, src)
    for name in JSON_FILES:
        if (ckpt / name).exists():
            read_json(ckpt / name, src)
    for name in TEXT_FILES:
        if (ckpt / name).exists():
            read_text(ckpt / name, src)
    for name in BINARY_FILES:
        if (ckpt / name).exists():
            check_file(ckpt / name, src)
    if tokenizer and not any((ckpt / name).exists() for name in TOKENIZER_FILES):
        raise src.error(ckpt, f"has weights but no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}: a partial "
                              "copy?)", "copy the tokenizer files from the original checkpoint too "
                              "(tokenizer.save_pretrained writes them)")
    return config


GGUF_MAGIC = b"GGUF"
GGUF_HEADER = 24  # magic, version (u32), tensor count (u64), metadata count (u64)


def check_gguf(file, src: Source) -> None:
    """A GGUF file's fixed header: magic ``GGUF``, a known version, the whole header there. A file cut inside its
    tensors is refused when gguf's reader opens it for the conversion (:func:`fafo.engine.gguf.gguf_architecture`)."""
    path = Path(file)
    head = read_head(path, src, GGUF_HEADER)
    if head[:4] != GGUF_MAGIC:
        raise src.error(path, f"is not a readable GGUF file (it starts with {head[:4]!r}, not b'GGUF')")
    if len(head) < GGUF_HEADER:
        raise src.error(path, f"is truncated ({len(head)} bytes: not even the GGUF header)")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in (1, 2, 3):
        raise src.error(path, f"has GGUF version {version} (known: 1, 2, 3); the file is damaged or too new")


def check_directory_or_creatable(path, src: Source) -> None:
    """A directory the harness writes and reads back (``bench.reference_dir``): no regular file on its path."""
    path = Path(str(path)).expanduser()
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                raise src.error(part, "is a file, not a directory")
            return
