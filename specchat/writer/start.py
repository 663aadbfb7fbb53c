"""Opening a book: a new one from the options, or an existing one with `--resume`, whose stored settings fill
in every option not given again (a given one that would change the text is refused)."""

from __future__ import annotations

import secrets
from dataclasses import replace
from pathlib import Path

from specchat.drafters import DrafterChoice
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.errors import SpecchatError
from specchat.session import Session
from specchat.writer.book import Book
from specchat.writer.settings import BookSettings, check_same, prompt_digest

WRITER_DRAFTERS = ("tokenswift", "longspec")  # in order of preference, where the profile publishes them


def writer_drafter(profile) -> str:
    """The default drafter of a book: the one the profile measured fastest (`writer`); else TokenSwift's heads
    where the model has them, else its trained drafter, with n-gram reuse on top (long texts repeat
    themselves); n-gram alone for a model with none."""
    if profile and profile.writer:
        return profile.writer
    published = profile.drafters if profile else {}
    for name in WRITER_DRAFTERS:
        if name in published:
            return name if name == "tokenswift" else f"{name}+ngram"
    return "ngram"


SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "min_p_keep", "penalty", "penalty_window", "seed")


def new_book(loaded, out: Path, tokens: int, prompt: str, *, raw: bool, sampling: dict, stop_at_eos: bool,
             force: bool, kv_cache: str = "auto", drafter: str | DrafterChoice = "none",
             **drafting) -> tuple[Book, Engine]:  # fmt: skip
    """A book for `tokens` new tokens after `prompt`, and the engine sized for it (the prompt and the tokens when
    the model's window holds both: never a refill; else the window), drafting with `drafter` and its options
    (`Session.over`)."""
    prompt_ids = encode_prompt(loaded.tokenizer, prompt, raw=raw)
    engine = Session.over(loaded, max_len=len(prompt_ids) + tokens, kv_cache=kv_cache, drafter=drafter,
                          **drafting).engine  # fmt: skip
    if engine.capacity - len(prompt_ids) < 2:
        raise SpecchatError(
            f"the prompt has {len(prompt_ids)} tokens; the model's window holds {engine.capacity}, "
            "so nothing can be written after it"
        )
    settings = BookSettings(
        model=loaded.source.name, weights=loaded.weights, dtype=loaded.dtype, kv_cache=kv_cache, yarn=loaded.yarn,
        prompt_sha256=prompt_digest(prompt_ids), prompt_tokens=len(prompt_ids),
        **{name: sampling[name] for name in SAMPLING_FIELDS if name != "seed"},
        seed=sampling["seed"] if sampling["seed"] is not None else secrets.randbits(62),
        stop_at_eos=stop_at_eos, **window_policy(engine.capacity, len(prompt_ids)),
    )  # fmt: skip
    return Book.create(out, settings, prompt_ids, force=force), engine


def window_policy(capacity: int, prompt_tokens: int) -> dict:
    """The book's window policy when the cache holds `capacity` tokens: the whole book when the model's window
    allows (no refill ever), else the window, half of whose generated tokens each refill drops (as llama.cpp's
    context shift discards half): a refill prefills what stays, so the fewer tokens it keeps, the less often and the
    less it prefills (on the default model 12% of a book's time; a quarter dropped cost 27%)."""
    return {"context": capacity, "refill_chunk": max(1, (capacity - prompt_tokens) // 2)}


def resumed_book(loaded, book: Book, tokens: int, *, prompt: str | None, raw: bool, given: dict,
                 stop_at_eos: bool | None, kv_cache: str = "auto", drafter: str | DrafterChoice = "none",
                 **drafting) -> Engine:  # fmt: skip
    """Check that what was given again matches the book, and the engine that goes on with it to `tokens`,
    drafting with `drafter` and its options."""
    settings = book.settings
    asked = replace(settings, weights=loaded.weights, dtype=loaded.dtype, kv_cache=kv_cache, model=loaded.source.name,
                    yarn=loaded.yarn,
                    **{name: value for name, value in given.items() if value is not None})  # fmt: skip
    if stop_at_eos is not None:
        asked = replace(asked, stop_at_eos=stop_at_eos)
    if prompt is not None:
        asked = replace(asked, prompt_sha256=prompt_digest(encode_prompt(loaded.tokenizer, prompt, raw=raw)))
    check_same(settings, asked)
    engine = Session.over(loaded, max_len=settings.prompt_tokens + tokens, kv_cache=kv_cache, drafter=drafter,
                          **drafting).engine  # fmt: skip
    fit_window(book, engine.capacity)
    return engine


def fit_window(book: Book, capacity: int) -> None:
    """Size the book's window policy for a cache of `capacity` tokens, the book's prompt and length to be.

    Before its first refill the policy has not acted, so the book is what a book written for its new length
    from the start holds: it takes that book's policy (an extended book then equals an unbroken run). After
    one, the window is the model's and must stay the same."""
    if book.progress.refills == 0:
        book.settings = replace(book.settings, **window_policy(capacity, book.settings.prompt_tokens))
    elif capacity != book.settings.context:
        raise SpecchatError(f"this model holds {capacity} tokens; the book was written holding {book.settings.context}")
