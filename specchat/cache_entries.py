"""What specchat keeps on disk, entry by entry (`specchat cache`): what each is, its size, the files it was made from,
and why no load reads it any more where none does.

The entries live in specchat's cache (`disk_cache.cache_dir`) and, for the compiled CPU decoder, in torch's
extension cache; the profiles' model files (`loading.GGUF_DIR`) are listed too. Everything but those is made again
when a load needs it: `clear` leaves only the model files, `prune` removes what is stale (made from a file that is
gone, built from other code of specchat, or left half written by a process that died).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from specchat.disk_cache import SOURCES_FILE, cache_dir

KINDS = {  # by the entry's folder or name: what it is
    "packed": "4-bit codes packed for torch's int4 kernel (older versions' embedded model: no load reads them)",
    "quantized": "GGUF blocks of a checkpoint loaded with --quantize",
    "gguf-": "tokenizer and config read from a GGUF file",
    "smollm2-135m-": "the embedded model's tokenizer and config, and its fp32 weights once loaded in float32",
    "verify_cost": "measured costs of tree verification, by model and machine",
    "activation_dtype": "measured fastest activation dtype, by model and machine",
}


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    kind: str
    size: int  # bytes
    sources: tuple[Path, ...] = ()  # the files it was made from, where it records them
    stale: str | None = None  # why no load reads it any more; None while one may

    @property
    def removable(self) -> bool:
        """Whether a load makes it again when it needs it: all but model files."""
        return self.kind != "model file"


def cache_entries() -> list[CacheEntry]:
    """Every entry of specchat's cache and every build of its CPU decoder, model files first."""
    from specchat.loading import GGUF_DIR  # profiles' model files: never removed

    root, models = cache_dir(), GGUF_DIR.expanduser()
    entries = [_model_file(path) for path in sorted(models.glob("*"))]
    for path in sorted(root.glob("*")) if root.is_dir() else ():
        if path.name in ("packed", "quantized"):
            entries += [_entry(item, KINDS[path.name]) for item in sorted(path.iterdir())]
        elif path != models:
            entries.append(_entry(path, next((kind for key, kind in KINDS.items() if key in path.name), "unknown")))
    return entries + _decoder_builds()


def remove(entry: CacheEntry) -> None:
    """Delete an entry (a process still reading one of its files reads on: unlinking keeps its pages)."""
    if entry.path.is_dir():
        shutil.rmtree(entry.path, ignore_errors=True)
    else:
        entry.path.unlink(missing_ok=True)


def _model_file(path: Path) -> CacheEntry:
    return CacheEntry(path, "model file", _size(path))


def _entry(path: Path, kind: str) -> CacheEntry:
    sources = _sources(path)
    return CacheEntry(path, kind, _size(path), sources, _partial_left(path) or _sources_gone(sources) or
                      _other_embedded_version(path))  # fmt: skip


def _sources(path: Path) -> tuple[Path, ...]:
    """The files an entry records it was made from: a directory's SOURCES_FILE, a safetensors file's metadata."""
    try:
        if path.is_dir():
            return tuple(Path(name) for name in json.loads((path / SOURCES_FILE).read_text()))
        if path.suffix == ".safetensors":
            with path.open("rb") as file:  # the header alone: 8 bytes of length, then JSON
                header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
            return tuple(Path(name) for name in json.loads(header.get("__metadata__", {}).get("sources", "[]")))
    except (OSError, ValueError):
        pass
    return ()


def _sources_gone(sources: tuple[Path, ...]) -> str | None:
    if sources and not any(path.exists() for path in sources):
        return f"made from {', '.join(str(path) for path in sources)}, which is gone"
    return None


def _partial_left(path: Path) -> str | None:
    """A write in progress is named `{name}.{pid}.partial`: stale once its process is gone."""
    match = re.fullmatch(r".*\.(\d+)\.partial", path.name)
    if match is None:
        return None
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return "left half written by a process that died"
    except PermissionError:  # another user's live process
        pass
    return None


def _other_embedded_version(path: Path) -> str | None:
    """The embedded model's conversion for another release of specchat or of the model's package."""
    from specchat.loading import embedded_checkpoint_dir, embedded_gguf_path

    if not path.name.startswith("smollm2-135m-") or path.name.endswith(".partial"):
        return None
    gguf = embedded_gguf_path()
    if gguf is not None and path.name != embedded_checkpoint_dir(gguf).name:
        return "converted for another release"
    return None


def _decoder_builds() -> list[CacheEntry]:
    """The CPU decoder's builds in torch's extension cache: stale when built from other code of specchat."""
    from specchat.kernels.cpu.cpu_decoder import build_directory, source_version

    root, current = build_directory("native").parent, source_version()
    builds = []
    for path in sorted(root.glob("specchat_*")) if root.is_dir() else ():
        target, _, version = path.name.removeprefix("specchat_").rpartition("_")  # e.g. cpu_decoder_avx2
        stale = None if version == current else "built from other code of specchat"
        builds.append(CacheEntry(path, f"compiled kernels ({target})", _size(path), (), stale))
    return builds


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())
