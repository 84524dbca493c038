"""Loading Hugging Face checkpoints (hub id or local directory) into :class:`fafo.engine.model.Transformer`.

transformers does what it is good at (``AutoConfig``, ``AutoTokenizer`` with the chat template, rope init);
the weights come straight from safetensors (or ``pytorch_model*.bin``) into our module, whose parameter names
match Hugging Face's.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from fafo.errors import ConfigError
from fafo.files import Source, check_safetensors, weight_files
from fafo.engine.model import SUPPORTED_FAMILIES, ModelArgs, Transformer

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_ALLOW = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


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
    if not _HUB_ID.match(path):
        raise ConfigError(f"model.path={path!r} is neither an existing directory nor a hub id like 'org/name'; "
                          "fix the path or use a hub id")
    from huggingface_hub import snapshot_download

    try:
        allow = _ALLOW if weights else [p for p in _ALLOW if p != "*.safetensors"]
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
