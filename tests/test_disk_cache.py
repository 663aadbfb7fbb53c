"""Measurements kept on disk: computed once, read back after, none lost to another process storing its own."""

from __future__ import annotations

import json

import pytest

from specchat.disk_cache import cached_json


def test_a_value_is_computed_once_then_read_from_the_file(tmp_path):
    path, calls = tmp_path / "costs.json", []

    def compute():
        calls.append(1)
        return {"seconds": [0.5, 0.7]}

    assert cached_json(path, "a", compute) == {"seconds": [0.5, 0.7]}
    assert cached_json(path, "a", compute) == {"seconds": [0.5, 0.7]}
    assert len(calls) == 1 and json.loads(path.read_text()) == {"a": {"seconds": [0.5, 0.7]}}


def test_a_key_stored_while_another_is_measured_is_kept(tmp_path):
    """Two processes measuring at once (a chat and a server starting together): the one that finishes last
    writes the file, and what the other stored meanwhile stays in it."""
    path = tmp_path / "costs.json"

    def measured_while_another_process_stores_b():
        assert cached_json(path, "b", lambda: 2) == 2
        return 1

    assert cached_json(path, "a", measured_while_another_process_stores_b) == 1
    assert json.loads(path.read_text()) == {"a": 1, "b": 2}
    assert not list(tmp_path.glob("*.partial"))


def test_a_value_that_cannot_be_kept_is_used_with_a_warning(tmp_path):
    """A cache that cannot be written (here a directory where the file should be; a full disk, a read-only home):
    the measurement is returned all the same, the run goes on, and a warning says it is measured again next time."""
    path = tmp_path / "costs.json"
    path.mkdir()
    with pytest.warns(UserWarning, match=r"could not keep .*costs\.json .*measured again next time"):
        assert cached_json(path, "a", lambda: 3) == 3
    assert path.is_dir() and not list(tmp_path.glob("*.partial"))
