"""The CPU decoder's build on disk: a finished build is imported as it is, without torch's extension builder
(setuptools and a ninja run, a sixth of a second of every launch); a build of another torch, or one whose library is
gone, goes back through the builder; and a build that was killed midway (a closed terminal, a `kill` during the first
start's minute of compiling) leaves torch's lock file behind, which the next start, taking its turn under specchat's
own lock (the kernel releases it when its holder dies), removes instead of waiting for it for ever.

The test starts processes on a copy of the suite's build in a cache of its own (TORCH_EXTENSIONS_DIR, which specchat's
builds follow as torch's do): the other tests' processes go on reading the real one, which this test would otherwise
change under them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_fork import run_specchat

from specchat.kernels.cpu.cpu_decoder import BUILD_STAMP, build_directory, cpu_decoder, selected_isa

# A fresh process's start: the decoder's ISA, and whether torch's extension builder was imported for it.
START = """
import sys
from specchat.kernels.cpu.cpu_decoder import cpu_decoder
print(cpu_decoder().isa(), "torch.utils.cpp_extension" in sys.modules)
"""


@pytest.fixture
def build(tmp_path) -> Path:
    """The build directory of a copy of the suite's build (objects, library, stamp), under `tmp_path`."""
    cpu_decoder()  # built, as every run of the suite builds it
    built = build_directory(selected_isa())
    copy = tmp_path / built.name
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns("*lock"))  # times kept: ninja finds it up to date
    return copy


def start(build: Path) -> tuple[str, bool]:
    environment = {**os.environ, "TORCH_EXTENSIONS_DIR": str(build.parent)}
    result = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, timeout=600, env=environment)
    assert result.returncode == 0, result.stderr
    isa, built = result.stdout.rsplit(maxsplit=1)
    return isa, built == "True"


def test_a_build_is_imported_as_built_and_built_again_when_it_cannot_be(build):
    """In turn, on one copy (its first pass through the builder compiles it again in its new place, a minute; the
    later ones find it up to date): the stamp's facts; a library that is gone; a killed build's lock."""
    isa, stamp, library = cpu_decoder().isa(), build / BUILD_STAMP, build / f"{build.name}.so"
    assert start(build) == (isa, False)  # a finished build: imported without the builder

    facts = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**facts, "torch": "0.0"}))  # built by another torch
    assert start(build) == (isa, True)
    assert json.loads(stamp.read_text()) == facts  # stamped again by the builder, for the next start
    assert start(build) == (isa, False)

    library.unlink()  # its objects stay: the builder links it again
    assert start(build) == (isa, True)
    assert library.is_file() and stamp.is_file()

    stamp.unlink()  # a build killed midway has none: it is written once the library loads
    (build / "lock").write_text("")  # what torch's build leaves when it is killed
    assert start(build) == (isa, True)
    assert not (build / "lock").exists()


def test_where_the_decoder_cannot_be_built_the_default_model_runs_dense_and_a_gguf_file_is_one_line(tmp_path):
    """Without the decoder (no compiler, or here an extension cache that cannot be written: a path through a file)
    the embedded model runs on its weights dequantized to fp32 through the torch decoder, warning so, and answers
    what that path answers with the decoder built (`--dtype float32 --attention hybrid`); a GGUF file, whose blocks
    only the decoder's kernels multiply, is refused in one line."""
    from gguf_files import write_tiny_model

    from specchat.loading import embedded_gguf_path

    (tmp_path / "a-file").write_text("")
    common = {**os.environ, "HF_HUB_OFFLINE": "1"}
    without = {**common, "TORCH_EXTENSIONS_DIR": str(tmp_path / "a-file" / "builds")}

    def run(*args: str, environment: dict) -> subprocess.CompletedProcess:
        command = ["run", *args, "--json", "--temperature", "0", "--drafter", "none"]
        return run_specchat(command, env=environment, timeout=600)

    dense = run("What is the capital of France?", "-n", "6", environment=without)
    assert dense.returncode == 0, dense.stderr
    warnings = [line for line in dense.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings[0].startswith("warning: the CPU decoder could not be built: ")
    assert warnings[0].endswith("; the embedded model runs on its weights dequantized to fp32 (slower)")
    reference = run("What is the capital of France?", "-n", "6", "--dtype", "float32", "--attention", "hybrid",
                    environment=common)  # fmt: skip
    assert reference.returncode == 0, reference.stderr
    assert json.loads(dense.stdout)["token_ids"] == json.loads(reference.stdout)["token_ids"]

    gguf = write_tiny_model(tmp_path / "tiny.gguf", embedded_gguf_path(), architecture="llama")
    refused = run("hi", "-n", "2", "--model", str(gguf), environment=without)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.splitlines()[-1].startswith("error: the CPU decoder could not be built: ")
    assert "GGUF blocks run on its kernels" in refused.stderr
