"""Teacher-labelled data: existing text shown as the target's answer, with no generation.

A drafter learns the target's greedy next token at every row (`features.py`), and the features stage computes
it by one prefill per sample whatever the sample's text is. So besides the target's own answers, which cost a
decode step per token, any text can be labelled at prefill speed: for the 1.5B coder on this CPU about 190K
tokens an hour against about 25K of its own answers. The text is the Python standard library's own source, asked
for and shown as a fenced code block in a chat answer, the shape code takes when the target writes it.

The text is not the target's output, so these records (`sampling: "text"`) train a drafter's loss but are left
out of greedy chain tau, which needs the target's own greedy answers.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specchat.training.data import DataProgress, DataRecipe, open_data, split_of
from specchat.training.prompts import stdlib_modules

TEXT_TOKENS = 1000  # text tokens a record at most: with the request, under the samples' 1200-token cap
CHARS_PER_TOKEN = 4.3  # the coder tokenizer reads about 4.6 characters of stdlib source a token
BENCH_TEXT = ("pydoc_data",)  # the long prompt sets' documentation: never trained on


@dataclass(frozen=True)
class TextChunk:
    module: str
    first_line: int  # 1-based, inclusive
    last_line: int
    text: str

    @property
    def id(self) -> str:
        return hashlib.sha1(f"{self.module}:{self.first_line}-{self.last_line}".encode()).hexdigest()[:16]

    @property
    def request(self) -> str:
        return f"Show lines {self.first_line}-{self.last_line} of the source of Python's `{self.module}` module."


def stdlib_chunks(seed: int = 0, root: Path | None = None) -> Iterator[TextChunk]:
    """The standard library's modules (tests, private modules and the bench's documentation skipped) in a
    seeded order, each cut into chunks of whole lines of about TEXT_TOKENS tokens."""
    modules = [(name, path) for name, path in stdlib_modules(root or Path(sysconfig.get_paths()["stdlib"]))
               if name.split(".")[0] not in BENCH_TEXT]  # fmt: skip
    random.Random(seed).shuffle(modules)
    for module, path in modules:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        first, size = 0, 0
        for index, line in enumerate(lines):
            size += len(line) + 1
            if size >= TEXT_TOKENS * CHARS_PER_TOKEN or index == len(lines) - 1:
                text = "\n".join(lines[first : index + 1])
                if text.strip():
                    yield TextChunk(module, first + 1, index + 1, text)
                first, size = index + 1, 0


def build_text_data(loaded, out: Path, recipe: DataRecipe, *, tokens: int, chunks: Iterator[TextChunk],
                    progress: Callable[[DataProgress], None] = lambda _progress: None) -> DataProgress:  # fmt: skip
    """Write `chunks` as records, skipping those already in `out`, until `out` holds `tokens` text tokens."""
    from specchat.engine.prompt import encode_chat

    done, total, writers = open_data(out, recipe)
    start = time.perf_counter()
    for chunk in chunks:
        if total.answer_tokens >= tokens:
            break
        if chunk.id in done:
            continue
        answer = f"```python\n{chunk.text}\n```"
        answer_ids = loaded.tokenizer.encode(answer, add_special_tokens=False)[:TEXT_TOKENS]
        messages = [{"role": "user", "content": chunk.request}]
        prompt_ids = encode_chat(loaded.tokenizer, messages)
        messages.append({"role": "assistant", "content": loaded.tokenizer.decode(answer_ids)})
        split = split_of(chunk.id, recipe.heldout)
        writers[split].write([{"id": chunk.id, "turn": 0, "source": f"text-stdlib:{chunk.module}", "split": split,
                               "sampling": "text", "finish": None, "prompt_ids": prompt_ids,
                               "answer_ids": answer_ids, "messages": messages}])  # fmt: skip
        total.records += 1
        total.answer_tokens += len(answer_ids)
        total.seconds = time.perf_counter() - start
        progress(total)
    return total
