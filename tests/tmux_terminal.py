"""A terminal for driving full-screen apps in tests and benchmarks: tmux send-keys in, capture-pane out."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid


class Terminal:
    """A detached tmux session on a private server (so it inherits this process's environment).

    Each terminal gets its own server: reusing one name raced with the previous terminal's server shutting
    down, and the new session silently never started.
    """

    def __init__(self, command: str, *, width: int, height: int):
        self.socket = f"specchat-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        started = self._tmux("new-session", "-d", "-s", "chat", "-x", str(width), "-y", str(height), command)
        if started.returncode != 0:
            raise RuntimeError(f"tmux could not start a session: {started.stderr.strip()}")

    def _tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=False, capture_output=True, text=True)

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

    def wait_for_quiet(self, timeout: float) -> None:
        """Until the program in the pane has turned the terminal's echo off (keys typed before that are echoed by
        the terminal itself, before any program could hold them)."""
        import termios

        tty = self._tmux("display-message", "-p", "-t", "chat", "#{pane_tty}").stdout.strip()
        fd = os.open(tty, os.O_RDONLY | os.O_NOCTTY)
        try:
            deadline = time.monotonic() + timeout
            while termios.tcgetattr(fd)[3] & termios.ECHO:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the terminal's echo was never turned off:\n{self.screen()}")
                time.sleep(0.01)
        finally:
            os.close(fd)

    def alive(self) -> bool:
        return self._tmux("has-session", "-t", "chat").returncode == 0

    def close(self) -> None:
        """End the session and everything started in it (an app may outlive tmux's hangup)."""
        pane = self._tmux("display-message", "-p", "-t", "chat", "#{pane_pid}").stdout.strip()
        self._tmux("kill-server")
        if pane:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pane), signal.SIGTERM)
