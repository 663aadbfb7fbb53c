"""`specchat chat` for real: the default model in a tmux terminal, driven with send-keys, read with capture-pane."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/run installs it)"),
]


class Terminal:
    """A detached tmux session on a private server (so it inherits this process's environment)."""

    def __init__(self, command: str, *, width: int, height: int):
        self.socket = f"specchat-test-{os.getpid()}"
        self._tmux("new-session", "-d", "-s", "chat", "-x", str(width), "-y", str(height), command)

    def _tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "chat").stdout

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "chat", *keys)

    def wait_for(self, *needles: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(needle in screen for needle in needles):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"never saw {needles} on the screen:\n{self.screen()}")

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", "chat").returncode == 0

    def close(self) -> None:
        self._tmux("kill-server")


def test_chat_answers_on_the_default_model_with_the_overlay(tmp_path):
    # Textual prefers COLUMNS / LINES (which pytest's environment may carry) over the terminal's real size.
    command = (
        f"env -u COLUMNS -u LINES HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false {shlex.quote(sys.executable)} -m specchat chat "
        f"--temperature 0 --max-new-tokens 40; echo exit=$? > {tmp_path / 'exit'}"
    )
    terminal = Terminal(command, width=100, height=30)
    try:
        terminal.wait_for("ready on cpu", timeout=120)
        terminal.send("What is the capital of France?", "Enter")
        screen = terminal.wait_for("Paris", "tok/s · τ", timeout=180)  # the answer and its figures line
        for label in ("acceptance", "tau", "tokens/s", "speedup", "per depth", "context", "memory"):
            assert label in screen
        terminal.send("C-q")
        deadline = time.monotonic() + 20
        while not (tmp_path / "exit").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (tmp_path / "exit").read_text().strip() == "exit=0"
    finally:
        terminal.close()
