"""A build of the CPU decoder that was killed midway (a closed terminal, a `kill` during the first start's minute
of compiling) leaves torch's lock file behind: the next start takes its turn under specchat's own lock, which the
kernel releases when its holder dies, and goes on instead of waiting for that file for ever."""

from __future__ import annotations

import subprocess
import sys

from specchat.kernels.cpu.cpu_decoder import build_directory, cpu_decoder, selected_isa


def test_a_killed_build_does_not_block_the_next_start():
    cpu_decoder()  # built, as every run of the suite builds it
    directory = build_directory(selected_isa())
    (directory / "lock").write_text("")  # what torch's build leaves when it is killed
    code = "from specchat.kernels.cpu.cpu_decoder import cpu_decoder; print(cpu_decoder().isa())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr
    assert not (directory / "lock").exists()
