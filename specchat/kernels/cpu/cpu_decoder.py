"""The CPU decoder extension (its module `cpu_decoder.cpp`, its layers `decoder.cpp`, its attention for each kind of
cache `attention_*.cpp`, and the GGUF kernels in `gguf/`): compiled on first use with the machine's C++ compiler, its
files side by side on the machine's cores, then imported from torch's extension cache as it is (built again when its
code, torch, Python or its flags change). `build(isa, "gguf_kernels")` compiles the GGUF kernels alone, without the
decoder's own files: a module the tests hold to the decoder's kernels.

It is compiled for the machine it runs on (`-march=native`), so the kernels' code path follows the CPU's features:
AVX-512 VNNI / BF16 with or without AMX tiles, AVX-512 without BF16 (its bf16 products in fp32 fmas), AVX2 (with FMA and
F16C) with or without AVX-VNNI, or the portable loops (`isa()` of the module names the one built).
`SPECCHAT_CPU_ISA=avx2` builds the AVX2 path (x86-64-v3) on any x86 machine, for measuring it where the CPU has more;
`avxvnni` adds AVX-VNNI to it (it runs only on CPUs that have AVX-VNNI: Intel's since Alder Lake, AMD's since Zen 5);
`avx512vnni` is AVX-512 with VNNI alone, no BF16 or VBMI (Intel's Cascade Lake Xeons); `noamx` is the machine's own
without AMX (the AVX-512 path of an Intel Xeon that has the tiles).

`python -m specchat.kernels.cpu.cpu_decoder` builds it ahead of time; so does this file run as a script, which needs
torch, ninja and gguf alone (`make setup` compiles it so while the other packages install). Builds of one target
take turns under a lock the kernel releases when its holder dies (torch's own lock file outlives a build that was
killed, and would keep every later start waiting for ever).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from pathlib import Path

HERE = Path(__file__).parent
KERNELS = sorted(HERE.glob("gguf/*.cpp"))  # the GGUF kernels, a few block types a file: compiled side by side
# The decoder's own files: its Python module, its layers, its attention for each kind of cache (side by side too).
DECODER = [HERE / f"{name}.cpp" for name in ("cpu_decoder", "decoder", "attention_plain", "attention_bf16",
                                              "attention_int8")]  # fmt: skip
# The modules: the decoder, and the GGUF kernels alone (what the tests hold other targets' kernels to this one's with).
MODULES = {"cpu_decoder": [*DECODER, *KERNELS], "gguf_kernels": [HERE / "gguf_kernels.cpp", *KERNELS]}
# Compiler targets by SPECCHAT_CPU_ISA: the machine's own, without AMX, the AVX2 path alone, or AVX-512 VNNI alone
# (tuned for this CPU).
ISA_FLAGS = {
    "native": lambda: ["-mcpu=native" if platform.machine().lower() in ("arm64", "aarch64") else "-march=native"],
    "noamx": lambda: ["-march=native", "-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8"],
    "avx2": lambda: ["-march=x86-64-v3", "-mtune=native"],
    "avxvnni": lambda: ["-march=x86-64-v3", "-mavxvnni", "-mtune=native"],
    "avx512vnni": lambda: ["-march=x86-64-v4", "-mavx512vnni", "-mtune=native"],
}
BUILD_STAMP = "specchat-build.json"  # written once a build has loaded: what `_import_built` checks before importing it
HEADERS = sorted(HERE.glob("*.h")) + sorted(HERE.glob("gguf/*.h"))
# Where the decoder has a dense product of its own (dense_matmul.h, x86 builds): each output row summed on its own, in
# fp32 too, where ATen's sums depend on the rows sharing the call. The decoder's layers pad their inputs to 32s for it.
DENSE_PRODUCT = platform.machine() in ("x86_64", "AMD64")


def cpu_decoder():
    """The compiled module (Linear, Projection, Layer, Decoder, forward) for `selected_isa()`; raises
    RuntimeError when it cannot be built (no compiler, no ninja)."""
    return build(selected_isa())


def selected_isa() -> str:
    """The build target SPECCHAT_CPU_ISA names (default: native)."""
    isa = os.environ.get("SPECCHAT_CPU_ISA", "native")
    if isa not in ISA_FLAGS:
        raise RuntimeError(f"SPECCHAT_CPU_ISA={isa} is not one of {', '.join(ISA_FLAGS)}")
    return isa


@functools.cache
def build(isa: str, module: str = "cpu_decoder"):
    """`module` (a key of MODULES) compiled for `isa` (a key of ISA_FLAGS), named by its code and target: two
    checkouts of different versions, or two targets, each keep their own build. A build that failed is not tried
    again in the same process: the same RuntimeError is raised at once."""
    if (isa, module) in _failed:
        raise _failed[isa, module]
    directory = build_directory(isa, module)
    flags = ["-O3", *ISA_FLAGS[isa](), "-fopenmp", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
    try:
        built = _import_built(directory, flags) or _compile(directory, flags, module)
    except RuntimeError as error:
        _failed[isa, module] = error
        raise
    built.iq_grids(iq_grids())
    return built


_failed: dict[tuple[str, str], RuntimeError] = {}  # builds that failed in this process, by target and module


def _import_built(directory: Path, flags: list[str]):
    """The module a finished build left, imported as it is: torch's `load` would import setuptools and run ninja to
    find it up to date, 0.15-0.3 s of every launch. Only a build whose stamp names this torch, this
    Python and these flags is taken (its code is in the directory's name); None sends the caller to `_compile`."""
    import importlib.util

    try:
        stamp = json.loads((directory / BUILD_STAMP).read_text())
    except (OSError, ValueError):
        return None
    if stamp != _build_facts(flags):
        return None
    spec = importlib.util.spec_from_file_location(directory.name, directory / f"{directory.name}.so")
    try:
        built = importlib.util.module_from_spec(spec)  # opens the library
        spec.loader.exec_module(built)
    except ImportError:  # the library went missing or will not link: build it again
        return None
    return built


def _compile(directory: Path, flags: list[str], module: str):
    """Builds (or finds up to date) and imports `module` through torch's extension builder, then stamps the build."""
    from torch.utils.cpp_extension import load

    _put_ninja_on_path()
    try:
        directory.mkdir(parents=True, exist_ok=True)  # torch's extension cache may not be writable
        import fcntl  # POSIX: elsewhere the decoder is not built (ImportError below), the torch decoder runs

        with open(directory / "specchat.lock", "w") as turn:
            fcntl.flock(turn, fcntl.LOCK_EX)  # released by the kernel, even when this process is killed
            (directory / "lock").unlink(missing_ok=True)  # torch's: held by no one while we hold ours
            (directory / BUILD_STAMP).unlink(missing_ok=True)  # while the library may be rebuilt, no one imports it
            # -fopenmp compiles at::parallel_for's threads in (serial without it); not linked: the OpenMP calls
            # resolve to the runtime torch itself loaded, so both share one pool instead of fighting over the cores.
            # Hidden symbols: two builds loaded in one process (tests, A/B scripts) must not bind to each other's
            # kernels, which share their names and may use instructions the CPU lacks.
            built = load(name=directory.name, sources=[str(path) for path in MODULES[module]],
                         build_directory=str(directory), extra_cflags=flags)  # fmt: skip
            partial = directory / f"{BUILD_STAMP}.partial"
            partial.write_text(json.dumps(_build_facts(flags)))
            partial.replace(directory / BUILD_STAMP)
    except (OSError, ImportError, RuntimeError) as error:  # no compiler: an OSError; a failed build: a RuntimeError
        raise RuntimeError(f"the CPU decoder could not be built: {str(error).strip().splitlines()[-1]}") from None
    return built


def _build_facts(flags: list[str]) -> dict:
    """What a build depends on beyond its code: the torch it links against, the Python it extends, its flags."""
    import torch

    return {"torch": torch.__version__, "python": platform.python_version(), "flags": flags}


def iq_grids() -> dict:
    """The IQ block types' codebooks as int8 [entries, values], from gguf-py's tables (those that dequantize the
    types there): what the decoder's unpacking of IQ1_S ... IQ3_S blocks reads."""
    import gguf.quants
    import torch

    grids = {}
    for name in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"):
        kind = getattr(gguf.quants, name)
        kind.init_grid()
        grids[name.lower()] = torch.from_numpy(kind.grid.reshape(kind.grid_shape)).to(torch.int8)
    return grids


def build_directory(isa: str, module: str = "cpu_decoder") -> Path:
    """Where the build of `module` for `isa` of this source lives: under torch's extension cache, TORCH_EXTENSIONS_DIR
    where it is set (as torch's builder reads it)."""
    from torch._appdirs import user_cache_dir  # torch's `get_default_build_root`, without importing its builder

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or user_cache_dir(appname="torch_extensions")
    suffix = "" if isa == "native" else f"_{isa}"
    return Path(root).resolve() / f"specchat_{module}{suffix}_{source_version()}"


@functools.cache
def source_version() -> str:
    """A hash of the decoder's C++ code: names its builds, and keys what was measured with them."""
    sources = sorted(HERE.glob("*.cpp")) + KERNELS + HEADERS
    return hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:12]


def _put_ninja_on_path() -> None:
    """torch runs `ninja` from PATH; the `ninja` wheel's binary sits in the venv, which may not be on it."""
    try:
        import ninja
    except ImportError:
        return
    if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


if __name__ == "__main__":
    print(f"CPU decoder ready ({cpu_decoder().isa()})")
