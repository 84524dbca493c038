"""LongBench (v1) subsets: multi_news, lcc, trec, qasper, 2wikimqa, narrativeqa, gov_report, qmsum, repobench-p
(THUDM/LongBench ``pred.py``).

Source. ``THUDM/LongBench`` on the hub is **script-based** (``LongBench.py`` + ``data.zip``), which
``datasets >= 4`` no longer runs ("Dataset scripts are no longer supported"). The default reads the parquet
mirror ``Xnhyacinth/LongBench`` (config = subset, split ``test``; the mirror lm-evaluation-harness switched
to). Offline, download the release ``data.zip`` from the hub repo and point ``task.data_path`` at the zip, at
its unzipped ``data/`` directory, or at ``data/{subset}.jsonl`` itself. Record fields: ``input``,
``context``, ``answers``, ``length``, ``dataset``, ``language``, ``all_classes``, ``_id`` (the sample id).
200 records per subset (lcc 500), in file order.

Prompt: ``dataset2prompt[subset].format(**record)`` (templates copied verbatim from
``LongBench/config/dataset2prompt.json``, including narrativeqa's upstream typo "asconcisely"). When
``task.max_input_tokens`` (``model2maxlen``: 3500 for 4k models, 7500 for 8k, 15500 for 16k, 31500 for 32k) is
set and the prompt is longer, it is **truncated in the middle in target-tokenizer tokens** exactly as
``pred.py`` does: ``ids = tokenizer(prompt).input_ids`` (special tokens included),
``half = int(max_input_tokens / 2)``, ``prompt = decode(ids[:half]) + decode(ids[-half:])`` (special tokens
skipped). The chat template is applied **after** truncation, except for trec and lcc (and the other few-shot /
code subsets triviaqa, samsum, lsht, repobench-p), which are tokenized raw with the tokenizer's BOS.
``max_new_tokens`` per subset from ``dataset2maxlen.json``; greedy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from fafo.bounds import at_least, one_of
from tasks.base import Sample, check_turn
from tasks.sources import DataTask

# LongBench/config/dataset2prompt.json (v1), verbatim.
DATASET2PROMPT = {
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
        "question asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\n"
        "Story: {context}\n\n"
        "Now, answer the question based on the story asconcisely as you can, using a single phrase if possible. "
        "Do not provide any explanation.\n\n"
        "Question: {input}\n\n"
        "Answer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as you can, using a "
        "single phrase or sentence if possible. If the question cannot be answered based on the information in "
        "the article, write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or "
        "\"unanswerable\". Do not provide any explanation.\n\n"
        "Article: {context}\n\n"
        " Answer the question based on the above article as concisely as you can, using a single phrase or "
        "sentence if possible. If the question cannot be answered based on the information in the article, write "
        "\"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do "
        "not provide any explanation.\n\n"
        "Question: {input}\n\n"
        "Answer:"
    ),
    "2wikimqa": (
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\n"
        "The following are given passages.\n"
        "{context}\n\n"
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\n"
        "Question: {input}\n"
        "Answer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\n"
        "News:\n"
        "{context}\n\n"
        "Now, write a one-page summary of all the news.\n\n"
        "Summary:"
    ),
    "trec": (
        "Please determine the type of the question below. Here are some examples of questions.\n\n"
        "{context}\n"
        "{input}"
    ),
    "lcc": (
        "Please complete the code given below. \n"
        "{context}Next line of code:\n"
    ),
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
        "Report:\n{context}\n\n"
        "Now, write a one-page summary of the report.\n\n"
        "Summary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query in "
        "one or more sentences.\n\n"
        "Transcript:\n{context}\n\n"
        "Now, answer the query based on the above meeting transcript in one or more sentences.\n\n"
        "Query: {input}\n"
        "Answer:"
    ),
    "repobench-p": (
        "Please complete the code given below. \n"
        "{context}{input}Next line of code:\n"
    ),
}

# LongBench/config/dataset2maxlen.json, for these subsets.
DATASET2MAXLEN = {"narrativeqa": 128, "qasper": 128, "2wikimqa": 32, "multi_news": 512, "trec": 64, "lcc": 64,
                  "gov_report": 512, "qmsum": 512, "repobench-p": 64}

# pred.py: "chat models are better off without build prompts on these tasks".
RAW_SUBSETS = frozenset({"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"})


@dataclass
class LongBenchTask(DataTask):
    """One LongBench subset (see the module docstring).

    Args:
        subset: one of multi_news, lcc, trec, qasper, 2wikimqa, narrativeqa.
        max_new_tokens: null = the subset's ``dataset2maxlen`` count.
        max_input_tokens: LongBench's ``model2maxlen`` for the model (null = no truncation).
        min_input_tokens: keep only prompts with more tokens than this (LongSpec's ``1200 < length``; null = all).
        max_kept_tokens: keep only prompts with at most this many tokens (LongSpec's ``length <= context - 2000``:
            longer ones are dropped, as its ``inference_long-bench.py`` does, not truncated; null = all).
    """

    name: str = "longbench"
    subset: str = one_of(tuple(DATASET2PROMPT), "narrativeqa")
    max_new_tokens: int | None = None
    hub_id: str = "Xnhyacinth/LongBench"
    hub_config: str | None = None  # null = the subset name
    split: str = "test"
    min_input_tokens: int | None = at_least(0, None)  # 0 or null: no minimum
    max_kept_tokens: int | None = at_least(1, None)  # null: no maximum

    TRUNCATION: ClassVar[str] = "middle, in target-tokenizer tokens, before the chat template (LongBench pred.py)"
    RELEASE: ClassVar[str] = "THUDM/LongBench's data.zip (data/{subset}.jsonl)"
    PATTERNS: ClassVar[tuple[str, ...]] = ("data/{subset}.jsonl", "{subset}.jsonl", "*/data/{subset}.jsonl",
                                           "{subset}/{split}-*.parquet", "{subset}/{split}/*.parquet",
                                           "*/{subset}/{split}-*.parquet", "*/{subset}/{split}/*.parquet")
    HUB_NOTE: ClassVar[str] = ("THUDM/LongBench itself is script-based, which datasets>=4 cannot run; the default "
                               "hub_id is its parquet mirror Xnhyacinth/LongBench")

    def __post_init__(self) -> None:
        if self.max_new_tokens is None:
            self.max_new_tokens = DATASET2MAXLEN.get(self.subset)
        if self.hub_config is None:
            self.hub_config = self.subset

    def load_samples(self) -> list[Sample]:
        template = DATASET2PROMPT[self.subset]
        chat = self.subset not in RAW_SUBSETS
        samples = []
        for i, r in enumerate(self.records()):
            for key in ("context", "input"):
                self.value(r, i, key)
            answers = r.get("answers") or []
            samples.append(Sample(
                id=str(self.value(r, i, "_id")),
                category=self.subset,
                chat=chat,
                turns=[template.format(**r)],
                references=[str(a) for a in answers],
            ))
        return samples

    def usable(self, tokenizer: Any, sample: Sample) -> bool:
        """``min_input_tokens`` < tokens of the formatted (truncated) prompt <= ``max_kept_tokens``."""
        if (self.min_input_tokens is None and self.max_kept_tokens is None) or tokenizer is None:
            return True
        text = self.memo(tokenizer, ("prompt", sample.id), lambda: self.truncated_prompt(tokenizer, sample))
        n = self.memo(tokenizer, ("length", sample.id), lambda: len(tokenizer(text, truncation=False).input_ids))
        return (self.min_input_tokens is None or n > self.min_input_tokens) and (
            self.max_kept_tokens is None or n <= self.max_kept_tokens)

    def truncated_prompt(self, tokenizer: Any, sample: Sample) -> str:
        """The formatted prompt, middle-truncated to ``max_input_tokens`` tokens as ``pred.py`` does."""
        prompt = sample.turns[0]
        if self.max_input_tokens is None:
            return prompt
        ids = tokenizer(prompt, truncation=False).input_ids
        if len(ids) <= self.max_input_tokens:
            return prompt
        half = int(self.max_input_tokens / 2)
        return (tokenizer.decode(ids[:half], skip_special_tokens=True)
                + tokenizer.decode(ids[-half:], skip_special_tokens=True))

    def prompt_ids(self, tokenizer: Any, sample: Sample, turn: int, answers: list[str]) -> list[int]:
        """Truncate (cached per tokenizer), then the base rule: chat template, or raw for trec/lcc."""
        check_turn(sample, turn, answers)
        text = self.memo(tokenizer, ("prompt", sample.id), lambda: self.truncated_prompt(tokenizer, sample))
        return super().prompt_ids(tokenizer, dataclasses.replace(sample, turns=[text]), turn, answers)
