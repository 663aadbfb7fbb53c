"""docs/cli.md: every command and its options as tables, written from the command line's own definitions, so the
reference cannot drift from `--help` (`python -m specchat.cli.reference > docs/cli.md`; a test holds the file
to it)."""

from __future__ import annotations

import typer

from specchat.cli import app

INTRO = """# Command reference

Every `specchat` command and its options, written from the command line's own definitions (`python -m
specchat.cli.reference > docs/cli.md`); `specchat COMMAND --help` says the same. What the commands do, and
why: the [README](../README.md); the server's API: [serve.md](serve.md)."""


def markdown() -> str:
    lines = [INTRO, ""]
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        _describe(lines, f"specchat {name}", command)
    return "\n".join(lines).rstrip() + "\n"


def _describe(lines: list[str], path: str, command) -> None:
    group = hasattr(command, "commands")
    if not group or command.invoke_without_command:  # a group that runs by itself too (`specchat bench`)
        _command(lines, path, command)
    for name, sub in command.commands.items() if group else ():
        _describe(lines, f"{path} {name}", sub)


def _options(command) -> list:
    return [param for param in command.params if param.param_type_name == "option" and param.name != "help"]


def _command(lines: list[str], path: str, command) -> None:
    arguments = [param for param in command.params if param.param_type_name == "argument"]
    options = _options(command)
    usage = " ".join([path, *(param.name.upper() for param in arguments), "[OPTIONS]" if options else ""]).strip()
    lines += [f"## `{path}`", "", (command.help or "").strip().split("\n\n")[0].replace("\n", " "), "",
              f"`{usage}`", ""]  # fmt: skip
    for param in arguments:
        lines += [f"- `{param.name.upper()}`: {_text(param.help)}"]
    if arguments:
        lines += [""]
    if options:
        lines += ["| option | default | what |", "|---|---|---|"]
        for param in options:
            names = ", ".join(f"`{name}`" for name in [*param.opts, *param.secondary_opts])
            lines += [f"| {names} | {_default(param)} | {_text(param.help)} |"]
        lines += [""]


def _default(param) -> str:
    if param.required:
        return "required"
    if param.default is None or param.default is False or param.default == () or param.show_default is False:
        return ""
    return f"`{param.default}`"


def _text(help_text: str | None) -> str:
    return " ".join((help_text or "").split()).replace("|", "\\|")


if __name__ == "__main__":
    print(markdown(), end="")
