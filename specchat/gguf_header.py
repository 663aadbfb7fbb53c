"""A GGUF file's header read directly: the names it gives its model, its other metadata, and its tensor table.

gguf-py's reader parses every metadata field into numpy views, the tokenizer's 150K strings and merges included
(10.4 s for Qwen2.5-Coder-1.5B's file on a Xeon core). Here the fields are walked over the memory-mapped bytes,
skipped unless wanted (a string costs one length read): 0.03 s for the same file. The tensor data is never read.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import struct
from pathlib import Path

UINT32, STRING, ARRAY = 4, 8, 9
LAYOUTS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
SIZES = {kind: struct.calcsize(layout) for kind, layout in LAYOUTS.items()}  # fixed-size value types, bytes
_LENGTH = struct.Struct("<Q")  # a string's byte count
DEFAULT_ALIGNMENT = 32  # of the tensor data, unless `general.alignment` says otherwise
CHAT_TEMPLATE = "tokenizer.chat_template"


def names_gguf_file(path: Path) -> bool:
    """Whether `--model` or a draft model's `path` is taken as a GGUF file: by its extension, or any file (an ollama
    blob is named sha256-...; its first bytes are checked when it loads)."""
    return path.suffix.lower() == ".gguf" or path.is_file()


class Cursor:
    """Reads little-endian values from `data` at a moving offset; past the end is a ValueError ("truncated")."""

    def __init__(self, data: bytes | mmap.mmap):
        self.data, self.at = data, 0

    def take(self, layout: str) -> tuple:
        size = struct.calcsize(layout)
        self.advance(size)
        return struct.unpack_from(layout, self.data, self.at - size)

    def advance(self, size: int) -> None:
        if self.at + size > len(self.data):
            raise ValueError("the header ends early: the file is truncated")
        self.at += size

    def string(self) -> str:
        (length,) = self.take("<Q")
        self.advance(length)
        return bytes(self.data[self.at - length : self.at]).decode("utf-8")

    def value(self, kind: int) -> int | float | bool | str:
        """One value of type `kind`, a number, a bool or a string (KeyError for an array or an unknown type)."""
        return self.string() if kind == STRING else self.take(LAYOUTS[kind])[0]

    def skip(self, kind: int) -> None:
        """Past one value of type `kind` (arrays element by element only where they hold strings)."""
        if kind == STRING:
            self.advance(self.take("<Q")[0])
        elif kind == ARRAY:
            self.skip_elements(*self.take("<IQ"))
        else:
            self.advance(SIZES[kind])

    def skip_elements(self, element: int, count: int) -> None:
        """Past an array's `count` values of type `element` (a vocabulary's strings in one tight loop: 150K of
        them in 0.05 s, where a `take` each took 0.5 s)."""
        if element != STRING:
            self.advance(SIZES[element] * count)
            return
        data, at, length = self.data, self.at, _LENGTH.unpack_from
        try:
            for _ in range(count):
                at += 8 + length(data, at)[0]
        except struct.error:
            raise ValueError("the header ends early: the file is truncated") from None
        self.advance(at - self.at)


def general_fields(path: Path) -> dict[str, str]:
    """The string `general.*` fields at the head of a GGUF file (name, basename, size_label, finetune, ...); empty
    for a file this cannot read (an old or damaged header: the caller goes on without a profile). They come
    first, so reading stops at the first other field."""
    fields: dict[str, str] = {}
    try:
        with _mapped(path) as data:
            cursor = Cursor(data)
            _, field_count = _counts(cursor)
            for _ in range(field_count):
                key = cursor.string()
                if not key.startswith("general."):
                    break
                (kind,) = cursor.take("<I")
                if kind == STRING:
                    fields[key] = cursor.string()
                else:
                    cursor.skip(kind)
    except (OSError, ValueError, struct.error, KeyError):
        return fields
    return fields


def header_fields(path: Path) -> dict[str, int | float | bool | str]:
    """Every metadata field of a GGUF file, an array as its length (the vocabulary's size, not its 150K strings);
    a ValueError (or OSError) for a file whose header is damaged or cut short."""
    fields = {}
    with _mapped(path) as data:
        cursor = Cursor(data)
        _, field_count = _counts(cursor)
        for _ in range(field_count):
            key = cursor.string()
            (kind,) = cursor.take("<I")
            try:
                if kind == ARRAY:
                    element, count = cursor.take("<IQ")
                    cursor.skip_elements(element, count)
                    fields[key] = count
                else:
                    fields[key] = cursor.value(kind)
            except KeyError:
                raise ValueError(f"field '{key}' has an unknown value type {kind}") from None
    return fields


def tokenizer_digest(path: Path) -> str:
    """A hash of what transformers builds a GGUF file's tokenizer from: its architecture and its `tokenizer.*`
    fields as stored, all but the chat template. Files that share it (a model's quantizations, the sizes of one
    family) convert to the same tokenizer, their templates aside; a ValueError (or OSError) for a damaged header."""
    digest = hashlib.sha256()
    with _mapped(path) as data:
        cursor = Cursor(data)
        _, field_count = _counts(cursor)
        for _ in range(field_count):
            start = cursor.at
            key = cursor.string()
            (kind,) = cursor.take("<I")
            try:
                cursor.skip(kind)
            except KeyError:
                raise ValueError(f"field '{key}' has an unknown value type {kind}") from None
            if key == "general.architecture" or (key.startswith("tokenizer.") and key != CHAT_TEMPLATE):
                digest.update(data[start : cursor.at])
    return digest.hexdigest()


def tensor_table(path: Path) -> list[list]:
    """Every tensor of a GGUF file as [name, ggml type id, shape (the row length first), byte offset in the file,
    bytes]; a ValueError (or OSError) for a file whose header is damaged or cut short."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with _mapped(path) as data:
        cursor = Cursor(data)
        tensor_count, field_count = _counts(cursor)
        alignment = DEFAULT_ALIGNMENT
        for _ in range(field_count):
            key = cursor.string()
            (kind,) = cursor.take("<I")
            if key == "general.alignment" and kind == UINT32:
                (alignment,) = cursor.take("<I")
                if alignment == 0:
                    raise ValueError("its data alignment is 0")
            else:
                try:
                    cursor.skip(kind)
                except KeyError:
                    raise ValueError(f"field '{key}' has an unknown value type {kind}") from None
        infos = []
        for _ in range(tensor_count):
            name = cursor.string()
            (dims,) = cursor.take("<I")
            shape = list(cursor.take(f"<{dims}Q"))
            kind, offset = cursor.take("<IQ")
            infos.append((name, kind, shape, offset))
        start = -(-cursor.at // alignment) * alignment
    table = []
    for name, kind, shape, offset in infos:
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor '{name}' has an unknown type id {kind}") from None
        table.append([name, kind, shape, start + offset, math.prod(shape) // block * block_bytes])
    return table


def _mapped(path: Path) -> mmap.mmap:
    with path.open("rb") as file:
        try:
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise ValueError("the file is empty") from None


def _counts(cursor: Cursor) -> tuple[int, int]:
    """The header's tensor and metadata field counts, after checking it is a GGUF file of version 2 or later."""
    magic, version, tensor_count, field_count = cursor.take("<4sIQQ")
    if magic != b"GGUF" or version < 2:
        raise ValueError(f"not a GGUF file of version 2 or later (magic {magic!r}, version {version})")
    return tensor_count, field_count
