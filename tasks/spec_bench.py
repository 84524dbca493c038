"""Spec-Bench (Xia et al., ACL 2024 Findings, https://arxiv.org/abs/2401.07851; hemingkx/Spec-Bench): 480
questions in 6 subtasks (13 categories), the leaderboard workload of speculative decoding.

Source: the release file ``data/spec_bench/question.jsonl`` (fields ``question_id`` 81-560, ``category``,
``turns``, optional ``reference``) via ``task.data_path`` (there is no hub copy; the path is required; commit
fd2c1cd read). Rows 81-160 are MT-Bench (2 turns each, 10 per category: ``writing``, ``roleplay``, ``reasoning``,
``math``, ``coding``, ``extraction``, ``stem``, ``humanities``), then 80 each of ``translation``,
``summarization``, ``qa``, ``math_reasoning`` and ``rag`` (one turn). A sample's ``category`` is the file's own,
as Spec-Bench's ``evaluation/speed.py`` selects rows by it (``mt_bench`` is the eight MT-Bench categories
together; a row written as ``mt_bench`` would be selected by no subtask). The leaderboard's six columns are the
subtasks (:func:`subtask`): ``mt_bench`` (Multi-turn Conversation), ``translation``, ``summarization``, ``qa``
(Question Answering), ``math_reasoning`` (Mathematical Reasoning), ``rag`` (Retrieval-aug. Generation);
``task.categories`` keeps some subtasks (or single MT-Bench categories).

Prompts (Spec-Bench ``evaluation/eval.py``): every turn is a chat turn, turn 2 replays the model's own turn-1
answer; ``max_new_tokens`` 1024 per turn, greedy. ``task.template=model`` renders the tokenizer's chat template
(our convention for every chat task); ``task.template=vicuna`` renders FastChat's ``vicuna_v1.1`` conversation
as Spec-Bench does for its Vicuna-7B-v1.3 leaderboard (``"<system> USER: q1 ASSISTANT: a1</s>USER: q2
ASSISTANT:"``, tokenized with the tokenizer's BOS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fafo.bounds import one_of
from fafo.errors import ConfigError
from tasks.base import Sample, check_turn, conversation
from tasks.sources import DataTask, str_list

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SUBTASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")  # leaderboard columns
CATEGORIES = MT_BENCH_CATEGORIES + SUBTASKS[1:]  # the release file's `category` values (speed.py selects by them)
SUBTASK_NAMES = {"mt_bench": "Multi-turn Conversation", "translation": "Translation",
                 "summarization": "Summarization", "qa": "Question Answering",
                 "math_reasoning": "Mathematical Reasoning", "rag": "Retrieval-aug. Generation"}
VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                 "helpful, detailed, and polite answers to the user's questions.")
TEMPLATES = ("model", "vicuna")


def subtask(category: str) -> str:
    """Spec-Bench's subtask of a row's ``category`` (``speed.py``: the 8 MT-Bench categories are ``mt_bench``);
    any other category is its own."""
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


def vicuna_prompt(messages: list[dict[str, str]], system: str | None = None) -> str:
    """FastChat ``vicuna_v1.1``: ``system + " "``, then ``"USER: m "`` / ``"ASSISTANT: m</s>"``, then
    ``"ASSISTANT:"``."""
    text = (system if system is not None else VICUNA_SYSTEM) + " "
    for m in messages:
        if m["role"] == "user":
            text += f"USER: {m['content']} "
        elif m["role"] == "assistant":
            text += f"ASSISTANT: {m['content']}</s>"
    return text + "ASSISTANT:"


@dataclass
class SpecBenchTask(DataTask):
    """Spec-Bench (see the module docstring).

    Args:
        categories: keep only these subtasks (``mt_bench``, ``translation``, ``summarization``, ``qa``,
            ``math_reasoning``, ``rag``) or MT-Bench categories (``writing`` ...); null keeps all.
        template: ``model`` (the tokenizer's chat template) or ``vicuna`` (FastChat's, as Spec-Bench).
    """

    name: str = "spec_bench"
    max_new_tokens: int = 1024
    categories: Any = None
    template: str = one_of(TEMPLATES, "model", why="model: the tokenizer's chat template; vicuna: Spec-Bench's")

    RELEASE: ClassVar[str] = "hemingkx/Spec-Bench's data/spec_bench/question.jsonl"
    RELEASE_URL: ClassVar[str] = ("https://raw.githubusercontent.com/hemingkx/Spec-Bench/"
                                  "fd2c1cd7d2201ef71db4c5f4e455008f017967bf/data/spec_bench/question.jsonl")
    PATTERNS: ClassVar[tuple[str, ...]] = ("question.jsonl", "*/question.jsonl", "*/*/question.jsonl", "*.jsonl")

    def _categories(self) -> list[str] | None:
        if self.categories is None:
            return None
        cats = [self.categories] if isinstance(self.categories, str) else list(self.categories)
        unknown = [c for c in cats if c not in SUBTASKS + MT_BENCH_CATEGORIES]
        if unknown or not cats:
            raise ConfigError(f"task.categories={cats!r} has unknown subtasks {unknown}; use some of "
                              f"{', '.join(SUBTASKS)} or the MT-Bench categories {', '.join(MT_BENCH_CATEGORIES)} "
                              "(or null for all)")
        return cats

    def validate(self) -> None:
        self._categories()
        if not self.data_path:
            raise ConfigError("task spec_bench reads Spec-Bench's release file, which has no hub copy; set "
                              "task.data_path=/path/to/Spec-Bench/data/spec_bench/question.jsonl")

    def load_samples(self) -> list[Sample]:
        keep = self._categories()
        samples = []
        for i, r in enumerate(self.records()):
            turns = str_list(self.value(r, i, "turns"))
            if turns is None:
                raise self.bad_record(i, "has `turns` that is not a non-empty list of strings")
            cat = str(self.value(r, i, "category"))
            if cat not in CATEGORIES:
                raise self.bad_record(i, f"has category {cat!r}, not one of Spec-Bench's {', '.join(CATEGORIES)}")
            if keep is not None and cat not in keep and subtask(cat) not in keep:
                continue
            samples.append(Sample(id=str(self.value(r, i, "question_id")), category=cat, turns=turns,
                                  followup="own", references=[str(x) for x in r.get("reference") or []]))
        if not samples:
            raise ConfigError(f"task.categories={keep} keeps no row of {self.source()}; use categories it has")
        return samples

    def prompt_ids(self, tokenizer: Any, sample: Sample, turn: int, answers: list[str]) -> list[int]:
        if self.template == "model":
            return super().prompt_ids(tokenizer, sample, turn, answers)
        check_turn(sample, turn, answers)
        messages = [m for m in conversation(sample, turn, answers) if m["role"] != "system"]
        text = vicuna_prompt(messages, sample.system)
        return list(tokenizer(text, add_special_tokens=True).input_ids)

    def prompt_format(self, tokenizer: Any, sample: Sample) -> str:
        return super().prompt_format(tokenizer, sample) if self.template == "model" else "Vicuna v1.1 template"
