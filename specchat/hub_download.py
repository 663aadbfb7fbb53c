"""Files from the Hugging Face hub, downloaded into its cache with their progress shown, and what stops a download
said in one line.

The hub's own progress bars are off while transformers' warnings are (`quiet_transformers`), and transformers
downloading a checkpoint itself shows nothing: a first `--model meta-llama/Llama-3.1-8B-Instruct` would sit silent
through 16 GB. So specchat downloads before anything loads, one file at a time, each with tqdm's bar
(`DownloadBar`), and hands the loaders a directory. A model repo often holds its weights twice (Llama 3.1's
`original/consolidated.00.pth`, Mistral's `consolidated.safetensors` beside the shards): a checkpoint's download
takes the files transformers reads, at the repo's top level, and of the weights those its index names.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from tqdm import tqdm

from specchat.errors import SpecchatError, first_line
from specchat.first_use import progress_file

SHOW_AFTER = 1.0  # seconds before a bar shows: a file found in the cache at once draws nothing
CHECKPOINT_FILES = ("*.json", "*.jinja", "*.model", "merges.txt")  # configs and tokenizers
INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"
SUBFOLDERS = ("*/*",)  # other formats of the weights, other runtimes' files
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class DownloadBar(tqdm):
    """A file's download as tqdm draws it, on stderr or the chat's loading line (`first_use.progress_file`), after
    `SHOW_AFTER`. The hub reports a file's bytes written to `update` and, for Xet storage, its network bytes to
    `update_transfer`: one count is the bar."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("delay", SHOW_AFTER)
        kwargs.setdefault("file", progress_file())
        super().__init__(*args, **kwargs)

    def update_transfer(self, n: int = 1) -> None:
        pass


def offline() -> bool:
    """Whether the Hugging Face hub is off limits (HF_HUB_OFFLINE)."""
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def download_file(repo: str, name: str, *, elsewhere: str = "") -> Path:
    """`name` of the repo `repo`, from the hub's cache or downloaded into it. `elsewhere`: where else the user could
    put the file, told when it cannot be downloaded."""
    from huggingface_hub import hf_hub_download

    with _one_line(repo, name, elsewhere):
        return Path(hf_hub_download(repo, name, tqdm_class=DownloadBar))


def download_checkpoint(repo: str) -> Path:
    """The snapshot directory of the model repo `repo` (an owner/name id) holding what a load reads: configs,
    tokenizer files and the safetensors weights (those its index names). A complete one in the cache is used as it
    is, online or not."""
    cached = cached_checkpoint(repo)
    if cached is not None:
        return cached
    if offline():
        raise SpecchatError(f"model '{repo}' is not available offline; download it with `hf download {repo}` on a "
                            "connected machine (or unset HF_HUB_OFFLINE)")  # fmt: skip
    small = download_snapshot(repo, CHECKPOINT_FILES)
    index = small / INDEX
    weights = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [SINGLE]
    return download_snapshot(repo, (*CHECKPOINT_FILES, *weights))


def download_snapshot(repo: str, patterns: tuple[str, ...]) -> Path:
    """The snapshot directory of `repo` with its top-level files matching `patterns`, those missing downloaded;
    offline, the cached snapshot as it is."""
    from huggingface_hub import hf_hub_download, snapshot_download

    quiet = partial(tqdm, disable=True)  # the listing's own bars
    with _one_line(repo, "its files"):
        if offline():
            return Path(snapshot_download(repo, allow_patterns=list(patterns), ignore_patterns=list(SUBFOLDERS)))
        listed = snapshot_download(repo, allow_patterns=list(patterns), ignore_patterns=list(SUBFOLDERS),
                                   dry_run=True, tqdm_class=quiet)  # fmt: skip
        for file in listed:
            if file.will_download:
                hf_hub_download(repo, file.filename, revision=file.commit_hash, tqdm_class=DownloadBar)
    if not listed:
        raise SpecchatError(f"{repo} has no file matching {', '.join(patterns)}")
    return Path(listed[0].local_path).parent  # top-level files: the snapshot's directory


def cached_checkpoint(repo: str) -> Path | None:
    """The cached snapshot of `repo` whose config and weights are all there, else None."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo, "config.json")
    if not isinstance(config, str):
        return None
    directory = Path(config).parent
    index = directory / INDEX
    if index.is_file():
        shards = set(json.loads(index.read_text())["weight_map"].values())
        return directory if all((directory / shard).is_file() for shard in shards) else None
    return directory if (directory / SINGLE).is_file() else None


@contextmanager
def _one_line(repo: str, what: str, elsewhere: str = "") -> Iterator[None]:
    """The hub's errors as one line: a gated repo, no such repo, no connection or no such file, any other."""
    from huggingface_hub.errors import DryRunError, GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    instead = f", or {elsewhere}" if elsewhere else ""
    try:
        yield
    except OSError as raised:
        listing = raised.__cause__ if isinstance(raised, DryRunError) else None  # why the repo could not be listed
        error = listing if isinstance(listing, RepositoryNotFoundError) else raised
        if isinstance(error, GatedRepoError):
            message = f"{repo} is gated: accept its terms on huggingface.co and log in (`hf auth login`){instead}"
        elif isinstance(error, RepositoryNotFoundError):
            message = f"no repo {repo} on the Hugging Face hub (a private one needs `hf auth login`)"
        elif isinstance(error, LocalEntryNotFoundError) and offline():
            message = f"{repo}: {what} not in the Hugging Face cache, and HF_HUB_OFFLINE is set{instead}"
        elif isinstance(error, (LocalEntryNotFoundError, DryRunError)):  # the hub says so of a file it lacks too
            message = f"cannot download {what} from {repo}: no connection, or no such file there{instead}"
        else:  # the hub's other HTTP errors, a full disk
            message = f"cannot download {what} from {repo}: {first_line(error)}"
        raise SpecchatError(message) from None
