"""The common sample type and task base class.

A task is a deterministic, ordered list of :class:`Sample` objects plus the rule that turns a sample (and
the model's answers to its earlier turns) into prompt token ids. Tasks are built by Hydra from
``conf/task/*.yaml`` (``_target_`` + keyword arguments). Constructing a task never fails on bad values;
:meth:`Task.samples` checks the settings and raises :class:`~fafo.errors.ConfigError`, so call it before
loading the model to fail early.

Prompt conventions (as the benchmarks' own evaluation code): chat samples go through the tokenizer's chat
template with ``add_generation_prompt=True`` and are then tokenized with ``add_special_tokens=False`` (no
double BOS); turn ``t > 0`` replays the earlier turns with the model's own answers (MT-Bench) or the gold
references (SCBench). Raw samples (code completion, PG-19, ...) are tokenized as plain text with the
tokenizer's own special tokens (BOS where the tokenizer adds one).

Tokenizer-dependent work (truncation in target-tokenizer tokens, skipping texts shorter than a token prefix)
cannot happen in :meth:`Task.load_samples`, which never sees a tokenizer. It happens in
:meth:`Task.prompt_ids` (which receives the tokenizer; tasks override it and cache per tokenizer with
:meth:`Task.memo`) and in :meth:`Task.usable`, which :meth:`Task.samples` applies when it is given the
tokenizer (``task.samples(tokenizer)``). ``task.max_input_tokens`` is the common truncation limit; each task
that truncates documents its own rule (middle, head) in :attr:`Task.TRUNCATION`. The helpers
:func:`chat_prompt_ids`, :func:`raw_prompt_ids`, :func:`truncate_middle` and :func:`head_token_ids` are the
building blocks those overrides share.
"""

from __future__ import annotations

import abc
import dataclasses
import sys
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fafo.bounds import at_least, check_bounds
from fafo.errors import ConfigError

FOLLOWUPS = ("own", "gold")

# Used when a tokenizer has no chat template (base models). Documented in Task.prompt_ids.
FALLBACK_SYSTEM = "### System:\n{content}\n\n"
FALLBACK_USER = "### User:\n{content}\n\n"
FALLBACK_ASSISTANT = "### Assistant:\n{content}\n\n"
FALLBACK_GENERATION_PROMPT = "### Assistant:\n"

# How a prompt was rendered (Task.prompt_format), counted per run in its plan and summary.
CHAT_TEMPLATE = "chat template"
FALLBACK_FORMAT = "### fallback (no chat template)"
RAW_TEXT = "raw text"

_warned_no_template: set[str] = set()

MEMO_SIZE = 32  # Task.memo entries kept per task


@dataclass
class Sample:
    """One prompt (possibly multi-turn) of a task."""

    id: str
    turns: list[str]  # user messages; raw samples have exactly one entry, the raw text
    category: str = ""
    chat: bool = True  # False: raw text, no chat template (code completion, PG19, ...)
    max_new_tokens: int | None = None  # this sample's own new-token count per turn; None = the task's default
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


@dataclass
class Task(abc.ABC):
    """Base class of all tasks. Subclasses implement :meth:`load_samples` and override the defaults.

    Args:
        name: short task name used in result files.
        max_new_tokens: new tokens generated per turn at most, for samples that do not set their own.
        limit: keep only the first ``limit`` samples (after ``ids`` selection); ``None`` keeps all.
        ids: keep only these sample ids, in the task's own order; ``None`` keeps all.
        data_path: path of the task's data file (or directory), for tasks that read one.
        max_input_tokens: prompt limit in target-tokenizer tokens for tasks that truncate long inputs
            (LongBench: middle truncation to the model's ``model2maxlen``, e.g. 3500 for 4k models, 7500 for
            8k, 15500 for 16k, 31500 for 32k; HumanEval: a 1024-token head cap; SCBench: the first turn's
            middle-truncation limit). ``None`` = no truncation. Tasks without a truncation rule
            (``TRUNCATION == ""``) reject it. Set it per model: the task cannot see the model's context.
        system: system message for chat samples that carry none (``None`` = the chat template's default).
    """

    name: str = "task"
    max_new_tokens: int = at_least(1, 128)
    limit: int | None = at_least(1, None)
    ids: list[str] | None = None
    data_path: str | None = None
    max_input_tokens: int | None = at_least(1, None)
    system: str | None = None
    _loaded: list[Sample] | None = field(default=None, init=False, repr=False, compare=False)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    # How ``max_input_tokens`` truncates a prompt, in words ("" = this task does not truncate).
    TRUNCATION: ClassVar[str] = ""

    @abc.abstractmethod
    def load_samples(self) -> list[Sample]:
        """Return every sample of the task in a deterministic order (no selection applied)."""

    def validate(self) -> None:
        """Check task-specific settings; raise :class:`ConfigError` naming the setting. Called by samples()."""

    def usable(self, tokenizer: Any, sample: Sample) -> bool:
        """Whether ``sample`` can be prompted with ``tokenizer`` (e.g. a book long enough for a token prefix).

        Applied by ``samples(tokenizer)`` before ``limit``; the default keeps every sample.
        """
        return True

    def memo(self, tokenizer: Any, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` cached per tokenizer object and ``key`` (a prompt is rebuilt several times a run).

        The cache keeps the ``MEMO_SIZE`` most recent entries (long-context prompts are large).
        """
        slot = (id(tokenizer), key)
        hit = self._memo.pop(slot, None)
        if hit is None or hit[0] is not tokenizer:
            hit = (tokenizer, compute())
        self._memo[slot] = hit  # most recent last
        while len(self._memo) > MEMO_SIZE:
            del self._memo[next(iter(self._memo))]
        return hit[1]

    def samples(self, tokenizer: Any = None) -> list[Sample]:
        """The selected samples: ``ids`` filter, then (given a tokenizer) :meth:`usable`, then ``limit``.

        Each sample comes with ``max_new_tokens`` filled in and, for chat samples without one, the task's
        ``system`` message. Without a tokenizer no sample is dropped for being too short; tasks whose prompts
        need a minimum length then raise a ConfigError from :meth:`prompt_ids` for such a sample.

        Raises:
            ConfigError: a bad setting, duplicate sample ids, or ids that the task does not have.
        """
        check_bounds(self, "task")  # the counts declared with fafo.bounds.at_least, subclasses' included
        self.validate()
        if self.max_input_tokens is not None:
            if not self.TRUNCATION:
                raise ConfigError(
                    f"task.max_input_tokens={self.max_input_tokens} but task {self.name!r} does not truncate its "
                    "prompts; set task.max_input_tokens=null"
                )
        if self.system is not None and not isinstance(self.system, str):
            raise ConfigError(f"task.system={self.system!r} is not a string; set task.system to a string or null")
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
        if tokenizer is not None:
            selected = [s for s in selected if self.usable(tokenizer, s)]
        if self.limit is not None:
            selected = selected[: self.limit]
        out = []
        for s in selected:
            max_new = self.max_new_tokens if s.max_new_tokens is None else s.max_new_tokens
            system = self.system if s.chat and s.system is None else s.system
            out.append(dataclasses.replace(s, max_new_tokens=max_new, turns=list(s.turns),
                                           references=list(s.references), system=system))
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
        the tokenizer's BOS prepended if it has one; a warning is printed once per tokenizer.

        Raw samples: ``tokenizer(text, add_special_tokens=True)``; they have a single turn.

        Tasks whose prompts depend on the tokenizer (truncation in target tokens, token prefixes, SCBench's
        token-level follow-ups) override this with the helpers below and cache with :meth:`memo`.

        Raises:
            ValueError: ``turn`` out of range, or fewer than ``turn`` answers for an own-answer follow-up.
        """
        check_turn(sample, turn, answers)
        if not sample.chat:
            return raw_prompt_ids(tokenizer, sample.turns[0])
        return chat_prompt_ids(tokenizer, conversation(sample, turn, answers))

    def prompt_format(self, tokenizer: Any, sample: Sample) -> str:
        """How :meth:`prompt_ids` renders ``sample``: :data:`CHAT_TEMPLATE`, :data:`FALLBACK_FORMAT` (a chat sample
        and a tokenizer without a chat template) or :data:`RAW_TEXT`. Tasks with their own rendering override it."""
        if not sample.chat:
            return RAW_TEXT
        return CHAT_TEMPLATE if has_chat_template(tokenizer) else FALLBACK_FORMAT


def check_turn(sample: Sample, turn: int, answers: list[str]) -> None:
    """Raise ValueError if ``turn`` is out of range or an own-answer follow-up lacks the earlier answers."""
    if not 0 <= turn < len(sample.turns):
        raise ValueError(
            f"sample {sample.id!r} has {len(sample.turns)} turn(s); turn={turn} is out of range"
        )
    if sample.chat and sample.followup == "own" and len(answers) < turn:
        raise ValueError(
            f"sample {sample.id!r} turn {turn} needs {turn} earlier answer(s), got {len(answers)}"
        )


def previous_reply(sample: Sample, t: int, answers: list[str]) -> str:
    """The assistant message replayed after user turn ``t``: the model's own answer (stripped) or the gold one."""
    return answers[t].strip() if sample.followup == "own" else sample.references[t]


def conversation(sample: Sample, turn: int, answers: list[str]) -> list[dict[str, str]]:
    """Chat messages for ``turn``: [system], user 0, assistant 0, ..., user ``turn``."""
    messages: list[dict[str, str]] = []
    if sample.system is not None:
        messages.append({"role": "system", "content": sample.system})
    for t in range(turn):
        messages.append({"role": "user", "content": sample.turns[t]})
        messages.append({"role": "assistant", "content": previous_reply(sample, t, answers)})
    messages.append({"role": "user", "content": sample.turns[turn]})
    return messages


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """``messages`` through the chat template (generation prompt on), tokenized with ``add_special_tokens=False``.

    Without a chat template: the plain ``### Role:`` fallback with the tokenizer's BOS (see Task.prompt_ids).
    """
    if has_chat_template(tokenizer):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False).input_ids)
    return _fallback_prompt_ids(tokenizer, messages)


def raw_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Raw text tokenized with the tokenizer's own special tokens (BOS where it adds one), no chat template."""
    return list(tokenizer(text, add_special_tokens=True).input_ids)


def truncate_middle(ids: list[int], max_tokens: int) -> list[int]:
    """Keep the first and last ``max_tokens // 2`` tokens when ``ids`` is longer than ``max_tokens``.

    The rule of LongBench ``pred.py`` and SCBench ``truncate_input`` (``half = int(max_length / 2)``;
    an odd limit keeps ``max_tokens - 1`` tokens).
    """
    if len(ids) <= max_tokens:
        return list(ids)
    half = max_tokens // 2
    return list(ids[:half]) + list(ids[len(ids) - half:])


def head_token_ids(tokenizer: Any, text: str, n: int, *, add_special_tokens: bool = True,
                   margin: int = 64) -> tuple[list[int], bool]:
    """The first ``n`` ids of ``tokenizer(text).input_ids`` without tokenizing all of a very long text.

    Tokenizes growing character prefixes of ``text`` until one yields at least ``n + margin`` tokens, so the
    cut can only change tokens past position ``n`` (pre-tokenizers split on whitespace; merges are local), or
    the whole text. Returns ``(ids, complete)``; ``complete`` is False when the text has fewer than ``n`` tokens
    (then ``ids`` is all of them).
    """
    chars = max(6 * (n + margin), 1 << 14)
    while chars < len(text):
        ids = tokenizer(text[:chars], add_special_tokens=add_special_tokens).input_ids
        if len(ids) >= n + margin:
            return list(ids[:n]), True
        chars *= 2
    ids = tokenizer(text, add_special_tokens=add_special_tokens).input_ids
    return list(ids[:n]), len(ids) >= n


def _fallback_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Render ``messages`` in the plain ``### Role:`` format for tokenizers without a chat template."""
    key = str(getattr(tokenizer, "name_or_path", "") or id(tokenizer))
    if key not in _warned_no_template:
        _warned_no_template.add(key)
        print(f"warning: tokenizer {key!r} has no chat template; chat prompts use the plain '### User:' / "
              "'### Assistant:' format (the summary's prompt_formats counts them); give the checkpoint a "
              "chat_template.jinja to render them with a template", file=sys.stderr, flush=True)
    formats = {"system": FALLBACK_SYSTEM, "user": FALLBACK_USER, "assistant": FALLBACK_ASSISTANT}
    text = "".join(formats[m["role"]].format(content=m["content"]) for m in messages)
    text += FALLBACK_GENERATION_PROMPT
    ids = list(tokenizer(text, add_special_tokens=False).input_ids)
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + ids
