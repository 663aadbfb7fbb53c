"""The `specchat` command line: parses options, calls the engine, prints what comes back. One module per
command (group); `common.py` holds the app and what they share."""

from __future__ import annotations

import contextlib
import os
import sys

import typer

try:  # typer >= 0.24 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:
    from click import exceptions as click_errors

from specchat.cli import bench, chat, models, run, serve, train, write  # noqa: F401  (each registers its commands)
from specchat.cli.common import app
from specchat.errors import SpecchatError


def main() -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit, never a traceback."""
    if sys.argv[1:2] == ["chat"]:
        from specchat.tui.typeahead import hold_typed_keys

        hold_typed_keys()
    try:
        status = app(standalone_mode=False)  # typer turns Ctrl-C into a returned 130
        if status == 130:
            raise KeyboardInterrupt
        if isinstance(status, int) and status:
            sys.exit(status)
    except SpecchatError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(1)
    except click_errors.NoArgsIsHelpError:
        pass  # the help is already printed
    except click_errors.UsageError as error:  # a bad flag or value: one line too, exit status 2 as click's
        typer.echo(f"error: {error.format_message()} (see --help)", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except OSError as error:  # the output cannot be written: a full disk, a closed pipe elsewhere than `run`
        with contextlib.suppress(OSError):
            sys.stderr.write(f"error: cannot write the output: {error.strerror or error}\n")
        os._exit(1)  # no flush of the broken stream at exit
