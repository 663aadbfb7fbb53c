"""How often a streaming answer redraws: as often as a fixed share of the UI thread's time allows.

On a machine with few cores the engine's threads and the UI share them: every millisecond the UI thread
spends (Textual's layout and compositing are Python) is a millisecond the engine's thread team waits. With
two cores and two engine threads the decode slows by about the UI's share of one core. So a streaming answer
redraws only once the UI thread's CPU time since the last redraw is within `share` of the time elapsed: a
machine that renders a frame in 2 ms redraws at the timer's rate, one that needs 15 ms twice a second.
"""

from __future__ import annotations

import time

UI_SHARE = 0.03  # of one core, for the UI thread while an answer streams


class RedrawBudget:
    def __init__(self, share: float = UI_SHARE):
        self.share = share
        self._wall = time.monotonic()
        self._cpu = time.thread_time()

    def allows(self) -> bool:
        """Whether to redraw now (call on the UI thread: its CPU time is the one counted); a yes starts the
        next period."""
        wall, cpu = time.monotonic(), time.thread_time()
        if cpu - self._cpu > self.share * (wall - self._wall):
            return False
        self._wall, self._cpu = wall, cpu
        return True
