"""docs/cli.md is what the command line defines today: regenerate it with `python -m specchat.cli.reference >
docs/cli.md` after changing a command or an option."""

from pathlib import Path

from specchat.cli.reference import markdown


def test_the_command_reference_is_current():
    written = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    assert written == markdown(), "docs/cli.md is stale: python -m specchat.cli.reference > docs/cli.md"


def test_every_option_says_what_it_does():
    assert "|  |\n" not in markdown()
