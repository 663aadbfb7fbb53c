"""The `specchat` command line: parses options, calls the engine, prints what comes back. One module per
command (group); `common.py` holds the app and what they share."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import warnings

import typer

try:  # typer >= 0.24 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:
    from click import exceptions as click_errors

from specchat.cli import bench, cache, chat, models, run, serve, train, write  # noqa: F401  (each registers its commands)
from specchat.cli.common import app
from specchat.errors import SpecchatError


def main() -> None:
    """The command line (entered through `specchat.launch`): user errors become one line on stderr and a non-zero
    exit, never a traceback; specchat's own warnings one line each."""
    warnings.showwarning = _one_line_warning
    _leave(command_status())


PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_python_warning = warnings.showwarning


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning of specchat's (raised from its own code) as `warning: ...`, as its errors read; others as Python
    shows them."""
    if not filename.startswith(PACKAGE):
        return _python_warning(message, category, filename, lineno, file, line)
    with contextlib.suppress(OSError):
        (file or sys.stderr).write(f"warning: {message}\n")


def command_status() -> int:
    """Run the command `sys.argv` names; its exit status, its output flushed. (`main` then exits; tests call
    this in their own process.)"""
    try:
        status = app(standalone_mode=False)  # typer turns Ctrl-C into a returned 130
        if status == 130:
            raise KeyboardInterrupt
        sys.stdout.flush()
        return status if isinstance(status, int) else 0
    except SpecchatError as error:
        typer.echo(f"error: {error}", err=True)
        return 1
    except click_errors.NoArgsIsHelpError:
        return 0  # the help is already printed
    except click_errors.UsageError as error:  # a bad flag or value: one line too, exit status 2 as click's
        typer.echo(f"error: {error.format_message()} (see --help)", err=True)
        return 2
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted", err=True)
        return 130
    except OSError as error:  # the output cannot be written (a full disk, a pipe closed elsewhere than `run`), a file
        where = str(error.filename) if error.filename else "cannot write the output"
        with contextlib.suppress(OSError):
            sys.stderr.write(f"error: {where}: {error.strerror or error}\n")
        os._exit(1)  # no flush of the broken stream at exit


def _leave(status: int) -> None:
    """Exit without the interpreter's finalization. With torch, transformers and a model loaded it spends
    1-2 s freeing objects one by one (measured after `specchat run`), and triton, which transformers imports
    even on a CPU, prints ~30 lines of nanobind "leaks" there. Exit handlers still run: the chat gives the
    terminal's settings back in one (tui/typeahead.py)."""
    atexit._run_exitfuncs()
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)
