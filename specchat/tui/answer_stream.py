"""Hands one answer's updates from the engine's thread to the UI's: in order, nothing dropped, in batches.

The worker thread runs `produce`; the UI drains on a timer, so a fast engine never floods the screen with
redraws and a slow one shows every step as it lands. `stop` ends the answer after the step in flight; every
step the engine committed still reaches the UI.
"""

from __future__ import annotations

import threading
from contextlib import closing
from dataclasses import dataclass
from queue import Empty, SimpleQueue

from specchat import first_use
from specchat.errors import SpecchatError, unexpected
from specchat.tui.session import ChatSession, Update


@dataclass(frozen=True)
class Status:
    """A line of one-time work said while the answer waits on it (a drafter's download, a calibration)."""

    line: str


@dataclass(frozen=True)
class AnswerEnd:
    finish: str  # eos | stop | length | stopped (Esc) | error
    error: str | None = None  # one line for the user


class AnswerStream:
    def __init__(self):
        self._queue: SimpleQueue[Update | Status | AnswerEnd] = SimpleQueue()
        self._stop = threading.Event()
        self._ended = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def produce(self, session: ChatSession, prompt_ids: list[int]) -> None:
        """Generate the answer to `prompt_ids`, queueing every step, then an `AnswerEnd` (worker thread); what
        one-time work says meanwhile (`first_use`) is queued as a `Status`."""
        finish, error = "stopped", None
        first_use.tell(self.say)
        try:
            with session.lock, closing(session.run(prompt_ids)) as updates:
                for update in updates:
                    self._queue.put(update)
                    finish = update.event.finish_reason or "stopped"
                    if self._stop.is_set():
                        break
        except SpecchatError as exc:
            finish, error = "error", str(exc)
        except Exception as exc:  # noqa: BLE001 - an engine bug must not kill the app: show it, keep the chat
            finish, error = "error", unexpected(exc)
        finally:
            first_use.tell(None)
        self._queue.put(AnswerEnd(finish, error))
        self._ended.set()

    def say(self, line: str) -> None:
        """Queue what one-time work says while the answer waits on it, as a `Status`."""
        self._queue.put(Status(line))

    def wait(self, seconds: float) -> None:
        """Block until the `AnswerEnd` is queued, or `seconds` have passed."""
        self._ended.wait(seconds)

    @property
    def ended(self) -> bool:
        """Whether the `AnswerEnd` is queued: the rest of the answer can be shown without waiting."""
        return self._ended.is_set()

    def drain(self) -> list[Update | Status | AnswerEnd]:
        """Everything queued since the last call, oldest first."""
        items = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except Empty:
                return items
