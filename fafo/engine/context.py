"""How many positions a checkpoint can attend to: the one place a context limit is derived from a config.

Checkpoints state their length in several ways, and ``max_position_embeddings`` alone is often the *pretraining*
length, not the trained one:

* ``max_sequence_length`` (FastChat's long-context releases: Vicuna-v1.5-16k and LongChat-7B-v1.5-32k write
  ``max_position_embeddings: 4096`` and ``max_sequence_length: 16384`` / ``32768``);
* rope scaling (Chen et al., 2023, "Extending Context Window ... via Positional Interpolation", arXiv 2306.15595,
  Sec. 2.3; YaRN, Peng et al., 2023, arXiv 2309.00071, Sec. 3; Llama 3.1's ``llama3`` type): the trained length is
  ``factor x original_max_position_embeddings`` when the config names the original length (yarn, llama3, longrope).
  Linear and dynamic configs usually do not: FastChat writes the unscaled length (LongChat-13B-16k: 2048 with
  factor 8 = 16384), Together writes the scaled one (Llama-2-7B-32K: 32768 with factor 8). A linear/dynamic
  ``max_position_embeddings`` of at most :data:`PRETRAINED_MAX` (the Llama-1/2 pretraining lengths) is taken as
  the unscaled original; a larger one as already scaled.

The limit is the largest of these. An explicit ``model.max_len`` wins, also above the trained length: positions
past it are allowed (transformers computes rotary embeddings for any position and never stops a generation there;
Spec-Bench decodes Vicuna-7B-v1.3 past its 2048 positions), with a warning from :func:`context_limit`.
"""

from __future__ import annotations

PRETRAINED_MAX = 4096  # largest unscaled length a linear/dynamic rope config writes (Llama-2); see module docstring
SCALED_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope")


def rope_dict(config) -> dict:
    """The rope settings of a transformers config (v5 ``rope_parameters``, or v4 ``rope_scaling``)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    params = dict(params)
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def trained_context(config) -> int:
    """Positions the checkpoint was trained (or rope-scaled) for, from its config alone (module docstring)."""
    mpe = int(config.max_position_embeddings)
    lengths = [mpe]
    msl = getattr(config, "max_sequence_length", None)
    if isinstance(msl, int) and not isinstance(msl, bool) and msl > 0:
        lengths.append(msl)
    rope = rope_dict(config)
    factor = rope.get("factor")
    if rope["rope_type"] in SCALED_TYPES and isinstance(factor, (int, float)) and factor > 1:
        original = rope.get("original_max_position_embeddings")
        if original:
            lengths.append(int(factor * int(original)))
        elif rope["rope_type"] in ("linear", "dynamic") and mpe <= PRETRAINED_MAX:
            lengths.append(int(factor * mpe))
    return max(lengths)


def attention_window(config) -> int | None:
    """The sliding window the engine caps a context to (it attends to everything: exact only inside it)."""
    window = getattr(config, "sliding_window", None)
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        return None
    return int(window) if window else None


def context_limit(config, max_len: int | None = None) -> tuple[int, str | None]:
    """``(limit, warning)``: ``model.max_len`` when given (a warning when it exceeds the trained length), else
    :func:`trained_context`; never more than a sliding window (:func:`attention_window`)."""
    trained, window = trained_context(config), attention_window(config)
    limit, warning = trained, None
    if max_len:
        limit = int(max_len)
        if max_len > trained:
            warning = (f"model.max_len={max_len} exceeds the {trained} positions the checkpoint was trained for; "
                       "positions past them are allowed (as in transformers) but lie outside its training")
    return (min(limit, window) if window else limit), warning
