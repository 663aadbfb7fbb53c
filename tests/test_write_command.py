"""`specchat write` as users run it: on the real default model, killed and resumed, and given bad input.

Proven here: a write killed (SIGKILL) mid-run and resumed with `--resume` leaves the very bytes of an
unbroken run with the same seed; Ctrl-C stops with the book saved and says how to go on; an existing book is
never overwritten without `--force`; bad input (token count, unwritable path, a prompt longer than the
window, foreign, corrupt or missing state, settings that would change the text) is one line and a non-zero
exit, and leaves the book as it was.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time

import pytest
from cli_fork import start_specchat
from test_cli import ENV, assert_one_line_error, refused_before_loading, specchat, specchat_in_process

from specchat.writer.book import ids_path, state_path

TOKENS = "300"  # no refill (the window holds 8K); ~2 s even at 130 tok/s, so the kill after 50 lands mid-book
COMMON = ("--tokens", TOKENS, "--seed", "11", "--drafter", "ngram")


def _start(*args: str):
    """`specchat write ARGS` running, as `subprocess.Popen` would start it (forked from a warm interpreter,
    `cli_fork.py`: a cold start spends ~6 s importing torch)."""
    return start_specchat(("write", *args), env=ENV)


def _wait_for_tokens(path, count: int, process) -> None:
    """Until the book's state counts `count` tokens and more were written after it."""
    deadline = time.monotonic() + 240
    while True:
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "the book did not grow"
        if state_path(path).exists():
            state = json.loads(state_path(path).read_text())
            saved = state["settings"]["prompt_tokens"] + state["progress"]["tokens"]
            if state["progress"]["tokens"] >= count and ids_path(path).stat().st_size > 4 * saved:
                return
        time.sleep(0.02)


@pytest.mark.slow
def test_killed_and_resumed_writes_the_same_bytes(default_model, tmp_path):
    whole = tmp_path / "whole.txt"
    result = specchat("write", "--out", str(whole), *COMMON, "--json", warm=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["tokens"] == int(TOKENS) and report["finish_reason"] == "length"

    cut = tmp_path / "cut.txt"
    process = _start("--out", str(cut), *COMMON)
    _wait_for_tokens(cut, 50, process)
    process.kill()  # SIGKILL: no clean-up runs
    process.communicate()
    assert 0 < len(cut.read_bytes()) < len(whole.read_bytes())

    # the drafter may change
    resumed = specchat("write", "--out", str(cut), "--resume", "--drafter", "none", "--json", warm=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "warning" not in resumed.stderr
    assert cut.read_bytes() == whole.read_bytes()
    assert json.loads(resumed.stdout)["written"] < int(TOKENS)


@pytest.mark.slow
def test_ctrl_c_saves_the_book_and_says_how_to_go_on(default_model, tmp_path):
    book = tmp_path / "book.txt"
    process = _start("--out", str(book), "--tokens", "100000", "--drafter", "ngram")
    _wait_for_tokens(book, 100, process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130
    assert "--resume" in err and "Traceback" not in err
    state = json.loads(state_path(book).read_text())
    assert len(book.read_bytes()) == state["progress"]["text_bytes"] > 0

    refused = specchat("write", "--out", str(book), "--resume", "--temperature", "0.5", warm=True)
    assert_one_line_error(refused, "would change the book's text", "temperature: was 1.0, now 0.5")
    assert json.loads(state_path(book).read_text()) == state


@pytest.mark.slow
def test_a_prompt_longer_than_the_window_is_refused(default_model, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("word " * 9000)
    assert_one_line_error(specchat("write", "--out", str(tmp_path / "b.txt"), "--prompt-file", str(prompt), warm=True),
                          "the prompt has", "window holds")  # fmt: skip


@pytest.mark.slow
def test_a_book_written_on_an_int8_cache_resumes_on_one_only(tmp_path):
    """The KV cache is part of the book's arithmetic, as the dtype is: extended on int8, the book is an unbroken
    int8 run's; resumed on auto, it is refused and left as it was. int8 on the torch decoder (no compiled decoder)
    is refused before a book is made."""
    int8 = ("--kv-cache", "int8", "--seed", "11", "--drafter", "ngram")
    whole, book = tmp_path / "whole.txt", tmp_path / "book.txt"
    assert specchat("write", "--out", str(whole), "--tokens", "48", *int8, warm=True).returncode == 0
    written = specchat("write", "--out", str(book), "--tokens", "24", *int8, warm=True)
    assert written.returncode == 0, written.stderr
    assert json.loads(state_path(book).read_text())["settings"]["kv_cache"] == "int8"

    files = [book.read_bytes(), ids_path(book).read_bytes(), state_path(book).read_text()]
    refused = specchat("write", "--out", str(book), "--resume", "--tokens", "48", "--kv-cache", "auto", warm=True)
    assert_one_line_error(refused, "would change the book's text", "kv_cache: was 'int8', now 'auto'")
    assert [book.read_bytes(), ids_path(book).read_bytes(), state_path(book).read_text()] == files

    resumed = specchat("write", "--out", str(book), "--resume", "--tokens", "48", "--kv-cache", "int8", warm=True)
    assert resumed.returncode == 0, resumed.stderr
    assert book.read_bytes() == whole.read_bytes() and ids_path(book).read_bytes() == ids_path(whole).read_bytes()

    hybrid = tmp_path / "hybrid.txt"
    refused = specchat("write", "--out", str(hybrid), "--tokens", "8", "--attention", "hybrid", *int8, warm=True)
    assert_one_line_error(refused, "--kv-cache int8 needs the compiled CPU decoder")
    assert not hybrid.exists()


def test_a_book_remembers_its_prompt_cache_and_a_plain_resume_reads_it(tmp_path):
    """`--prompt-cache` once: the book keeps the file's path, a plain `--resume` reads the cache kept at the stop
    (and keeps it again), and the text is an unbroken run's. A remembered file that turned into something else is
    refused, and left as it is."""
    seeded = ("--seed", "5", "--drafter", "ngram")
    whole, book, cache = tmp_path / "whole.txt", tmp_path / "book.txt", tmp_path / "book.kv"
    assert specchat("write", "--out", str(whole), "--tokens", "48", *seeded, warm=True).returncode == 0
    written = specchat("write", "--out", str(book), "--tokens", "24", "--prompt-cache", str(cache), *seeded, warm=True)
    assert written.returncode == 0, written.stderr
    assert json.loads(state_path(book).read_text())["progress"]["prompt_cache"] == str(cache)
    kept = cache.stat().st_mtime_ns
    resumed = specchat("write", "--out", str(book), "--resume", "--tokens", "48", warm=True)
    assert resumed.returncode == 0, resumed.stderr
    assert book.read_bytes() == whole.read_bytes() and cache.stat().st_mtime_ns > kept  # read, and kept again

    cache.write_text("not a cache")
    refused = specchat("write", "--out", str(book), "--resume", "--tokens", "60", warm=True)
    assert_one_line_error(refused, "is not a specchat prompt cache", "the file this book remembers")
    assert cache.read_text() == "not a cache"


@pytest.mark.slow
def test_a_book_stretched_by_yarn_resumes_stretched(tmp_path):
    """`--yarn` is part of a book's arithmetic: kept with the book, taken again by `--resume`; another stretch is
    refused and leaves the book as it was."""
    book = tmp_path / "book.txt"
    written = specchat("write", "--out", str(book), "--tokens", "16", "--yarn", "2", *COMMON[2:], warm=True)
    assert written.returncode == 0, written.stderr
    assert json.loads(state_path(book).read_text())["settings"]["yarn"] == 2.0

    files = [book.read_bytes(), ids_path(book).read_bytes(), state_path(book).read_text()]
    refused = specchat("write", "--out", str(book), "--resume", "--tokens", "24", "--yarn", "3", warm=True)
    assert_one_line_error(refused, "would change the book's text", "yarn: was 2.0, now 3.0")
    assert [book.read_bytes(), ids_path(book).read_bytes(), state_path(book).read_text()] == files

    resumed = specchat("write", "--out", str(book), "--resume", "--tokens", "24", warm=True)
    assert resumed.returncode == 0, resumed.stderr
    state = json.loads(state_path(book).read_text())
    assert state["settings"]["yarn"] == 2.0 and state["progress"]["tokens"] == 24


def test_bad_input_is_one_line_and_loses_nothing(tmp_path, monkeypatch, capfd):
    # in this process (`specchat_in_process`): each is refused before any model loads
    write = functools.partial(specchat_in_process, monkeypatch, capfd, "write")
    book = tmp_path / "book.txt"
    book.write_text("my novel")
    assert_one_line_error(write("--out", str(book)), "exists", "--resume", "--force")
    assert book.read_text() == "my novel"
    assert_one_line_error(write("--out", str(book), "--resume"), "nothing to resume")
    state_path(book).write_text("{not json")
    assert_one_line_error(write("--out", str(book), "--resume"), "not a specchat book state")
    state_path(book).write_text(json.dumps({"format": "specchat-book/1", "settings": {"model": "x"}, "progress": {}}))
    assert_one_line_error(write("--out", str(book), "--resume"), "not a specchat book state")
    assert book.read_text() == "my novel"
    for args, needle in [
        (("--tokens", "-5"), "--tokens must be at least 1"),
        (("--resume", "--force"), "choose one"),
        (("--prompt", "a", "--prompt-file", "p.txt"), "not both"),
        (("--prompt", "   "), "the prompt is empty"),
        (("--prompt-file", str(tmp_path / "missing.txt")), "cannot read the prompt file"),
        (("--penalty", "0"), "--penalty must be"),
        (("--kv-cache", "q4"), "invalid --kv-cache 'q4'; use auto, bf16, int8"),
        (("--drafter", "psychic"), "unknown drafter"),
        (("--drafter", "ngram", "--no-draft-forward"), "--draft-forward is for the tokenswift drafter, not ngram"),
        (("--drafter", "tokenswift", "--draft-kv-budget", "64", "--no-draft-forward"),
         "which --no-draft-forward leaves out"),
    ]:
        assert_one_line_error(write("--out", str(tmp_path / "new.txt"), *args), needle)
    assert not (tmp_path / "new.txt").exists()


def test_a_path_that_cannot_take_a_book_is_refused_before_loading(tmp_path):
    """Each answered in one line before torch is imported (they used to come after a 9-23 s model load)."""
    existing = tmp_path / "existing.txt"
    existing.write_text("my novel")
    for args, needle in [
        (("--out", str(existing)), "exists; --resume continues it, --force overwrites it"),
        (("--out", "/dev/full", "--force"), "/dev/full is not a regular file"),
        (("--out", str(tmp_path / "missing" / "dir" / "book.txt")),
         f"the directory {tmp_path}/missing/dir does not exist"),
        (("--out", str(tmp_path)), "is a directory"),
    ]:
        result = refused_before_loading("write", *args)
        assert_one_line_error(result, needle)
        assert result.stdout.strip() == "False", args
    assert existing.read_text() == "my novel"


def test_a_read_only_directory_is_refused_before_loading(tmp_path):
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):  # root writes anywhere
            pytest.skip("this user can write to a read-only directory")
        assert_one_line_error(specchat("write", "--out", str(tmp_path / "b.txt"), "--tokens", "5"), "cannot write into")
    finally:
        os.chmod(tmp_path, 0o700)
