"""Models ollama has pulled, by the names ollama gives them (`llama3.2`, `qwen2.5-coder:1.5b`,
`hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M`): each is a GGUF file among ollama's blobs, named by its
manifest, so `--model` runs it in place, nothing downloaded or copied. ollama keeps them in `$OLLAMA_MODELS`, else
`~/.ollama/models`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import SpecchatError

MODEL_LAYER = "application/vnd.ollama.image.model"  # the manifest layer that holds the GGUF file
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"


@dataclass(frozen=True)
class OllamaModel:
    name: str  # as `ollama list` shows it
    path: Path  # the GGUF blob
    size: int  # bytes


def models_dir() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or "~/.ollama/models").expanduser()


def manifest_path(name: str) -> Path | None:
    """Where ollama keeps the manifest of `name` (`[host/][namespace/]model[:tag]`); None for what cannot be an
    ollama name."""
    base, _, tag = name.partition(":")
    parts = base.split("/")
    if not base or len(parts) > 3 or not all(parts) or any(part in (".", "..") for part in parts) or "/" in tag:
        return None
    host, namespace, model = [DEFAULT_HOST, DEFAULT_NAMESPACE][: 3 - len(parts)] + parts
    return models_dir() / "manifests" / host / namespace / model / (tag or DEFAULT_TAG)


def ollama_gguf(name: str) -> Path | None:
    """The GGUF file ollama holds for `name`, or None where ollama has no such model; a manifest that names no
    model file, or a file that is gone, is a one-line error."""
    manifest = manifest_path(name)
    if manifest is None or not manifest.is_file():
        return None
    try:
        layers = json.loads(manifest.read_text()).get("layers", [])
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == MODEL_LAYER)
    except (OSError, ValueError, AttributeError, KeyError, StopIteration):
        raise SpecchatError(f"ollama's manifest of '{name}' ({manifest}) names no model file") from None
    blob = models_dir() / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise SpecchatError(f"ollama's model file of '{name}' is missing ({blob}): `ollama pull {name}` fetches it")
    return blob


def ollama_models() -> list[OllamaModel]:
    """Every model ollama holds here, by name."""
    root = models_dir() / "manifests"
    found = []
    for manifest in sorted(root.glob("*/*/*/*")) if root.is_dir() else []:
        host, namespace, model, tag = manifest.relative_to(root).parts
        if host != DEFAULT_HOST:
            name = f"{host}/{namespace}/{model}:{tag}"
        else:
            name = f"{model}:{tag}" if namespace == DEFAULT_NAMESPACE else f"{namespace}/{model}:{tag}"
        try:
            path = ollama_gguf(name)
        except SpecchatError:
            continue
        if path is not None:
            found.append(OllamaModel(name, path, path.stat().st_size))
    return found
