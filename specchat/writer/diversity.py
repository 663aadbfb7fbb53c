"""Distinct-n: the share of a text's n-grams that are different, the diversity measure TokenSwift reports
(a model that loops scores near 0; its paper: 0.12 on average without the contextual penalty, 0.69 with
theta = 1.2)."""

from __future__ import annotations


def distinct_n(ids: list[int], n: int) -> float:
    """Distinct n-grams / all n-grams of `ids` (0 when it has none)."""
    grams = len(ids) - n + 1
    if grams <= 0:
        return 0.0
    return len(set(zip(*(ids[i:] for i in range(n))))) / grams
