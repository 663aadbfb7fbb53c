"""The streaming answer's redraw budget: the UI thread's CPU time since the last redraw against wall time."""

from __future__ import annotations

import time

from specchat.tui.redraw_budget import RedrawBudget


def burn(seconds: float) -> None:
    """Spend `seconds` of this thread's CPU time."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def test_a_redraw_waits_until_the_cpu_spent_is_within_the_share_of_the_time_since_the_last():
    budget = RedrawBudget(share=0.1)
    time.sleep(0.02)
    assert budget.allows()  # idle since it began
    burn(0.03)
    assert not budget.allows()  # 30 ms of CPU in well under 300 ms (even with other processes on the cores)
    time.sleep(0.3)
    assert budget.allows()  # 30 ms of CPU in over 300 ms


def test_a_yes_starts_a_new_period():
    budget = RedrawBudget(share=0.1)
    burn(0.03)
    time.sleep(0.3)
    assert budget.allows()
    burn(0.03)
    assert not budget.allows()  # the 30 ms before the yes no longer count, these 30 ms do
