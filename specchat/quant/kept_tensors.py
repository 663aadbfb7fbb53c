"""Tensors a load makes from a model's files, kept in specchat's cache so that the next load of the same files reads
them instead of making them again: the GGUF blocks a checkpoint is quantized to (`gguf_quantize.py`), the embedded
model's codes packed for torch's int4 kernel (`gguf_model.py`).

One safetensors file per model, named by what its tensors depend on (`kept_path`); read back memory-mapped, so a
second load costs what mapping a file of them does.
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

from specchat.disk_cache import cache_dir


def kept_path(folder: str, stem: str, files: list[Path], code: list[Path], *facts: str) -> Path:
    """Where tensors made from `files` by `code` are kept: named by the files (path, size, time), the code's bytes
    and `facts` (whatever else the tensors depend on), so that a change to any of them is made anew."""
    stats = [(str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns) for path in sorted(files)]
    source = b"".join(path.read_bytes() for path in code)
    key = hashlib.sha256(json.dumps([stats, facts]).encode() + source).hexdigest()[:16]
    return cache_dir() / folder / f"{stem}-{key}.safetensors"


class KeptTensors:
    """Tensors by name: read from the file a previous load wrote at `path`, or made now and written there by `save`
    (one file a model; a partial or unreadable one is never read)."""

    def __init__(self, path: Path | None):
        self.path, self.made = path, {}
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
            save_file({**stored, **self.made}, partial)
            partial.replace(self.path)  # atomic: a concurrent reader sees no file or the whole file
        except (OSError, SafetensorError):  # safetensors reports its own failed writes as its error
            partial.unlink(missing_ok=True)
