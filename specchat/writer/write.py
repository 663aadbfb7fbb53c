"""The writing loop: the engine's steps appended to a book, the cache refilled when it is full, the state
saved every few seconds, autoregressive decoding timed along the way.

**Window policy** (part of what defines the text): the cache holds `context` tokens. When it is full, the
oldest `refill_chunk` generated tokens leave it, and the prompt plus the rest are prefilled again at
positions from 0, so positions stay inside the model's trained range. Autoregressive decoding under the same
policy writes the same text: every sampled choice is keyed by its token's index in the book
(`Engine.generate(index_offset=...)`), not by how the cache got there.

**Resume.** A prefill computes a cache that differs in its last bits from the one decoding builds step by
step, so a book cannot be continued exactly from an arbitrary token. It is replayed instead from the last
point where it was prefilled anyway (the start or the last refill), the book's tokens verified as known
chains (`Engine.generate(known=...)`: one forward per 64 tokens, whatever the drafter) and checked against
the book's, then writing goes on, byte for byte as if it had never stopped. Should a machine compute them
differently, the book keeps what it has and goes on from its last token, with a warning. With a prompt cache
(`engine/prompt_cache.py`, where reuse is exact) the cache is kept in a file at every stop, and a resume that finds
it holding the book's text up to its last token goes on from there, with no replay: a prefilled row is then bitwise
the decode step, so the file holds what the replay would rebuild.

Nothing here grows with the book: each step appends its tokens and text; the cache, the n-gram tables and
the detokenizer hold bounded state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specchat.engine.generate import Engine
from specchat.engine.prompt_cache import read_prompt_cache, write_prompt_cache
from specchat.engine.stats import GenerationStats
from specchat.engine.text import TextStream
from specchat.writer.book import Book
from specchat.writer.diversity import distinct_n

SAVE_SECONDS = 2.0  # a kill loses at most this much writing
AR_EVERY = 2048  # generated tokens between two timings of an autoregressive step


@dataclass
class WriteStatus:
    """What a progress display shows after each step (this run's figures; the book's token count)."""

    tokens: int  # in the book
    target: int
    written: int  # by this run
    seconds: float  # of this run's writing steps (not the replay, not the timing of the AR baseline)
    steps: int  # target forwards after prefills
    decode_tokens: int  # tokens those forwards committed
    drafted_depth: int
    accepted: int
    refills: int  # of the book
    replaying: bool  # re-deriving tokens already in the book (after --resume)

    @property
    def tokens_per_second(self) -> float:
        return self.written / self.seconds if self.seconds else 0.0

    @property
    def mean_accepted_length(self) -> float | None:
        return self.decode_tokens / self.steps if self.steps else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted_depth if self.drafted_depth else None


@dataclass(frozen=True)
class WriteReport:
    tokens: int  # in the book
    written: int  # by this run (the rest was in the book already)
    seconds: float
    tokens_per_second: float
    mean_accepted_length: float | None
    acceptance_rate: float | None
    distinct_1: float
    distinct_2: float
    distinct_3: float
    distinct_4: float
    ar_tokens_per_second: float | None
    speedup_vs_ar: float | None
    refills: int  # of the book
    prefill_seconds: float  # this run's prefills: the prompt's and every refill's
    finish_reason: str | None  # "length" | "eos"; None when stopped early


def write_book(engine: Engine, book: Book, target: int, *, warn: Callable[[str], None] = lambda _m: None,
               status: Callable[[WriteStatus], None] = lambda _s: None,
               prompt_cache: Path | None = None) -> WriteReport:  # fmt: skip
    """Write `book` on until it holds `target` generated tokens (or to EOS, if its settings stop there).

    Only steps that write new tokens count as writing: their time, their figures, their prefills; the replay
    of tokens already in the book (after --resume) verifies them as known chains and counts for nothing. The
    book's state, writing time included, is saved every SAVE_SECONDS and on the way out, a KeyboardInterrupt
    included; the cache too, to `prompt_cache` where one is given (read back at the start instead of a replay)."""
    settings, progress = book.settings, book.progress
    if target < progress.tokens:
        raise ValueError(f"the book holds {progress.tokens} tokens already, more than {target}")
    if engine.capacity != settings.context:
        raise ValueError(f"the engine holds {engine.capacity} tokens; the book was written with {settings.context}")
    sampling = settings.sampling(engine.eos_ids)
    stream = TextStream(engine.tokenizer, **progress.stream)
    position = progress.segment_start  # generated tokens reproduced or written so far
    if prompt_cache is not None and _read_cache(engine, book, prompt_cache):
        position = progress.tokens  # the cache as the last run left it: nothing to replay
    run = GenerationStats()  # this run's writing steps
    ar_steps: list[float] = []
    written, seconds, prefill_seconds, since_ar = 0, 0.0, 0.0, AR_EVERY
    book_seconds, saved = progress.seconds, time.monotonic()

    def current() -> WriteStatus:
        return WriteStatus(progress.tokens, target, written, seconds, run.steps, run.decode_tokens, run.drafted_depth,
                           run.accepted, progress.refills, position < progress.tokens)  # fmt: skip

    try:
        while progress.finished is None and position < target:
            if settings.prompt_tokens + position - progress.dropped >= settings.context:  # full: refill
                progress.dropped = position - (settings.context - settings.prompt_tokens - settings.refill_chunk)
                progress.refills += 1
            progress.segment_start = position
            context = book.prompt_ids + book.generated[progress.dropped : position]
            before, mark = GenerationStats(), time.perf_counter()
            for event in engine.generate(context, sampling=sampling, max_new_tokens=target - position,
                                         index_offset=progress.dropped, known=book.generated[position:]):  # fmt: skip
                tokens, stats = event.tokens, event.stats
                known = book.generated[position : position + len(tokens)]
                if tokens[: len(known)] != known:
                    warn(f"resuming did not reproduce token {position + 1} of the book (this machine computes "
                         "differently from the one that wrote it); going on from the book's last token")  # fmt: skip
                    position = progress.tokens
                    break
                position += len(tokens)
                new = tokens[len(known) :]
                if new:  # a writing step: its time and figures count (the segment's prefill with its first token)
                    book.append(new, stream.add(new))
                    written += len(new)
                    since_ar += len(new)
                    seconds += time.perf_counter() - mark
                    prefill_seconds += stats.prefill_seconds if before.new_tokens == 0 else 0.0
                    run = _add(run, stats, before)
                before = _copy(stats)
                if event.finish_reason == "eos" or position >= target:
                    progress.finished = event.finish_reason or "length"
                elif since_ar >= AR_EVERY:
                    ar_steps.append(engine.autoregressive_step_seconds(sampling=sampling))  # not writing time
                    since_ar = 0
                status(current())
                if time.monotonic() - saved > SAVE_SECONDS:
                    progress.seconds, progress.stream = book_seconds + seconds, stream.state()
                    book.save()
                    saved = time.monotonic()
                mark = time.perf_counter()
    finally:
        progress.seconds, progress.stream = book_seconds + seconds, stream.state()
        book.save()
        if prompt_cache is not None:
            _keep_cache(engine, prompt_cache, warn)
    return _report(book, current(), ar_steps, prefill_seconds)


def _read_cache(engine: Engine, book: Book, path: Path) -> bool:
    """Hold in `engine` what the file at `path` keeps of the book's window; whether that is all of it up to its last
    token (a file of another run, or cut short, holds less: the replay rebuilds the rest)."""
    progress = book.progress
    if progress.segment_start >= progress.tokens:
        return False
    text = book.prompt_ids + book.generated[progress.dropped : progress.tokens]
    try:
        return read_prompt_cache(engine, path, text) == len(text) - 1
    except OSError:  # cut short: the replay rebuilds it
        return False


def _keep_cache(engine: Engine, path: Path, warn: Callable[[str], None]) -> None:
    try:
        write_prompt_cache(engine, path)
    except OSError as error:  # a full disk costs the next resume its shortcut, not the book
        warn(f"--prompt-cache {path} not written: {error.strerror or error}")


def _add(run: GenerationStats, now: GenerationStats, before: GenerationStats) -> GenerationStats:
    """`run` plus what a generation's stats gained from `before` to `now`."""
    return GenerationStats(steps=run.steps + now.steps - before.steps,
                           decode_tokens=run.decode_tokens + now.decode_tokens - before.decode_tokens,
                           drafted_depth=run.drafted_depth + now.drafted_depth - before.drafted_depth,
                           accepted=run.accepted + now.accepted - before.accepted)  # fmt: skip


def _copy(stats: GenerationStats) -> GenerationStats:
    return GenerationStats(new_tokens=stats.new_tokens, steps=stats.steps, decode_tokens=stats.decode_tokens,
                           drafted_depth=stats.drafted_depth, accepted=stats.accepted)  # fmt: skip


def _report(book: Book, run: WriteStatus, ar_steps: list[float], prefill_seconds: float) -> WriteReport:
    """The run's figures. The AR baseline writes the same tokens at the measured AR step time each, and pays
    the same prefills: its time is written tokens x median step + the refills' prefill time."""
    ar_step = sorted(ar_steps)[len(ar_steps) // 2] if ar_steps else None
    ar_tps = 1 / ar_step if ar_step else None
    speedup = None
    if ar_step and run.seconds and run.written:
        speedup = (run.written * ar_step + prefill_seconds) / run.seconds
    distinct = [distinct_n(book.generated, n) for n in (1, 2, 3, 4)]
    return WriteReport(run.tokens, run.written, run.seconds, run.tokens_per_second, run.mean_accepted_length,
                       run.acceptance_rate, *distinct, ar_tps, speedup, book.progress.refills, prefill_seconds,
                       book.progress.finished)  # fmt: skip
