"""Pages of a file mapping given back (`quant/mapped_pages.py`) leave the process and read back as the file holds
them: what lets a GGUF model's tiled matrices stop counting the file's bytes twice."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from specchat.quant.mapped_pages import give_back

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
PAGE = mmap.PAGESIZE


def resident_bytes(address: int) -> int:
    """The resident bytes of this process's mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise LookupError(f"no mapping holds {address:#x}")


def test_given_back_pages_leave_the_process_and_read_back_as_the_file(tmp_path):
    content = np.random.default_rng(0).integers(0, 256, 64 * PAGE, dtype=np.uint8)
    path = tmp_path / "blocks.bin"
    content.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="c")  # as gguf_tensors maps a GGUF file
    assert int(mapped.sum(dtype=np.int64)) == int(content.sum(dtype=np.int64))  # every page read
    address = mapped.ctypes.data
    assert resident_bytes(address) == 64 * PAGE

    view = mapped[100 : 100 + 40 * PAGE]  # a tensor's bytes: 39 whole pages and parts of two more
    give_back(view)
    assert resident_bytes(address) == 25 * PAGE  # the two pages it shares with its neighbours stay
    assert np.array_equal(view, content[100 : 100 + 40 * PAGE])  # read again from the file
    assert resident_bytes(address) == 64 * PAGE


def test_a_view_within_one_page_gives_back_nothing(tmp_path):
    path = tmp_path / "small.bin"
    np.arange(2 * PAGE, dtype=np.uint8).tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="c")
    mapped.sum()
    give_back(mapped[10 : PAGE - 10])
    assert resident_bytes(mapped.ctypes.data) == 2 * PAGE
