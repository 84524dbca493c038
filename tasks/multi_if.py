"""Multi-IF: three-turn multilingual instruction following (facebookresearch/Multi-IF).

Source: ``facebook/Multi-IF`` (one CSV, ``multiIF_20241018.csv``, default split ``train``, 4501 rows) by
default, or that CSV via ``task.data_path`` (read with ``pandas.read_csv(keep_default_na=False)`` so empty
``turn_3_prompt`` cells stay empty strings). Columns used: ``key`` (the sample id), ``language`` (the category),
``turn_1_prompt`` .. ``turn_3_prompt``: each a JSON **string** ``{"role": "user", "content": ...}``. A turn whose
cell is empty, ``"None"`` or missing ends the conversation (the eval script's rule), so a sample has 1-3 turns.
A ``key`` seen twice gets ``#2``, ``#3``... appended, in file order.

Prompts (``multi_turn_instruct_following_eval_vllm.py``): step k sends ``[previous messages] + [assistant:
the model's own step-(k-1) response, stripped] + [turn k's message]`` through the chat template with the
generation prompt. The runner's ``main()`` decodes with max_new_tokens 1024, temperature 0.6, top-p 0.9
(``sampling=random sampling.temperature=0.6 sampling.top_p=0.9``; lossless speed runs use greedy).
``task.languages`` keeps only some languages (e.g. ``[English]``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from fafo.errors import ConfigError
from tasks.base import Sample
from tasks.sources import DataTask

N_TURNS = 3


@dataclass
class MultiIFTask(DataTask):
    """Multi-IF (see the module docstring).

    Args:
        languages: keep only rows whose ``language`` is in this list; null keeps all.
    """

    name: str = "multi_if"
    max_new_tokens: int = 1024
    hub_id: str = "facebook/Multi-IF"
    split: str = "train"
    languages: Any = None

    RELEASE: ClassVar[str] = "facebook/Multi-IF's multiIF_20241018.csv"
    PATTERNS: ClassVar[tuple[str, ...]] = ("multiIF_*.csv", "*/multiIF_*.csv", "*.csv", "*{split}-*.parquet")

    def _languages(self) -> set[str] | None:
        if self.languages is None:
            return None
        values = [self.languages] if isinstance(self.languages, str) else list(self.languages)
        if not values or not all(isinstance(v, str) for v in values):
            raise ConfigError(f"task.languages={self.languages!r} is not a list of language names; set e.g. "
                              "task.languages=[English] or null")
        return set(values)

    def validate(self) -> None:
        self._languages()

    def load_samples(self) -> list[Sample]:
        languages = self._languages()
        samples, seen = [], {}
        for i, r in enumerate(self.records()):
            language = str(r.get("language") or "")
            if languages is not None and language not in languages:
                continue
            turns = []
            for k in range(1, N_TURNS + 1):
                cell = r.get(f"turn_{k}_prompt")
                if cell is None or (isinstance(cell, str) and cell.strip() in ("", "None")):
                    break
                try:
                    message = json.loads(cell) if isinstance(cell, str) else cell
                    content = message["content"]
                except (json.JSONDecodeError, TypeError, KeyError):
                    raise self.bad_record(i, f"has a turn_{k}_prompt that is not a JSON {{\"role\", \"content\"}} "
                                             "string") from None
                if not isinstance(content, str):
                    raise self.bad_record(i, f"has a turn_{k}_prompt whose content is not a string")
                turns.append(content)
            if not turns:
                raise self.bad_record(i, "has an empty turn_1_prompt")
            key = str(self.value(r, i, "key"))
            seen[key] = seen.get(key, 0) + 1
            sid = key if seen[key] == 1 else f"{key}#{seen[key]}"
            samples.append(Sample(id=sid, category=language, turns=turns, followup="own"))
        if not samples:
            raise ConfigError(f"task.languages={sorted(languages or [])} keeps no row of {self.source()}; use "
                              "languages of the file (e.g. English, French, Chinese) or null")
        return samples
