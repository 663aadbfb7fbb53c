"""How many threads the model runs on by default: one per physical core, and on Intel's hybrid CPUs (Alder Lake and
after) one per performance core, as llama.cpp's default is. torch counts the efficiency cores too, and every
parallel loop of a forward then waits for the threads on the slower cores. Read from Linux's sysfs, which lists a
hybrid CPU's performance cores under `devices/cpu_core`."""

from __future__ import annotations

import os
from pathlib import Path

SYSFS = Path("/sys")


def cpu_list(text: str) -> set[int]:
    """The CPUs of a sysfs list such as "0-7,12,14-15"."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def performance_cores(sysfs: Path | None = None, allowed: set[int] | None = None) -> int | None:
    """The physical performance cores among the CPUs this process may run on (`allowed`: its affinity), on a hybrid
    CPU; None on any other CPU, or where sysfs does not say."""
    sysfs = sysfs or SYSFS
    try:
        listed = cpu_list((sysfs / "devices/cpu_core/cpus").read_text())
        cores = set()
        for cpu in listed & (os.sched_getaffinity(0) if allowed is None else allowed):
            topology = sysfs / f"devices/system/cpu/cpu{cpu}/topology"
            cores.add(tuple((topology / name).read_text().strip() for name in ("physical_package_id", "core_id")))
    except (OSError, ValueError):
        return None
    return len(cores) or None
