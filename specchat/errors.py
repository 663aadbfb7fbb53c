"""The one exception type whose message is shown to users as is (one line, no traceback)."""


class SpecchatError(Exception):
    """A problem with the user's input or environment, explained in one line."""


def first_line(error: Exception) -> str:
    """An exception's message cut to its first line (its type's name when it has none)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def unexpected(error: Exception) -> str:
    """One line for an error that is not the user's (a bug, a broken file): its type and first line."""
    return f"{type(error).__name__}: {first_line(error)}"
