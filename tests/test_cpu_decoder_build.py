"""The CPU decoder's build on disk: a finished build is imported as it is, without torch's extension builder
(setuptools and a ninja run, a sixth of a second of every launch); a build of another torch goes back through the
builder; and a build that was killed midway (a closed terminal, a `kill` during the first start's minute of
compiling) leaves torch's lock file behind, which the next start, taking its turn under specchat's own lock (the
kernel releases it when its holder dies), removes instead of waiting for it for ever."""

from __future__ import annotations

import json
import subprocess
import sys

from specchat.kernels.cpu.cpu_decoder import BUILD_STAMP, build_directory, cpu_decoder, selected_isa

# A fresh process's start: the decoder's ISA, and whether torch's extension builder was imported for it.
START = """
import sys
from specchat.kernels.cpu.cpu_decoder import cpu_decoder
print(cpu_decoder().isa(), "torch.utils.cpp_extension" in sys.modules)
"""


def start() -> tuple[str, bool]:
    result = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    isa, built = result.stdout.rsplit(maxsplit=1)
    return isa, built == "True"


def test_a_finished_build_is_imported_without_the_builder():
    isa = cpu_decoder().isa()  # built, as every run of the suite builds it
    assert (build_directory(selected_isa()) / BUILD_STAMP).exists()
    assert start() == (isa, False)


def test_a_build_stamped_by_another_torch_goes_back_through_the_builder():
    isa = cpu_decoder().isa()
    stamp = build_directory(selected_isa()) / BUILD_STAMP
    facts = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**facts, "torch": "0.0"}))
    assert start() == (isa, True)
    assert json.loads(stamp.read_text()) == facts  # stamped again by the builder, for the next start


def test_a_killed_build_does_not_block_the_next_start():
    isa = cpu_decoder().isa()
    directory = build_directory(selected_isa())
    (directory / BUILD_STAMP).unlink()  # a build killed midway has none: it is written once the library loads
    (directory / "lock").write_text("")  # what torch's build leaves when it is killed
    assert start() == (isa, True)
    assert not (directory / "lock").exists()
