"""A profile's GGUF file not on the machine is downloaded from the Hugging Face hub with its progress shown (the hub's
own bars are off with transformers'), and what stops a download (a gated repo, no such repo, no answer for the file)
is one line saying what to do. The hub is a local HTTP server answering as huggingface.co does (HF_ENDPOINT), in a
fresh process (the hub reads its endpoint when imported) with a home and caches of its own."""

from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import sys
import threading

import pytest

FILE = b"GGUF" + bytes(range(256)) * 2048  # half a megabyte
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


class Hub(http.server.BaseHTTPRequestHandler):
    """me/coder has tiny.gguf; me/gated is gated; no other repo exists; a file me/coder lacks gets a bare 404."""

    def answer(self) -> bool:
        repo = self.path.split("/resolve/")[0].strip("/")
        if repo == "me/gated":
            self.send_response(403)
            self.send_header("X-Error-Code", "GatedRepo")
        elif repo != "me/coder":
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
        elif not self.path.endswith("/resolve/main/tiny.gguf"):
            self.send_response(404)
        else:
            self.send_response(200)
            self.send_header("X-Repo-Commit", "0" * 40)
            self.send_header("ETag", f'"{hashlib.sha256(FILE).hexdigest()}"')
            self.send_header("Content-Length", str(len(FILE)))
            self.end_headers()
            return True
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def do_HEAD(self):
        self.answer()

    def do_GET(self):
        if self.answer():
            self.wfile.write(FILE)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def find(hub: str, home, *specs: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_ENDPOINT": hub, "HOME": str(home), "HF_HOME": str(home / "hf"),
                   "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "NO_PROXY": "127.0.0.1"}  # fmt: skip
    environment.pop("XDG_CACHE_HOME", None)
    return subprocess.run([sys.executable, "-c", FIND, *specs], capture_output=True, text=True, env=environment,
                          timeout=120)  # fmt: skip


def test_a_file_is_downloaded_with_its_progress_shown(hub, tmp_path):
    result = find(hub, tmp_path, "me/coder/tiny.gguf")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["found", "tiny.gguf", hashlib.sha256(FILE).hexdigest()]
    assert "100%" in result.stderr and "Traceback" not in result.stderr  # the bar, though the hub's are off


def test_what_stops_a_download_is_one_line(hub, tmp_path):
    result = find(hub, tmp_path, "me/gated/model.gguf", "me/none/model.gguf", "me/coder/other.gguf")
    assert result.returncode == 0, result.stderr
    gated, missing, no_file = result.stdout.splitlines()
    assert gated.startswith("error me/gated is gated: accept its terms") and "hf auth login" in gated
    assert missing == "error no repo me/none on the Hugging Face hub (a private one needs `hf auth login`)"
    assert no_file.startswith("error cannot download other.gguf from me/coder: no connection, or no such file there")
