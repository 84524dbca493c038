"""NarrativeQA in TriForce's setting: summarise a book prefix of a given token length (FAFO's Table 9).

This is **not** LongBench's narrativeqa QA task (that is ``task=longbench_narrativeqa``). TriForce's
``data/dataset.py`` (``lwm``) reads ``load_dataset("narrativeqa")`` (now ``deepmind/narrativeqa``, parquet;
split ``train``; each row nests the book as ``document.text``) at 20 fixed row indices, and builds

    book   = tokenizer.encode(document.text[3:1024*500])[:input_tokens - 84]
    prompt = "You are a helpful assistant. USER: Please read a part of the book below, and then give me the "
             "summary.\\n[start of the book]\\n" + decode(book, skip_special_tokens=True) + "\\n[end of the book]"
             "\\n\\nNow you have read it. Please summarize it for me. First, tell me the title and the author, and "
             "then tell the story in 500 words.\\n\\nASSISTANT: "
    ids    = tokenizer.encode(prompt)                       # raw text with BOS: the chat format is in the text

with ``input_tokens`` = 127 * 1024 there; FAFO reports 3072 (default), 5120 and 10240. ``max_new_tokens`` 256.
84 is TriForce's template allowance (``task.template_tokens``; null = the template's own token count in the
target tokenizer). Offline, point ``task.data_path`` at a parquet file or snapshot directory of
``deepmind/narrativeqa`` (``train-*.parquet`` shards are read in sorted order, so row indices match the hub's) or
at a jsonl/json with the same nested ``document`` field (or a top-level ``text``). Ids are the row indices.

Where TriForce is silent or differs: a book whose text has fewer than ``input_tokens - template_tokens``
tokens is skipped when the task has the tokenizer (``samples(tokenizer)``) and raises a ConfigError when its
prompt is built otherwise (TriForce drops prompts whose length is not exactly 127K, a test that depends on
re-tokenisation); an index past the end of the split is a ConfigError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fafo.bounds import at_least
from fafo.errors import ConfigError
from tasks.base import Sample, check_turn, head_token_ids, raw_prompt_ids
from tasks.sources import DataTask

# TriForce data/dataset.py (`lwm` / `demo`)
TRIFORCE_INDICES = (0, 50, 300, 800, 950, 1100, 2150, 2450, 2550, 2750, 3350, 3400, 3600, 3900, 4000, 4100, 4200,
                    4400, 4500, 4550)
PROMPT_HEAD = ("You are a helpful assistant. USER: Please read a part of the book below, and then give me the "
               "summary.\n[start of the book]\n")
PROMPT_TAIL = ("\n[end of the book]\n\nNow you have read it. Please summarize it for me. First, tell me the title "
               "and the author, and then tell the story in 500 words.\n\nASSISTANT: ")
TEXT_START, TEXT_END = 3, 1024 * 500  # document.text[3:1024*500]


@dataclass
class NarrativeQATriForceTask(DataTask):
    """TriForce's NarrativeQA book-summary prompts (see the module docstring).

    Args:
        input_tokens: target prompt length in tokens (TriForce's ``prefill``).
        template_tokens: tokens reserved for the template (TriForce: 84); null = counted in the tokenizer.
        indices: row indices of the split to use; null = every row.
    """

    name: str = "narrativeqa_triforce"
    max_new_tokens: int = 256
    hub_id: str = "deepmind/narrativeqa"
    split: str = "train"
    input_tokens: int = at_least(1, 3072)
    template_tokens: int | None = at_least(1, 84)
    indices: Any = TRIFORCE_INDICES

    RELEASE: ClassVar[str] = "the deepmind/narrativeqa {split} parquet shards (or a jsonl with document.text)"
    PATTERNS: ClassVar[tuple[str, ...]] = ("*{split}-*.parquet", "*{split}/*.parquet", "*{split}.jsonl",
                                           "*.jsonl", "*.json")

    def _indices(self) -> list[int] | None:
        if self.indices is None:
            return None
        values = [self.indices] if isinstance(self.indices, int) else list(self.indices)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ConfigError(f"task.indices={self.indices!r} is not a list of row indices; set a list of "
                              "integers >= 0 or null")
        return values

    def validate(self) -> None:
        self._indices()

    def load_samples(self) -> list[Sample]:
        indices = self._indices()
        records = self.records(indices)
        if indices is None:
            indices = list(range(len(records)))
        samples = []
        for i, r in zip(indices, records):
            document = r.get("document")
            text = document.get("text") if isinstance(document, dict) else None
            if text is None:
                text = self.value(r, i, "text")
            if not isinstance(text, str):
                raise self.bad_record(i, "has a document text that is not a string")
            samples.append(Sample(id=str(i), category="narrativeqa", chat=False, turns=[text[TEXT_START:TEXT_END]]))
        return samples

    def book_tokens(self, tokenizer: Any) -> int:
        """How many book tokens the prompt keeps: ``input_tokens - template_tokens``."""
        reserved = self.template_tokens
        if reserved is None:
            reserved = len(raw_prompt_ids(tokenizer, PROMPT_HEAD + PROMPT_TAIL))
        n = self.input_tokens - reserved
        if n < 1:
            raise ConfigError(f"task.input_tokens={self.input_tokens} leaves no room for the book after {reserved} "
                              "template tokens; raise task.input_tokens")
        return n

    def book(self, tokenizer: Any, sample: Sample) -> tuple[list[int], bool]:
        n = self.book_tokens(tokenizer)
        return self.memo(tokenizer, ("book", sample.id, n), lambda: head_token_ids(tokenizer, sample.turns[0], n))

    def usable(self, tokenizer: Any, sample: Sample) -> bool:
        return self.book(tokenizer, sample)[1]

    def prompt_text(self, tokenizer: Any, sample: Sample) -> str:
        ids, complete = self.book(tokenizer, sample)
        if not complete:
            raise ConfigError(
                f"task {self.name!r}: book {sample.id!r} has {len(ids)} tokens, fewer than the "
                f"{self.book_tokens(tokenizer)} task.input_tokens={self.input_tokens} needs; leave it out with "
                "task.ids/task.indices or lower task.input_tokens")
        return PROMPT_HEAD + tokenizer.decode(ids, skip_special_tokens=True) + PROMPT_TAIL

    def prompt_ids(self, tokenizer: Any, sample: Sample, turn: int, answers: list[str]) -> list[int]:
        check_turn(sample, turn, answers)
        return raw_prompt_ids(tokenizer, self.prompt_text(tokenizer, sample))
