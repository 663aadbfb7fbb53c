"""`specchat cache`: what specchat keeps on disk, entry by entry, and why an entry is stale; `prune` removes the stale
entries alone, `clear` everything but model files. The entries are made by the mechanisms that make them in a load
(kept tensors, a GGUF file's conversion), in a cache of the test's own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cli import specchat_in_process

from specchat.cache_entries import cache_entries
from specchat.kernels.cpu.cpu_decoder import source_version
from specchat.loading import embedded_gguf_path, gguf_checkpoint
from specchat.quant.kept_tensors import kept_tensors


@pytest.fixture
def cache(tmp_path, monkeypatch) -> dict[str, Path]:
    """A cache with an entry of each kind, stale ones among them; the paths by name."""
    monkeypatch.delenv("SPECCHAT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))  # the profiles' model files, in ~/.cache/specchat/gguf
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))  # specchat's cache and torch's extension cache
    root, builds = tmp_path / ".cache" / "specchat", tmp_path / ".cache" / "torch_extensions"
    paths = {"model file": root / "gguf" / "model.gguf"}
    paths["model file"].parent.mkdir(parents=True)
    paths["model file"].write_bytes(b"GGUF" + bytes(60))
    for name in ("kept", "kept from a file now gone"):
        source = tmp_path / f"{name}.bin"
        source.write_bytes(name.encode())
        kept = kept_tensors("packed", source.stem, [source], [Path(__file__)])
        kept.tensors("layer", lambda: {"codes": torch.ones(64, dtype=torch.uint8)})
        kept.save()
        paths[name] = kept.path
    (tmp_path / "kept from a file now gone.bin").unlink()
    embedded = tmp_path / embedded_gguf_path().name
    shutil.copy(embedded_gguf_path(), embedded)
    paths["conversion"] = Path(gguf_checkpoint(embedded))
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    paths["half written"] = root / f"verify_cost.json.{exited.stdout.strip()}.partial"
    paths["half written"].write_text("{")
    for name, version in (("build", source_version()), ("build of other code", "0" * 12)):
        paths[name] = builds / f"specchat_cpu_decoder_{version}"
        paths[name].mkdir(parents=True)
        (paths[name] / "module.so").write_bytes(bytes(100))
    return paths


def test_the_listing_says_what_each_entry_is_and_why_it_is_stale(cache, monkeypatch, capfd):
    stale = {entry.path: entry.stale for entry in cache_entries()}
    gone = cache["kept"].parents[3] / "kept from a file now gone.bin"
    assert stale == {
        cache["model file"]: None,
        cache["kept"]: None,
        cache["kept from a file now gone"]: f"made from {gone}, which is gone",
        cache["conversion"]: None,
        cache["half written"]: "left half written by a process that died",
        cache["build"]: None,
        cache["build of other code"]: "built from other code of specchat",
    }
    listed = specchat_in_process(monkeypatch, capfd, "cache")
    assert listed.returncode == 0, listed.stderr
    assert "gguf/model.gguf\n" in listed.stdout and "model file" in listed.stdout
    copied = cache["conversion"].parents[2] / embedded_gguf_path().name
    assert f"tokenizer and config read from a GGUF file, from {copied}\n" in listed.stdout
    assert listed.stdout.count("stale: ") == 3


def test_prune_removes_the_stale_entries_alone(cache, monkeypatch, capfd):
    pruned = specchat_in_process(monkeypatch, capfd, "cache", "prune")
    assert pruned.returncode == 0, pruned.stderr
    gone = {"kept from a file now gone", "half written", "build of other code"}
    assert {name for name, path in cache.items() if not path.exists()} == gone
    assert pruned.stdout.count("removed ") == 3


def test_clear_removes_everything_but_model_files(cache, monkeypatch, capfd):
    cleared = specchat_in_process(monkeypatch, capfd, "cache", "clear")
    assert cleared.returncode == 0, cleared.stderr
    assert [name for name, path in cache.items() if path.exists()] == ["model file"]
    assert [entry.path for entry in cache_entries()] == [cache["model file"]]
