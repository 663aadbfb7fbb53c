"""What specchat downloads from the Hugging Face hub shows its progress (the hub's own bars are off with transformers'),
and what stops a download (a gated repo, no such repo, no answer for a file) is one line saying what to do. A profile's
GGUF file comes down alone; a model repo comes down as its configs, tokenizer and the weights its index names, not the
other formats beside them; once complete in the cache it loads without the hub, online or not.

The hub is a local HTTP server answering as huggingface.co does (HF_ENDPOINT), reached from a fresh process (the hub
reads its endpoint when imported) with a home and caches of its own."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import torch
from conftest import tiny_model

from specchat.disk_cache import cache_dir
from specchat.first_use import tell
from specchat.hub_download import SHOW_AFTER, DownloadBar, endpoint_accepts, reachable
from specchat.loading import load_model

GGUF = b"GGUF" + bytes(range(256)) * 2048  # half a megabyte
SLOW_PAST = 1 << 18  # bytes
COMMIT = "0123456789abcdef0123456789abcdef01234567"
DECOYS = {"original/consolidated.00.pth": b"0" * 4096, "consolidated.safetensors": b"1" * 4096,
          "pytorch_model.bin": b"2" * 4096, "README.md": b"# a model\n"}  # fmt: skip
FIND = """
import hashlib, sys
from specchat.errors import SpecchatError
from specchat.loading import find_gguf
for spec in sys.argv[1:]:
    try:
        path = find_gguf(spec)
        print("found", path.name, hashlib.sha256(path.read_bytes()).hexdigest())
    except SpecchatError as error:
        print("error", error)
"""
FETCH = """
import sys
from specchat.errors import SpecchatError
from specchat.hub_download import download_checkpoint
try:
    print(download_checkpoint(sys.argv[1]))
except SpecchatError as error:
    sys.exit(f"error {error}")
"""
LOAD = """
import sys, torch
from specchat.errors import SpecchatError
from specchat.loading import load_model
try:
    loaded = load_model(sys.argv[1], dtype="float32", device="cpu")
except SpecchatError as error:
    sys.exit(f"error {error}")
print(loaded.model.name_or_path)
torch.save(loaded.model(torch.arange(3, 40)[None]).logits, sys.argv[2])
"""

FETCH_DRAFTER = """
import sys
from specchat.drafters import fetch_published
from specchat.errors import SpecchatError
try:
    print("found", fetch_published(sys.argv[1]))
except SpecchatError as error:
    print("error", error)
"""

CHAT_ANSWER = """
import sys
from specchat.engine.sampling_config import SamplingConfig
from specchat.loading import load_model
from specchat.tui.answer_stream import AnswerStream
from specchat.tui.session import ChatSession, ChatSettings
session = ChatSession(load_model(None, device="cpu"), SamplingConfig(), ChatSettings(max_new_tokens=8))
session.choose_drafter("model:" + sys.argv[1])
answer = AnswerStream()
answer.produce(session, session.begin_turn("Hello")[2])
for item in answer.drain():
    print(type(item).__name__, getattr(item, "line", ""))
"""


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub(http.server.BaseHTTPRequestHandler):
    """The repos of `server.repos` (name -> {path: bytes}); me/gated is gated; no other repo exists; a file a repo
    lacks gets a bare 404. `server.fetched` lists the files sent (GET); a large one is sent slowly."""

    def route(self) -> tuple[str, int, dict[str, str], bytes]:
        """(what, status, headers, body) of this request."""
        path = unquote(urlparse(self.path).path)
        if path.startswith("/api/models/"):
            repo, _, rest = path.removeprefix("/api/models/").partition("/revision/")
            if not rest:
                repo, _, rest = path.removeprefix("/api/models/").partition("/tree/")
                return self.repo(repo, listing=True)
            return self.repo(repo, listing=False)
        repo, _, rest = path.strip("/").partition("/resolve/")
        status, headers, body = self.repo(repo, listing=None)[1:]
        if status != 200:
            return "", status, headers, body
        name = rest.partition("/")[2]
        data = self.server.repos[repo].get(name)
        if data is None:
            return "", 404, {}, b""
        return name, 200, {"X-Repo-Commit": COMMIT, "ETag": f'"{blob_id(data)}"',
                           "Content-Disposition": f'inline; filename="{name.rpartition("/")[2]}";'}, data

    def repo(self, repo: str, listing: bool | None) -> tuple[str, int, dict[str, str], bytes]:
        if repo == "me/gated":
            return "", 403, {"X-Error-Code": "GatedRepo"}, b""
        if repo not in self.server.repos:
            return "", 404, {"X-Error-Code": "RepoNotFound"}, b""
        files = self.server.repos[repo]
        if listing is None:
            return "", 200, {}, b""
        if listing:
            body = [{"type": "file", "oid": blob_id(data), "size": len(data), "path": name}
                    for name, data in files.items()]  # fmt: skip
        else:
            body = {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": name} for name in files]}
        return "", 200, {"Content-Type": "application/json"}, json.dumps(body).encode()

    def answer(self, send_body: bool) -> None:
        name, status, headers, body = self.route()
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        if send_body:
            parts = 10 if len(body) > SLOW_PAST else 1  # a large file takes as long as a bar waits to show
            for part in range(parts):
                time.sleep(SHOW_AFTER * 1.3 / parts if parts > 1 else 0)
                self.wfile.write(body[part * len(body) // parts: (part + 1) * len(body) // parts])
            if name:
                self.server.fetched.append(name)

    def do_HEAD(self):
        self.answer(send_body=False)

    def do_GET(self):
        self.answer(send_body=True)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, hf_tokenizer) -> Path:
    """A tiny Llama checkpoint in bf16, its weights in shards an index names."""
    directory = tmp_path_factory.mktemp("llama")
    tiny_model("llama").to(torch.bfloat16).save_pretrained(directory, max_shard_size="5MB")
    hf_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def pytorch_checkpoint(tmp_path_factory, hf_tokenizer) -> Path:
    """A tiny Llama checkpoint as repos of 2023 hold one: its weights in PyTorch's pytorch_model.bin."""
    directory = tmp_path_factory.mktemp("pytorch")
    model = tiny_model("llama", seed=1)
    model.config.save_pretrained(directory)
    torch.save({name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items()},
               directory / "pytorch_model.bin")  # fmt: skip
    hf_tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def hub(checkpoint, pytorch_checkpoint):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    server.fetched = []
    files = {path.name: path.read_bytes() for path in checkpoint.iterdir()}
    old = {path.name: path.read_bytes() for path in pytorch_checkpoint.iterdir()}
    server.repos = {"me/coder": {"tiny.gguf": GGUF}, "me/llama": {**files, **DECOYS}, "me/old": old,
                    "me/empty": {"README.md": b"# nothing yet\n"}}  # fmt: skip
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def run(hub, home: Path, code: str, *args: str, offline: bool = False, port: int | None = None):
    """`code` run with `args` in a fresh process whose hub is `hub` (or whatever listens on `port`), its home and
    hub cache its own, specchat's cache and the decoder's builds this process's."""
    port = port or hub.server_address[1]
    builds = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    environment = {**os.environ, "SPECCHAT_CACHE": str(cache_dir()), "TORCH_EXTENSIONS_DIR": builds,
                   "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HOME": str(home),
                   "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1" if offline else "0",
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1", "NO_PROXY": "127.0.0.1"}  # fmt: skip
    environment.pop("XDG_CACHE_HOME", None)
    environment.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=environment,
                          timeout=300)  # fmt: skip


def test_a_gguf_file_is_downloaded_with_its_progress_shown(hub, tmp_path):
    result = run(hub, tmp_path, FIND, "me/coder/tiny.gguf")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["found", "tiny.gguf", hashlib.sha256(GGUF).hexdigest()]
    assert "100%" in result.stderr and "Traceback" not in result.stderr  # the bar, though the hub's are off


def test_what_stops_a_download_is_one_line(hub, tmp_path):
    result = run(hub, tmp_path, FIND, "me/gated/model.gguf", "me/none/model.gguf", "me/coder/other.gguf")
    assert result.returncode == 0, result.stderr
    gated, missing, no_file = result.stdout.splitlines()
    assert gated.startswith("error me/gated is gated: accept its terms") and "hf auth login" in gated
    assert missing == "error no repo me/none on the Hugging Face hub (a private one needs `hf auth login`)"
    assert no_file.startswith("error cannot download other.gguf from me/coder: no connection, or no such file there")
    loading = run(hub, tmp_path, LOAD, "me/gated", str(tmp_path / "logits.pt"))  # as a load says it
    assert loading.returncode == 1, loading.stderr
    assert loading.stderr.startswith("error me/gated is gated: accept its terms"), loading.stderr
    fetching = run(hub, tmp_path, FETCH, "me/none")  # the rest as the fetch a load makes (without its imports)
    assert fetching.returncode == 1 and fetching.stderr.startswith("error no repo me/none"), fetching.stderr
    with socket.socket() as closed:  # a port nothing listens on once closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    unreachable = run(hub, tmp_path, FETCH, "me/llama", port=port)
    assert unreachable.returncode == 1, unreachable.stderr
    assert unreachable.stderr == ("error cannot reach me/llama on the Hugging Face hub: no connection, or the hub is "
                                  "down\n")  # fmt: skip
    gguf = run(hub, tmp_path, FIND, "me/coder/tiny.gguf", port=port)  # at once: not the hub client's five retries
    assert gguf.stdout == ("error cannot reach me/coder on the Hugging Face hub: no connection, or the hub is down, or "
                           "put tiny.gguf in ~/.cache/specchat/gguf\n")  # fmt: skip
    assert "Retry" not in gguf.stderr, gguf.stderr
    drafter = run(hub, tmp_path, FETCH_DRAFTER, "me/llama", offline=True)
    assert drafter.stdout == "error me/llama: its files not in the Hugging Face cache, and HF_HUB_OFFLINE is set\n"


def test_a_model_repo_comes_down_as_what_loads_it_then_loads_from_the_cache(hub, checkpoint, tmp_path):
    """Its configs, tokenizer and sharded weights, shown as they come; none of the other formats beside them. Loaded,
    it computes what the checkpoint does; loaded again, online or offline, nothing is fetched and nothing shown; a
    file missing (a download cut short) is fetched alone."""
    logits = tmp_path / "logits.pt"
    hub.fetched.clear()
    first = run(hub, tmp_path, LOAD, "me/llama", str(logits))
    assert first.returncode == 0, first.stderr
    snapshot = Path(first.stdout.strip())
    assert snapshot.parts[-2:] == ("snapshots", COMMIT)
    assert sorted(hub.fetched) == sorted(path.name for path in checkpoint.iterdir())
    assert sorted(path.name for path in snapshot.iterdir()) == sorted(hub.fetched)
    shards = set(json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"].values())
    slow = [path.name for path in checkpoint.iterdir() if path.stat().st_size > SLOW_PAST]
    assert len(shards) > 1 and len(shards & set(slow)) > 1
    for name in slow:  # each bar ran to its end
        assert f"\n{name}: 100%" in first.stderr, first.stderr
    expected = load_model(str(checkpoint), dtype="float32", device="cpu").model(torch.arange(3, 40)[None]).logits
    assert torch.equal(torch.load(logits), expected)

    hub.fetched.clear()
    for offline in (False, True):
        again = run(hub, tmp_path, LOAD, "me/llama", str(logits), offline=offline)
        assert again.returncode == 0 and again.stdout.strip() == str(snapshot), again.stderr
        assert "%" not in again.stderr and torch.equal(torch.load(logits), expected)
    assert hub.fetched == []

    shard = sorted(shards)[0]
    for cut_short in (False, True):  # the file missing from the snapshot, its data kept or a download cut short
        blob = (snapshot / shard).resolve()
        (snapshot / shard).unlink()
        if cut_short:
            blob.unlink()
        offline = run(hub, tmp_path, FETCH, "me/llama", offline=True)  # what a load fetches, without the load's imports
        assert offline.returncode == 1 and "is not available offline" in offline.stderr
        resumed = run(hub, tmp_path, FETCH, "me/llama")
        assert resumed.returncode == 0 and hub.fetched == ([shard] if cut_short else []), resumed.stderr
        assert (snapshot / shard).read_bytes() == (checkpoint / shard).read_bytes()


def test_a_cached_drafter_loads_with_no_connection_and_no_hf_hub_offline(hub, tmp_path):
    """A drafter's snapshot once fetched loads from the cache when the hub cannot be reached, as it does with
    HF_HUB_OFFLINE set; one never fetched is refused in one line saying so."""
    fetched = run(hub, tmp_path, FETCH_DRAFTER, "me/llama")
    assert fetched.stdout.startswith("found "), fetched.stdout + fetched.stderr
    with socket.socket() as closed:  # a port nothing listens on once closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    again = run(hub, tmp_path, FETCH_DRAFTER, "me/llama", port=port)
    assert again.stdout == fetched.stdout, again.stderr
    never = run(hub, tmp_path, FETCH_DRAFTER, "me/old", port=port)
    assert never.stdout == "error me/old: its files not in the Hugging Face cache, and the hub is out of reach\n"


def test_the_hub_is_reachable_where_its_endpoint_accepts_a_connection_or_a_proxy_reaches_it(monkeypatch):
    from huggingface_hub import constants

    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # this machine's own, if any
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
        assert endpoint_accepts(constants.ENDPOINT) and reachable()
    assert not endpoint_accepts(f"http://127.0.0.1:{port}") and not reachable()  # refused: asked again each time
    assert not endpoint_accepts("https://no-such-host.invalid")  # no such host
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{port}")
    assert endpoint_accepts("https://no-such-host.invalid")  # the proxy connects, not this machine


def test_a_repo_of_pytorch_weights_loads_and_one_without_weights_is_refused(hub, pytorch_checkpoint, tmp_path):
    logits = tmp_path / "logits.pt"
    loaded = run(hub, tmp_path, LOAD, "me/old", str(logits))
    assert loaded.returncode == 0, loaded.stderr
    expected = load_model(str(pytorch_checkpoint), dtype="float32", device="cpu").model(torch.arange(3, 40)[None])
    assert torch.equal(torch.load(logits), expected.logits)
    empty = run(hub, tmp_path, LOAD, "me/empty", str(logits))
    assert empty.returncode == 1
    assert empty.stderr == "error me/empty has no config.json: not a model transformers loads\n"


def test_a_drafter_chosen_in_the_chat_shows_its_download_while_the_answer_waits(hub, tmp_path):
    """`/drafter model:REPO` loads at the next answer, in the generation worker: the download's bars reach the chat as
    the answer's status lines, not a hidden stderr, and the answer follows."""
    result = run(hub, tmp_path, CHAT_ANSWER, "me/llama")
    assert result.returncode == 0, result.stderr
    kinds = [line.split()[0] for line in result.stdout.splitlines()]
    assert kinds[-1] == "AnswerEnd" and "Update" in kinds, result.stdout
    statuses = [line for line in result.stdout.splitlines() if line.startswith("Status ")]
    assert any("model-00001-of-00003.safetensors: 100%" in line for line in statuses), result.stdout
    assert kinds.index("Status") < kinds.index("Update") and "%" not in result.stderr


def test_a_bar_draws_on_the_chat_loading_line_while_told(tmp_path):
    lines = []
    tell(lines.append)
    try:
        with DownloadBar(total=2**20, desc="model.safetensors", unit="B", unit_scale=True, delay=0,
                         mininterval=0) as bar:  # fmt: skip
            bar.update(2**19)
    finally:
        tell(None)
    assert any(line.startswith("model.safetensors:  50%|") and "524k/1.05M" in line for line in lines), lines
    assert all("\r" not in line and "\n" not in line for line in lines)
