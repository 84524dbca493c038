"""The user's own workload, read from a jsonl file (``task.data_path``).

Each non-blank line is one JSON object:

* ``id`` (str or int, required; stored as str, unique);
* exactly one of ``text`` (a raw prompt: no chat template, one turn) or ``turns`` (a non-empty list of user
  messages, rendered with the chat template; later turns replay the model's own earlier answers);
* optional ``category`` (str), ``max_new_tokens`` (int >= 1), ``system`` (str, chat lines only),
  ``references`` (list of str, gold answers per turn) and ``followup`` (``"own"``, the default, or ``"gold"``
  to replay ``references`` instead of the model's answers; needs one reference per earlier turn).

Other keys are ignored, so converted benchmark files may keep their metadata. Blank lines are skipped.
Example::

    {"id": "q1", "turns": ["Name three rivers in Europe.", "Which is the longest?"], "category": "chat"}
    {"id": 2, "text": "def fizzbuzz(n: int) -> str:\\n", "max_new_tokens": 64}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from fafo.errors import ConfigError
from fafo.files import Source, read_text
from tasks.base import FOLLOWUPS, Sample, Task

_FIX = "each line of task.data_path must be a JSON object with `id` and exactly one of `text` or `turns`"


def _resolve(path: str) -> str:
    """Resolve a relative path against the original working directory when running under Hydra."""
    path = os.path.expanduser(path)
    try:
        from hydra.utils import to_absolute_path

        return to_absolute_path(path)
    except (ImportError, ValueError):
        return os.path.abspath(path)


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _parse_line(record: Any, where: str) -> Sample:
    """Validate one decoded jsonl record and turn it into a Sample (``where`` names the setting, file and line)."""

    def bad(problem: str, fix: str) -> ConfigError:
        return ConfigError(f"{where}: {problem}; {fix}")

    if not isinstance(record, dict):
        raise bad(f"expected a JSON object, got {type(record).__name__}", _FIX)
    if "id" not in record:
        raise bad("missing `id`", "add an `id` (string or integer) to every line of task.data_path")
    sid = record["id"]
    if isinstance(sid, bool) or not isinstance(sid, (str, int)) or str(sid) == "":
        raise bad(f"`id`={sid!r} is not a non-empty string or integer", "use a string or integer `id`")
    has_text, has_turns = "text" in record, "turns" in record
    if has_text == has_turns:
        problem = "has both `text` and `turns`" if has_text else "has neither `text` nor `turns`"
        raise bad(problem, "give `text` (raw prompt, no chat template) or `turns` (list of user messages)")
    if has_text:
        if not isinstance(record["text"], str) or not record["text"]:
            raise bad("`text` is not a non-empty string", "set `text` to the raw prompt string")
        turns, chat = [record["text"]], False
    else:
        if not _is_str_list(record["turns"]) or not record["turns"]:
            raise bad("`turns` is not a non-empty list of strings", "set `turns` to a list of user messages")
        turns, chat = list(record["turns"]), True
    category = record.get("category", "")
    if not isinstance(category, str):
        raise bad(f"`category`={category!r} is not a string", "set `category` to a string or drop it")
    max_new = record.get("max_new_tokens")
    if max_new is not None and (isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1):
        raise bad(f"`max_new_tokens`={max_new!r} is not a positive integer", "set it to an integer >= 1")
    system = record.get("system")
    if system is not None and (not isinstance(system, str) or not chat):
        raise bad("`system` must be a string on a `turns` line", "drop `system` or use `turns`, not `text`")
    references = record.get("references", [])
    if not _is_str_list(references):
        raise bad("`references` is not a list of strings", "set `references` to a list of strings or drop it")
    followup = record.get("followup", "own")
    if followup not in FOLLOWUPS:
        raise bad(f"`followup`={followup!r} is not one of {list(FOLLOWUPS)}", "use \"own\" or \"gold\"")
    if followup == "gold" and len(references) < len(turns) - 1:
        raise bad(
            f"`followup`=\"gold\" needs {len(turns) - 1} `references`, got {len(references)}",
            "add a reference answer for each turn but the last, or use `followup`=\"own\"",
        )
    return Sample(
        id=str(sid),
        turns=turns,
        category=category,
        chat=chat,
        max_new_tokens=max_new,
        followup=followup,
        references=list(references),
        system=system,
    )


@dataclass
class PromptsTask(Task):
    """Samples from the jsonl file ``data_path`` (format in the module docstring), in file order."""

    name: str = "prompts"
    max_new_tokens: int = 128

    def load_samples(self) -> list[Sample]:
        """Read and validate ``data_path``.

        Raises:
            ConfigError: ``data_path`` unset or missing, or a malformed line (with file and line number).
        """
        if not self.data_path:
            raise ConfigError(
                "task.data_path is not set; point task.data_path at a jsonl file whose lines have `id` and "
                "`text` or `turns`"
            )
        path = _resolve(str(self.data_path))
        if not os.path.exists(path):  # a directory or a damaged file: fafo.files.read_text below
            raise ConfigError(
                f"task.data_path={self.data_path!r} does not exist; point task.data_path at a jsonl file "
                "whose lines have `id` and `text` or `turns`"
            )
        samples: list[Sample] = []
        first_line: dict[str, int] = {}
        text = read_text(path, Source("task.data_path", str(self.data_path), _FIX), empty_ok=True)
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"task.data_path: {path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{where}: invalid JSON ({e.msg}); {_FIX}") from None
            sample = _parse_line(record, where)
            if sample.id in first_line:
                raise ConfigError(
                    f"{where}: duplicate id {sample.id!r} (first on line {first_line[sample.id]}); "
                    "give every line of task.data_path a unique `id`"
                )
            first_line[sample.id] = lineno
            samples.append(sample)
        if not samples:
            raise ConfigError(
                f"task.data_path={self.data_path!r} has no samples; add at least one jsonl line"
            )
        return samples
