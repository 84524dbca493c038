"""HumanEval-Completion: 164 Python function prefixes completed as raw text (Lookahead Decoding's setting).

Source: ``openai/openai_humaneval`` (config ``openai_humaneval``, split ``test``; fields ``task_id``,
``prompt``, ``canonical_solution``, ``test``, ``entry_point``) by default, or the release
``data/HumanEval.jsonl.gz`` (``openai/human-eval``, what ``human_eval.data.read_problems()`` reads) via
``task.data_path``. Ids are the ``task_id`` ("HumanEval/0" ...), in file order.

Prompt (``applications/eval_humaneval.py``): ``prompt`` is the raw code prefix, **no chat template**,
tokenized as ``tokenizer(prompt, max_length=1024, truncation=True)`` (BOS included; the 1024-token input cap is
``task.max_input_tokens``, a head cut on the tokenizer's truncation side), ``max_new_tokens`` 512, greedy.
For pass@k, score ``prompt + completion`` with ``test`` and ``entry_point`` (``references`` holds the canonical
solution).

``task.chat=true`` gives EAGLE's chat variant instead: ``"Complete the code I provided.\\n\\n" + prompt`` as a
user turn through the chat template (no input cap). Rows already in EAGLE's ``question.jsonl`` schema
(``question_id``, ``turns``) are used as they are, as chat turns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tasks.base import Sample, check_turn
from tasks.sources import DataTask, str_list

EAGLE_PREFIX = "Complete the code I provided.\n\n"


@dataclass
class HumanEvalTask(DataTask):
    """HumanEval-Completion (see the module docstring).

    Args:
        chat: False (default) = raw completion; True = EAGLE's chat variant.
    """

    name: str = "humaneval"
    max_new_tokens: int = 512
    max_input_tokens: int | None = 1024
    hub_id: str = "openai/openai_humaneval"
    hub_config: str | None = "openai_humaneval"
    split: str = "test"
    chat: bool = False

    TRUNCATION: ClassVar[str] = "head: tokenizer(prompt, max_length=max_input_tokens, truncation=True)"
    RELEASE: ClassVar[str] = "openai/human-eval's data/HumanEval.jsonl.gz"
    PATTERNS: ClassVar[tuple[str, ...]] = ("HumanEval.jsonl.gz", "*/HumanEval.jsonl.gz", "HumanEval.jsonl",
                                           "*/HumanEval.jsonl", "*{split}-*.parquet", "question.jsonl", "*.jsonl*")

    def load_samples(self) -> list[Sample]:
        samples = []
        for i, r in enumerate(self.records()):
            if "prompt" in r:
                prompt = self.value(r, i, "prompt")
                if not isinstance(prompt, str) or not prompt:
                    raise self.bad_record(i, "has an empty `prompt`")
                sid = str(self.value(r, i, "task_id"))
                refs = [str(r["canonical_solution"])] if r.get("canonical_solution") is not None else []
                text = EAGLE_PREFIX + prompt if self.chat else prompt
                samples.append(Sample(id=sid, category="humaneval", chat=bool(self.chat), turns=[text],
                                      references=refs))
            else:  # EAGLE's humaneval question.jsonl: the chat turns are given
                turns = str_list(self.value(r, i, "turns"))
                if turns is None:
                    raise self.bad_record(i, "has `turns` that is not a non-empty list of strings")
                samples.append(Sample(id=str(self.value(r, i, "question_id")), category="humaneval", turns=turns))
        return samples

    def prompt_ids(self, tokenizer: Any, sample: Sample, turn: int, answers: list[str]) -> list[int]:
        """Raw samples: ``tokenizer(prompt, max_length=max_input_tokens, truncation=True)``; chat: the base rule."""
        check_turn(sample, turn, answers)
        if sample.chat or self.max_input_tokens is None:
            return super().prompt_ids(tokenizer, sample, turn, answers)
        return list(tokenizer(sample.turns[0], max_length=self.max_input_tokens, truncation=True).input_ids)

