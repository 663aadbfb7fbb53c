"""Whether a composite drafter's first part drafts the next step: whichever way committed more tokens per second.

A model drafter costs a forward every step; merged with n-gram lookup it pays only where enough of its tokens
are accepted, which depends on the model, the machine and the text. So the composite times its own steps in
each mode, both parts (`BOTH`) or the second alone (`SECOND`), from one commit to the next (the budget the
engine sized for the mode, drafting, verification), and counts the tokens each step committed. The mode is
chosen at each commit, before the engine sizes the next tree for it. Counts decay, so the choice follows the
text; the mode not chosen is tried every `probe_every` steps, so a change is noticed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BOTH, SECOND = "both", "second"


class ModeChoice:
    def __init__(self, *, decay: float = 0.97, probe_every: int = 16, clock: Callable[[], float] = time.perf_counter):
        self.decay = decay
        self.probe_every = probe_every
        self.clock = clock
        self.tokens = {BOTH: 0.0, SECOND: 0.0}  # decayed sums per mode
        self.seconds = {BOTH: 0.0, SECOND: 0.0}
        self.steps = 0
        self.mode = BOTH  # the next step's
        self._since: float | None = None  # when the step in flight began: the last commit

    def restart(self) -> None:
        """A new request: the time since the last commit was not a step."""
        self._since = None

    def committed(self, tokens: int) -> None:
        """A step of `self.mode` ended with `tokens` committed: count it, and choose the next step's mode."""
        now = self.clock()
        if self._since is not None:
            self.tokens[self.mode] = self.tokens[self.mode] * self.decay + tokens
            self.seconds[self.mode] = self.seconds[self.mode] * self.decay + (now - self._since)
        self._since = now
        self.steps += 1
        self.mode = self._best()
        if self.steps % self.probe_every == 0:
            self.mode = SECOND if self.mode == BOTH else BOTH

    def _best(self) -> str:
        untried = [mode for mode in (BOTH, SECOND) if self.seconds[mode] == 0]
        if untried:
            return untried[0]
        return max((BOTH, SECOND), key=lambda mode: self.tokens[mode] / self.seconds[mode])
