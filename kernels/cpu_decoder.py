"""The CPU decoder extension (`cpu_decoder.cpp`): compiled on first use with the machine's C++ compiler, then
loaded from torch's extension cache (rebuilt only when the source changes).

`python -m specchat.kernels.cpu_decoder` builds it ahead of time (`make setup` does).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu_decoder.cpp")
HEADERS = [Path(__file__).with_name(name) for name in ("bf16_dots.h", "gguf_blocks.h", "int8_dots.h", "lane_pairs.h")]


@functools.cache
def cpu_decoder():
    """The compiled module (Linear, Projection, Layer, Decoder, forward); raises RuntimeError when it cannot be
    built (no compiler, no ninja)."""
    from torch.utils.cpp_extension import load

    _put_ninja_on_path()
    native = "-mcpu=native" if platform.machine().lower() in ("arm64", "aarch64") else "-march=native"
    try:
        # named by its code: two checkouts of different versions each keep their own build
        version = source_version()
        # -fopenmp compiles at::parallel_for's threads in (serial without it); not linked: the OpenMP calls
        # resolve to the runtime torch itself loaded, so both share one pool instead of fighting over the cores
        return load(name=f"specchat_cpu_decoder_{version}", sources=[str(SOURCE)],
                    extra_cflags=["-O3", native, "-fopenmp"])
    except (OSError, ImportError, RuntimeError) as error:  # a missing compiler is an OSError, a failed build a RuntimeError
        raise RuntimeError(f"the CPU decoder could not be built: {str(error).strip().splitlines()[-1]}") from None


@functools.cache
def source_version() -> str:
    """A hash of the decoder's C++ code: names its build, and keys what was measured with it."""
    return hashlib.sha256(b"".join(path.read_bytes() for path in (SOURCE, *HEADERS))).hexdigest()[:12]


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the `ninja` wheel's binary sits in the venv, which may not be on it."""
    try:
        import ninja
    except ImportError:
        return
    if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


if __name__ == "__main__":
    cpu_decoder()
    print(f"CPU decoder ready ({SOURCE.name})")
