"""The target's own books as training data: what `specchat write` samples, cut into records.

Heads trained on code and chat answers are accepted about a sixth of the time on a sampled novel: prose at the
writer's settings (TokenSwift's: temperature 1, min-p 0.1, contextual penalty 1.2) is another text. The target
writes its books here at decode speed (the 1.5B coder on this CPU: about 2 minutes for 4000 tokens), one story
prompt and one seed a book, and each book is cut into records of BOOK_ANSWER tokens, each after up to
BOOK_CONTEXT tokens of the book before it (the chat prompt before the first): the samples stay under the
trainers' 1200-token cap. A book is held out or trained on whole, so held-out records are prose the drafter
never read. The records' `sampling` holds the writer's settings: they are the target's sampled text, not its
greedy answers, so greedy chain tau leaves them out.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from specchat.training.data import DataProgress, DataRecipe, open_data, split_of

BOOK_ANSWER = 800  # answer tokens a record
BOOK_CONTEXT = 384  # tokens of the book before them that a record's prompt holds
STORIES = (
    "Write a very long novel. Begin with the title, then tell the story chapter by chapter, with named characters, "
    "places, dialogue and vivid detail. Never summarise and never stop: keep the story going.",
    "Write a long adventure story about a lighthouse keeper and a shipwreck. Begin with the title, then tell it "
    "chapter by chapter, with dialogue.",
    "Write a long mystery novel set in a mountain village in winter. Begin with the title, then tell the story "
    "chapter by chapter, with named characters and dialogue.",
    "Write a long science fiction novel about the first colony ship to reach another star. Begin with the title, "
    "then tell the story chapter by chapter, with named characters and dialogue.",
    "Write a long fantasy novel about a young blacksmith who finds a talking sword. Begin with the title, then tell "
    "the story chapter by chapter, with named characters, places and dialogue.",
    "Write a long historical novel about a family of bakers in nineteenth-century Paris. Begin with the title, then "
    "tell the story chapter by chapter, with dialogue and vivid detail.",
    "Write a long detective story set in a busy harbour city. Begin with the title, then tell it chapter by "
    "chapter, with named characters and dialogue.",
    "Write a long coming-of-age novel about two friends on a farm during a drought. Begin with the title, then tell "
    "the story chapter by chapter, with dialogue.",
    "Write a long sea adventure about a crew searching for a lost island. Begin with the title, then tell it "
    "chapter by chapter, with named characters, places and dialogue.",
)  # fmt: skip


def book_records(book_id: str, split: str, sampling: dict, prompt_ids: list[int], generated: list[int]) -> list[dict]:
    """A book's records: its generated tokens in pieces of BOOK_ANSWER, each after the BOOK_CONTEXT tokens before
    it (the prompt before the first)."""
    records = []
    for start in range(0, len(generated), BOOK_ANSWER):
        context = prompt_ids if start == 0 else generated[max(0, start - BOOK_CONTEXT) : start]
        records.append({"id": hashlib.sha1(f"{book_id}:{start}".encode()).hexdigest()[:16], "turn": 0,
                        "source": f"book:{book_id}", "split": split, "sampling": sampling, "finish": "length",
                        "prompt_ids": list(context), "answer_ids": generated[start : start + BOOK_ANSWER],
                        "messages": []})  # fmt: skip
    return records


def build_book_data(loaded, out: Path, recipe: DataRecipe, *, tokens: int,
                    progress: Callable[[DataProgress], None] = lambda _progress: None) -> DataProgress:  # fmt: skip
    """Write books of `recipe.max_new_tokens` tokens into `out/books/` and their records into `out`, skipping the
    books already there, until `out` holds `tokens` book tokens. A stopped run writes its last book again."""
    from specchat.writer import settings as writer
    from specchat.writer.start import new_book
    from specchat.writer.write import write_book

    done, total, writers = open_data(out, recipe)
    (out / "books").mkdir(exist_ok=True)
    progress(total)
    start, index = time.perf_counter(), 0
    while total.answer_tokens < tokens:
        story, seed = STORIES[index % len(STORIES)], recipe.seed + index
        book_id = hashlib.sha1(f"book:{seed}:{story}".encode()).hexdigest()[:16]
        index += 1
        if hashlib.sha1(f"{book_id}:0".encode()).hexdigest()[:16] in done:
            continue
        sampling = {**writer.SAMPLING, "seed": seed}
        book, engine = new_book(loaded, out / "books" / f"{book_id}.txt", recipe.max_new_tokens, story, raw=False,
                                sampling=sampling, stop_at_eos=False, force=True)  # fmt: skip
        write_book(engine, book, recipe.max_new_tokens)
        book.close()
        split = split_of(book_id, recipe.heldout)
        records = book_records(book_id, split, sampling, book.prompt_ids, book.generated)
        writers[split].write(records)  # a book's records at once: a stopped run writes the book again
        total.records += len(records)
        total.answer_tokens += len(book.generated)
        total.seconds = time.perf_counter() - start
        progress(total)
    return total
