"""Drafters propose token trees for the target to verify; one file each, behind one protocol."""

from __future__ import annotations

from specchat.drafters.base import Drafter

# Drafters this build can run; "none" is plain autoregressive decoding.
AVAILABLE = ("none", "ngram")
DEFAULT_DRAFTER = "ngram"  # the best drafter every model has: the default of run, chat and bench


def make_drafter(name: str) -> Drafter | None:
    if name == "none":
        return None
    if name == "ngram":
        from specchat.drafters.ngram import NgramDrafter

        return NgramDrafter()
    raise ValueError(f"unknown drafter '{name}'")
