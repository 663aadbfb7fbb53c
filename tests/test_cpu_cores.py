"""The default thread count on Intel's hybrid CPUs: one per performance core, read from a sysfs tree laid out as
Linux lays out an Alder Lake's (written here: this machine's CPU is not hybrid)."""

from __future__ import annotations

from pathlib import Path

import torch

from specchat import cpu_cores
from specchat.cli.common import use_threads
from specchat.cpu_cores import cpu_list, performance_cores


def hybrid_sysfs(root: Path, *, p_cores: int = 8, e_cores: int = 8, packages: int = 1) -> Path:
    """A hybrid CPU's sysfs: per package, `p_cores` performance cores of two threads each (CPUs 2k, 2k + 1 on core
    k), then `e_cores` efficiency cores of one; `devices/cpu_core` and `devices/cpu_atom` list each kind's CPUs."""
    performance, efficiency, cpu = [], [], 0
    for package in range(packages):
        for core in range(p_cores + e_cores):
            for _ in range(2 if core < p_cores else 1):
                topology = root / f"devices/system/cpu/cpu{cpu}/topology"
                topology.mkdir(parents=True)
                (topology / "physical_package_id").write_text(f"{package}\n")
                (topology / "core_id").write_text(f"{4 * core}\n")  # Linux's core ids need not be consecutive
                (performance if core < p_cores else efficiency).append(cpu)
                cpu += 1
    for kind, cpus in (("cpu_core", performance), ("cpu_atom", efficiency)):
        (root / f"devices/{kind}").mkdir(parents=True)
        (root / f"devices/{kind}/cpus").write_text(",".join(map(str, cpus)) + "\n")
    return root


def test_cpu_lists_read_as_linux_writes_them():
    assert cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpu_list("5") == {5} and cpu_list("\n") == set()


def test_a_hybrid_cpu_counts_its_physical_performance_cores(tmp_path):
    sysfs = hybrid_sysfs(tmp_path / "one")
    everything = set(range(24))
    assert performance_cores(sysfs, everything) == 8  # not 16 threads, not the 8 E-cores
    assert performance_cores(sysfs, {0, 1, 2, 16, 17}) == 2  # the affinity's P-cores only (taskset)
    assert performance_cores(sysfs, {16, 17}) is None  # pinned to E-cores: torch's default stands
    two = hybrid_sysfs(tmp_path / "two", p_cores=6, e_cores=4, packages=2)
    assert performance_cores(two, set(range(64))) == 12  # a core id repeats in each package


def test_any_other_cpu_keeps_torchs_default(tmp_path):
    plain = tmp_path / "plain"
    (plain / "devices/cpu").mkdir(parents=True)  # what a CPU of one kind of core has instead of cpu_core / cpu_atom
    assert performance_cores(plain, {0, 1}) is None
    damaged = hybrid_sysfs(tmp_path / "damaged")
    (damaged / "devices/system/cpu/cpu3/topology/core_id").unlink()
    assert performance_cores(damaged, {2, 3}) is None


def test_commands_default_to_the_performance_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_cores, "SYSFS", hybrid_sysfs(tmp_path))
    monkeypatch.setattr(cpu_cores.os, "sched_getaffinity", lambda pid: set(range(24)))
    before = torch.get_num_threads()
    try:
        use_threads(None)
        assert torch.get_num_threads() == 8
        use_threads(3)  # --threads still decides
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
