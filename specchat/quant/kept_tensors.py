"""Tensors a load makes from a model's files, kept in specchat's cache so that the next load of the same files reads
them instead of making them again: the GGUF blocks a checkpoint is quantized to (`gguf_quantize.py`), the embedded
model's codes packed for torch's int4 kernel (`gguf_model.py`).

One safetensors file per model, named by what its tensors depend on (`kept_path`); read back memory-mapped, so a
second load costs what mapping a file of them does. Writing a new version of a model's file removes the old one: the
cache holds one file per model and variant, not one per release of specchat or edit of the model's file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specchat.disk_cache import cache_dir, other_versions, sources_json


def kept_path(folder: str, stem: str, files: list[Path], code: list[Path], *facts: str) -> Path:
    """Where tensors made from `files` by `code` are kept: `{stem}-{source}-{version}.safetensors`, the source named
    by the files' paths and `facts` (whatever else the tensors depend on: such variants are kept side by side), the
    version by the files' sizes and times and the code's bytes, so that an edited file or new code makes them anew and
    `save` removes the version it replaces."""
    paths = sorted(files)
    source = _digest(json.dumps([[str(path.resolve()) for path in paths], facts]).encode())
    stats = json.dumps([(path.stat().st_size, path.stat().st_mtime_ns) for path in paths]).encode()
    version = _digest(stats + b"".join(path.read_bytes() for path in code))
    return cache_dir() / folder / f"{stem}-{source}-{version}.safetensors"


def kept_tensors(folder: str, stem: str, files: list[Path], code: list[Path], *facts: str) -> KeptTensors:
    """The tensors kept at `kept_path` for `files`, which their file names as what they were made from."""
    return KeptTensors(kept_path(folder, stem, files, code, *facts), sources=files)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


class KeptTensors:
    """Tensors by name: read from the file a previous load wrote at `path`, or made now and written there by `save`
    (one file a model; a partial or unreadable one is never read), its metadata naming the `sources` they came from."""

    def __init__(self, path: Path | None, sources: list[Path] = ()):
        self.path, self.sources, self.made = path, list(sources), {}
        self.stored = None
        if path is not None and path.is_file():
            try:
                self.stored = safe_open(path, framework="pt")
            except (SafetensorError, OSError):  # damaged: made anew, and `save` replaces it
                pass
        self.parts: dict[str, list[str]] = {}  # a stored name's parts: its tensors are "name:part"
        for key in self.stored.keys() if self.stored is not None else ():
            name, _, part = key.partition(":")
            self.parts.setdefault(name, []).append(part)

    def tensors(self, name: str, make: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The tensors kept under `name`, by part, or those `make()` returns (kept by `save`)."""
        if name in self.parts:
            return {part: self.stored.get_tensor(f"{name}:{part}") for part in self.parts[name]}
        made = make()
        self.made.update({f"{name}:{part}": tensor for part, tensor in made.items()})
        return made

    def save(self) -> None:
        """Write what was made, beside what was read; where the cache cannot be written (full, read-only), the next
        load makes it again."""
        if self.path is None or not self.made:
            return
        partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
        stored = {key: self.stored.get_tensor(key) for key in self.stored.keys()} if self.stored is not None else {}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            save_file({**stored, **self.made}, partial, metadata={"sources": sources_json(self.sources)})
            partial.replace(self.path)  # atomic: a concurrent reader sees no file or the whole file
        except (OSError, SafetensorError):  # safetensors reports its own failed writes as its error
            partial.unlink(missing_ok=True)
            return
        for replaced in other_versions(self.path):  # a process still mapping one reads on: unlinking keeps its pages
            replaced.unlink(missing_ok=True)
