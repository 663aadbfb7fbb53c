"""Option checks that run before anything slow is imported (no torch): names, ranges and output paths,
one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specchat.errors import SpecchatError

DTYPE_NAMES = ("float32", "bfloat16", "float16")
GGUF_QUANTIZE = ("q4_k_m", "q8_0")  # written as GGUF blocks (quant/gguf_quantize.py)
QUANTIZE = (*GGUF_QUANTIZE, "int4", "int8")
KV_CACHES = ("auto", "bf16", "int8")  # auto: the activations' dtype, or bf16 beside fp32 on quantized weights
PROMPT_CACHE_KIND = "specchat prompt cache"  # the `kind` in a prompt cache file's metadata (engine/prompt_cache.py)


def check_dtype(dtype: str) -> None:
    if dtype != "auto" and dtype not in DTYPE_NAMES:
        raise SpecchatError(f"invalid dtype '{dtype}'; use auto, {', '.join(DTYPE_NAMES)}")


def check_quantize(quantize: str | None, device: str = "cpu") -> None:
    if quantize is not None and quantize not in QUANTIZE:
        raise SpecchatError(f"invalid --quantize '{quantize}'; use {', '.join(QUANTIZE)}")
    if quantize is not None and device not in ("auto", "cpu"):
        raise SpecchatError("--quantize runs on CPU only (its kernels are CPU kernels)")


def check_yarn(factor: float | None) -> None:
    if factor is not None and not 1 < factor <= 64:
        raise SpecchatError(f"--yarn takes the window's multiple, above 1 (Qwen2.5: 4), not {factor:g}")


def check_kv_cache(kv_cache: str) -> None:
    if kv_cache not in KV_CACHES:
        raise SpecchatError(f"invalid --kv-cache '{kv_cache}'; use {', '.join(KV_CACHES)}")


def check_output_file(path: Path, *, force: bool) -> None:
    """A file to create, beside which files of the same name are kept: a regular file only with `force`, in a
    directory that exists and can be written."""
    if path.is_dir():
        raise SpecchatError(f"{path} is a directory; --out takes a file")
    if path.exists() and not force:
        raise SpecchatError(f"{path} exists; --resume continues it, --force overwrites it")
    if path.exists() and not path.is_file():
        raise SpecchatError(f"{path} is not a regular file; --out takes a file (its state is kept beside it)")
    if not path.absolute().parent.is_dir():
        raise SpecchatError(f"{path}: the directory {path.parent} does not exist")
    _check_writable(path.absolute().parent, path)


def check_output_dir(path: Path) -> None:
    """A directory to go on filling, or to create with its missing parents."""
    if path.exists() and not path.is_dir():
        raise SpecchatError(f"--out {path} exists and is not a directory")
    existing = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise SpecchatError(f"--out {path}: {existing} is not a directory")
    _check_writable(existing, path)


def check_prompt_cache(path: Path) -> None:
    """A prompt cache to read and rewrite: a file of ours or none yet (never another file, which it would replace),
    in a directory that can be written."""
    if path.is_dir():
        raise SpecchatError(f"--prompt-cache {path} is a directory; name a file")
    if not path.absolute().parent.is_dir():
        raise SpecchatError(f"--prompt-cache {path}: the directory {path.parent} does not exist")
    if path.exists() and safetensors_metadata(path).get("kind") != PROMPT_CACHE_KIND:
        raise SpecchatError(f"--prompt-cache {path} is not a specchat prompt cache (left as it is); name a new file")
    _check_writable(path.absolute().parent, path)


def safetensors_metadata(path: Path) -> dict[str, str]:
    """The metadata in a safetensors file's header (its first 8 bytes give the JSON header's length); {} for a
    file that is not safetensors."""
    try:
        with path.open("rb") as file:
            size = int.from_bytes(file.read(8), "little")
            if not 0 < size <= 100_000_000:
                return {}
            header = json.loads(file.read(size))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def _check_writable(directory: Path, path: Path) -> None:
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SpecchatError(f"{path}: cannot write into {directory}")
