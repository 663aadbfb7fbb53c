"""The seconds of a decode step's phases as the device ran them: what the adaptive budget prices.

A step waits for the device once, at the acceptance, so on a CUDA device the host's clock sees only when each
phase's work was queued: a queued draft "ends" before the device has run it. The clock therefore records a CUDA
event at each mark, in stream order, and reads the intervals between them after the step's read, when the device
has passed every mark. On a CPU each call runs to its end, and the host's clock is the device's.
"""

from __future__ import annotations

import time

import torch


class StepClock:
    def __init__(self, device: torch.device):
        """Starts the first phase now."""
        self.cuda = torch.device(device).type == "cuda"
        self.host: list[float] = []
        self.events: list[torch.cuda.Event] = []
        self.mark()

    def mark(self) -> None:
        """The phase queued so far ends here; the next starts."""
        self.host.append(time.perf_counter())
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)

    def restart(self) -> None:
        """The phase under way starts again now: its work was dropped and is queued anew."""
        self.host.pop()
        if self.cuda:
            self.events.pop()
        self.mark()

    def host_seconds(self) -> float:
        """Seconds from the first mark to the last on the host's clock: the device's, where the host has waited
        for the work in between (a drafter that read its tree)."""
        return self.host[-1] - self.host[0]

    def seconds(self) -> list[float]:
        """Each phase's seconds, between consecutive marks: call once the device has passed the last mark (the
        host has read a result queued after it)."""
        if not self.cuda:
            return [end - start for start, end in zip(self.host, self.host[1:])]
        return [start.elapsed_time(end) / 1e3 for start, end in zip(self.events, self.events[1:])]
