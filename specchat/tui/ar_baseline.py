"""The denominator of the overlay's speedup: one autoregressive step, timed during answers.

Samples are taken between speculative steps of a streaming answer, so they run under the same conditions
(the UI drawing, the other threads) as the steps they are compared with; a sample taken while the app is
idle or busy mounting a message would flatter one side. The median of a few samples per context range
is kept, and the range starts over once the context is a quarter longer or shorter (attention cost follows
it: a longer answer, or a new conversation).
"""

from __future__ import annotations

import statistics

SAMPLES = 5  # timed autoregressive steps per context range
FIRST_STEP = 2  # decode steps an answer runs before sampling starts (the UI has settled by then)
GROWTH = 1.25  # a context this much longer (or shorter) than the range's start begins a new range


class ArBaseline:
    def __init__(self):
        self.samples: list[float] = []  # seconds of one autoregressive step, this range
        self.context = 0  # committed tokens when this range's first sample was taken

    def wants_sample(self, step: int, context: int) -> bool:
        """Whether to time an autoregressive step after decode step `step` of an answer, at `context`."""
        return step >= FIRST_STEP and (len(self.samples) < SAMPLES or not self._in_range(context))

    def add(self, seconds: float, context: int) -> None:
        if not self._in_range(context):
            self.samples, self.context = [], context
        self.samples.append(seconds)

    def _in_range(self, context: int) -> bool:
        return self.context / GROWTH <= context <= self.context * GROWTH

    @property
    def seconds(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    def seconds_at(self, context: int) -> float | None:
        """The step time at `context`, when this range covers it (a speedup against another context would
        compare unlike steps)."""
        return self.seconds if self._in_range(context) else None
