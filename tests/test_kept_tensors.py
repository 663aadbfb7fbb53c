"""Tensors kept for the next load: read back as made, and a cache that cannot be written costs a load nothing but
the making."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specchat.quant.kept_tensors import KeptTensors


def _made():
    return {"codes": torch.arange(12, dtype=torch.uint8).view(3, 4), "scales": torch.ones(3, 2)}


def test_kept_tensors_are_read_back_by_the_next_load_as_they_were_made(tmp_path):
    path = tmp_path / "kept" / "model.safetensors"
    first = KeptTensors(path)
    made = first.tensors("layers.0.q", _made)
    first.save()
    again = KeptTensors(path).tensors("layers.0.q", lambda: pytest.fail("made again"))
    assert again.keys() == made.keys() and all(torch.equal(again[part], made[part]) for part in made)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, where no file can be created")
def test_a_cache_that_cannot_be_written_keeps_nothing_and_says_nothing():
    kept = KeptTensors(Path("/proc/specchat-kept.safetensors"))  # safetensors' own write fails there
    assert torch.equal(kept.tensors("head", _made)["codes"], _made()["codes"])
    kept.save()
    assert not Path("/proc/specchat-kept.safetensors").exists()
