"""`specchat chat` for real: the default model in a tmux terminal, driven with send-keys, read with capture-pane."""

from __future__ import annotations

import shlex
import shutil
import sys
import time

import pytest
from tmux_terminal import Terminal

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/run installs it)"),
]


def chat_in_terminal(tmp_path, *args: str) -> Terminal:
    """`specchat chat ARGS` in a 100x30 terminal; its exit status lands in tmp_path / "exit" (the pane stays)."""
    # Textual prefers COLUMNS / LINES (which pytest's environment may carry) over the terminal's real size.
    command = (
        f"env -u COLUMNS -u LINES HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false {shlex.quote(sys.executable)} "
        f"-m specchat chat {shlex.join(args)}; echo exit=$? > {tmp_path / 'exit'}; sleep 60"
    )
    return Terminal(command, width=100, height=30)


def exit_status(tmp_path, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while not (tmp_path / "exit").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return (tmp_path / "exit").read_text().strip()


def test_chat_answers_on_the_default_model_with_the_overlay(tmp_path):
    terminal = chat_in_terminal(tmp_path, "--temperature", "0", "--max-new-tokens", "40")
    try:
        terminal.wait_for("ready on cpu", timeout=120)
        terminal.send("What is the capital of France?", "Enter")
        screen = terminal.wait_for("Paris", "tok/s · τ", timeout=180)  # the answer and its figures line
        for label in ("acceptance", "tau", "tokens/s", "speedup", "per depth", "context", "memory"):
            assert label in screen
        terminal.send("C-q")
        assert exit_status(tmp_path) == "exit=0"
    finally:
        terminal.close()


def test_a_message_typed_before_ready_is_kept_and_answered(tmp_path):
    """Typed at once, as a new user does, before the app has drawn anything (the terminal still turns Enter
    into a line feed then): the text is kept, `?` stays text (no help screen), Enter queues the message."""
    terminal = chat_in_terminal(tmp_path, "--temperature", "0", "--max-new-tokens", "24")
    try:
        terminal.wait_for_quiet(timeout=60)  # the process has started: seconds before the app draws
        terminal.send("What is the capital of France? Answer in one sentence.", "Enter")
        screen = terminal.wait_for("Paris", "ready on cpu in", timeout=180)
        assert "The overlay" not in screen  # the help screen never opened
        terminal.send("C-q")
        assert exit_status(tmp_path) == "exit=0"
        left = terminal.screen()  # what the app leaves on the terminal: neither the keys again nor triton's leaks
        assert "capital of France" not in left and "nanobind" not in left, left
    finally:
        terminal.close()


def test_a_model_that_cannot_load_is_shown_then_the_app_quits_with_an_error(tmp_path):
    terminal = chat_in_terminal(tmp_path, "--model", "nobody/not-a-model")
    try:
        terminal.wait_for("error: model 'nobody/not-a-model' is not available offline", timeout=60)
        assert exit_status(tmp_path) == "exit=1"
        assert terminal.wait_for("error: model", timeout=5)  # the one line on stderr, after the app left
    finally:
        terminal.close()
