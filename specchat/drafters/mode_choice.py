"""Whether a composite drafter's first part drafts this step: whichever way committed more tokens per second.

A model drafter costs a forward every step; merged with n-gram lookup it pays only where enough of its tokens
are accepted, which depends on the model, the machine and the text. So the composite times its own steps in
each mode, both parts (`BOTH`) or the second alone (`SECOND`), from one proposal to the next (drafting,
verification, commit), and counts the tokens each step committed. Counts decay, so the choice follows the
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
        self._pending: tuple[str, float] | None = None  # the mode of the step in flight, and when it began
        self._commits: list[int] = []  # tokens of each commit since the last proposal

    def restart(self) -> None:
        """A new request: the time since the last proposal was not one step."""
        self._pending = None

    def committed(self, tokens: int) -> None:
        self._commits.append(tokens)

    def next_mode(self) -> str:
        """The mode to propose in now. Closes the step in flight, counted only if exactly one commit followed
        it: steps the engine decoded without drafting, or a new request, are not that step's."""
        now = self.clock()
        if self._pending is not None and len(self._commits) == 1:
            mode, began = self._pending
            self.tokens[mode] = self.tokens[mode] * self.decay + self._commits[0]
            self.seconds[mode] = self.seconds[mode] * self.decay + (now - began)
        self._commits = []
        self.steps += 1
        mode = self._best()
        if self.steps % self.probe_every == 0:
            mode = SECOND if mode == BOTH else BOTH
        self._pending = mode, now
        return mode

    def _best(self) -> str:
        untried = [mode for mode in (BOTH, SECOND) if self.seconds[mode] == 0]
        if untried:
            return untried[0]
        return max((BOTH, SECOND), key=lambda mode: self.tokens[mode] / self.seconds[mode])
