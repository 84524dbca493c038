"""Multi-LexSum (long legal-case summarization) as QuantSpec's Table 3 uses it, and the prompt rule it shares with
InfiniteBench En.Sum (:mod:`tasks.infinitebench`).

Source. The hub dataset ``allenai/multi_lexsum`` (config ``v20230518``, split ``test``; one record per case:
``id``, ``sources`` (the case documents, a list of strings), ``sources_metadata``, ``summary/long``,
``summary/short``, ``summary/tiny``, ``case_metadata``). Offline, point ``task.data_path`` at a parquet / jsonl
export of that split (a file or a snapshot directory). As in QuantSpec's loader (``Data/data_converter.py``,
``convert_multilexsum_dataset``), cases without a short summary are dropped; ids are the record index over the
split, counted before that filter.

Prompt (QuantSpec, raw text, no chat template)::

    user = "\\nYou are given the legal documents in a civil rights lawsuit, ... outcomes of the case.\\n\\n"
           "Legal documents:\\n" + "\\n\\n".join(sources)
    ids  = tokenizer.encode(user)[: input_tokens - len(tokenizer.encode(SYSTEM))]   # head truncation
    ids[0] = BOS (eos when the tokenizer has no BOS)
    ids += tokenizer.encode(SYSTEM)       # SYSTEM = "\\n\\nNow please summarize the case. Summary:"

``tokenizer.encode`` adds the tokenizer's special tokens both times, so a Llama prompt has a second BOS before the
closing instruction: kept as the official code does it. Only cases whose prompt reaches ``input_tokens`` tokens
are used (QuantSpec keeps ``shape >= seq_len``), so every prompt is exactly ``input_tokens`` tokens: 4096 to
131072 in Table 3. max_new_tokens: 90 (the paper's setting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fafo.bounds import at_least
from fafo.errors import ConfigError
from tasks.base import Sample, check_turn, head_token_ids
from tasks.sources import DataTask, str_list

LEXSUM_USER = ("\nYou are given the legal documents in a civil rights lawsuit, and you are tasked to summarize the "
               "case. Write a concise summary of one paragraph (200 to 250 words). The summary should contain a "
               "short description of the background, the parties involved, and the outcomes of the case.\n\n"
               "{demo}Legal documents:\n{context}")
LEXSUM_SYSTEM = "\n\nNow please summarize the case. Summary:"


@dataclass
class QuantSpecSummaryTask(DataTask):
    """A long document, head-truncated to exactly ``input_tokens`` tokens with QuantSpec's templates.

    Args:
        input_tokens: prompt length in target-tokenizer tokens (documents that are shorter are skipped).
    """

    max_new_tokens: int = 90
    input_tokens: int = at_least(16, 8192, why="the prompt template alone takes about 16; e.g. 8192")

    USER: ClassVar[str] = ""
    SYSTEM: ClassVar[str] = ""

    def document(self, record: dict, index: int) -> str | None:
        """The record's document text, or None to skip the record."""
        raise NotImplementedError

    def load_samples(self) -> list[Sample]:
        samples = []
        for i, r in enumerate(self.records()):
            context = self.document(r, i)
            if context is None:
                continue
            text = self.USER.format(demo="", context=context)
            if len(text.encode("utf-8")) + 2 < self.input_tokens - len(self.SYSTEM.encode("utf-8")) - 1:
                continue  # certainly too short in any tokenizer (a token covers at least one byte)
            samples.append(Sample(id=str(i), category=self.name, chat=False, turns=[text]))
        if not samples:
            raise ConfigError(f"task.input_tokens={self.input_tokens}: every document of {self.source()} is "
                              "shorter; lower task.input_tokens")
        return samples

    def _ids(self, tokenizer: Any, sample: Sample) -> tuple[list[int], bool]:
        def build():
            tail = list(tokenizer(self.SYSTEM).input_ids)
            head, complete = head_token_ids(tokenizer, sample.turns[0], self.input_tokens - len(tail))
            head = list(head)
            first = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
            if head and first is not None:
                head[0] = first
            return head + tail, complete

        return self.memo(tokenizer, ("quantspec", sample.id, self.input_tokens), build)

    def usable(self, tokenizer: Any, sample: Sample) -> bool:
        return self._ids(tokenizer, sample)[1]

    def prompt_ids(self, tokenizer: Any, sample: Sample, turn: int, answers: list[str]) -> list[int]:
        check_turn(sample, turn, answers)
        ids, complete = self._ids(tokenizer, sample)
        if not complete:
            raise ConfigError(
                f"task {self.name!r}: document {sample.id!r} has fewer than task.input_tokens={self.input_tokens} "
                "tokens; leave it out with task.ids/task.limit or lower task.input_tokens")
        return ids


@dataclass
class MultiLexSumTask(QuantSpecSummaryTask):
    """Multi-LexSum with QuantSpec's prompt (see the module docstring)."""

    name: str = "multi_lexsum"
    hub_id: str = "allenai/multi_lexsum"
    hub_config: str | None = "v20230518"
    split: str = "test"

    USER: ClassVar[str] = LEXSUM_USER
    SYSTEM: ClassVar[str] = LEXSUM_SYSTEM
    RELEASE: ClassVar[str] = ("a parquet / jsonl export of allenai/multi_lexsum (config v20230518, split {split}; "
                              "fields sources, summary/short)")
    PATTERNS: ClassVar[tuple[str, ...]] = ("*{split}-*.parquet", "*{split}/*.parquet", "*{split}*.jsonl",
                                           "*{split}*.json", "*.parquet", "*.jsonl", "*.json", "*.jsonl.gz")
    HUB_NOTE: ClassVar[str] = "the hub repo may be script-based, which datasets>=4 cannot run"

    def document(self, record: dict, index: int) -> str | None:
        if record.get("summary/short") is None:
            return None  # QuantSpec: all_data.filter(lambda x: x["summary/short"] is not None)
        sources = str_list(self.value(record, index, "sources"))
        if sources is None:
            raise self.bad_record(index, "has `sources` that is not a non-empty list of strings")
        return "\n\n".join(sources)
