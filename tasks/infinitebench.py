"""InfiniteBench En.Sum (``longbook_sum_eng``: summarize a novel) as QuantSpec's Table 3 uses it.

Source. The hub dataset ``xinrongzhang2022/InfiniteBench``, split ``longbook_sum_eng`` (103 books; fields ``id``,
``context``, ``input``, ``answer`` (list), ``options``), or offline its release file ``longbook_sum_eng.jsonl``
(the same fields, one book per line) via ``task.data_path`` (a file or a directory holding it). The hub repo's
splits have different schemas (QuantSpec passes explicit ``features`` to ``load_dataset``); when the hub read fails
the error names the jsonl to download. Ids are the record index.

Prompt (QuantSpec ``Data/data_converter.py::load_infbench``, "slightly modified" from InfiniteBench's
``src/prompt.py``; raw text, no chat template): the same head-truncation rule as Multi-LexSum
(:class:`tasks.multi_lexsum.QuantSpecSummaryTask`) with::

    user   = "You are given a book and you are tasked to summarize it. Write a summary of about 1000 to 1200
              words. Only write about the plot and characters of the story. Do not discuss the themes or
              background of the book. Do not provide any analysis or commentary.\\n\\n" + context + "."
    system = "\\n\\nNow summarize the book. Summary:"

Books shorter than ``input_tokens`` are skipped (QuantSpec keeps prompts of at least ``seq_len`` tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tasks.multi_lexsum import QuantSpecSummaryTask

INFBENCH_USER = ("You are given a book and you are tasked to summarize it. Write a summary of about 1000 to 1200 "
                 "words. Only write about the plot and characters of the story. Do not discuss the themes or "
                 "background of the book. Do not provide any analysis or commentary.\n\n{demo}{context}.")
INFBENCH_SYSTEM = "\n\nNow summarize the book. Summary:"


@dataclass
class InfiniteBenchSumTask(QuantSpecSummaryTask):
    """InfiniteBench En.Sum with QuantSpec's prompt (see the module docstring)."""

    name: str = "infbench_sum"
    hub_id: str = "xinrongzhang2022/InfiniteBench"
    hub_config: str | None = None
    split: str = "longbook_sum_eng"
    input_tokens: int = 16384

    USER: ClassVar[str] = INFBENCH_USER
    SYSTEM: ClassVar[str] = INFBENCH_SYSTEM
    RELEASE: ClassVar[str] = "InfiniteBench's {split}.jsonl (hub xinrongzhang2022/InfiniteBench)"
    PATTERNS: ClassVar[tuple[str, ...]] = ("{split}.jsonl", "*/{split}.jsonl", "*{split}*.jsonl", "*{split}*.parquet",
                                           "*{split}*/*.parquet", "*.jsonl")
    HUB_NOTE: ClassVar[str] = "its splits have different schemas; the jsonl release file always works"

    def document(self, record: dict, index: int) -> str | None:
        context = self.value(record, index, "context")
        if not isinstance(context, str):
            raise self.bad_record(index, "has a `context` that is not a string")
        return context
