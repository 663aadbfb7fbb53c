"""A book on disk: its text, its token ids and a small state file, consistent at every moment.

`book.txt` holds the text and `book.txt.specchat.ids` the prompt's and the generated token ids (uint32,
little-endian); both only grow, by appends flushed as tokens commit. `book.txt.specchat.json` says how much
of them counts: it is replaced atomically (write, fsync, rename) after the data it points to is on disk, so
a kill at any moment leaves a state that points at whole, written data. Resuming truncates both files to
what the state counts: bytes written after the last state are written again, the same.

The state also keeps a CRC-32 of the text and of the ids it counts, so a book edited by hand is refused
rather than silently rewritten: text added after a clean stop (no ids beyond the state's: only a kill leaves
those), or any counted byte changed.
"""

from __future__ import annotations

import json
import os
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from specchat.errors import SpecchatError
from specchat.writer.settings import BookSettings

FORMAT = "specchat-book/1"


@dataclass
class Progress:
    """Where writing stands, as the state file records it."""

    tokens: int = 0  # generated tokens in the book
    target: int = 0  # tokens asked for
    text_bytes: int = 0  # bytes of book.txt that hold their text (the rest waits for a whole character)
    stream: dict = field(default_factory=lambda: {"window": [], "read": 0})  # the detokenizer's state
    dropped: int = 0  # generated tokens the cache stopped holding at the last prefill
    segment_start: int = 0  # generated tokens at the last prefill: a resume replays from there
    refills: int = 0
    seconds: float = 0.0  # writing time, all sessions together
    finished: str | None = None  # why writing ended: "length" | "eos"
    text_crc: int | None = None  # CRC-32 of the counted text and ids (None: a book from before they were kept)
    ids_crc: int | None = None
    prompt_cache: str | None = None  # the file its cache is kept in at every stop (`write --prompt-cache`), if any


class Book:
    def __init__(self, path: Path, settings: BookSettings, prompt_ids: list[int], generated: list[int],
                 progress: Progress):
        self.path, self.settings, self.prompt_ids = path, settings, prompt_ids
        self.generated = generated  # every generated id: the window policy and the n-gram reuse read them
        self.progress = progress
        self._text = open(path, "ab")
        self._ids = open(ids_path(path), "ab")

    @classmethod
    def create(cls, path: Path, settings: BookSettings, prompt_ids: list[int], *, force: bool) -> Book:
        """A new, empty book at `path`; an existing file is replaced only with `force`."""
        if path.exists() and not force:
            raise SpecchatError(f"{path} exists; --resume continues it, --force overwrites it")
        if path.is_dir():
            raise SpecchatError(f"{path} is a directory")
        try:
            path.write_bytes(b"")
            ids_path(path).write_bytes(array("I", prompt_ids).tobytes())
        except OSError as error:
            raise SpecchatError(f"cannot write {path}: {error.strerror}") from None
        book = cls(path, settings, list(prompt_ids), [], Progress(text_crc=0, ids_crc=_crc(array("I", prompt_ids))))
        book.save()
        return book

    @classmethod
    def open(cls, path: Path) -> Book:
        """The book at `path` as its state file last recorded it; later bytes are cut off."""
        state_file = state_path(path)
        if not state_file.exists():
            raise SpecchatError(f"nothing to resume: {state_file.name} is not beside {path}")
        try:
            state = json.loads(state_file.read_text())
            if state.get("format") != FORMAT:
                raise ValueError(f"its format is {state.get('format')!r}, not {FORMAT}")
            settings = BookSettings.from_json(state["settings"])
            progress = Progress(**state["progress"])
        except (ValueError, KeyError, TypeError) as error:
            raise SpecchatError(f"{state_file} is not a specchat book state ({error})") from None
        count = settings.prompt_tokens + progress.tokens
        try:
            with open(ids_path(path), "rb") as file:
                id_bytes = file.read()
            with open(path, "rb") as file:
                text = file.read()
        except OSError as error:
            raise SpecchatError(f"cannot read the book {path}: {error.strerror}") from None
        if not _as_recorded(text, id_bytes, 4 * count, progress):
            raise SpecchatError(f"{path} or its ids are not what {state_file.name} records: the book was cut or "
                                "edited; restore it, or write a new book")  # fmt: skip
        os.truncate(path, progress.text_bytes)
        os.truncate(ids_path(path), 4 * count)
        ids = array("I")
        ids.frombytes(id_bytes[: 4 * count])
        ids = ids.tolist()
        return cls(path, settings, ids[: settings.prompt_tokens], ids[settings.prompt_tokens :], progress)

    def append(self, tokens: list[int], text: str) -> None:
        """Tokens and the text they completed, flushed: a killed process leaves them to the next resume. Ids go
        first: a kill between the two leaves ids beyond the state and no text, which a resume takes (text beyond
        the state without ids is an edit by hand)."""
        data = text.encode("utf-8")
        self._ids.write(array("I", tokens).tobytes())
        self._ids.flush()
        self._text.write(data)
        self._text.flush()
        self.generated.extend(tokens)
        self.progress.tokens += len(tokens)
        self.progress.text_bytes += len(data)
        if self.progress.text_crc is not None:
            self.progress.text_crc = zlib.crc32(data, self.progress.text_crc)
            self.progress.ids_crc = _crc(array("I", tokens), self.progress.ids_crc)

    def save(self) -> None:
        """Make what was appended count: data to disk first, then the state that points at it. The files are cut
        to what the state counts: an append that Ctrl-C stopped halfway is left out of both."""
        count = 4 * (len(self.prompt_ids) + self.progress.tokens)
        for file, size in ((self._text, self.progress.text_bytes), (self._ids, count)):
            file.truncate(size)
            file.flush()
            os.fsync(file.fileno())
        state = {"format": FORMAT, "settings": self.settings.to_json(), "progress": self.progress.__dict__}
        temporary = state_path(self.path).with_suffix(".tmp")
        with open(temporary, "w") as file:
            json.dump(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, state_path(self.path))

    def close(self) -> None:
        self._text.close()
        self._ids.close()


def _as_recorded(text: bytes, ids: bytes, id_bytes: int, progress: Progress) -> bool:
    """Whether the files hold what the state counts, unchanged, plus at most what a kill leaves after it (ids
    and the text they completed, appended after the last state)."""
    if len(ids) < id_bytes or len(text) < progress.text_bytes:
        return False  # cut
    if len(text) > progress.text_bytes and len(ids) == id_bytes:
        return False  # text added by hand: a kill leaves ids beyond the state too
    if progress.text_crc is None:
        return True
    return zlib.crc32(text[: progress.text_bytes]) == progress.text_crc and _crc(ids[:id_bytes]) == progress.ids_crc


def _crc(data, start: int = 0) -> int:
    return zlib.crc32(memoryview(data).cast("B"), start)


def state_path(path: Path) -> Path:
    return path.with_name(path.name + ".specchat.json")


def ids_path(path: Path) -> Path:
    return path.with_name(path.name + ".specchat.ids")
