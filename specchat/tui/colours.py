"""The colour of each token origin: messages and the legend read this one table.

Origins come from the engine's events (docs/design.md, "Events, metrics and the UI"): TARGET for tokens
the target produced itself (shown plain), otherwise the kind of drafter whose proposal the target accepted.
"""

from __future__ import annotations

from rich.text import Text

from specchat.drafters import NAMES
from specchat.engine.events import ANSWERS, COPY, TARGET

# One colour per drafter in the registry (a drafter's kind is its registry name), in registry order; the n-gram
# lookup's copies of long passages a brighter green than its short matches, its guesses from the target's own
# answers a darker one.
PALETTE = ("bold green", "bold cyan", "bold magenta", "bold blue", "bold red")
DRAFT_STYLES = {**dict(zip([name for name in NAMES if name != "none"], PALETTE)), COPY: "bold bright_green",
                ANSWERS: "green"}
UNKNOWN_DRAFT_STYLE = "bold yellow"  # a drafter kind added later still stands out
LABELS = {TARGET: "target", "ngram": "n-gram", "tokenswift": "heads", COPY: "copy", ANSWERS: "answers"}


def origin_style(origin: str) -> str:
    return "" if origin == TARGET else DRAFT_STYLES.get(origin, UNKNOWN_DRAFT_STYLE)


def coloured(pieces: list[str], origins: list[str], text: Text | None = None) -> Text:
    """Each token's text in its origin's colour, appended to `text` when given."""
    text = Text() if text is None else text
    for piece, origin in zip(pieces, origins):
        text.append(piece, origin_style(origin))
    return text


def legend() -> Text:
    """'target' in plain text, then each drafter kind in its colour."""
    text = Text.assemble(("tokens: ", "dim"), f"{LABELS[TARGET]}  ")
    for origin, style in DRAFT_STYLES.items():
        text.append(f"■ {LABELS.get(origin, origin)}  ", style)
    return text
