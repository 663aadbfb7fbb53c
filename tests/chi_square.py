"""Pearson's chi-square goodness of fit for the sampling-exactness tests (scipy is not a dependency)."""

from __future__ import annotations

from collections import Counter

# chi-square critical values at p = 0.001 (upper tail) by degrees of freedom, from the standard table
# (`tests/test_rejection_sampling.py` checks them against torch's regularized incomplete gamma function)
CHI2_CRITICAL_P001 = {
    1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124,
    9: 27.877, 10: 29.588, 11: 31.264, 12: 32.909, 13: 34.528, 14: 36.123, 15: 37.697, 16: 39.252,
    17: 40.790, 18: 42.312, 19: 43.820, 20: 45.315, 21: 46.797, 22: 48.268, 23: 49.728, 24: 51.179,
    25: 52.620, 26: 54.052, 27: 55.476, 28: 56.892, 29: 58.301, 30: 59.703,
}  # fmt: skip
MIN_EXPECTED = 10  # cells are pooled until each is expected at least this many times


def chi_square(counts: Counter, exact: dict) -> tuple[float, int]:
    """Pearson's statistic of observed `counts` against the `exact` probabilities of the outcomes, and its
    degrees of freedom. Outcomes are taken likeliest first, and consecutive ones pooled into a cell until it
    is expected MIN_EXPECTED times (at most 31 cells: the rest pooled into the last); a short last cell joins
    the one before. Drawing an outcome of probability 0 fails outright."""
    total = sum(counts.values())
    impossible = {o: n for o, n in counts.items() if exact.get(o, 0) <= 0}
    assert not impossible, f"drew outcomes of probability 0: {impossible}"
    cells: list[list] = []  # [observed, expected] per cell
    for outcome in sorted(exact, key=exact.get, reverse=True):
        if not cells or (cells[-1][1] >= MIN_EXPECTED and len(cells) <= max(CHI2_CRITICAL_P001)):
            cells.append([0, 0.0])
        cells[-1][0] += counts[outcome]
        cells[-1][1] += exact[outcome] * total
    if len(cells) > 1 and cells[-1][1] < MIN_EXPECTED:
        observed, expected = cells.pop()
        cells[-1][0] += observed
        cells[-1][1] += expected
    assert len(cells) >= 2 and min(e for _, e in cells) >= MIN_EXPECTED  # the chi-square approximation holds
    return sum((o - e) ** 2 / e for o, e in cells), len(cells) - 1


def assert_fits(counts: Counter, exact: dict, what: str) -> None:
    statistic, df = chi_square(counts, exact)
    assert statistic < CHI2_CRITICAL_P001[df], f"{what}: chi2 = {statistic:.1f} with {df} dof"


def assert_rejected(counts: Counter, exact: dict, what: str) -> None:
    statistic, df = chi_square(counts, exact)
    assert statistic > CHI2_CRITICAL_P001[df], f"{what} was not caught: chi2 = {statistic:.1f} with {df} dof"
