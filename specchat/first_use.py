"""Work a machine does once (compiling the CPU decoder, timing this CPU, converting the embedded model): when
it takes more than a moment, say what it is and that it happens once, so a first run is never silent."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

AFTER_SECONDS = 3.0  # quicker work (the same step when its result is cached) says nothing


def _stderr(line: str) -> None:
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


_say: Callable[[str], None] = _stderr


def tell(say: Callable[[str], None] | None) -> None:
    """Where the lines go: e.g. the chat's loading line while it loads; None: stderr (the default)."""
    global _say
    _say = say or _stderr


@contextmanager
def first_use(what: str) -> Iterator[None]:
    """Around work that is slow only the first time on a machine: if it runs past AFTER_SECONDS, says `what`
    is happening (`what` says it happens once), then how long it took."""
    start, said = time.monotonic(), threading.Event()

    def announce() -> None:
        said.set()
        _say(f"{what} ...")

    timer = threading.Timer(AFTER_SECONDS, announce)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if said.is_set():
            _say(f"{what}: done in {time.monotonic() - start:.0f} s")


class _Lines:
    """A file a progress bar draws on, handing each redraw to where `tell` sends lines (the chat's loading line)."""

    encoding = "utf-8"  # tqdm draws its bar in block characters, not '#'

    def write(self, text: str) -> None:
        if line := text.strip("\r\n "):
            _say(line)

    def flush(self) -> None:
        pass


def progress_file():
    """Where a progress bar draws: stderr, or while `tell` has somewhere else, there, one redraw a line."""
    return sys.stderr if _say is _stderr else _Lines()
