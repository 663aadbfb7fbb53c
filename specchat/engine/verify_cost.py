"""What a verification forward over the root and n draft nodes costs: timed once per machine, then kept up to
date from the forwards decoding runs.

The calibration times forwards of 0, 1, 2, 3, 4, 7, 15, ... nodes at the current context (up to the first that costs
three decode steps: larger trees cost in proportion to their rows), once per model, dtype, device and context class,
and keeps them on disk. Its prices are ratios to a decode step, and on a machine that shares
its memory those ratios move with the minute: a decode step reads the weights at whatever bandwidth the
neighbours leave, while a forward of a few rows, nearer compute-bound, does not; a calibration timed while
another process loaded the CPU would misprice trees for good.

So each timed forward of decoding corrects the price of its size class: a factor per calibrated size, the
median ratio of measured to calibrated seconds over its latest timings, read by the sizes it stands for (a class
not timed lately takes the factor of the nearest one that was). A drafting engine runs few forwards of the root
alone, and every price is a ratio to that one, so while drafting the budget asks for a plain step after
`PLAIN_STEP_EVERY` forwards with a tree (`decode_stale`): one step in 65 drafts nothing, under 1% of the tokens.

A median, and a class's timings forgotten when it has not been timed lately, because the budget reads the prices
it makes: with a moving average, one slow forward (a few steps into a prompt) raised a class's price, the budget
left that size, and the size, never timed again, kept its price. Slow outliers are the noise here (a forward
cannot run faster than its work), so a class timed afresh starts from the factor it was priced at, and of an
even count of timings the lower middle one counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median_low

from specchat.disk_cache import cached_json
from specchat.engine.timing import Timer

MIN_PRICED_CONTEXT = 1024  # contexts up to this share one calibration
PLAIN_STEP_EVERY = 64  # timed forwards with a tree before a plain step re-times the decode step
LIVE_TIMINGS = 9  # a size class's latest timings, whose median is its factor
STALE_AFTER = 4 * PLAIN_STEP_EVERY  # timed forwards after which a class's timing no longer counts
PRICED_IN_PROPORTION = 3.0  # decode steps a tree costs from which larger ones are priced in proportion, not timed


@dataclass
class VerifyCost:
    """Seconds of one target forward over 1 + n tokens: calibrated at the listed tree sizes n, corrected by the
    forwards decoding times (`observe`)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    factors: dict[int, float] = field(default_factory=dict, compare=False)  # size class -> measured / calibrated
    timings: dict[int, list[tuple[int, float]]] = field(default_factory=dict, compare=False)  # (at, ratio) a class
    forwards: int = field(default=0, compare=False)  # timed forwards so far: the clock `timings` are kept by
    since_decode: int = field(default=0, compare=False)  # timed forwards since the last one of the root alone

    def calibrated(self, n: int) -> float:
        """The calibration's seconds for n nodes, linearly interpolated between measured sizes."""
        for (n0, s0), (n1, s1) in zip(zip(self.sizes, self.seconds), zip(self.sizes[1:], self.seconds[1:])):
            if n <= n1:
                return s0 + (s1 - s0) * (n - n0) / (n1 - n0)
        return self.seconds[-1] * n / self.sizes[-1]

    def now(self, n: int) -> float:
        """Seconds for n nodes as the forwards timed lately have cost."""
        return self.calibrated(n) * self._factor(self._size_class(n))

    def relative(self, n: int) -> float:
        """cost(n) / cost(0), now."""
        return self.now(n) / self.now(0)

    def observe(self, n: int, seconds: float) -> None:
        """Count one forward over the root and n nodes that took `seconds`."""
        size = self._size_class(n)
        recent = self._recent(size) or [(self.forwards, self._factor(size))]  # afresh: from the price it had
        self.forwards += 1
        self.timings[size] = [*recent, (self.forwards, seconds / self.calibrated(n))][-LIVE_TIMINGS:]
        self.factors = {}
        for timed in self.timings:
            if ratios := [ratio for _, ratio in self._recent(timed)]:
                self.factors[timed] = median_low(ratios)
        self.since_decode = 0 if n == 0 else self.since_decode + 1

    def _recent(self, size: int) -> list[tuple[int, float]]:
        """The size class's timings (forward count, ratio to the calibration) of the last `STALE_AFTER` forwards."""
        return [(at, ratio) for at, ratio in self.timings.get(size, ()) if self.forwards - at < STALE_AFTER]

    @property
    def decode_stale(self) -> bool:
        """Whether the decode step, every price's unit, wants timing again."""
        return self.since_decode >= PLAIN_STEP_EVERY

    def _size_class(self, n: int) -> int:
        """The calibrated size at or above n (the largest past it): the forwards whose prices n's timing moves."""
        return next((size for size in self.sizes if n <= size), self.sizes[-1])

    def _factor(self, size: int) -> float:
        if not self.factors:
            return 1.0
        nearest = min(self.factors, key=lambda seen: (abs(self.sizes.index(seen) - self.sizes.index(size)), seen))
        return self.factors[nearest]


def priced_context(length: int) -> int:
    """The context class a calibration stands for: the power of two at or above `length`, at least 1024. A tree's
    rows each attend to the whole context, so its price in decode steps grows with it (the 1.5B on this CPU: 7
    nodes 1.6x a decode step at a few hundred tokens, 2.7x at 16K)."""
    return max(MIN_PRICED_CONTEXT, 1 << (length - 1).bit_length())


def measure_verify_cost(
    verify_forward: Callable[[int], Callable[[], object]], *, sizes: tuple[int, ...], repeats: int = 5, device=None
) -> VerifyCost:
    """Median seconds of a verification forward over 1 + n tokens for each size n up to the first that costs
    `PRICED_IN_PROPORTION` decode steps, after a warm-up that finds it; larger sizes priced in proportion to it
    (each stays a size class of its own, corrected as decoding times it).

    `verify_forward(n)` builds the call to time (`specchat.engine.verify_forward.verification_forward`);
    `device` is where it runs (a CUDA device is synchronised around each call). The sizes run interleaved, round
    by round: timed one size after another, a CPU whose memory bandwidth drifted between them (this 2-core
    machine's decode step moves between 16 and 24 ms) priced a one-node tree at 1.17x a decode step in one
    calibration and 1.01x in the next, and the budget followed.
    """
    calls = _worth_timing(verify_forward, sizes, device)
    times = Timer(device, repeats=repeats, warmup=0).seconds_each(calls)
    seconds = [times[str(n)] for n in sizes[: len(calls)]]
    # Larger trees never cost less than smaller ones; measured noise otherwise makes the curve non-monotone.
    for i in range(1, len(seconds)):
        seconds[i] = max(seconds[i], seconds[i - 1])
    timed = sizes[len(calls) - 1]
    seconds += [seconds[-1] * n / timed for n in sizes[len(calls):]]
    return VerifyCost(tuple(sizes), tuple(seconds))


def _worth_timing(verify_forward: Callable[[int], Callable[[], object]], sizes: tuple[int, ...],
                  device) -> dict[str, Callable[[], object]]:  # fmt: skip
    """The calls of the sizes to time, by size, each run once as its warm-up (the root's twice): from the root alone
    (`sizes[0]` is 0) up to the first size whose warm-up costs `PRICED_IN_PROPORTION` times the root's. Past that,
    a forward's rows are its work (on a CPU, 31 and 63 nodes would be most of the calibration's time)."""
    once = Timer(device, repeats=1, warmup=0)
    calls, decode = {}, None
    for n in sizes:
        calls[str(n)] = call = verify_forward(n)
        seconds = once.seconds(call)
        if decode is None:  # the first forward is slower: it also warms what every size shares
            decode = once.seconds(call)
        elif seconds >= PRICED_IN_PROPORTION * decode:
            break
    return calls


def cached_verify_cost(path: Path, key: str, measure: Callable[[], VerifyCost]) -> VerifyCost:
    """The calibration stored under `key` in the JSON file at `path`, measured and stored when missing."""

    def compute() -> dict:
        cost = measure()
        return {"sizes": list(cost.sizes), "seconds": list(cost.seconds)}

    entry = cached_json(path, key, compute)
    return VerifyCost(tuple(entry["sizes"]), tuple(entry["seconds"]))
