"""Whether a composite drafter's first part drafts the next step: whichever way committed more tokens per second.

A model drafter costs a forward every step; merged with n-gram lookup it pays only where enough of its tokens
are accepted, which depends on the model, the machine and the text. So the composite times its own steps in
each mode, both parts (`BOTH`) or the second alone (`SECOND`), from one commit to the next (the budget the
engine sized for the mode, drafting, verification), and counts the tokens each step committed. The mode is
chosen at each commit, before the engine sizes the next tree for it. Counts decay, so the choice follows the
text; the mode not chosen is tried now and then (a probe), so a change is noticed.

What the second part alone would have committed is known on every step, not only on its own: its tree was
drafted within the whole budget either way, and it would have committed the tokens its tree matched and the
target's next (`second_alone`). So the second alone's tokens are counted on every step and its own steps only
time it, every `probe_second_every` steps while both parts draft (both parts are tried every `probe_every`
steps while the second drafts alone: the first's tokens are known only where it drafts). Counted on its own
steps alone, one lucky probe (a copy found in a chat answer) could make it look the faster for several steps
after. For the same reason the first steps draft with both parts (`FIRST_STEPS`) before the lookup alone is
timed: a model's first guesses can all miss, and after two such steps the lookup alone drafted a chat answer's
first 28 steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BOTH, SECOND = "both", "second"
FIRST_STEPS = {BOTH: 3, SECOND: 1}  # each mode's steps, in this order, before the rates decide


class ModeChoice:
    def __init__(self, *, decay: float = 0.97, probe_every: int = 16, probe_second_every: int = 64,
                 clock: Callable[[], float] = time.perf_counter):  # fmt: skip
        self.decay = decay
        self.probe_every, self.probe_second_every = probe_every, probe_second_every
        self.clock = clock
        # decayed sums per mode: tokens over `counted` steps (the second alone's counted on every step), seconds
        # over `timed` steps (each mode's own)
        self.tokens = {BOTH: 0.0, SECOND: 0.0}
        self.counted = {BOTH: 0.0, SECOND: 0.0}
        self.seconds = {BOTH: 0.0, SECOND: 0.0}
        self.timed = {BOTH: 0.0, SECOND: 0.0}
        self.own_steps = {BOTH: 0, SECOND: 0}
        self.steps = 0
        self.mode = BOTH  # the next step's
        self._since: float | None = None  # when the step in flight began: the last commit

    def restart(self) -> None:
        """A new request: the time since the last commit was not a step."""
        self._since = None

    def committed(self, tokens: int, second_alone: int | None = None) -> None:
        """A step of `self.mode` ended with `tokens` committed, where the second part alone would have committed
        `second_alone` (None: not known): count it, and choose the next step's mode."""
        now = self.clock()
        if self._since is not None:
            self.own_steps[self.mode] += 1
            self._count(self.seconds, self.timed, self.mode, now - self._since)
            if self.mode == BOTH:
                self._count(self.tokens, self.counted, BOTH, tokens)
            if self.mode == SECOND or second_alone is not None:
                self._count(self.tokens, self.counted, SECOND, tokens if self.mode == SECOND else second_alone)
        self._since = now
        self.steps += 1
        self.mode = self._best()
        if self.steps % (self.probe_every if self.mode == SECOND else self.probe_second_every) == 0:
            self.mode = SECOND if self.mode == BOTH else BOTH

    def _count(self, sums: dict[str, float], steps: dict[str, float], mode: str, value: float) -> None:
        sums[mode] = sums[mode] * self.decay + value
        steps[mode] = steps[mode] * self.decay + 1

    def _best(self) -> str:
        untried = [mode for mode in (BOTH, SECOND) if self.own_steps[mode] < FIRST_STEPS[mode]]
        if untried:
            return untried[0]
        return max((BOTH, SECOND), key=self.rate)

    def rate(self, mode: str) -> float:
        """Tokens a second: tokens a step over seconds a step."""
        return (self.tokens[mode] / self.counted[mode]) / (self.seconds[mode] / self.timed[mode])
