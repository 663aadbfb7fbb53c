"""A step's phases are timed between marks: on a CPU by the host's clock (`test_cuda.py` times them on a GPU,
where the host's clock sees only what was queued)."""

from __future__ import annotations

import time

import torch

from specchat.engine.step_clock import StepClock


def test_each_phase_is_the_time_between_its_marks():
    clock = StepClock(torch.device("cpu"))
    time.sleep(0.2)
    clock.mark()
    clock.mark()
    time.sleep(0.1)
    clock.mark()
    first, second, third = clock.seconds()
    assert first >= 0.2 and 0 <= second < 0.1 and third >= 0.1  # wide of a loaded machine's jitter
    assert abs(clock.host_seconds() - (first + second + third)) < 1e-9
