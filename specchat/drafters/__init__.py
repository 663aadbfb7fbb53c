"""Drafters propose token trees for the target to verify; one file each, behind one protocol."""

from __future__ import annotations

from specchat.drafters.base import Drafter
from specchat.drafters.ngram import NgramDrafter

# Drafters this build can run; "none" is plain autoregressive decoding.
AVAILABLE = ("none", "ngram")


def make_drafter(name: str) -> Drafter | None:
    if name == "none":
        return None
    if name == "ngram":
        return NgramDrafter()
    raise ValueError(f"unknown drafter '{name}'")
