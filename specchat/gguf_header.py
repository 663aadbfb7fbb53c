"""The names a GGUF file gives its model, read from the header's first fields without parsing the rest.

A GGUF file's metadata starts with its `general.*` fields; the tokenizer's vocabulary (megabytes of strings)
comes later, so reading field by field and stopping at the first field past `general.*` costs microseconds where
gguf-py's reader parses everything (seconds). Used to find the profile of a file the user names by path.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

STRING, ARRAY = 8, 9
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # fixed-size value types, bytes


def general_fields(path: Path) -> dict[str, str]:
    """The string `general.*` fields at the head of a GGUF file (name, basename, size_label, finetune, ...); empty
    for a file this cannot read (an old or damaged header: the caller goes on without a profile)."""
    fields: dict[str, str] = {}
    try:
        with path.open("rb") as file:
            magic, version, _tensors, count = struct.unpack("<4sIQQ", file.read(24))
            if magic != b"GGUF" or version < 2:
                return fields
            for _ in range(count):
                key = _string(file)
                if not key.startswith("general."):
                    break
                (kind,) = struct.unpack("<I", file.read(4))
                if kind == STRING:
                    fields[key] = _string(file)
                else:
                    _skip(file, kind)
    except (OSError, struct.error, UnicodeDecodeError, KeyError):
        return fields
    return fields


def _string(file: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", file.read(8))
    return file.read(length).decode("utf-8")


def _skip(file: BinaryIO, kind: int) -> None:
    if kind != ARRAY:
        file.seek(SIZES[kind], 1)
        return
    element, count = struct.unpack("<IQ", file.read(12))
    if element == STRING:
        for _ in range(count):
            _string(file)
    else:
        file.seek(SIZES[element] * count, 1)
