"""The one timer: median seconds of a call after a warm-up, used by the engine's calibration and the benchmarks.

Wall time by default, with a CUDA device synchronised before and after each call, so a call is timed to the
end of the work it queued. `cold_l2` times a CUDA call on the GPU instead, between CUDA events, with a buffer
larger than any L2 cache zeroed before each call (as `triton.testing.do_bench` does): one kernel's own time,
as a benchmark of a single attention call wants it. Calls timed together (`seconds_each`) run interleaved,
round by round, so a slow drift of a noisy machine hits each of them alike.

No torch at import: the engine's budget module, which option checks import, uses this one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

L2_FLUSH_BYTES = 256 * 2**20  # zeroed before each `cold_l2` call: larger than any GPU's L2


class Timer:
    """Times calls: `warmup` untimed calls of each, then the median of `repeats` timed ones."""

    def __init__(self, device=None, *, repeats: int = 3, warmup: int = 1, cold_l2: bool = False):
        """`device`: where the calls run (a torch.device or its name; None: the host only)."""
        if repeats < 1 or warmup < 0:
            raise ValueError(f"a timer needs repeats >= 1 and warmup >= 0, not {repeats} and {warmup}")
        self.device = None
        self.cuda = False
        if device is not None:
            import torch

            self.device = torch.device(device)
            self.cuda = self.device.type == "cuda"
        self.repeats = repeats
        self.warmup = warmup
        self.flush = None
        if cold_l2 and self.cuda:
            import torch

            self.flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)

    def seconds(self, call: Callable[[], object]) -> float:
        """Median seconds of one `call()`."""
        return self.seconds_each({"call": call})["call"]

    def seconds_each(self, calls: dict[str, Callable[[], object]]) -> dict[str, float]:
        """Median seconds of each call, the calls interleaved: every round runs each of them once, in order."""
        for _ in range(self.warmup):
            for call in calls.values():
                call()
        if self.flush is not None:
            return self._gpu_seconds(calls)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(self.repeats):
            for name, call in calls.items():
                times[name].append(self._wall_seconds(call))
        return {name: statistics.median(values) for name, values in times.items()}

    def _wall_seconds(self, call: Callable[[], object]) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        call()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def _gpu_seconds(self, calls: dict[str, Callable[[], object]]) -> dict[str, float]:
        import torch

        events = {name: [] for name in calls}
        for _ in range(self.repeats):
            for name, call in calls.items():
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                self.flush.zero_()
                start.record()
                call()
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize(self.device)
        return {
            name: statistics.median(start.elapsed_time(end) for start, end in pairs) / 1e3
            for name, pairs in events.items()
        }
