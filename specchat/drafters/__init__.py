"""Drafters propose token trees for the target to verify; one folder per kind, behind the engine's protocol
(`specchat.engine.drafter`).

This module is their registry, as data (`KINDS`: each kind's `build` and, where it fetches only part of a
published repo, its `fetch`, named as "module:function"): every place that names drafters (the CLI's checks and help,
the chat's `/drafter`, `bench`, `models`) reads it. `--drafter NAME` uses the model profile's checkpoint for NAME,
`--drafter NAME:PATH` a local checkpoint directory, `--drafter A+B` two drafters merged into one tree (`composite.py`;
`longspec:PATH+ngram`). It imports no torch: option checks stay fast.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from specchat.errors import SpecchatError

if TYPE_CHECKING:
    from specchat.engine.drafter import Drafter, TargetView
    from specchat.engine.generate import Engine
    from specchat.loading import ModelSource
    from specchat.profiles import Profile


@dataclass(frozen=True)
class DrafterKind:
    name: str
    summary: str
    build: str  # "module:function", `function(target, checkpoint, **options) -> Drafter`; "" for none
    trained: bool = False  # reads a checkpoint: the profile's, or NAME:PATH
    options: tuple[str, ...] = ()  # the build options (`OPTION_FLAGS`) its `build` takes as keyword arguments
    optional: bool = False  # a trained kind that also runs without one (where no profile publishes it)
    fetch: str = ""  # "module:function", `function(repo) -> directory`: fetches a published checkpoint's files
    hub_ids: bool = False  # NAME:X may also name a Hugging Face repo


NONE, NGRAM, LONGSPEC, GLIDE, TOKENSWIFT, MODEL, EAGLE3 = (
    "none", "ngram", "longspec", "glide", "tokenswift", "model", "eagle3"
)
KINDS = {
    kind.name: kind
    for kind in (
        DrafterKind(NONE, "no drafting: autoregressive decoding", ""),
        DrafterKind(NGRAM, "prompt lookup: continuations of earlier n-grams, and of the target's own answers where its "
                    "profile ships them", "specchat.drafters.ngram.drafter:build", True, optional=True),
        DrafterKind(LONGSPEC, "LongSpec: one draft layer reading the target's KV cache",
                    "specchat.drafters.longspec.drafter:build", True, ("cache",)),
        DrafterKind(GLIDE, "GLIDE + CAPE: draft layers attending to the target's KV cache",
                    "specchat.drafters.glide.drafter:build", True),
        DrafterKind(TOKENSWIFT, "TokenSwift: heads on the target over a partial KV cache, with n-gram reuse",
                    "specchat.drafters.tokenswift.drafter:build", True, ("kv_budget", "draft_forward")),
        DrafterKind(MODEL, "SpecExtend: a small draft model reading part of its own cache (--draft-cache)",
                    "specchat.drafters.model.drafter:build", True, ("cache",),
                    fetch="specchat.drafters.model.drafter:fetch_checkpoint", hub_ids=True),
        DrafterKind(EAGLE3, "EAGLE-3: one draft layer over three of the target's layers, drafting on its own outputs",
                    "specchat.drafters.eagle3.drafter:build", True, hub_ids=True),
    )
}  # fmt: skip
NAMES = tuple(KINDS)
DEFAULT_DRAFTER = NGRAM  # every model has it: the default of a model whose profile measured none faster
# Build options, by the flag that sets them: what a draft model reads of a long context (`cache_policy.py`), and
# whether TokenSwift runs a draft forward and the KV slots it reads. A kind takes those its `options` name.
OPTION_FLAGS = {"cache": "--draft-cache", "kv_budget": "--draft-kv-budget", "draft_forward": "--draft-forward"}
DRAFT_CACHES = ("full", "streaming", "retrieval")

_NEXT_PART = re.compile(rf"\+(?=(?:{'|'.join(NAMES)})(?:[:+]|$))")  # '+' and a name: where A:PATH+B's path ends


@dataclass(frozen=True)
class DrafterChoice:
    """A parsed `--drafter`: a kind and, for trained kinds, where its checkpoint comes from; or, for A+B,
    the name 'A+B' and the two parts' choices."""

    name: str
    path: Path | None = None  # NAME:PATH
    repo: str | None = None  # the profile's published checkpoint, once resolved
    parts: tuple[DrafterChoice, ...] = ()  # A+B: the first drafter's tree comes first

    def __str__(self) -> str:
        if self.parts:
            return "+".join(map(str, self.parts))
        return f"{self.name}:{self.path}" if self.path else self.name


def parse_drafter(text: str, flag: str = "--drafter") -> DrafterChoice:
    """'ngram', 'longspec:./draft', 'longspec+ngram' -> a choice; unknown names, misplaced paths and
    composites of other than two different drafters are one line, naming `flag` as the user typed it (the
    chat's is /drafter)."""
    parts = _split_parts(text)
    if len(parts) == 1:
        return _parse_one(text, flag)
    if len(parts) != 2 or "" in parts:
        raise SpecchatError(f"{flag} {text}: a composite combines two drafters, as A+B")
    first, second = (_parse_one(part, flag) for part in parts)
    if "none" in (first.name, second.name):
        raise SpecchatError(f"{flag} {text}: none drafts nothing, so it combines with nothing")
    if first.name == second.name:
        raise SpecchatError(f"{flag} {text}: combine two different drafters, not {first.name} twice")
    return DrafterChoice(f"{first.name}+{second.name}", parts=(first, second))


def _split_parts(text: str) -> list[str]:
    """'longspec:./a+b+ngram' -> ['longspec:./a+b', 'ngram']."""
    parts = []
    while (end := _first_part_end(text)) is not None:
        parts.append(text[:end])
        text = text[end + 1 :]
    return [*parts, text]


def _first_part_end(text: str) -> int | None:
    """The '+' that ends the first part: right after its name, or after its path where a drafter's name follows
    (a path may hold other '+'); None for a single part."""
    plus, colon = text.find("+"), text.find(":")
    if colon < 0 or 0 <= plus < colon:
        return plus if plus >= 0 else None
    after_path = _NEXT_PART.search(text, colon)
    return after_path.start() if after_path else None


def _parse_one(text: str, flag: str) -> DrafterChoice:
    name, colon, path = text.partition(":")
    kind = KINDS.get(name)
    if kind is None:
        raise SpecchatError(
            f"unknown drafter '{name}'; available: {', '.join(NAMES)} "
            "(NAME:PATH for a local checkpoint, A+B for two at once)"
        )
    if colon and not kind.trained:
        raise SpecchatError(f"the {name} drafter takes no checkpoint: use {flag} {name}")
    if colon and not path:
        raise SpecchatError(f"{flag} {name}: give the checkpoint directory after the colon")
    return DrafterChoice(name, Path(path).expanduser() if path else None)


def takes_option(choice: DrafterChoice, option: str) -> bool:
    """Whether `choice`, or a part of it, takes the build option `option`."""
    return any(option in KINDS[part.name].options for part in choice.parts or (choice,))


def check_option(choice: DrafterChoice, option: str) -> None:
    """A one-line error when the user set `option`'s flag for a drafter that takes no such option."""
    if not takes_option(choice, option):
        takers = [name for name, kind in KINDS.items() if option in kind.options]
        kinds = f"{' and '.join(takers)} drafter{'s' if len(takers) > 1 else ''}"
        raise SpecchatError(f"{OPTION_FLAGS[option]} is for the {kinds}, not {choice}")


def check_draft_cache(name: str, choice: DrafterChoice) -> None:
    """`--draft-cache NAME` with `--drafter CHOICE`: a known policy, for a drafter (or part) that reads one."""
    if name not in DRAFT_CACHES:
        raise SpecchatError(f"unknown --draft-cache '{name}'; use {', '.join(DRAFT_CACHES)}")
    check_option(choice, "cache")


def attach_drafter(engine: Engine, source: ModelSource, drafter: str | DrafterChoice, *,
                   draft_budget: int | None = None, draft_cache: str | None = None, kv_budget: int | None = None,
                   draft_forward: bool | None = None, flag: str = "--drafter") -> DrafterChoice:  # fmt: skip
    """Make `engine` draft with what `drafter` names for the model `source` (a trained kind: its profile's
    checkpoint unless a path is given), with its options; returns the resolved choice. What every command runs."""
    choice = parse_drafter(drafter, flag) if isinstance(drafter, str) else drafter
    choice = resolve_drafter(choice, source.profile, source.name, flag)
    drafter = build_drafter(choice, engine.target, cache=draft_cache, kv_budget=kv_budget, draft_forward=draft_forward)
    engine.set_drafter(drafter, draft_budget)
    return choice


def usable_drafters(profile: Profile | None) -> list[str]:
    """The drafters a model runs with as it is: the untrained ones and those its profile publishes (any two of
    them other than none also run together, as A+B)."""
    published = profile.drafters if profile else {}
    return [name for name, kind in KINDS.items() if not kind.trained or kind.optional or name in published]


def resolve_drafter(choice: DrafterChoice, profile: Profile | None, model_name: str,
                    flag: str = "--drafter") -> DrafterChoice:
    """Fill in the profile's checkpoint for a trained kind given without a path, or say what the model has; a
    path given that does not exist is a one-line error."""
    if choice.parts:
        return replace(choice, parts=tuple(resolve_drafter(part, profile, model_name, flag) for part in choice.parts))
    if choice.path is not None and not KINDS[choice.name].hub_ids and not choice.path.exists():  # before loading
        raise SpecchatError(f"{choice.path}: no such checkpoint directory")
    if not KINDS[choice.name].trained or choice.path is not None:
        return choice
    repo = profile.drafters.get(choice.name) if profile else None
    if repo is None and KINDS[choice.name].optional:
        return choice
    if repo is None:
        raise SpecchatError(
            f"model '{model_name}' has no published {choice.name} drafter "
            f"(it has: {', '.join(usable_drafters(profile))}); "
            f"pass a checkpoint directory with {flag} {choice.name}:PATH"
        )
    return DrafterChoice(choice.name, repo=repo)


def build_drafter(choice: DrafterChoice, target: TargetView, **options) -> Drafter | None:
    """The drafter for `choice` over `target` (None for none); checkpoints are read, or fetched, here. Each kind
    (each part of A+B) gets the build `options` it takes that are not None; the others go unused."""
    if choice.parts:
        from specchat.drafters.composite import CompositeDrafter

        return CompositeDrafter(*(build_drafter(part, target, **options) for part in choice.parts))
    kind = KINDS[choice.name]
    if not kind.build:
        return None
    build = function(kind.build)
    taken = {name: value for name, value in options.items() if name in kind.options and value is not None}
    if not kind.trained or (kind.optional and choice.path is None and choice.repo is None):
        return build(target, None, **taken)
    fetch = function(kind.fetch) if kind.fetch else None
    return build(target, choice.path or fetch_published(choice.repo, fetch), **taken)


def function(reference: str):
    """The function a registry entry names as "module:function" (its module imported only now: torch stays out
    of the option checks)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def bundled_checkpoint(repo: str) -> Path | None:
    """The directory of a checkpoint shipped with specchat (a profile names it without an owner: no '/'), or
    None for a Hugging Face repo id."""
    if "/" in repo:
        return None
    from importlib import resources

    return Path(str(resources.files("specchat.checkpoints"))) / repo


def fetch_published(repo: str, download=None) -> Path:
    """A profile's checkpoint directory: shipped with specchat, else from the Hugging Face cache (downloaded
    when online) by the drafter's own `download(repo)` when it fetches only part of a repo."""
    bundled = bundled_checkpoint(repo)
    if bundled is not None:
        if not (bundled / "config.json").is_file():
            raise SpecchatError(f"the drafter checkpoint {repo} is missing from this installation ({bundled})")
        return bundled
    if download is not None:
        return download(repo)
    from specchat.hub_download import download_snapshot

    return download_snapshot(repo, ("config.json", "*.safetensors"))
