"""The engine's own thread: loads the model, then runs one request at a time, in arrival order.

One engine serves every client, one request after the other (answers and embeddings alike). A prompt reuses the
cached prefix it shares with the last one (a conversation's next turn prefills only what is new) where that is exact
(`Engine.exact_reuse`: the CPU decoder); elsewhere each prompt is prefilled whole, as `specchat run` does, unless
the prompt cache is forced on. Either way an answer is then the same alone or under load, whatever was asked before
it. Requests wait in a bounded queue; a full queue is refused at once (429) rather than left to time out. Each
request hears its steps through `deliver` (called on this thread) and can be cancelled at any time: a cancelled
request stops within one step, or is skipped if it has not started.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from specchat.engine.sampling_config import SamplingConfig
from specchat.errors import SpecchatError, unexpected
from specchat.server.indent_cut import IndentCut


@dataclass
class Job:
    prompt_ids: list[int]
    sampling: SamplingConfig
    max_new_tokens: int
    stop: tuple[str, ...]
    deliver: Callable[[object], None]  # the `Prompt` (with echo), a StepEvent per step, then one `Ended`
    cancelled: threading.Event = field(default_factory=threading.Event)
    drafting: bool = True  # False: the target alone, whatever drafter the server has
    draft_budget: int | None = None  # a fixed budget for this request; None: the server's
    constraint: Callable[[object], object] | None = None  # engine -> the answer's Constraint (JSON mode, tools)
    logprobs: int | None = None  # each token's log-probability and this many alternatives
    echo: bool = False  # the prompt is delivered first (`Prompt`), scored when `logprobs` asks
    time_limit: float | None = None  # seconds after the first token past which a line's end ends the answer
    min_tokens: int = 0  # tokens before the end of text or a stop string may end the answer
    indent: int = 0  # llama-server's n_indent: a later line indented less ends the answer (`IndentCut`); 0: none

@dataclass
class EmbeddingJob:
    """Texts (their token ids) to embed, one after the other (`Engine.embedding`)."""

    texts: list[list[int]]
    deliver: Callable[[object], None]  # one `Embedded`, or an `Ended` with the error or the shutdown
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class Embedded:
    vectors: list  # a [hidden_size] fp32 tensor per text


@dataclass(frozen=True)
class Prompt:
    """An echoed prompt: its ids, and each token's log-probability (None for the first) when asked."""

    ids: list[int]
    logprobs: list | None = None


@dataclass(frozen=True)
class Ended:
    """A job's last delivery: why it ended early, or None when the engine finished it."""

    error: str | None = None  # the engine refused it, or failed
    cut: bool = False  # its own limit ended it (`Job.time_limit`, `Job.indent`)
    status: int = 500  # with an error: 400 when the request was at fault
    shutdown: bool = False  # the server is stopping: cut short, or never started


class QueueFull(Exception):
    pass


class EngineWorker:
    """Owns the engine from `load()` (called on this thread: the server listens while the model loads)."""

    def __init__(self, load: Callable[[], object], max_queue: int, *, prompt_cache: bool | None = None):
        self.served = None  # what `load` returned, once loaded
        self.load_error: str | None = None
        self.ready = threading.Event()  # set when loaded, or when loading failed
        self._load = load
        self._prompt_cache = prompt_cache  # None: where reuse is exact
        self._queue: queue.Queue[Job | EmbeddingJob | None] = queue.Queue(maxsize=max_queue)
        self._current: Job | EmbeddingJob | None = None
        self.tokens_generated = 0  # since the start, every request's: what /health reports
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specchat-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def prompt_cache(self) -> bool:
        """Whether prompts reuse the cached prefix (once loaded)."""
        if self._prompt_cache is not None:
            return self._prompt_cache
        return self.served is not None and self.served.engine.exact_reuse

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    @property
    def busy(self) -> bool:
        return self._current is not None

    def submit(self, job: Job | EmbeddingJob) -> None:
        if self._stopping.is_set():
            job.deliver(Ended(shutdown=True))
            return
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    def stop(self) -> None:
        """Stop taking work: the running job ends after its current step, the waiting ones are turned away."""
        self._stopping.set()
        current = self._current
        if current is not None:
            current.cancelled.set()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.deliver(Ended(shutdown=True))
        self._queue.put(None)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self.served = self._load()
        except SpecchatError as error:
            self.load_error = str(error)
        except Exception as error:  # a broken file, a bug: the server reports it and exits
            self.load_error = unexpected(error)
        finally:
            self.ready.set()
        if self.load_error is not None:
            return
        while (job := self._queue.get()) is not None:
            if self._stopping.is_set():
                job.deliver(Ended(shutdown=True))
                continue
            if not job.cancelled.is_set():
                self._current = job
                self._serve(job)
                self._current = None

    def _serve(self, job: Job | EmbeddingJob) -> None:
        """Run a job; a failure is its last delivery."""
        try:
            if isinstance(job, EmbeddingJob):
                self._embed(job)
            else:
                self._answer(job)
        except SpecchatError as error:
            job.deliver(Ended(error=str(error), status=400))
        except Exception as error:  # reported to its client and on stderr; the server goes on
            print(f"error in a request: {unexpected(error)}", file=sys.stderr)
            job.deliver(Ended(error=unexpected(error)))

    def _embed(self, job: EmbeddingJob) -> None:
        vectors = []
        for ids in job.texts:
            if job.cancelled.is_set():
                job.deliver(Ended(shutdown=self._stopping.is_set()))
                return
            vectors.append(self.served.engine.embedding(ids))
        job.deliver(Embedded(vectors))

    def _answer(self, job: Job) -> None:
        engine = self.served.engine
        drafter, budget = engine.drafter, engine.fixed_budget  # the server's, back after a request that asks otherwise
        if not job.drafting or job.draft_budget is not None:
            engine.set_drafter(drafter if job.drafting else None, job.draft_budget if job.drafting else None)
        try:
            self._generate(job)
        finally:
            if (engine.drafter, engine.fixed_budget) != (drafter, budget):
                engine.set_drafter(drafter, budget)

    def _generate(self, job: Job) -> None:
        engine = self.served.engine
        if job.echo:
            scored = engine.prompt_logprobs(job.prompt_ids, job.logprobs) if job.logprobs is not None else None
            job.deliver(Prompt(job.prompt_ids, scored))
            if job.max_new_tokens == 0:
                job.deliver(Ended())
                return
        events = engine.generate(  # a seed keys each draw by position: the same text whatever was drafted
            job.prompt_ids, sampling=job.sampling, max_new_tokens=job.max_new_tokens, stop=job.stop,
            fresh=not self.prompt_cache, logprobs=job.logprobs,
            constraint=job.constraint(engine) if job.constraint else None, min_tokens=job.min_tokens,
        )
        first, lines = None, False  # when the first token came; whether a line has ended since
        cut = IndentCut(job.indent) if job.indent else None
        for event in events:
            self.tokens_generated += len(event.tokens)
            kept, ends = cut.feed(event.text) if cut else (event.text, False)
            if ends:
                events.close()
                job.deliver(replace(event, text=kept))
                job.deliver(Ended(cut=True))
                return
            job.deliver(event)
            if job.cancelled.is_set():
                events.close()
                job.deliver(Ended(shutdown=self._stopping.is_set()))
                return
            first, lines = first or time.perf_counter(), lines or "\n" in event.text
            if job.time_limit is not None and lines and time.perf_counter() - first > job.time_limit:
                events.close()
                job.deliver(Ended(cut=True))
                return
        job.deliver(Ended())
