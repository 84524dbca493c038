"""The embedded default workload: 12 small, original prompts that need no download.

It mixes the shapes that matter for lossless decoders: short chat questions, two-turn chats (the second turn
replays the model's own first answer), raw code completion, math word problems, a summary of a ~2,000-word
document (long prompt) and a repetitive table continuation (where n-gram/lookup methods accept a lot).
All text was written for this project.
"""

from __future__ import annotations

from dataclasses import dataclass

from tasks.base import Sample, Task
from tasks.builtin_text import LONG_DOCUMENT

CODE_01 = '''\
def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals and return them sorted by their start.

    >>> merge_intervals([(1, 3), (2, 6), (8, 10), (9, 12)])
    [(1, 6), (8, 12)]
    >>> merge_intervals([])
    []
    """
'''

CODE_02 = '''\
from collections import OrderedDict


class LRUCache:
    """A fixed-capacity cache that evicts the least recently used key first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._data: OrderedDict[str, object] = OrderedDict()

    def get(self, key: str) -> object | None:
        """Return the value stored under key (marking it as recently used), or None."""
'''

STRUCTURED_01 = (
    "Continue the following table up to n = 40, keeping exactly the same format and columns. "
    "Output only the table rows.\n\n"
    "| n | n squared | n cubed | n is even |\n"
    "|---|---|---|---|\n"
    + "".join(f"| {n} | {n * n} | {n ** 3} | {'yes' if n % 2 == 0 else 'no'} |\n" for n in range(1, 9))
)

_SAMPLES: tuple[Sample, ...] = (
    Sample(
        id="chat-01",
        category="chat",
        turns=["What are three practical tips for keeping houseplants alive in a flat that gets little "
               "daylight? Keep each tip to one or two sentences."],
    ),
    Sample(
        id="chat-02",
        category="chat",
        turns=["Explain the difference between a process and a thread in two short paragraphs, "
               "with one everyday analogy."],
    ),
    Sample(
        id="chat-03",
        category="chat",
        turns=["Write a short, friendly email to my neighbour asking whether they could water my tomato "
               "plants while I am away for a week in August. Offer to return the favour."],
    ),
    Sample(
        id="chat-04",
        category="chat",
        system="You are a concise assistant. Answer in at most four sentences.",
        turns=["Why does bread go stale, and why does toasting stale bread make it taste better?"],
    ),
    Sample(
        id="multi-01",
        category="multi-turn",
        turns=[
            "Suggest three names for a small bakery that specialises in sourdough bread, with one sentence "
            "explaining each name.",
            "Pick the name you like best from your list and write a two-sentence slogan for a poster "
            "in the bakery window.",
        ],
    ),
    Sample(
        id="multi-02",
        category="multi-turn",
        turns=[
            "Explain what a hash table is to someone who has just learned basic programming.",
            "Now write a short Python function that counts how often each word appears in a text using a "
            "dict, and state its time complexity.",
        ],
    ),
    Sample(id="code-01", category="code", chat=False, turns=[CODE_01]),
    Sample(id="code-02", category="code", chat=False, turns=[CODE_02]),
    Sample(
        id="math-01",
        category="math",
        turns=["A community garden has 18 raised beds. Each bed holds 6 tomato plants, and each plant "
               "yields 4 kilograms of tomatoes over the season. The gardeners keep a quarter of the harvest "
               "and sell the rest at 3 dollars per kilogram. How much money do they make? Reason step by "
               "step and give the final answer on its own line."],
        references=["972"],
    ),
    Sample(
        id="math-02",
        category="math",
        turns=["Maria reads 23 pages on each weekday and 40 pages on each day of the weekend. Her book has "
               "512 pages and she starts reading on a Monday. On which day does she finish the book, and how "
               "many pages does she read on that last day? Reason step by step."],
        references=["Saturday of the third week; 7 pages"],
    ),
    Sample(
        id="long-01",
        category="long",
        turns=["Summarise the following report in five bullet points, then state its main recommendation "
               "in one sentence.\n\n" + LONG_DOCUMENT],
    ),
    Sample(id="struct-01", category="structured", turns=[STRUCTURED_01]),
)


@dataclass
class BuiltinTask(Task):
    """The embedded default workload (12 samples; ids ``chat-01`` ... ``struct-01``)."""

    name: str = "builtin"
    max_new_tokens: int = 128

    def load_samples(self) -> list[Sample]:
        """All 12 builtin samples, in a fixed order."""
        return list(_SAMPLES)
