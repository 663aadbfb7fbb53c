"""Models ollama has pulled, by the names ollama gives them (`llama3.2`, `qwen2.5-coder:1.5b`,
`hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M`): each is a GGUF file among ollama's blobs, named by its
manifest, so `--model` runs it in place, nothing downloaded or copied. ollama keeps them in `$OLLAMA_MODELS`, else
`~/.ollama/models`. Beside the file a manifest may name the model's sampling parameters, stop strings and system
prompt (its Modelfile's PARAMETER and SYSTEM lines): they are its defaults here too, as under `ollama run`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import SpecchatError

MODEL_LAYER = "application/vnd.ollama.image.model"  # the manifest layer that holds the GGUF file
PARAMS_LAYER = "application/vnd.ollama.image.params"  # JSON: the Modelfile's PARAMETER lines
SYSTEM_LAYER = "application/vnd.ollama.image.system"  # text: its SYSTEM prompt
# ollama's sampling defaults where a model's parameters name none, and its names for our SamplingConfig fields
OLLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1, "repeat_last_n": 64}
PARAMETERS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
              "repeat_penalty": "penalty", "repeat_last_n": "penalty_window", "frequency_penalty": "frequency_penalty",
              "presence_penalty": "presence_penalty", "seed": "seed"}  # fmt: skip
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
    layers = _layers(name)
    if layers is None:
        return None
    if MODEL_LAYER not in layers:
        raise SpecchatError(f"ollama's manifest of '{name}' ({manifest_path(name)}) names no model file")
    blob = layers[MODEL_LAYER]
    if not blob.is_file():
        raise SpecchatError(f"ollama's model file of '{name}' is missing ({blob}): `ollama pull {name}` fetches it")
    return blob


def ollama_decoding(name: str) -> dict[str, float] | None:
    """The sampling defaults of the model ollama holds as `name` (SamplingConfig's fields): its parameters over
    ollama's own defaults; None where ollama holds no such model."""
    given = _parameters(name)
    if given is None:
        return None
    settings = {**OLLAMA_DEFAULTS, **{key: value for key, value in given.items() if key in PARAMETERS}}
    if settings["repeat_last_n"] == 0:  # ollama's "no repetition penalty"
        settings["repeat_penalty"], settings["repeat_last_n"] = 1.0, OLLAMA_DEFAULTS["repeat_last_n"]
    elif settings["repeat_last_n"] < 0:  # the whole context
        settings["repeat_last_n"] = 1 << 20
    return {PARAMETERS[key]: value for key, value in settings.items()}


def ollama_stop(name: str) -> tuple[str, ...]:
    """The stop strings of the model ollama holds as `name` (its Modelfile's `PARAMETER stop` lines): what ends an
    answer there when a request names none."""
    stop = (_parameters(name) or {}).get("stop", [])
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(each, str) and each for each in stop):
        raise SpecchatError(f"ollama's parameters of '{name}' give a stop that is not a list of strings")
    return tuple(stop)


def _parameters(name: str) -> dict | None:
    """The Modelfile parameters of the model ollama holds as `name` ({} where it gives none); None where ollama
    holds no such model."""
    layers = _layers(name)
    if layers is None:
        return None
    if PARAMS_LAYER not in layers:
        return {}
    try:
        given = json.loads(layers[PARAMS_LAYER].read_text())
    except (OSError, ValueError):
        given = None
    if not isinstance(given, dict):
        raise SpecchatError(f"ollama's parameters of '{name}' ({layers[PARAMS_LAYER]}) cannot be read")
    return given


def ollama_system(name: str) -> str | None:
    """The system prompt of the model ollama holds as `name`, None where it has none (or no such model)."""
    layers = _layers(name) or {}
    if SYSTEM_LAYER not in layers:
        return None
    try:
        return layers[SYSTEM_LAYER].read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise SpecchatError(f"ollama's system prompt of '{name}' ({layers[SYSTEM_LAYER]}) cannot be read") from None


def _layers(name: str) -> dict[str, Path] | None:
    """The blobs the manifest of `name` names, by media type; None where ollama has no such model."""
    manifest = manifest_path(name)
    if manifest is None or not manifest.is_file():
        return None
    try:
        layers = json.loads(manifest.read_text()).get("layers", [])
        return {layer["mediaType"]: models_dir() / "blobs" / layer["digest"].replace(":", "-") for layer in layers}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        raise SpecchatError(f"ollama's manifest of '{name}' ({manifest}) cannot be read") from None


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
