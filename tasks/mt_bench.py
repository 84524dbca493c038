"""MT-Bench: 80 two-turn chat questions (FastChat ``llm_judge``), the standard speed-benchmark workload.

Source: the hub copy ``HuggingFaceH4/mt_bench_prompts`` (split ``train``; fields ``prompt`` [2 turns],
``prompt_id`` (a hash), ``category``, ``reference``) by default, or FastChat's release
``fastchat/llm_judge/data/mt_bench/question.jsonl`` (fields ``question_id`` 81-160, ``category``, ``turns``,
optional ``reference``) via ``task.data_path``; EAGLE's ``eagle/data/mt_bench/question.jsonl`` is the same file,
and Spec-Bench's ``data/spec_bench/question.jsonl`` works too (its first 80 rows are MT-Bench; select them with
``task.limit=80`` or ``task.ids``). Ids are ``question_id`` (or ``prompt_id``), in file order.

Prompts (FastChat / Spec-Bench / EAGLE): turn 1 is ``[user: turns[0]]`` through the chat template with the
generation prompt; turn 2 replays the model's **own** decoded turn-1 answer (special tokens removed, stripped)
as the assistant message, then ``[user: turns[1]]``, re-rendered. ``max_new_tokens`` 1024 per turn, greedy.
``task.system`` sets a system message (e.g. EAGLE's Llama-2 system prompt); null keeps the template default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tasks.base import Sample
from tasks.sources import DataTask, str_list


@dataclass
class MTBenchTask(DataTask):
    """MT-Bench (see the module docstring)."""

    name: str = "mt_bench"
    max_new_tokens: int = 1024
    hub_id: str = "HuggingFaceH4/mt_bench_prompts"
    split: str = "train"

    RELEASE: ClassVar[str] = "FastChat's fastchat/llm_judge/data/mt_bench/question.jsonl"
    PATTERNS: ClassVar[tuple[str, ...]] = ("question.jsonl", "*/question.jsonl", "*{split}-*.parquet", "*.jsonl")

    def load_samples(self) -> list[Sample]:
        samples = []
        for i, r in enumerate(self.records()):
            turns = str_list(self.value(r, i, "turns", "prompt"))
            if turns is None:
                raise self.bad_record(i, "has `turns` that is not a non-empty list of strings")
            references = r.get("reference") or []
            samples.append(Sample(
                id=str(self.value(r, i, "question_id", "prompt_id")),
                category=str(r.get("category", "")),
                turns=turns,
                followup="own",
                references=[str(x) for x in references],
            ))
        return samples
