"""Drafters propose token trees for the target to verify; one file each, behind one protocol (`base.py`).

This module is their registry: every place that names drafters (the CLI's checks and help, the chat's
`/drafter`, `bench`, `models`) reads it. `--drafter NAME` uses the model profile's checkpoint for NAME,
`--drafter NAME:PATH` a local checkpoint directory. It imports no torch: option checks stay fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specchat.errors import SpecchatError

if TYPE_CHECKING:
    from specchat.drafters.base import Drafter, TargetView
    from specchat.profiles import Profile


@dataclass(frozen=True)
class DrafterKind:
    name: str
    summary: str
    module: str  # holds `build(target, checkpoint) -> Drafter`; "" for none
    trained: bool = False  # reads a checkpoint: the profile's, or NAME:PATH


KINDS = {
    kind.name: kind
    for kind in (
        DrafterKind("none", "no drafting: autoregressive decoding", ""),
        DrafterKind("ngram", "prompt lookup: continuations of earlier n-grams (training-free)", "specchat.drafters.ngram"),
        DrafterKind("longspec", "LongSpec: one draft layer reading the target's KV cache", "specchat.drafters.longspec", True),
        DrafterKind("glide", "GLIDE + CAPE: draft layers attending to the target's KV cache", "specchat.drafters.glide", True),
    )
}  # fmt: skip
NAMES = tuple(KINDS)
DEFAULT_DRAFTER = "ngram"  # the best drafter every model has: the default of run, chat and bench


@dataclass(frozen=True)
class DrafterChoice:
    """A parsed `--drafter`: a kind and, for trained kinds, where its checkpoint comes from."""

    name: str
    path: Path | None = None  # NAME:PATH
    repo: str | None = None  # the profile's published checkpoint, once resolved

    def __str__(self) -> str:
        return f"{self.name}:{self.path}" if self.path else self.name


def parse_drafter(text: str) -> DrafterChoice:
    """'ngram', 'longspec', 'longspec:./draft' -> a choice; unknown names and misplaced paths are one line."""
    name, colon, path = text.partition(":")
    kind = KINDS.get(name)
    if kind is None:
        raise SpecchatError(f"unknown drafter '{name}'; available: {', '.join(NAMES)} (NAME:PATH for a local checkpoint)")
    if colon and not kind.trained:
        raise SpecchatError(f"the {name} drafter takes no checkpoint: use --drafter {name}")
    if colon and not path:
        raise SpecchatError(f"--drafter {name}: give the checkpoint directory after the colon")
    return DrafterChoice(name, Path(path).expanduser() if path else None)


def usable_drafters(profile: Profile | None) -> list[str]:
    """The drafters a model runs with as it is: the untrained ones and those its profile publishes."""
    published = profile.drafters if profile else {}
    return [name for name, kind in KINDS.items() if not kind.trained or name in published]


def resolve_drafter(choice: DrafterChoice, profile: Profile | None, model_name: str) -> DrafterChoice:
    """Fill in the profile's checkpoint for a trained kind given without a path, or say what the model has."""
    if not KINDS[choice.name].trained or choice.path is not None:
        return choice
    repo = profile.drafters.get(choice.name) if profile else None
    if repo is None:
        raise SpecchatError(
            f"model '{model_name}' has no published {choice.name} drafter (it has: {', '.join(usable_drafters(profile))}); "
            f"pass a checkpoint directory with --drafter {choice.name}:PATH"
        )
    return DrafterChoice(choice.name, repo=repo)


def build_drafter(choice: DrafterChoice, target: TargetView) -> Drafter | None:
    """The drafter for `choice` over `target` (None for none); checkpoints are read, or fetched, here."""
    kind = KINDS[choice.name]
    if not kind.module:
        return None
    build = importlib.import_module(kind.module).build
    if not kind.trained:
        return build(target, None)
    return build(target, choice.path or _fetch(choice.repo))


def _fetch(repo: str) -> Path:
    """A published checkpoint's directory: from the Hugging Face cache, downloaded when online."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, allow_patterns=["config.json", "*.safetensors"]))
    except LocalEntryNotFoundError:
        raise SpecchatError(f"the drafter checkpoint {repo} is not cached and this machine is offline") from None
