"""Pages of a memory-mapped file given back once a copy replaced what they held.

A GGUF matrix repacked in tiles (`GGUFLinear`) is read from its copy from then on, but the file's pages read to make
the copy would stay resident in the process beside it: a file's bytes counted twice (the 1.5B's 1.1 GB file: 2.3 GB
resident; an 8B Q4_K_M's 4.9 GB: 9.9 GB). Given back with `madvise(MADV_DONTNEED)` they leave the process and stay
in the kernel's page cache, reclaimable, until anything touches them again (the tied embedding's looked-up rows):
then they are read from the file as they were, since the mapping is copy-on-write and never written.
"""

from __future__ import annotations

import ctypes
import functools
import mmap

import numpy as np


def give_back(data: np.ndarray) -> None:
    """Drop from this process the whole pages under `data`, a view of a file mapped copy-on-write that nothing wrote
    (the pages it shares with its neighbours stay). Where the system has no madvise, nothing happens."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:
        return
    page = mmap.PAGESIZE
    start = -(-data.ctypes.data // page) * page
    end = (data.ctypes.data + data.nbytes) // page * page
    if end > start:
        _madvise()(ctypes.c_void_p(start), ctypes.c_size_t(end - start), advice)


@functools.cache
def _madvise():
    """The C library's madvise (a system with `mmap.MADV_DONTNEED` has one)."""
    function = ctypes.CDLL(None, use_errno=True).madvise
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function
