"""The speedup's denominator: autoregressive steps sampled during answers, per context range."""

from __future__ import annotations

from specchat.tui.ar_baseline import FIRST_STEP, SAMPLES, ArBaseline


def test_samples_start_after_the_first_steps_and_stop_once_enough():
    baseline = ArBaseline()
    assert baseline.seconds is None
    assert not baseline.wants_sample(FIRST_STEP - 1, 100)
    for i in range(SAMPLES):
        assert baseline.wants_sample(FIRST_STEP + i, 100 + i)
        baseline.add(0.1 + 0.01 * i, 100 + i)
    assert not baseline.wants_sample(50, 120)  # enough samples for this context range
    assert baseline.seconds == 0.1 + 0.01 * (SAMPLES // 2)  # the median
    assert baseline.context == 100


def test_a_context_a_quarter_longer_or_shorter_starts_a_new_range():
    baseline = ArBaseline()
    for _ in range(SAMPLES):
        baseline.add(0.1, 1000)
    for context, fresh in ((1250, False), (1251, True), (800, False), (799, True)):
        assert baseline.wants_sample(FIRST_STEP, context) == fresh
    baseline.add(0.3, 2000)  # a new range: the old samples no longer count
    assert (baseline.samples, baseline.context, baseline.seconds) == ([0.3], 2000, 0.3)
