"""Keys typed before the chat app takes the terminal: the app reads them (a message typed at once is kept),
so the terminal must not echo them too, or they show again on the screen the app leaves behind at exit."""

from __future__ import annotations

import atexit
import sys


def hold_typed_keys() -> None:
    """Stop the terminal's echo now, from the first moment of `specchat chat`, and give it back at exit."""
    try:
        import termios
    except ImportError:  # not POSIX
        return
    try:
        if not sys.stdin.isatty():
            return
        fd = sys.stdin.fileno()
        saved, quiet = termios.tcgetattr(fd), termios.tcgetattr(fd)
        quiet[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
    except (termios.error, OSError, ValueError):  # no terminal to hold
        return
    atexit.register(termios.tcsetattr, fd, termios.TCSADRAIN, saved)
