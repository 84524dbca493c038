"""AIME 2024: 30 competition problems with a reasoning prompt and a long generation.

Source: ``HuggingFaceH4/aime_2024`` (split ``train``; ``id``, ``problem``, ``solution``, ``answer`` (str),
``url``, ``year``) by default; ``Maxwell-Jia/AIME_2024`` (``ID``, ``Problem``, ``Solution``, ``Answer`` (int))
and Qwen2.5-Math's ``evaluation/data/aime24/test.jsonl`` (``id``, ``problem``, ``answer``, ...) work too, from the
hub (``task.hub_id``) or via ``task.data_path``. Ids are the record id as a string, in file order; ``references``
holds the answer as a string (the copies disagree on its type).

Prompt (Qwen2.5-Math / OpenCompass): the user turn ``"{problem}\\nPlease reason step by step, and put your
final answer within \\boxed{}."`` through the chat template; ``task.instruction_in_system=true`` is the Qwen
variant (the sentence as the system message, the bare problem as the user turn). max_new_tokens: reasoning models need
16k (gpt-fast's R1-distill speculative-decoding script; the default) to 32k new tokens. Only 30 items, so the
variance is high.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tasks.base import Sample
from tasks.sources import DataTask

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass
class AIMETask(DataTask):
    """AIME 2024 (see the module docstring).

    Args:
        instruction_in_system: False = instruction appended to the problem (default); True = Qwen's system form.
    """

    name: str = "aime24"
    max_new_tokens: int = 16384
    hub_id: str = "HuggingFaceH4/aime_2024"
    split: str = "train"
    instruction_in_system: bool = False

    RELEASE: ClassVar[str] = "QwenLM/Qwen2.5-Math's evaluation/data/aime24/test.jsonl (or a hub copy's parquet)"
    PATTERNS: ClassVar[tuple[str, ...]] = ("test.jsonl", "*/test.jsonl", "*{split}-*.parquet", "*.jsonl", "*.json")

    def load_samples(self) -> list[Sample]:
        samples = []
        for i, r in enumerate(self.records()):
            problem = self.value(r, i, "problem", "Problem")
            if not isinstance(problem, str) or not problem:
                raise self.bad_record(i, "has an empty problem")
            answer = self.value(r, i, "answer", "Answer", default=None)
            if self.instruction_in_system:
                turns, system = [problem], INSTRUCTION
            else:
                turns, system = [f"{problem}\n{INSTRUCTION}"], None
            samples.append(Sample(
                id=str(self.value(r, i, "id", "ID")),
                category="aime24",
                turns=turns,
                system=system,
                references=[] if answer is None else [str(answer)],
            ))
        return samples
