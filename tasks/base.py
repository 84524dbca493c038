"""The common sample type and task base class.

A task is a deterministic, ordered list of :class:`Sample` objects plus the rule that turns a sample (and
the model's answers to its earlier turns) into prompt token ids. Tasks are built by Hydra from
``conf/task/*.yaml`` (``_target_`` + keyword arguments). Constructing a task never fails on bad values;
:meth:`Task.samples` checks the settings and raises :class:`~fafo.errors.ConfigError`, so call it before
loading the model to fail early.

Prompt conventions (see ``shared/reference/datasets_ref.md``): chat samples go through the tokenizer's chat
template with ``add_generation_prompt=True`` and are then tokenized with ``add_special_tokens=False`` (no
double BOS); turn ``t > 0`` replays the earlier turns with the model's own answers (MT-Bench) or the gold
references (SCBench). Raw samples (code completion, PG-19, ...) are tokenized as plain text with the
tokenizer's own special tokens (BOS where the tokenizer adds one).
"""

from __future__ import annotations

import abc
import dataclasses
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fafo.errors import ConfigError

FOLLOWUPS = ("own", "gold")

# Used when a tokenizer has no chat template (base models). Documented in Task.prompt_ids.
FALLBACK_SYSTEM = "### System:\n{content}\n\n"
FALLBACK_USER = "### User:\n{content}\n\n"
FALLBACK_ASSISTANT = "### Assistant:\n{content}\n\n"
FALLBACK_GENERATION_PROMPT = "### Assistant:\n"

_warned_no_template: set[str] = set()


@dataclass
class Sample:
    """One prompt (possibly multi-turn) of a task."""

    id: str
    turns: list[str]  # user messages; raw samples have exactly one entry, the raw text
    category: str = ""
    chat: bool = True  # False: raw text, no chat template (code completion, PG19, ...)
    max_new_tokens: int | None = None  # per-sample budget; None = the task's default
    # how turn t>0 is built: "own" = the model's own previous answer, "gold" = references[t-1]
    followup: str = "own"
    references: list[str] = field(default_factory=list)  # gold answers per turn, if any
    system: str | None = None  # optional system message

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError(f"sample {self.id!r} has no turns")
        if not self.chat and len(self.turns) != 1:
            raise ValueError(f"raw sample {self.id!r} must have exactly one turn, got {len(self.turns)}")
        if not self.chat and self.system is not None:
            raise ValueError(f"raw sample {self.id!r} cannot have a system message")
        if self.followup not in FOLLOWUPS:
            raise ValueError(
                f"sample {self.id!r}: followup must be one of {FOLLOWUPS}, got {self.followup!r}"
            )
        if self.followup == "gold" and len(self.references) < len(self.turns) - 1:
            raise ValueError(
                f"sample {self.id!r}: followup='gold' needs a reference for each of the first "
                f"{len(self.turns) - 1} turns, got {len(self.references)}"
            )


def n_turns(sample: Sample) -> int:
    """Number of generation steps (turns) the sample needs."""
    return len(sample.turns)


def _as_str_list(value: Any) -> list[str]:
    """Hydra hands lists over as ListConfig and single CLI values as scalars; normalise to a list of str."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, Iterable):
        return [str(v) for v in value]
    raise ConfigError(
        f"task.ids={value!r} is not a list; set task.ids to a list of sample ids, e.g. [chat-01]"
    )


def _check_positive_int(value: Any, setting: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{setting}={value!r} is not a positive integer; set {setting} to an integer >= 1")


@dataclass
class Task(abc.ABC):
    """Base class of all tasks. Subclasses implement :meth:`load_samples` and override the defaults.

    Args:
        name: short task name used in result files.
        max_new_tokens: default generation budget per turn, for samples that do not set their own.
        limit: keep only the first ``limit`` samples (after ``ids`` selection); ``None`` keeps all.
        ids: keep only these sample ids, in the task's own order; ``None`` keeps all.
        data_path: path of the task's data file, for tasks that read one.
    """

    name: str = "task"
    max_new_tokens: int = 128
    limit: int | None = None
    ids: list[str] | None = None
    data_path: str | None = None
    _loaded: list[Sample] | None = field(default=None, init=False, repr=False, compare=False)

    @abc.abstractmethod
    def load_samples(self) -> list[Sample]:
        """Return every sample of the task in a deterministic order (no selection applied)."""

    def samples(self) -> list[Sample]:
        """The selected samples: ``ids`` filter, then ``limit``; each with ``max_new_tokens`` filled in.

        Raises:
            ConfigError: a bad setting, duplicate sample ids, or ids that the task does not have.
        """
        _check_positive_int(self.max_new_tokens, "task.max_new_tokens")
        if self.limit is not None:
            _check_positive_int(self.limit, "task.limit")
        if self._loaded is None:
            self._loaded = list(self.load_samples())
        selected = self._loaded
        seen: set[str] = set()
        for s in selected:
            if s.id in seen:
                raise ConfigError(
                    f"task {self.name!r} has the sample id {s.id!r} twice; give every sample a unique id"
                )
            seen.add(s.id)
        if self.ids is not None:
            wanted = _as_str_list(self.ids)
            unknown = [i for i in wanted if i not in seen]
            if unknown:
                known = ", ".join(s.id for s in selected[:8]) + (", ..." if len(selected) > 8 else "")
                raise ConfigError(
                    f"task.ids has ids that task {self.name!r} does not have: {unknown}; "
                    f"use ids from the task (e.g. {known})"
                )
            keep = set(wanted)
            selected = [s for s in selected if s.id in keep]
        if self.limit is not None:
            selected = selected[: self.limit]
        out = []
        for s in selected:
            budget = self.max_new_tokens if s.max_new_tokens is None else s.max_new_tokens
            out.append(dataclasses.replace(s, max_new_tokens=budget, turns=list(s.turns),
                                           references=list(s.references)))
        return out

    @staticmethod
    def n_turns(sample: Sample) -> int:
        """Number of turns (generation steps) of ``sample``."""
        return n_turns(sample)

    def prompt_ids(self, tokenizer: Any, sample: Sample, turn: int, answers: list[str]) -> list[int]:
        """Token ids of the prompt for ``turn`` of ``sample``.

        Args:
            tokenizer: a Hugging Face tokenizer.
            sample: the sample.
            turn: 0-based turn index, ``< n_turns(sample)``.
            answers: the model's decoded answers to the earlier turns; ``answers[:turn]`` is used (only when
                ``sample.followup == "own"``). Answers are stripped of surrounding whitespace (FastChat).

        Chat samples: messages = [system], user turns[0], assistant answer 0 (own) or references[0] (gold),
        user turns[1], ..., user turns[turn], rendered by ``tokenizer.apply_chat_template`` with
        ``add_generation_prompt=True`` and tokenized with ``add_special_tokens=False`` (the template carries
        its own BOS). Without a chat template the same messages are rendered as ``### System:``/``### User:``
        /``### Assistant:`` blocks (``"### User:\\n{text}\\n\\n"``), ending with ``"### Assistant:\\n"``, with
        the tokenizer's BOS prepended if it has one; a warning is issued once per tokenizer.

        Raw samples: ``tokenizer(text, add_special_tokens=True)``; they have a single turn.
        """
        if not 0 <= turn < len(sample.turns):
            raise ValueError(
                f"sample {sample.id!r} has {len(sample.turns)} turn(s); turn={turn} is out of range"
            )
        if not sample.chat:
            return list(tokenizer(sample.turns[0], add_special_tokens=True).input_ids)
        if sample.followup == "own" and len(answers) < turn:
            raise ValueError(
                f"sample {sample.id!r} turn {turn} needs {turn} earlier answer(s), got {len(answers)}"
            )
        messages: list[dict[str, str]] = []
        if sample.system is not None:
            messages.append({"role": "system", "content": sample.system})
        for t in range(turn):
            reply = answers[t].strip() if sample.followup == "own" else sample.references[t]
            messages.append({"role": "user", "content": sample.turns[t]})
            messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": sample.turns[turn]})
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return list(tokenizer(text, add_special_tokens=False).input_ids)
        return _fallback_prompt_ids(tokenizer, messages)


def _fallback_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Render ``messages`` in the plain ``### Role:`` format for tokenizers without a chat template."""
    key = str(getattr(tokenizer, "name_or_path", "") or id(tokenizer))
    if key not in _warned_no_template:
        _warned_no_template.add(key)
        warnings.warn(
            f"tokenizer {key!r} has no chat_template; chat prompts use the plain '### User:/### Assistant:' "
            "format (set a chat template on the tokenizer to change this)",
            stacklevel=3,
        )
    formats = {"system": FALLBACK_SYSTEM, "user": FALLBACK_USER, "assistant": FALLBACK_ASSISTANT}
    text = "".join(formats[m["role"]].format(content=m["content"]) for m in messages)
    text += FALLBACK_GENERATION_PROMPT
    ids = list(tokenizer(text, add_special_tokens=False).input_ids)
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + ids
