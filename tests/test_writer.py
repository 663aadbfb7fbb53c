"""The writer: a book is what autoregressive decoding under the same window policy writes, and it survives
any interruption.

Proven here, on a tiny model whose window is made small enough to refill many times:
- greedy and sampled-with-penalty books written with drafters (n-gram, random trees, an oracle of the book)
  equal the autoregressive book token for token, across refills; the refills change the text (the policy
  matters) and the drafters' tokens are accepted;
- a book cut at any step (the files as a kill leaves them: data appended after the last saved state)
  resumes by replay to the very bytes of an unbroken run, before and after refills;
- the state refuses what would change the text, a foreign or corrupt state file, and a cut or edited book;
- a finished book extended to more tokens equals an unbroken run of that length (before and after its first
  refill), its replay verifies the book's tokens in chains of 64 and none of its time counts as writing;
  the state keeps the writing time as it grows.
`tests/test_cli.py` runs the real command: kill and resume of the real process, overwrite refusal, bad input.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter

from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.engine.generate import Engine
from specchat.engine.tree import ROOT, TreeBuilder
from specchat.errors import SpecchatError
from specchat.writer import write as write_module
from specchat.writer.book import Book, ids_path, state_path
from specchat.writer.settings import BookSettings, check_same, prompt_digest
from specchat.writer.start import fit_window, window_policy
from specchat.writer.write import write_book

VOCAB = 64
WINDOW = 160  # positions: the engine keeps 64 slots for trees, so the cache holds 96 tokens
PROMPT = [5, 9, 17, 33, 8, 41, 12, 3, 30, 22]
TOKENS = 300


@pytest.fixture(scope="module")
def model():
    model = tiny_model("llama", vocab_size=VOCAB, seed=3)
    model.config.max_position_embeddings = WINDOW
    return model


def settings(engine: Engine, **sampling) -> BookSettings:
    values = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, min_p_keep=1, penalty=1.0, penalty_window=1024,
                  seed=7)
    values.update(sampling)
    return BookSettings(model="tiny", weights="fp32", dtype="float32", kv_cache="auto", yarn=None,
                        prompt_sha256=prompt_digest(PROMPT), prompt_tokens=len(PROMPT), **values, stop_at_eos=False,
                        **window_policy(engine.capacity, len(PROMPT)))  # fmt: skip


def write(model, tokenizer, path, drafter=None, budget=None, tokens=TOKENS, **sampling):
    engine = Engine(model, tokenizer, max_len=WINDOW, drafter=drafter, draft_budget=budget)
    book = Book.create(path, settings(engine, **sampling), PROMPT, force=True)
    report = write_book(engine, book, tokens)
    book.close()
    return book.generated, report


class BookOracle:
    """Knows the book: proposes its next tokens as a chain with a wrong sibling per level, wherever the cache
    window starts (it finds its place from the context it is prefilled with)."""

    kind = "oracle"
    feature_layers = None  # reads no target states

    def __init__(self, book: list[int], depth: int = 5):
        self.book, self.depth, self.position = book, depth, 0

    def prefill(self, ids, hidden=None, reused=0):
        tail = ids[len(PROMPT) :]
        self.position = next(p for p in range(len(tail), len(self.book) + 1) if self.book[p - len(tail) : p] == tail)

    def commit(self, tokens, hidden=None):
        assert tokens == self.book[self.position : self.position + len(tokens)]
        self.position += len(tokens)

    def propose(self, budget, sampling=None, least_chance=0.0, noise=None):
        builder, parent = TreeBuilder(), ROOT
        for token in self.book[self.position : self.position + min(self.depth, budget // 2)]:
            builder.add(parent, (token + 1) % VOCAB, self.kind)
            parent = builder.add(parent, token, self.kind)
        return builder.build()


@pytest.mark.parametrize(
    "sampling",
    [{}, {"temperature": 1.0, "min_p": 0.05, "min_p_keep": 3, "penalty": 1.3, "penalty_window": 24}],
    ids=["greedy", "sampled-penalised"],
)
def test_books_equal_the_autoregressive_book_across_refills(model, tokenizer, tmp_path, sampling):
    expected, report = write(model, tokenizer, tmp_path / "ar.txt", **sampling)
    assert len(expected) == TOKENS and report.refills >= 5
    unwindowed = Engine(model, tokenizer, max_len=len(PROMPT) + TOKENS + 1)
    book_settings = settings(unwindowed, **sampling)
    events = unwindowed.generate(PROMPT, sampling=book_settings.sampling(frozenset()), max_new_tokens=TOKENS)
    plain = [t for e in events for t in e.tokens]
    assert plain != expected  # dropping the oldest tokens changes what comes next: the policy defines the text
    drafters = [
        (NgramDrafter(), 8),
        (RandomTreeDrafter(vocab_size=VOCAB, seed=1), 16),
        (BookOracle(expected), 12),
    ]
    for drafter, budget in drafters:
        book, report = write(model, tokenizer, tmp_path / f"{drafter.kind}.txt", drafter, budget, **sampling)
        assert book == expected, drafter.kind
        assert report.acceptance_rate > 0, drafter.kind
        assert (tmp_path / f"{drafter.kind}.txt").read_bytes() == (tmp_path / "ar.txt").read_bytes()


def test_a_book_cut_anywhere_resumes_to_the_same_bytes(model, tokenizer, tmp_path, monkeypatch):
    sampling = {"temperature": 1.0, "penalty": 1.2, "penalty_window": 32}
    write(model, tokenizer, tmp_path / "whole.txt", NgramDrafter(), 8, **sampling)
    whole = (tmp_path / "whole.txt").read_bytes()

    monkeypatch.setattr(write_module, "SAVE_SECONDS", 0.0)  # a state per step: cuts land anywhere
    cuts, seen = [3, 40, 101, 180, 260], []

    def cut_here(status):  # after a step's append, before its state: what a kill leaves on disk
        if cuts and status.tokens >= cuts[0]:
            cut = tmp_path / f"cut{cuts.pop(0)}.txt"
            for source, target in ((book_path, cut), (ids_path(book_path), ids_path(cut)),
                                   (state_path(book_path), state_path(cut))):  # fmt: skip
                shutil.copy(source, target)
            seen.append(cut)

    book_path = tmp_path / "cut.txt"
    engine = Engine(model, tokenizer, max_len=WINDOW, drafter=NgramDrafter(), draft_budget=8)
    book = Book.create(book_path, settings(engine, **sampling), PROMPT, force=True)
    write_book(engine, book, TOKENS, status=cut_here)
    book.close()
    assert len(seen) == 5

    for cut in seen:
        book = Book.open(cut)
        assert book.progress.tokens < TOKENS
        engine = Engine(model, tokenizer, max_len=WINDOW, drafter=RandomTreeDrafter(vocab_size=VOCAB, seed=2),
                        draft_budget=16)  # fmt: skip
        warnings = []
        write_book(engine, book, TOKENS, warn=warnings.append)
        book.close()
        assert not warnings
        assert cut.read_bytes() == whole, cut.name
        assert json.loads(state_path(cut).read_text())["progress"]["finished"] == "length"


def test_an_append_stopped_halfway_leaves_a_book_that_resumes(model, tokenizer, tmp_path, monkeypatch):
    """A kill between an append's two files leaves ids beyond the state and no text: the book opens. Ctrl-C
    in the middle of an append (the state not yet counting it) leaves files that `save` cuts back to the state."""
    path = tmp_path / "book.txt"
    engine = Engine(model, tokenizer, max_len=WINDOW)
    book = Book.create(path, settings(engine), PROMPT, force=True)
    book.append([5, 6], "ab")
    book.save()
    text_write = book._text.write

    def killed(_data):  # the process dies once the ids are out, before the text
        raise KeyboardInterrupt

    monkeypatch.setattr(book._text, "write", killed)
    with pytest.raises(KeyboardInterrupt):
        book.append([7], "c")
    assert Book.open(path).generated == [5, 6]  # the kill's leftovers are taken and cut
    monkeypatch.setattr(book._text, "write", text_write)

    class Interrupted(list):  # Ctrl-C after both files, before the counts
        def extend(self, _tokens):
            raise KeyboardInterrupt

    generated, book.generated = book.generated, Interrupted()
    with pytest.raises(KeyboardInterrupt):
        book.append([7], "c")
    book.generated = generated
    book.save()  # what the writer's `finally` does
    book.close()
    assert path.read_bytes() == b"ab" and len(ids_path(path).read_bytes()) == 4 * (len(PROMPT) + 2)
    assert Book.open(path).generated == [5, 6]


def test_resume_refuses_other_text_settings(model, tokenizer, tmp_path):
    engine = Engine(model, tokenizer, max_len=WINDOW)
    stored = settings(engine, temperature=1.0)
    check_same(stored, settings(engine, temperature=1.0))
    with pytest.raises(SpecchatError, match=r"temperature: was 1.0, now 0.7"):
        check_same(stored, settings(engine, temperature=0.7))


def test_a_book_keeps_its_kv_cache_and_one_saved_before_the_field_reads_as_auto(model, tokenizer, tmp_path):
    """The KV cache and the YaRN stretch are part of the arithmetic: resuming with another is refused. A state file
    written before `--kv-cache` and `--yarn` existed has neither: it was auto and unstretched, and the book opens
    and goes on as it was; any other gap is refused."""
    stored = settings(Engine(model, tokenizer, max_len=WINDOW))
    with pytest.raises(SpecchatError, match=r"kv_cache: was 'auto', now 'int8'"):
        check_same(stored, replace(stored, kv_cache="int8"))
    with pytest.raises(SpecchatError, match=r"yarn: was None, now 2.0"):
        check_same(stored, replace(stored, yarn=2.0))
    path = tmp_path / "book.txt"
    write(model, tokenizer, path, tokens=40)
    state = json.loads(state_path(path).read_text())
    del state["settings"]["kv_cache"], state["settings"]["yarn"]
    state_path(path).write_text(json.dumps(state))
    book = Book.open(path)
    assert book.settings == stored
    book.progress.finished = None  # as `--resume --tokens 60` asks for more
    write_book(Engine(model, tokenizer, max_len=WINDOW), book, 60)
    book.close()
    assert book.progress.tokens == 60
    saved = json.loads(state_path(path).read_text())["settings"]
    assert saved["kv_cache"] == "auto" and saved["yarn"] is None  # saved as books are now
    unknown = {**state["settings"], "weather": "fine"}
    missing = {name: value for name, value in state["settings"].items() if name != "dtype"}
    for broken in (unknown, missing):
        with pytest.raises(ValueError, match="not a book's"):
            BookSettings.from_json(broken)


def test_foreign_corrupt_and_cut_books_are_refused(model, tokenizer, tmp_path):
    path = tmp_path / "book.txt"
    write(model, tokenizer, path, tokens=40)
    with pytest.raises(SpecchatError, match="exists; --resume continues it, --force overwrites it"):
        Book.create(path, settings(Engine(model, tokenizer, max_len=WINDOW)), PROMPT, force=False)

    state = state_path(path).read_text()
    state_path(path).write_text(json.dumps({"format": "someone-else/2"}))
    with pytest.raises(SpecchatError, match="not a specchat book state"):
        Book.open(path)
    state_path(path).write_text(state[: len(state) // 2])
    with pytest.raises(SpecchatError, match="not a specchat book state"):
        Book.open(path)
    state_path(path).write_text(state)
    path.write_bytes(path.read_bytes()[:5])
    with pytest.raises(SpecchatError, match="cut or edited"):
        Book.open(path)
    with pytest.raises(SpecchatError, match="nothing to resume"):
        Book.open(tmp_path / "other.txt")


def test_a_hand_edited_book_is_refused_and_left_as_it_is(model, tokenizer, tmp_path):
    path = tmp_path / "book.txt"
    write(model, tokenizer, path, tokens=40)
    text = path.read_bytes()
    for edited in (text + b"\nTHE END, added by hand", text[:-3] + b"xyz"):  # appended; changed in place
        path.write_bytes(edited)
        with pytest.raises(SpecchatError, match="not what book.txt.specchat.json records: the book was cut or edited"):
            Book.open(path)
        assert path.read_bytes() == edited


def sized_book(model, tokenizer, path, tokens, **sampling) -> Book:
    """A book written as `specchat write --tokens N` sizes it: the cache holds the whole book if it can."""
    engine = Engine(model, tokenizer, max_len=len(PROMPT) + tokens)
    book = Book.create(path, settings(engine, **sampling), PROMPT, force=True)
    write_book(engine, book, tokens)
    book.close()
    return book


@pytest.mark.parametrize(("first", "total"), [(40, 80), (40, TOKENS), (150, TOKENS)])
def test_an_extended_book_equals_an_unbroken_run(model, tokenizer, tmp_path, monkeypatch, first, total):
    sampling = {"temperature": 1.0, "penalty": 1.2, "penalty_window": 32}
    sized_book(model, tokenizer, tmp_path / "whole.txt", total, **sampling)
    path = tmp_path / "book.txt"
    assert (sized_book(model, tokenizer, path, first, **sampling).progress.refills > 0) == (first == 150)

    book = Book.open(path)
    engine = Engine(model, tokenizer, max_len=len(PROMPT) + total, drafter=NgramDrafter(), draft_budget=8)
    fit_window(book, engine.capacity)
    book.progress.finished = None  # as `specchat write --resume --tokens N` asks for more
    forwards, statuses, real_forward = [], [], engine._forward
    monkeypatch.setattr(engine, "_forward", lambda *a, **k: forwards.append(1) or real_forward(*a, **k))
    monkeypatch.setattr(write_module, "SAVE_SECONDS", 0.0)
    saved = lambda: json.loads(state_path(path).read_text())["progress"]["seconds"]  # noqa: E731
    report = write_book(engine, book, total, status=lambda s: statuses.append((s, saved())))
    book.close()
    assert path.read_bytes() == (tmp_path / "whole.txt").read_bytes()
    assert report.written == total - first and report.finish_reason == "length"
    replayed = first - book.progress.segment_start if first == 150 else first
    ar_timing = 3  # forwards: the AR step timed once
    assert len(forwards) <= 2 + replayed // 64 + report.written + report.refills + ar_timing  # replay: a chain per 64
    assert all(status.seconds == status.written == 0 for status, _ in statuses if status.replaying)
    assert statuses[-1][1] > statuses[0][1]  # the state's writing time grows as the book is written
