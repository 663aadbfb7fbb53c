"""The one exception type whose message is shown to users as is (one line, no traceback)."""


class SpecchatError(Exception):
    """A problem with the user's input or environment, explained in one line."""
