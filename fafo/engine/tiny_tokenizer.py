"""A tiny, deterministic byte-level BPE tokenizer built in-process.

It exists so that the embedded default model (a small randomly initialised decoder) runs fully offline:
no Hugging Face hub download, no files shipped next to the code. The tokenizer is trained on first use (and
cached per vocab size) on a small corpus embedded below (English prose, Python code, arithmetic and chat-like
text), which takes well under a second, and it behaves like a real chat tokenizer:

* byte-level BPE (GPT-2 style pre-tokenizer and decoder), so any text round-trips and ``<unk>`` never appears;
* special tokens ``<unk>`` (0), ``<s>`` (1, bos), ``</s>`` (2, eos), ``<pad>`` (3) and the chat markers
  ``<|user|>``, ``<|assistant|>``, ``<|system|>``, ``<|end|>`` (4-7);
* ``<s>`` is prepended when ``add_special_tokens=True``;
* a Jinja ``chat_template``: ``<s>`` then, for every message, ``<|role|>\\n{content}<|end|>\\n``;
  ``add_generation_prompt=True`` appends ``<|assistant|>\\n``.

Training is deterministic (the same vocab and merges in every process), and the result round-trips through
``save_pretrained`` + ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from fafo.errors import ConfigError

BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
CHAT_MARKERS = ("<|user|>", "<|assistant|>", "<|system|>", "<|end|>")
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD, *CHAT_MARKERS)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('tiny tokenizer chat template: unknown role ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# 256 byte symbols + the special tokens: the smallest vocabulary that can encode every input.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

_CORPUS = r'''
The morning fog lifted slowly from the river, and the town woke to the sound of carts on the old stone bridge.
People opened their shops, swept the steps, and talked about the weather, the price of bread and the news from
the capital. Nobody expected anything unusual to happen that day, which is exactly why everyone remembered it.

A good explanation starts with what the reader already knows. First, describe the problem in plain words. Then
show a small example, and only after that introduce the general rule. When the rule has exceptions, say so
clearly, because a reader who finds an exception on their own will stop trusting the rest of the text.

The history of science is full of simple questions that turned out to be hard. Why is the sky blue? Why does
water expand when it freezes? How do birds find their way home across thousands of kilometres? Each answer
opened new questions, and the people who asked them were often curious rather than clever.

In the summer the garden needs water every evening. Tomatoes, beans and peppers grow quickly in the heat, and
the soil dries out before noon. A layer of straw keeps the roots cool, and a simple timer on the tap saves the
gardener from forgetting. In the autumn the beds are cleared, compost is added, and the tools are cleaned.

The report summarises the results of the project, the costs, the risks and the recommendations of the
committee. It describes the work of the council, the engineers, the workers and the families of the town.

def add(a: int, b: int) -> int:
    """Return the sum of two integers."""
    return a + b


def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    numbers = [0, 1]
    while len(numbers) < n:
        numbers.append(numbers[-1] + numbers[-2])
    return numbers[:n]


class Counter:
    """Count how often each item appears."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, item: str) -> None:
        self.counts[item] = self.counts.get(item, 0) + 1

    def most_common(self, k: int = 3) -> list[tuple[str, int]]:
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


for i in range(10):
    if i % 2 == 0:
        print(f"{i} is even")
    else:
        print(f"{i} is odd")

import os
import sys

def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]

1 + 1 = 2
2 + 3 = 5
7 * 8 = 56
12 * 12 = 144
100 - 37 = 63
81 / 9 = 9
3 * 4 + 5 = 17
(6 + 4) * 3 = 30
The total is 24 + 18 + 6 = 48, so each of the 4 people pays 48 / 4 = 12 dollars.
If a train travels 60 kilometres per hour for 3 hours, it covers 60 * 3 = 180 kilometres.
| n | n squared | n cubed |
| 1 | 1 | 1 |
| 2 | 4 | 8 |
| 3 | 9 | 27 |
| 4 | 16 | 64 |
| 5 | 25 | 125 |

User: Hello! Can you help me write a short email to my neighbour?
Assistant: Of course. Here is a short and friendly email you can send to your neighbour.
User: What is the capital of France?
Assistant: The capital of France is Paris.
User: Explain what a hash table is in two sentences.
Assistant: A hash table stores values under keys and uses a hash function to find the right slot quickly.
On average, looking up, inserting and deleting a key takes constant time.
User: Thank you, that was very helpful.
Assistant: You are welcome! Let me know if you have any other questions.
System: You are a helpful, concise assistant. Answer step by step and give the final answer on its own line.
User: Summarise the following text in three bullet points.
Assistant: - The project was finished on time.
- The costs were higher than planned.
- The committee recommends a second phase.
'''


@functools.lru_cache(maxsize=8)
def _trained_tokenizer_json(vocab_size: int) -> str:
    """Train the BPE model once per vocab size and return its JSON serialisation (cached)."""
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Split on lines so that the corpus is a list of short, ordered documents.
    tok.train_from_iterator([line for line in _CORPUS.splitlines() if line.strip()], trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A:0",
        pair=f"{BOS} $A:0 {BOS}:1 $B:1",
        special_tokens=[(BOS, bos_id)],
    )
    return tok.to_str()


def build_tiny_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Build the embedded offline tokenizer (deterministic; a fresh object on every call).

    Args:
        vocab_size: upper bound on the vocabulary (special tokens included). The embedded corpus is small, so
            the trained vocabulary may stop a little short of it; ``len(tokenizer) <= vocab_size`` always
            holds.

    Returns:
        A ``PreTrainedTokenizerFast`` with bos/eos/unk/pad set, the chat markers as extra special tokens,
        and a chat template (see the module docstring).
    """
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(
            f"vocab_size={vocab_size!r} is too small for the tiny tokenizer; "
            f"use an integer >= {MIN_VOCAB_SIZE}"
        )
    backend = Tokenizer.from_str(_trained_tokenizer_json(vocab_size))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        extra_special_tokens=list(CHAT_MARKERS),
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
