"""Tensors kept for the next load: read back as made, one version a source, and a cache that cannot be written costs
a load nothing but the making."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specchat.quant.kept_tensors import KeptTensors, kept_path


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


def test_a_new_version_replaces_the_old_and_leaves_other_sources_and_variants(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    model, other, code = tmp_path / "model.gguf", tmp_path / "elsewhere" / "model.gguf", tmp_path / "code.py"
    other.parent.mkdir()
    for path in (model, other, code):
        path.write_text("v1")

    def keep(source: Path, *facts: str) -> Path:
        kept = KeptTensors(kept_path("packed", "model", [source], [code], *facts))
        kept.tensors("head", _made)
        kept.save()
        return kept.path

    first, elsewhere, variant = keep(model, "bf16"), keep(other, "bf16"), keep(model, "fp32")
    assert len({first, elsewhere, variant}) == 3 and all(path.is_file() for path in (first, elsewhere, variant))
    code.write_text("v2")  # new code: the same source's next load makes its tensors again
    second = keep(model, "bf16")
    assert second != first and not first.exists()
    model.write_text("edited")  # an edited file too
    third = keep(model, "bf16")
    assert third != second and not second.exists()
    assert sorted((tmp_path / "cache" / "packed").iterdir()) == sorted([third, elsewhere, variant])
