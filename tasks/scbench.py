"""SCBench (shared-context, multi-turn) subsets, as ``microsoft/MInference`` ``scbench/`` runs them.

Source: ``microsoft/SCBench``, config ``scbench_{subset}``, split ``test`` by default, or the raw release
``data/scbench_{subset}.jsonl`` via ``task.data_path`` (the file, or a directory holding it). Records: ``id``,
``context``, ``multi_turns`` [{``input``, ``answer``, + ``options`` (choice_eng) / ``task``}]; in
``scbench_mf`` the context is a **list of int64** (rendered as Python prints it, ``[1, 2, 3]``) and the answers
are ints. Subsets: mf (Math.Find), repoqa, many_shot, vt (multi-hop variable tracing), qa_eng, and the
same-shaped kv, prefix_suffix, qa_chn, choice_eng. Ids are the record ``id``.

Multi-turn mode (``run_scbench.py`` default, ``--use_chat_template``, ``max_turns=5``):

* Turn 1 is ``multiturn_templates[subset]`` (below) with the context and turn 1's input, through the chat
  template (generation prompt on). mf's template is ``{prefix}\\n\\n{context}\\n\\n{input}`` with
  ``prefix = "What is {target}?"``, ``target`` taken from turn 1's input (``re.findall(r"The .+ is", input)``).
* Its token ids are **truncated in the middle** to ``max_seq_length - max_new_tokens * turns`` tokens
  (``truncate_input``: ``ids[:half] + ids[-half:]``; ``turns`` from the first record, capped at
  ``max_turns``), or to ``task.max_input_tokens`` when that is set.
* Turn k > 1 appends, as token ids, the chat-formatted piece ``[assistant: previous **gold** answer]
  [user: follow-up]``: the template rendered on ``[system: "", assistant, user]`` with the rendered
  ``[system: ""] + generation prompt`` prefix removed (SCBench's ``.replace``), tokenized with
  ``add_special_tokens=False``. The prompt of turn k is turn 1's ids + pieces 2..k, exactly the KV SCBench
  keeps. Templates that reject a leading assistant message (Llama-2's) get the same piece as the rendered
  conversation's suffix after the previous turn's prompt.
* ``task.followup=own`` (SCBench's ``--disable_golden_context``) puts the model's own stripped answer in that
  assistant slot instead (SCBench appends the raw generated tokens plus EOS and a re-rendered user turn; we
  keep one chat format for both).
* Without a chat template (``use_chat_template=false`` or a base tokenizer): turn 1 is the raw text with
  BOS and pieces are ``"{previous answer}\\n\\n{follow-up}"`` (``multiturn_follow_up_templates``).

Differences from the harness, on purpose: turn 1 is tokenized with ``add_special_tokens=False`` after the
chat template (SCBench's ``tok.encode`` adds a second BOS on templates that carry one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from fafo.bounds import at_least, one_of
from fafo.errors import ConfigError
from tasks.base import (CHAT_TEMPLATE, FOLLOWUPS, RAW_TEXT, Sample, check_turn, has_chat_template, previous_reply,
                        raw_prompt_ids, truncate_middle)
from tasks.sources import DataTask

# scbench/eval_utils.py multiturn_templates (turn 1), verbatim.
FIRST_TURN = {
    "mf": "{prefix}\n\n{context}\n\n{input}",
    "repoqa": ("Based on the function description and code context, please retrieve and repeat the exact described "
               "function from the code context in a code block wrapped by ```:\n\n{context}\n\n{input}"),
    "many_shot": "{context}\n\n{input}",
    "vt": "{context}\n\n{input}",
    "qa_eng": ("Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\n"
               "Question: {question}\nAnswer:"),
    "qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
    "kv": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",
    "prefix_suffix": "{context}\n\n{input}",
    "choice_eng": ("Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\nA. {OPTION_A}\n"
                   "B. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe the correct answer is"),
}

# multiturn_follow_up_templates_in_chat_tempate (turns > 1; the raw mode puts "{pre_ans}\n\n" before these).
FOLLOW_UP = {
    "mf": "{prefix}\n\n{input}",
    "repoqa": "{input}",
    "many_shot": "{input}",
    "vt": "{input}",
    "qa_eng": "Question: {question}\nAnswer:",
    "qa_chn": "问题：{question}\n答案：",
    "kv": "{input}",
    "prefix_suffix": "{input}",
    "choice_eng": ("Question: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\n"
                   "The the correct answer is"),
}
# The raw-mode choice_eng follow-up differs in its last words (multiturn_follow_up_templates).
RAW_FOLLOW_UP_CHOICE = ("{pre_ans}\n\nQuestion: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\n"
                        "D. {OPTION_D}\n\nThe letter of the correct answer is")

# DATA_NAME_TO_MAX_NEW_TOKENS
MAX_NEW_TOKENS = {"mf": 5, "repoqa": 1024, "many_shot": 10, "vt": 30, "qa_eng": 40, "qa_chn": 40, "kv": 150,
                  "prefix_suffix": 150, "choice_eng": 40}


def mf_prefix(query: str) -> str:
    """SCBench Math.Find's question prefix: ``"What is {target}?"`` from ``"The {target} is ..."``."""
    found = re.findall(r"The .+ is", query)
    if not found:
        raise ValueError(f"Math.Find input {query[:60]!r} has no 'The ... is' phrase")
    return f"What is {found[0].lower()[:-3]}?"


def _fields(subset: str, turn: dict, prefix: str | None = None) -> dict[str, Any]:
    """Template fields of one turn (``question``/``OPTION_*``/``prefix`` as SCBench passes them)."""
    values: dict[str, Any] = {"input": turn["input"], "question": turn["input"]}
    if subset == "choice_eng":
        options = list(turn["options"])
        values.update({f"OPTION_{c}": options[j] for j, c in enumerate("ABCD")})
    if subset == "mf":
        values["prefix"] = prefix if prefix is not None else mf_prefix(turn["input"])
    return values


@dataclass
class SCBenchTask(DataTask):
    """One SCBench subset in multi-turn mode (see the module docstring).

    Args:
        subset: mf, repoqa, many_shot, vt, qa_eng (also kv, prefix_suffix, qa_chn, choice_eng).
        max_new_tokens: null = SCBench's per-subset count (``DATA_NAME_TO_MAX_NEW_TOKENS``).
        max_turns: keep the first ``max_turns`` turns of every record (SCBench default 5).
        max_seq_length: SCBench's ``--max_seq_length`` (131072): turn 1 is cut to ``max_seq_length -
            max_new_tokens * turns`` tokens. Set it to the model's context; null = no truncation.
        max_input_tokens: turn 1's token limit directly (overrides ``max_seq_length``).
        followup: ``gold`` (SCBench's default: the gold answers are replayed) or ``own`` (the model's answers).
        use_chat_template: False = SCBench without ``--use_chat_template`` (raw text and raw follow-ups).
    """

    name: str = "scbench"
    subset: str = one_of(tuple(FIRST_TURN), "qa_eng")
    max_new_tokens: int | None = None
    hub_id: str = "microsoft/SCBench"
    hub_config: str | None = None  # null = scbench_{subset}
    split: str = "test"
    max_turns: int = at_least(1, 5)
    max_seq_length: int | None = at_least(1, 131072)
    followup: str = one_of(FOLLOWUPS, "gold", why="gold: SCBench replays the gold answers; own: the model's")
    use_chat_template: bool = True

    TRUNCATION: ClassVar[str] = "middle, in target-tokenizer tokens, of the rendered first turn (SCBench)"
    RELEASE: ClassVar[str] = "microsoft/SCBench's data/scbench_{subset}.jsonl"
    PATTERNS: ClassVar[tuple[str, ...]] = ("data/scbench_{subset}.jsonl", "scbench_{subset}.jsonl",
                                           "*/data/scbench_{subset}.jsonl", "scbench_{subset}/{split}-*.parquet",
                                           "*/scbench_{subset}/{split}-*.parquet", "*scbench_{subset}-*.parquet")

    def __post_init__(self) -> None:
        if self.max_new_tokens is None:
            self.max_new_tokens = MAX_NEW_TOKENS.get(self.subset)
        if self.hub_config is None:
            self.hub_config = f"scbench_{self.subset}"
        self._turns_reserved = 1  # turns whose answers max_seq_length leaves room for

    def load_samples(self) -> list[Sample]:
        samples = []
        for i, r in enumerate(self.records()):
            turns_in = self.value(r, i, "multi_turns")
            if hasattr(turns_in, "tolist"):
                turns_in = turns_in.tolist()
            if not isinstance(turns_in, list) or not turns_in or not all(isinstance(t, dict) for t in turns_in):
                raise self.bad_record(i, "has `multi_turns` that is not a non-empty list of {input, answer} objects")
            turns_in = turns_in[: self.max_turns]
            if i == 0:
                self._turns_reserved = len(turns_in)  # run_scbench.py: max_turn_size from the first example
            context = self.value(r, i, "context", "input")
            if hasattr(context, "tolist"):
                context = context.tolist()
            try:
                first = FIRST_TURN[self.subset].format(context=context, **_fields(self.subset, turns_in[0]))
                follow = [FOLLOW_UP[self.subset].format(**_fields(self.subset, t)) for t in turns_in[1:]]
                answers = [str(t["answer"]) for t in turns_in]
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise self.bad_record(i, f"does not fit scbench_{self.subset} ({type(exc).__name__}: {exc})") from None
            samples.append(Sample(
                id=str(self.value(r, i, "id")),
                category=self.subset,
                turns=[first, *follow],
                followup=self.followup,
                references=answers,
            ))
        return samples

    # ---------------------------------------------------------------- prompts
    def first_turn_tokens(self) -> int | None:
        """Token limit of turn 1: ``max_input_tokens``, else ``max_seq_length - max_new_tokens * turns``."""
        if self.max_input_tokens is not None:
            return self.max_input_tokens
        if self.max_seq_length is None:
            return None
        limit = self.max_seq_length - self.max_new_tokens * self._turns_reserved
        if limit < 1:
            raise ConfigError(f"task.max_seq_length={self.max_seq_length} leaves no room for the context after "
                              f"{self._turns_reserved} x {self.max_new_tokens} new tokens; raise task.max_seq_length")
        return limit

    def _chat(self, tokenizer: Any) -> bool:
        return bool(self.use_chat_template) and has_chat_template(tokenizer)

    def prompt_format(self, tokenizer: Any, sample: Sample) -> str:
        return CHAT_TEMPLATE if self._chat(tokenizer) else RAW_TEXT

    def first_turn_ids(self, tokenizer: Any, sample: Sample) -> list[int]:
        if self._chat(tokenizer):
            messages = [{"role": "system", "content": sample.system}] if sample.system is not None else []
            messages.append({"role": "user", "content": sample.turns[0]})
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = list(tokenizer(text, add_special_tokens=False).input_ids)
        else:
            ids = raw_prompt_ids(tokenizer, sample.turns[0])
        limit = self.first_turn_tokens()
        return ids if limit is None else truncate_middle(ids, limit)

    def follow_up_text(self, tokenizer: Any, sample: Sample, turn: int, reply: str) -> str:
        """The text appended for ``turn`` (> 0): previous reply + follow-up, chat-formatted or raw."""
        query = sample.turns[turn]
        if not self._chat(tokenizer):
            if self.subset == "choice_eng":  # its raw follow-up template words the question differently
                query = query[: -len("The the correct answer is")] + "The letter of the correct answer is"
            return f"{reply}\n\n{query}"
        return chat_piece(tokenizer, reply, query)

    def prompt_ids(self, tokenizer: Any, sample: Sample, turn: int, answers: list[str]) -> list[int]:
        """Turn 1's (truncated) ids + the token ids of each follow-up piece up to ``turn``."""
        check_turn(sample, turn, answers)
        ids = list(self.memo(tokenizer, ("first", sample.id), lambda: self.first_turn_ids(tokenizer, sample)))
        for t in range(1, turn + 1):
            text = self.follow_up_text(tokenizer, sample, t, previous_reply(sample, t - 1, answers))
            ids += tokenizer(text, add_special_tokens=False).input_ids
        return ids


def chat_piece(tokenizer: Any, reply: str, query: str) -> str:
    """``[assistant: reply][user: query]`` + generation prompt as SCBench renders it.

    SCBench renders ``[system: "", assistant: reply, user: query]`` and removes the rendered
    ``[system: ""]`` + generation prompt prefix. Templates that reject that conversation (or render it without
    that prefix) get the suffix of ``[user, assistant: reply, user: query]`` after ``[user]`` instead.
    """
    system_only = [{"role": "system", "content": ""}]
    try:
        prefix = tokenizer.apply_chat_template(system_only, add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(
            system_only + [{"role": "assistant", "content": reply}, {"role": "user", "content": query}],
            add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - e.g. "Conversation roles must alternate": use the suffix rule
        prefix = full = ""
    if prefix and full.startswith(prefix):
        return full.replace(prefix, "")
    marker = "\x00scbench-turn\x00"
    before = tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=True,
                                           tokenize=False)
    after = tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}, {"role": "assistant", "content": reply},
         {"role": "user", "content": query}], add_generation_prompt=True, tokenize=False)
    if not after.startswith(before):
        raise ConfigError("the tokenizer's chat template does not render an SCBench follow-up turn as a suffix of "
                          "the previous prompt; set task.use_chat_template=false")
    return after[len(before):]
