"""What specchat keeps on disk between runs: GGUF conversions and small measurements (verification cost, the
fastest activation dtype). What an entry was made from is recorded beside it (`sources_json`), so that `specchat
cache` can tell one whose model file is gone."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """Where specchat keeps what it converts and measures: $SPECCHAT_CACHE, else `specchat` in the user's cache
    (~/.cache, or $XDG_CACHE_HOME)."""
    if own := os.environ.get("SPECCHAT_CACHE"):
        return Path(own)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specchat"


def cached_json(path: Path, key: str, compute: Callable[[], Any]) -> Any:
    """The JSON value stored under `key` in the file at `path`, computed and stored when missing. The file is read
    again once `compute` returns: what other processes stored while it ran (seconds of measuring) is kept. Where it
    cannot be written (a full disk, a read-only cache) the value is used all the same, with a warning: a run is not
    lost for a measurement it could not keep."""
    if key in (store := _read(path)):
        return store[key]
    value = compute()
    store = _read(path)
    store[key] = value
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(store, indent=1))
        partial.replace(path)  # atomic: a concurrent reader never sees half a file
    except OSError as error:
        partial.unlink(missing_ok=True)
        warnings.warn(f"could not keep {path} ({error.strerror or error}): it is measured again next time",
                      stacklevel=2)  # fmt: skip
    return value


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def other_versions(path: Path) -> list[Path]:
    """What the cache holds beside `path` for the same thing at other versions: entries named as `path` is up to its
    last '-' (`{what}-{version}`), a partial one still being written (`*.partial`) left out."""
    what = path.name.rsplit("-", 1)[0] + "-"
    return [
        entry
        for entry in path.parent.iterdir()
        if entry.name.startswith(what) and entry != path and not entry.name.endswith(".partial")
    ]


SOURCES_FILE = "specchat-sources.json"  # in a directory entry: the files it was made from (`sources_json`)


def sources_json(files: list[Path]) -> str:
    """The files an entry was made from, as its record holds them (resolved paths): a directory entry's
    SOURCES_FILE, a safetensors entry's "sources" metadata."""
    return json.dumps(sorted(str(path.resolve()) for path in files))
