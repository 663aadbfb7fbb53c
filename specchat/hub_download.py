"""Files from the Hugging Face hub, downloaded into its cache with their progress shown, and what stops a download
said in one line.

The hub's own progress bars are off while transformers' warnings are (`quiet_transformers`), and transformers
downloading a checkpoint itself shows nothing: a first `--model meta-llama/Llama-3.1-8B-Instruct` would sit silent
through 16 GB. So specchat downloads before anything loads, one file at a time, each with tqdm's bar
(`DownloadBar`), and hands the loaders a directory. A model repo often holds its weights twice (Llama 3.1's
`original/consolidated.00.pth`, Mistral's `consolidated.safetensors` beside the shards): a checkpoint's download
takes the files transformers reads, at the repo's top level, and its weights in one format (safetensors, else
PyTorch's), those its index names.

A machine with no connection need not say so (HF_HUB_OFFLINE): the hub's client retries a refused or unresolved
connection five times over 23 s before it gives up, and it cannot list a snapshot it has cached. So before it asks
the hub anything, specchat tries to open a connection to it (`reachable`, each time: a chat started offline may
download once the machine is back online): a cached drafter then loads as it would offline, and a file that must come
down is refused at once.
"""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from urllib.parse import urlparse

from tqdm import tqdm

from specchat.errors import SpecchatError, first_line
from specchat.first_use import progress_file

SHOW_AFTER = 1.0  # seconds before a bar shows: a file found in the cache at once draws nothing
CHECKPOINT_FILES = ("*.json", "*.jinja", "*.model", "merges.txt")  # configs and tokenizers
WEIGHTS = (("model.safetensors.index.json", "model.safetensors"),
           ("pytorch_model.bin.index.json", "pytorch_model.bin"))  # (index, single file), as transformers prefers them
SUBFOLDERS = ("*/*",)  # other formats of the weights, other runtimes' files
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
CONNECT_SECONDS = 3.0  # how long `reachable` waits for the hub to accept a connection


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


def reachable() -> bool:
    """Whether the hub's endpoint (HF_ENDPOINT, else huggingface.co) accepts a connection within CONNECT_SECONDS.
    Behind a proxy the proxy is what connects, so the hub counts as reachable and its client finds out."""
    from huggingface_hub import constants

    return endpoint_accepts(constants.ENDPOINT)


def endpoint_accepts(endpoint: str) -> bool:
    """Whether `endpoint` (a URL) accepts a TCP connection, or is reached through a proxy (assumed to)."""
    url = urlparse(endpoint)
    if url.hostname is None:
        return False
    if url.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(url.hostname):
        return True
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=CONNECT_SECONDS):  # fmt: skip
            return True
    except OSError:  # no such host, refused, no route, no answer in time
        return False


def unreachable_message(repo: str, instead: str = "") -> str:
    return f"cannot reach {repo} on the Hugging Face hub: no connection, or the hub is down{instead}"


def download_file(repo: str, name: str, *, elsewhere: str = "") -> Path:
    """`name` of the repo `repo`, from the hub's cache or downloaded into it. `elsewhere`: where else the user could
    put the file, told when it cannot be downloaded."""
    from huggingface_hub import hf_hub_download

    if not reachable():
        raise SpecchatError(unreachable_message(repo, f", or {elsewhere}" if elsewhere else ""))
    with _one_line(repo, name, elsewhere):
        return Path(hf_hub_download(repo, name, tqdm_class=DownloadBar))


def download_checkpoint(repo: str) -> Path:
    """The snapshot directory of the model repo `repo` (an owner/name id) holding what a load reads: configs,
    tokenizer files and the weights in the format transformers prefers (`WEIGHTS`; an index's shards). A complete
    one in the cache is used as it is, online or not."""
    cached = cached_checkpoint(repo)
    if cached is not None:
        return cached
    if offline():
        raise SpecchatError(f"model '{repo}' is not available offline; download it with `hf download {repo}` on a "
                            "connected machine (or unset HF_HUB_OFFLINE)")  # fmt: skip
    if not reachable():
        raise SpecchatError(unreachable_message(repo))
    listed = {file.filename: file for file in _listed(repo, (*CHECKPOINT_FILES, "*.safetensors", "*.bin"))}
    if "config.json" not in listed:
        raise SpecchatError(f"{repo} has no config.json: not a model transformers loads")
    small = [file for name, file in listed.items() if not name.endswith((".safetensors", ".bin"))]
    directory = _fetched(repo, small)
    weights = _weight_files(directory, lambda name: name in listed)
    if weights is None or not set(weights) <= set(listed):
        raise SpecchatError(f"{repo} holds no weights transformers reads (model.safetensors, pytorch_model.bin or "
                            "the shards their index names)")  # fmt: skip
    return _fetched(repo, [listed[name] for name in weights])


def download_snapshot(repo: str, patterns: tuple[str, ...]) -> Path:
    """The snapshot directory of `repo` with its top-level files matching `patterns`, those missing downloaded;
    offline or with the hub out of reach, the cached snapshot as it is."""
    from huggingface_hub import snapshot_download

    if offline() or not reachable():
        with _one_line(repo, "its files", cache_only=True):
            return Path(snapshot_download(repo, allow_patterns=list(patterns), ignore_patterns=list(SUBFOLDERS),
                                          local_files_only=True))  # fmt: skip
    listed = _listed(repo, patterns)
    if not listed:
        raise SpecchatError(f"{repo} has no file matching {', '.join(patterns)}")
    return _fetched(repo, listed)


def cached_checkpoint(repo: str) -> Path | None:
    """The cached snapshot of `repo` whose config and weights are all there, else None."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo, "config.json")
    if not isinstance(config, str):
        return None
    directory = Path(config).parent
    weights = _weight_files(directory, lambda name: (directory / name).is_file())
    return directory if weights and all((directory / name).is_file() for name in weights) else None


def _weight_files(directory: Path, exists: Callable[[str], bool]) -> list[str] | None:
    """The files of a checkpoint's weights in the first format of `WEIGHTS` it has, its index in `directory` or its
    single file where `exists`; None for none."""
    for index, single in WEIGHTS:
        if (directory / index).is_file():
            return sorted(set(json.loads((directory / index).read_text())["weight_map"].values()))
        if exists(single):
            return [single]
    return None


def _listed(repo: str, patterns: tuple[str, ...]) -> list:
    """The top-level files of `repo` matching `patterns`, as the hub lists them (with what the cache lacks)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import logging

    quiet = partial(tqdm, disable=True)  # the listing's own bars
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # not its warning for no match: the caller says what that means
    try:
        with _one_line(repo, "its files"):
            return snapshot_download(repo, allow_patterns=list(patterns), ignore_patterns=list(SUBFOLDERS),
                                     dry_run=True, tqdm_class=quiet)  # fmt: skip
    finally:
        logging.set_verbosity(verbosity)


def _fetched(repo: str, files: list) -> Path:
    """The snapshot directory holding `files` (listed by `_listed`), those it lacks downloaded, one after another,
    each with its bar, from the commit they were listed at; the default branch recorded as that commit, as the
    cache's lookups read it (a dry-run listing does not record it, nor a download of a commit)."""
    from huggingface_hub import constants, hf_hub_download

    for file in files:
        if not Path(file.local_path).exists():  # not in the snapshot (its blob may be cached: then it is linked)
            with _one_line(repo, file.filename):
                hf_hub_download(repo, file.filename, revision=file.commit_hash, tqdm_class=DownloadBar)
    snapshot = Path(files[0].local_path).parent  # top-level files: the snapshot's directory
    _record_ref(snapshot.parent.parent / "refs" / constants.DEFAULT_REVISION, files[0].commit_hash)
    return snapshot


def _record_ref(ref: Path, commit: str) -> None:
    """`ref` (the cache's file naming a branch's commit) holding `commit`, replaced whole: a reader never sees it
    half written."""
    if ref.is_file() and ref.read_text() == commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    written = ref.with_name(f".{ref.name}.{os.getpid()}")
    written.write_text(commit)
    os.replace(written, ref)


@contextmanager
def _one_line(repo: str, what: str, elsewhere: str = "", *, cache_only: bool = False) -> Iterator[None]:
    """The hub's errors as one line: a gated repo, no such repo, no connection or no such file, any other.
    `cache_only`: the caller looked in the cache alone (offline, or with the hub out of reach)."""
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
        elif isinstance(error, LocalEntryNotFoundError) and cache_only:  # the caller looked in the cache alone
            why = "HF_HUB_OFFLINE is set" if offline() else "the hub is out of reach"
            message = f"{repo}: {what} not in the Hugging Face cache, and {why}{instead}"
        elif isinstance(error, DryRunError):  # the repo could not be listed, found or not
            message = unreachable_message(repo, instead)
        elif isinstance(error, LocalEntryNotFoundError):  # the hub says so of a file it lacks too
            message = f"cannot download {what} from {repo}: no connection, or no such file there{instead}"
        else:  # the hub's other HTTP errors, a full disk
            message = f"cannot download {what} from {repo}: {first_line(error)}"
        raise SpecchatError(message) from None
