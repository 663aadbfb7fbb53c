"""The `specchat` executable's entry point, run before the command line's imports (~0.2 s): `specchat chat` stops the
terminal's echo here, so keys typed at once are held for the app, not echoed."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["chat"]:
        from specchat.tui.typeahead import hold_typed_keys

        hold_typed_keys()
    from specchat.cli import main as run_command

    run_command()
