"""PG-19: a raw token prefix of a book, continued by the model (TriForce's long-context setting).

Source. ``deepmind/pg19`` is **script-based**, which ``datasets >= 4`` no longer runs; the default reads the
parquet copy ``emozilla/pg19`` (split ``test``: 100 books; ``validation`` 50, ``train`` 28602; fields
``short_book_title``, ``publication_date``, ``url``, ``text``). Offline, point ``task.data_path`` at a parquet
file or snapshot directory of it, or at TriForce's ``data/pg19/`` directory (``pg19-test.json`` ...: JSON with
``text``): every matching file, in **sorted** order (TriForce uses ``os.listdir`` order, which is
filesystem-dependent). Ids are the 0-based record index over those files, so they do not change with the
prefix length.

Prompt (TriForce ``data/dataset.py``): ``tokenizer.encode(text)`` on the **raw text, no chat template** (BOS
included), then ``input_ids[:prefix_tokens]``. Settings: ``prefix_tokens`` 1024 (default), 2048 and 3072
(FAFO's PG-19 table), 124928 (TriForce on-chip, 122K) and 130048 (offloaded, 127K); ``max_new_tokens`` 256
(``gen_len``). TriForce samples with temperature 0.6, top-p 0.9 (``sampling=random
sampling.temperature=0.6 sampling.top_p=0.9``); its ``gs`` set is the first 20 books (``task.limit=20``).

Books with fewer than ``prefix_tokens`` tokens are skipped: exactly when the task is given the tokenizer
(``task.samples(tokenizer)``); without one, books with fewer UTF-8 bytes than ``prefix_tokens - 2`` are dropped
at load time (a token covers at least one byte, plus BOS and a leading-space marker) and a remaining short book
raises a ConfigError naming it when its prompt is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fafo.bounds import at_least
from fafo.errors import ConfigError
from tasks.base import Sample, check_turn, head_token_ids
from tasks.sources import DataTask


@dataclass
class PG19Task(DataTask):
    """PG-19 token prefixes (see the module docstring).

    Args:
        prefix_tokens: prompt length in target-tokenizer tokens, BOS included.
    """

    name: str = "pg19"
    max_new_tokens: int = 256
    hub_id: str = "emozilla/pg19"
    split: str = "test"
    prefix_tokens: int = at_least(2, 1024, why="a prompt token and a continuation, e.g. 1024")

    RELEASE: ClassVar[str] = ("a PG-19 parquet file (hub emozilla/pg19, {split} split) or TriForce's data/pg19/*.json")
    PATTERNS: ClassVar[tuple[str, ...]] = ("*{split}-*.parquet", "*{split}/*.parquet", "*.parquet", "*.json",
                                           "*.jsonl", "*.json.gz", "*.jsonl.gz")
    HUB_NOTE: ClassVar[str] = ("deepmind/pg19 itself is script-based, which datasets>=4 cannot run; the default "
                               "hub_id is its parquet copy emozilla/pg19")

    def load_samples(self) -> list[Sample]:
        samples = []
        for i, r in enumerate(self.records()):
            text = self.value(r, i, "text")
            if not isinstance(text, str):
                raise self.bad_record(i, "has a `text` that is not a string")
            if len(text.encode("utf-8")) + 2 < self.prefix_tokens:
                continue  # certainly shorter than the prefix in any tokenizer
            samples.append(Sample(id=str(i), category="pg19", chat=False, turns=[text]))
        if not samples:
            raise ConfigError(f"task.prefix_tokens={self.prefix_tokens}: every book of {self.source()} is shorter; "
                              "lower task.prefix_tokens")
        return samples

    def prefix(self, tokenizer: Any, sample: Sample) -> tuple[list[int], bool]:
        """(first ``prefix_tokens`` ids of the book with BOS, whether the book is that long), cached."""
        return self.memo(tokenizer, ("prefix", sample.id, self.prefix_tokens),
                         lambda: head_token_ids(tokenizer, sample.turns[0], self.prefix_tokens))

    def usable(self, tokenizer: Any, sample: Sample) -> bool:
        return self.prefix(tokenizer, sample)[1]

    def prompt_ids(self, tokenizer: Any, sample: Sample, turn: int, answers: list[str]) -> list[int]:
        check_turn(sample, turn, answers)
        ids, complete = self.prefix(tokenizer, sample)
        if not complete:
            raise ConfigError(
                f"task {self.name!r}: book {sample.id!r} has {len(ids)} tokens, fewer than task.prefix_tokens="
                f"{self.prefix_tokens}; leave it out with task.ids/task.limit or lower task.prefix_tokens")
        return list(ids)
