"""What a verification forward over the root and n draft nodes costs: timed once per machine, then kept up to
date from the forwards decoding runs.

A forward of a few rows reads every weight once, whatever its rows, and computes each row: its time is the larger
of the weight read and the rows' compute, blended where they meet (a 4-norm: the measured curves of the 1.5B on
the Zen 4 fit it better than a plain max), a roofline:

    seconds(n) = (read^4 + compute(n)^4)^(1/4),  compute(n) = base + slope * n

The calibration times forwards of 0, 1, 3, 7, ... nodes at the current context (up to the first that costs three
decode steps: larger trees cost in proportion to their rows), once per model, dtype, device and context class,
and keeps them on disk. The compute line runs through the two smallest sizes whose compute outweighs the read
(each less the read it overlapped), the first trees whose time says what their rows cost; the read is what the
decode step's time leaves of it.

The two terms are kept apart because they drift apart: on a machine that shares its memory, the read moves with
the bandwidth the neighbours leave (this 2-core machine's decode step of the 1.5B: 22-40 ms within minutes) while
the rows' compute does not. Priced as ratios to one calibration, a curve timed while the memory was slow (3 nodes
1.04x a decode step: their rows hidden under the read) priced 3 nodes too cheap once it was fast (1.4x), and the
trees came out too large; the roofline moves the knee with the read.

So the forwards decoding times correct each term apart, a factor each: the median over its latest timings of the
factor that makes the roofline meet the timing. The decode step times the read, a tree the compute of its rows (the
read as priced), which includes what the engine does per row beside the forward (its logits processed), and corrects
the line drawn through larger trees (on the 1.5B the compute factor settles at 1.3-1.5). A drafting engine runs few
forwards of the root alone, and the read is timed by them, so while drafting the budget asks for a plain step after
`PLAIN_STEP_EVERY` forwards with a tree (`decode_stale`): one step in 65 drafts nothing, under 1% of the tokens. A
tree that ran within the read as priced says nothing of its rows: counted as a compute of nil it priced every tree
as a decode step, and the budget jumped to 15 nodes until their timings undid it.

A median, and a term's timings forgotten when it has not been timed lately, because the budget reads the prices
it makes: with a moving average, one slow forward (a few steps into a prompt) raised a price, the budget left that
size, and the size, never timed again, kept its price. Slow outliers are the noise here (a forward cannot run
faster than its work), so a term timed afresh starts from the factor it was priced at, and of an even count of
timings the lower middle one counts.
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
LIVE_TIMINGS = 9  # a term's latest timings, whose median is its factor
STALE_AFTER = 4 * PLAIN_STEP_EVERY  # timed forwards after which a term's timing no longer counts
PRICED_IN_PROPORTION = 3.0  # decode steps a tree costs from which larger ones are priced in proportion, not timed
NORM = 4  # of the read and the compute: how sharply a forward turns from read-bound to compute-bound
READ, COMPUTE = "read", "compute"


@dataclass
class VerifyCost:
    """Seconds of one target forward over 1 + n tokens: a roofline fitted to the calibration (`sizes`, `seconds`),
    its terms corrected by the forwards decoding times (`observe`)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    factors: dict[str, float] = field(default_factory=lambda: {READ: 1.0, COMPUTE: 1.0}, compare=False)
    timings: dict[str, list[tuple[int, float]]] = field(default_factory=dict, compare=False)  # (at, factor) a term
    forwards: int = field(default=0, compare=False)  # timed forwards so far: the clock `timings` are kept by
    since_decode: int = field(default=0, compare=False)  # timed forwards since the last one of the root alone

    def __post_init__(self):
        self.read = self.seconds[0]
        overlapped = [(n, _less(seconds, self.read)) for n, seconds in zip(self.sizes, self.seconds)]
        bound = [(n, c) for n, c in overlapped if c >= self.read]  # compute-bound: their time is their rows'
        points = bound[:2] if len(bound) >= 2 else overlapped[-2:]  # else the largest, the most compute-bound
        (n0, c0), (n1, c1) = points if len(points) == 2 else [(0, 0.0), (1, 0.0)]  # the root alone: no rows priced
        self.slope = max((c1 - c0) / (n1 - n0), 0.0)
        # the compute of the root alone, within the read (a decode step is read-bound), then the read it leaves:
        # the decode step is priced as timed
        self.base = min(max(c1 - self.slope * n1, 0.0), self.read * 2 ** (-1 / NORM))
        self.read = _less(self.read, self.base)

    def parts(self, n: int) -> tuple[float, float]:
        """Seconds of the weight read and of the compute of a forward over the root and n nodes, now."""
        return self.factors[READ] * self.read, self.factors[COMPUTE] * (self.base + self.slope * n)

    def now(self, n: int) -> float:
        """Seconds for n nodes as the forwards timed lately have cost."""
        read, compute = self.parts(n)
        return (read**NORM + compute**NORM) ** (1 / NORM)

    def relative(self, n: int) -> float:
        """cost(n) / cost(0), now."""
        return self.now(n) / self.now(0)

    def observe(self, n: int, seconds: float) -> None:
        """Count one forward over the root and n nodes that took `seconds`. A decode step times the read (the root's
        compute is well below it); a tree the compute of its rows, the read as the decode steps priced it, unless it
        ran within that read: its time then says nothing of its rows."""
        read, compute = self.parts(n)
        self.forwards += 1
        self.since_decode = 0 if n == 0 else self.since_decode + 1
        if n == 0:
            self._time(READ, max(_less(seconds, compute), seconds * 2 ** (-1 / NORM)) / self.read)
        elif seconds > read and (rows := self.base + self.slope * n):
            self._time(COMPUTE, _less(seconds, read) / rows)

    def _time(self, term: str, factor: float) -> None:
        """One timing of `term`: the factor that makes the roofline meet it."""
        recent = self._recent(term) or [(self.forwards - 1, self.factors[term])]  # afresh: from the factor it had
        self.timings[term] = [*recent, (self.forwards, factor)][-LIVE_TIMINGS:]
        self.factors[term] = median_low(factor for _, factor in self.timings[term])

    def _recent(self, term: str) -> list[tuple[int, float]]:
        """The term's timings (forward count, factor it measured) of the last `STALE_AFTER` forwards."""
        return [(at, ratio) for at, ratio in self.timings.get(term, ()) if self.forwards - at < STALE_AFTER]

    @property
    def decode_stale(self) -> bool:
        """Whether the decode step, every price's unit, wants timing again."""
        return self.since_decode >= PLAIN_STEP_EVERY


def _less(seconds: float, read: float) -> float:
    """The compute in a forward of `seconds` that overlapped a read of `read` seconds (the roofline solved for it)."""
    return max(seconds**NORM - read**NORM, 0.0) ** (1 / NORM)


def priced_context(length: int) -> int:
    """The context class a calibration stands for: the power of two at or above `length`, at least 1024. A tree's
    rows each attend to the whole context, so its price in decode steps grows with it (the 1.5B on this CPU: 7
    nodes 1.6x a decode step at a few hundred tokens, 2.7x at 16K)."""
    return max(MIN_PRICED_CONTEXT, 1 << (length - 1).bit_length())


def measure_verify_cost(
    verify_forward: Callable[[int], Callable[[], object]], *, sizes: tuple[int, ...], repeats: int = 5, device=None
) -> VerifyCost:
    """Median seconds of a verification forward over 1 + n tokens for each size n up to the first that costs
    `PRICED_IN_PROPORTION` decode steps, after a warm-up that finds it; larger sizes priced in proportion to it.

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
