"""Loading Hugging Face checkpoints (hub id, local directory, GGUF file or a built tiny model) into
:class:`fafo.engine.model.Transformer`.

:func:`open_checkpoint` finds (or builds) a checkpoint, checks its every file and reads its config and tokenizer
before any weight loads; :func:`load_model` then reads the weights. transformers does what it is good at
(``AutoConfig``, ``AutoTokenizer`` with the chat template, rope init); the weights come straight from safetensors
(or ``pytorch_model*.bin``) into our module, whose parameter names match Hugging Face's.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from fafo.engine.context import trained_context
from fafo.errors import ConfigError
from fafo.files import Source, check_checkpoint, check_safetensors, weight_files
from fafo.engine.model import SUPPORTED_FAMILIES, ModelArgs, Transformer, unimplemented_settings

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]  # what a hub fetch keeps


@dataclass
class Checkpoint:
    """A resolved model: its directory, transformers config and tokenizer (weights not loaded yet).

    ``source`` is what was asked for (hub id, with ``@revision`` when one is set; a local directory as an absolute
    path; a GGUF file; the built tiny model's directory), ``identity`` what the vanilla reference store keys the
    weights by, ``random`` whether it is a built-in random tiny model.
    """

    path: Path
    config: object
    tokenizer: object
    identity: str
    source: str = ""
    random: bool = False

    @property
    def context(self) -> int:
        """Positions the checkpoint was trained for (rope scaling and ``max_sequence_length`` included)."""
        return trained_context(self.config)


def open_checkpoint(*, path: str | None = None, revision: str | None = None, gguf_file: str | None = None,
                    tiny: dict | None = None, weights: bool = True, setting: str = "model") -> Checkpoint:
    """The checkpoint one source names: ``gguf_file`` (inside ``path``'s directory or hub repo when both are
    given, converted once), else ``path`` (a hub id or a checkpoint directory), else ``tiny`` (a random model's
    spec, built once). Every file is checked and the config and tokenizer read; no weight loads (``weights=False``:
    a hub checkpoint is fetched without its weight files and only its other files are checked, as ``bench.plan``
    reads). Errors name ``<setting>.path`` etc. (``method.draft`` for a draft model)."""
    try:
        if gguf_file:
            from fafo.engine.gguf import gguf_checkpoint

            where = gguf_checkpoint(str(gguf_file), None if path is None else str(path), revision)
            config = checked_config(where, Source("model.gguf_file", str(gguf_file),
                                                  f"delete {where} so that it is converted again"))
            source = f"{path}:{gguf_file}" if path else str(gguf_file)
            return Checkpoint(where, config, load_tokenizer(where), f"gguf:{where.name}", source)
        if path:
            where = resolve_checkpoint(str(path), revision, weights)
            config = checked_config(where, Source("model.path", str(path), "re-download the checkpoint (or copy all "
                                                  "of it again) and point model.path at the complete directory"),
                                    weights)
            local = Path(str(path)).expanduser()
            source = str(local.resolve()) if local.is_dir() else str(path) + (f"@{revision}" if revision else "")
            return Checkpoint(where, config, load_tokenizer(where), f"{path}@{revision or 'main'}", source)
        if tiny:
            from fafo.engine.tiny import tiny_checkpoint

            where = tiny_checkpoint(dict(tiny))
            config = checked_config(where, Source("model.tiny", str(where), f"delete {where} so that it is built "
                                                  "again"))
            return Checkpoint(where, config, load_tokenizer(where), f"tiny:{where.name}", str(where), random=True)
    except ConfigError as exc:
        if setting == "model":
            raise
        raise ConfigError(re.sub(r"\bmodel\.(path|gguf_file|tiny|revision)\b", rf"{setting}.\1", str(exc))) from None
    raise ConfigError(f"{setting}.path is not set; give a hub id or a local checkpoint directory")


def checked_config(path: Path, src: Source, weights: bool = True):
    """The transformers config of a checkpoint directory whose every file was checked (:mod:`fafo.files`) and whose
    safetensors headers hold the tensors that config needs, before any weight is read (``weights=False``: a
    config-only checkpoint has its other files checked)."""
    check_checkpoint(path, src, weights=weights)
    config = load_hf_config(path)
    if weights:
        check_weights_match(path, config, src)
    return config


def resolve_checkpoint(path: str, revision: str | None = None, weights: bool = True) -> Path:
    """A local checkpoint directory for ``path`` (a directory, or a hub id fetched into the HF cache; with
    ``weights=False`` only its config, tokenizer and other small files, as ``bench.plan`` needs).

    Raises:
        ConfigError: the path is neither a directory nor a hub id, or the hub cannot be reached and the model is
            not cached.
    """
    local = Path(os.path.expanduser(path))
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"model.path={path!r} is a directory without config.json; point it at a Hugging Face "
                              "checkpoint directory (save_pretrained output)")
        return local
    if not HUB_ID.match(path):
        raise ConfigError(f"model.path={path!r} is neither an existing directory nor a hub id like 'org/name'; "
                          "fix the path or use a hub id")
    from huggingface_hub import snapshot_download

    try:
        allow = HUB_FILES if weights else [p for p in HUB_FILES if p != "*.safetensors"]
        return Path(snapshot_download(path, revision=revision, allow_patterns=allow))
    except Exception as exc:  # offline, unknown repo, gated repo, no network...
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false")
        why = "HF_HUB_OFFLINE is set and it is not in the local cache" if offline else type(exc).__name__
        raise ConfigError(f"model.path={path!r} could not be fetched from the Hugging Face hub ({why}); download "
                          f"it where the hub is reachable (`hf download {path}`) and set model.path to that "
                          "directory, or log in for gated models") from None


def load_hf_config(ckpt: Path):
    """The transformers config of a checkpoint, refusing families the engine does not implement."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(ckpt)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # empty, corrupt or incomplete config.json
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"model.path={str(ckpt)!r}: its config.json could not be read ({why[:160]}); "
                          "re-download the checkpoint or repair its config.json") from None
    if config.model_type not in SUPPORTED_FAMILIES:
        raise ConfigError(f"model.path={str(ckpt)!r} is a {config.model_type!r} model; the engine supports "
                          f"{', '.join(SUPPORTED_FAMILIES)} checkpoints")
    unimplemented = unimplemented_settings(config)
    if unimplemented:
        raise ConfigError(f"model.path={str(ckpt)!r}: its config.json sets {'; '.join(unimplemented)}, which the "
                          f"engine's {config.model_type} transformer does not implement; use a checkpoint of the "
                          "standard architecture")
    return config


def load_tokenizer(ckpt: Path):
    """The checkpoint's tokenizer (its files are checked by :func:`fafo.files.check_checkpoint` first)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ckpt)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as exc:  # files of another kind
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"model.path={str(ckpt)!r}: its tokenizer could not be loaded ({why[:160]}); copy the "
                          "tokenizer files of this checkpoint (tokenizer.json / tokenizer.model) again") from None


def _weight_files(ckpt: Path) -> list[Path]:
    """The weight files of a checkpoint, each checked (safetensors header and sizes) before anything loads."""
    return weight_files(ckpt, Source("model.path", str(ckpt), "re-download the checkpoint and point model.path at "
                                     "the complete directory"))


def check_weights_match(ckpt: Path, config, src: Source | None = None) -> None:
    """The safetensors headers name exactly the tensors ``config`` needs, with their shapes (nothing is loaded):
    weights of another model in the right place are one line before any load. ``pytorch_model*.bin`` weights
    cannot be listed without unpickling and are matched when they load (:func:`load_model`)."""
    src = src or Source("model.path", str(ckpt), "is config.json from this checkpoint? re-download the checkpoint")
    args = ModelArgs.from_hf(config)
    with torch.device("meta"):
        want = {n: tuple(t.shape) for n, t in Transformer(args, config).state_dict().items()}
    have: dict[str, tuple] = {}
    files = weight_files(ckpt, src)
    if any(f.suffix != ".safetensors" for f in files):
        return
    for f in files:
        have.update({n: tuple(i["shape"]) for n, i in check_safetensors(f, src).items() if n != "__metadata__"})
    for names in (want, have):
        for n in [n for n in names if "rotary_emb" in n or (args.tie_embeddings and n == "lm_head.weight")]:
            del names[n]
    missing, unexpected = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    shapes = [f"{n} {list(have[n])} (needs {list(want[n])})" for n in sorted(set(want) & set(have))
              if want[n] != have[n]]
    if missing or unexpected or shapes:
        what = (f"missing {missing[:2]}" if missing else f"unexpected {unexpected[:2]}" if unexpected
                else f"shapes {shapes[:2]}")
        raise src.error(files[0] if len(files) == 1 else ckpt,
                        f"holds weights that do not match config.json ({args.family}, {args.n_layers} layers: {what}; "
                        f"{len(missing)} missing, {len(unexpected)} unexpected, {len(shapes)} of another shape)",
                        "copy config.json and the weights from the same checkpoint (re-download it)")


def _read_state_dict(files: list[Path], dtype: torch.dtype, device: torch.device):
    from safetensors import safe_open

    for f in files:
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt", device=str(device)) as sf:
                for name in sf.keys():
                    yield name, sf.get_tensor(name).to(dtype)
        else:
            for name, t in torch.load(f, map_location=device, weights_only=True).items():
                yield name, t.to(dtype)


def load_model(ckpt: Path, config, dtype: torch.dtype, device: torch.device) -> Transformer:
    """Build the engine's transformer and fill it with the checkpoint's weights (strict, tied embeddings aware)."""
    args = ModelArgs.from_hf(config)
    with torch.device("meta"):
        model = Transformer(args, config)
    state = {n: t for n, t in _read_state_dict(_weight_files(ckpt), dtype, device) if "rotary_emb" not in n}
    if args.tie_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (args.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ConfigError(f"model.path={str(ckpt)!r}: weights do not match a {args.family} model "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]}); is config.json from this checkpoint?")
    if args.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.setup_rotary(device)
    return model.eval().requires_grad_(False)
