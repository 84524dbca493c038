"""GSM8K grade-school math, zero-shot, as the speed benchmarks run it (Spec-Bench, EAGLE).

Source: ``openai/gsm8k`` (config ``main`` or ``socratic``; split ``test``, 1319 rows of ``question`` /
``answer``, the answer ending ``#### N``) by default, or the release ``grade_school_math/data/test.jsonl``
(``openai/grade-school-math``) via ``task.data_path``. Ids are the 0-based row index ("0" ... "1318").

The speed papers use 80-question subsets, and theirs are not the first 80 rows:

* EAGLE: ``eagle/data/gsm8k/question.jsonl`` (``question_id``, ``turns`` [question], ``reference``): point
  ``task.data_path`` at it; every row is used.
* Spec-Bench: the ``math_reasoning`` rows of ``data/spec_bench/question.jsonl``, question ids 401-480: point
  ``task.data_path`` at that file and set ``task.id_range=[401, 480]`` (conf ``task=gsm8k_specbench80``).
  Rows in that schema keep their ``question_id`` as the id.

Prompt: the raw question is the single user turn, through the chat template (generation prompt on); no
few-shot exemplars (8-shot "Question:/Answer:" CoT is an accuracy convention, not a speed one). Greedy,
``max_new_tokens`` 1024. ``references`` holds the gold solution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fafo.errors import ConfigError
from tasks.base import Sample
from tasks.sources import DataTask, str_list


@dataclass
class GSM8KTask(DataTask):
    """GSM8K (see the module docstring).

    Args:
        id_range: ``[first, last]`` (inclusive) ``question_id`` range to keep, for question.jsonl files holding
            other categories too (Spec-Bench: ``[401, 480]``); null keeps every row.
    """

    name: str = "gsm8k"
    max_new_tokens: int = 1024
    hub_id: str = "openai/gsm8k"
    hub_config: str | None = "main"
    split: str = "test"
    id_range: Any = None

    RELEASE: ClassVar[str] = ("openai/grade-school-math's grade_school_math/data/{split}.jsonl (or a Spec-Bench/"
                              "EAGLE question.jsonl)")
    PATTERNS: ClassVar[tuple[str, ...]] = ("{split}.jsonl", "*/{split}.jsonl", "main/{split}-*.parquet",
                                           "*{split}-*.parquet", "question.jsonl", "*.jsonl")

    def _range(self) -> tuple[int, int] | None:
        if self.id_range is None:
            return None
        value = list(self.id_range) if not isinstance(self.id_range, (str, int)) else None
        if (value is None or len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                        for v in value) or value[0] > value[1]):
            raise ConfigError(f"task.id_range={self.id_range!r} is not [first, last] question ids; set e.g. "
                              "task.id_range=[401,480] or null")
        return value[0], value[1]

    def validate(self) -> None:
        if self._range() is not None and not self.data_path:
            raise ConfigError(f"task.id_range={list(self.id_range)} selects question ids of a Spec-Bench/EAGLE "
                              "question.jsonl, which the hub copy lacks; set task.data_path=/path/to/Spec-Bench/data/"
                              "spec_bench/question.jsonl")

    def load_samples(self) -> list[Sample]:
        id_range = self._range()
        samples = []
        for i, r in enumerate(self.records()):
            if "question" in r:
                sid, question, refs, category = str(i), r["question"], [str(r.get("answer", ""))], "gsm8k"
                qid = None
            else:  # Spec-Bench / EAGLE question.jsonl
                turns = str_list(self.value(r, i, "turns"))
                if turns is None:
                    raise self.bad_record(i, "has `turns` that is not a non-empty list of strings")
                qid = self.value(r, i, "question_id")
                sid, question, category = str(qid), turns[0], str(r.get("category", "gsm8k"))
                refs = [str(x) for x in (r.get("reference") or [])]
            if id_range is not None:
                if qid is None:
                    raise ConfigError(f"task.id_range={list(id_range)} needs rows with `question_id`, but "
                                      f"{self.source()} has GSM8K rows; set task.id_range=null")
                if not (isinstance(qid, int) and id_range[0] <= qid <= id_range[1]):
                    continue
            if not isinstance(question, str) or not question:
                raise self.bad_record(i, "has an empty question")
            samples.append(Sample(id=sid, category=category, turns=[question], references=refs))
        if id_range is not None and not samples:
            raise ConfigError(f"task.id_range={list(id_range)} keeps no row of {self.source()}; use the question ids "
                              "of the file (Spec-Bench math_reasoning: [401, 480])")
        return samples
