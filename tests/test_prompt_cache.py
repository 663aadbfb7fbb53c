"""A prompt's keys and values in a file (`engine/prompt_cache.py`, `run --prompt-cache`) on the default model's CPU
decoder: a later prompt that shares a prefix with the file's reads it back instead of prefilling it, and answers
exactly as a new engine does, with a bf16 cache and an int8 one, with and without a drafter; a file of another
model or cache format is not read; a file that is not a prompt cache is never overwritten; a book resumed from the
cache kept at its stop goes on without a replay, as one unbroken run."""

from __future__ import annotations

import json
import subprocess

import pytest
from test_cli import assert_one_line_error, refused_before_loading, specchat

from specchat.checks import safetensors_metadata
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_chat
from specchat.engine.prompt_cache import read_prompt_cache, write_prompt_cache
from specchat.engine.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0)
DOCUMENT = "The lighthouse keeper wrote down every ship that passed, its flag, its cargo and the hour. " * 20


@pytest.fixture(scope="module")
def default_model():
    """The embedded model as `run` loads it: its own 4-bit weights on the CPU decoder."""
    from specchat.loading import load_model

    return load_model(None)


def ids_of(tokenizer, question: str) -> list[int]:
    message = [{"role": "user", "content": f"{DOCUMENT}\n\n{question}"}]
    return encode_chat(tokenizer, message)


def answer(engine: Engine, ids: list[int]) -> tuple[list[int], int]:
    tokens, stats = [], None
    for event in engine.generate(ids, sampling=GREEDY, max_new_tokens=16):
        tokens += event.tokens
        stats = event.stats
    return tokens, stats.reused_tokens


def engine_of(loaded, kv_cache: str = "auto", drafter: str = "none") -> Engine:
    from specchat.drafters import attach_drafter

    engine = Engine(loaded.model, loaded.tokenizer, max_len=1024, kv_cache=kv_cache)
    attach_drafter(engine, loaded.source, drafter)
    return engine


@pytest.mark.parametrize(("kv_cache", "drafter"), [("auto", "none"), ("int8", "none"), ("auto", "ngram"),
                                                 ("auto", "longspec")])  # fmt: skip
def test_a_later_prompt_reads_the_shared_prefix_back_and_answers_as_a_new_engine(default_model, tmp_path, kv_cache,
                                                                                  drafter):  # fmt: skip
    first = ids_of(default_model.tokenizer, "Who kept the record?")
    second = ids_of(default_model.tokenizer, "What did the keeper write down?")
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    path = tmp_path / "document.safetensors"
    writer = engine_of(default_model, kv_cache, drafter)
    answer(writer, first)
    assert write_prompt_cache(writer, path)
    assert safetensors_metadata(path)["kind"] == "specchat prompt cache"

    reader = engine_of(default_model, kv_cache, drafter)  # a new process's engine: nothing cached
    assert read_prompt_cache(reader, path, second) == shared > len(second) // 2
    tokens, reused = answer(reader, second)
    assert reused == shared
    assert tokens == answer(engine_of(default_model, kv_cache, drafter), second)[0]  # bitwise a whole prefill's
    assert read_prompt_cache(engine_of(default_model, kv_cache), path, first) == len(first) - 1  # the last runs


def test_a_conversation_going_on_reads_its_last_answer_back_too(default_model, tmp_path):
    """The file holds the prompt and its answer, as the next turn's prompt does (llama.cpp's --prompt-cache-all)."""
    tokenizer, path = default_model.tokenizer, tmp_path / "conversation.safetensors"
    messages = [{"role": "user", "content": f"{DOCUMENT}\n\nWho kept the record?"}]
    first = ids_of(tokenizer, "Who kept the record?")
    writer = engine_of(default_model)
    reply, _ = answer(writer, first)
    write_prompt_cache(writer, path)
    messages += [{"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True)},
                 {"role": "user", "content": "And when?"}]  # fmt: skip
    second = encode_chat(tokenizer, messages)
    assert second[: len(first) + len(reply) - 1] == first + reply[:-1]  # the answer, as the template writes it back
    reader = engine_of(default_model)
    assert read_prompt_cache(reader, path, second) >= len(first) + len(reply) - 1
    assert answer(reader, second)[0] == answer(engine_of(default_model), second)[0]


def test_a_file_of_another_cache_format_is_not_read_and_writing_replaces_it(default_model, tmp_path):
    ids = ids_of(default_model.tokenizer, "Who kept the record?")
    path = tmp_path / "document.safetensors"
    bf16 = engine_of(default_model, "auto")
    answer(bf16, ids)
    write_prompt_cache(bf16, path)
    int8 = engine_of(default_model, "int8")
    assert read_prompt_cache(int8, path, ids) == 0
    answer(int8, ids)
    assert write_prompt_cache(int8, path)
    assert json.loads(safetensors_metadata(path)["identity"])["kv_cache"] == "int8"


@pytest.mark.slow
def test_run_reads_and_writes_the_file_and_answers_as_without_it(default_model, tmp_path):
    path = tmp_path / "document.safetensors"
    reports = []
    for question, cache in [("Who kept the record?", True), ("What did the keeper write down?", True),
                            ("What did the keeper write down?", False)]:  # fmt: skip
        args = ["run", "-", "--temperature", "0", "-n", "12", "--json"] + (["--prompt-cache", str(path)] * cache)
        result = specchat(*args, stdin=f"{DOCUMENT}\n\n{question}", warm=True)
        assert result.returncode == 0, result.stderr
        reports.append(json.loads(result.stdout))
    assert reports[0]["reused_tokens"] == 0 and reports[2]["reused_tokens"] == 0
    assert reports[1]["reused_tokens"] > reports[1]["prompt_tokens"] // 2
    assert reports[1]["token_ids"] == reports[2]["token_ids"]
    assert path.exists() and not list(tmp_path.glob(".*.partial"))


def test_a_file_that_is_not_a_prompt_cache_is_refused_and_left_as_it_is(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    result = refused_before_loading("run", "hi", "--prompt-cache", str(notes))
    assert_one_line_error(result, "is not a specchat prompt cache (left as it is)")
    assert result.stdout.strip() == "False" and notes.read_text() == "my notes"  # torch never imported
    assert_one_line_error(refused_before_loading("run", "hi", "--prompt-cache", str(tmp_path)), "is a directory")
    assert_one_line_error(refused_before_loading("run", "hi", "--prompt-cache", str(tmp_path / "no" / "file")),
                          "does not exist")  # fmt: skip


def test_a_forward_whose_reuse_is_not_exact_is_refused(tmp_path):
    path = tmp_path / "document.safetensors"
    result = specchat("run", "hi", "-n", "1", "--prompt-cache", str(path), "--attention", "hybrid", warm=True)
    assert_one_line_error(result, "--prompt-cache needs the CPU decoder")
    assert not path.exists()


@pytest.fixture
def full_disk(tmp_path):
    """A directory on a 64 KB filesystem of its own (a tmpfs: root only), which no prompt cache fits."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_answer(full_disk):
    path = full_disk / "document.safetensors"
    result = specchat("run", "-", "--temperature", "0", "-n", "4", "--json", "--prompt-cache", str(path),
                      stdin=f"{DOCUMENT}\n\nWho kept the record?", warm=True)  # fmt: skip
    assert result.returncode == 0 and json.loads(result.stdout)["new_tokens"] == 4
    assert result.stderr.strip().startswith(f"warning: --prompt-cache {path} not written:")
    assert "No space left on device" in result.stderr and not list(full_disk.iterdir())  # no partial file left


def test_a_file_cut_short_is_prefilled_past_with_a_warning_and_replaced(default_model, tmp_path):
    path = tmp_path / "document.safetensors"
    ids = ids_of(default_model.tokenizer, "Who kept the record?")
    engine = engine_of(default_model)
    answer(engine, ids)
    write_prompt_cache(engine, path)
    with path.open("r+b") as file:  # a copy that stopped halfway
        file.truncate(path.stat().st_size // 2)
    stdin = f"{DOCUMENT}\n\nWho kept the record?"
    result = specchat("run", "-", "--temperature", "0", "-n", "4", "--json", "--prompt-cache", str(path), stdin=stdin,
                      warm=True)  # fmt: skip
    assert result.returncode == 0 and json.loads(result.stdout)["reused_tokens"] == 0
    assert result.stderr.startswith(f"warning: --prompt-cache {path} cannot be read (")
    assert read_prompt_cache(engine_of(default_model), path, ids) == len(ids) - 1  # whole again


def test_a_book_resumed_from_its_cache_file_goes_on_as_one_run_without_a_replay(default_model, tmp_path):
    """`write --prompt-cache`: the cache kept at the stop, after refills, is read back by the resume, which then
    replays nothing and writes what an unbroken run writes (sampled, keyed by position, with the penalty)."""
    from specchat.drafters.ngram.drafter import NgramDrafter
    from specchat.writer.book import Book
    from specchat.writer.settings import BookSettings, prompt_digest
    from specchat.writer.write import write_book

    prompt = ids_of(default_model.tokenizer, "Tell the keeper's story.")

    def book_at(path, engine) -> Book:
        settings = BookSettings(model="smollm2-135m", weights="q4_1", dtype="bfloat16", kv_cache="auto", yarn=None,
                                prompt_sha256=prompt_digest(prompt), prompt_tokens=len(prompt), temperature=1.0,
                                top_k=0, top_p=1.0, min_p=0.1, min_p_keep=20, penalty=1.2, penalty_window=64, seed=3,
                                stop_at_eos=False, context=engine.capacity, refill_chunk=64)  # fmt: skip
        return Book.create(path, settings, prompt, force=True)

    def engine() -> Engine:
        return Engine(default_model.model, default_model.tokenizer, max_len=len(prompt) + 96, drafter=NgramDrafter())

    whole = book_at(tmp_path / "whole.txt", first := engine())
    write_book(first, whole, 240)
    whole.close()
    assert whole.progress.refills >= 2

    cache, stopped = tmp_path / "book.safetensors", book_at(tmp_path / "book.txt", second := engine())
    write_book(second, stopped, 150, prompt_cache=cache)
    stopped.close()
    assert stopped.progress.refills >= 1 and stopped.progress.segment_start < 150
    replaying = []
    resumed = Book.open(tmp_path / "book.txt")
    resumed.progress.finished = None  # as `write --resume --tokens 240` asks
    write_book(engine(), resumed, 240, prompt_cache=cache, status=lambda status: replaying.append(status.replaying))
    resumed.close()
    assert resumed.generated == whole.generated and not any(replaying)


@pytest.mark.asyncio
async def test_a_chat_keeps_its_conversation_and_the_next_chat_reads_it(default_model, tmp_path):
    """`chat --prompt-cache`: kept after each answer (not after the warm-up, which would overwrite the last session's),
    read by a later chat whose first message is the same document, and by a `/load` of the whole conversation."""
    from tui_harness import ask, ready, send

    path, saved, question = tmp_path / "chat.safetensors", tmp_path / "chat.json", f"{DOCUMENT}\n\nWho kept the record?"
    app = make_app_of(default_model, path, max_new_tokens=8)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        first = await ask(pilot, question)
        asked = app.session.last_figures.prompt_tokens
        assert app.session.last_figures.reused_tokens < asked // 4
        await send(pilot, f"/save {saved}")
    app = make_app_of(default_model, path, max_new_tokens=8)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        again = await ask(pilot, question)
        figures = app.session.last_figures
        assert figures.reused_tokens == figures.prompt_tokens - 1 and again.token_ids == first.token_ids
    app = make_app_of(default_model, path, max_new_tokens=8)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, f"/load {saved}")
        await ask(pilot, "And when?")
        assert app.session.last_figures.reused_tokens >= asked + len(first.token_ids) - 1  # the answer's too


@pytest.mark.asyncio
async def test_a_chat_quit_mid_answer_keeps_what_it_had_before_exiting(default_model, tmp_path):
    from tui_harness import ready, send, wait_until

    from specchat.tui.answer_stream import AnswerEnd

    path = tmp_path / "chat.safetensors"
    app = make_app_of(default_model, path, max_new_tokens=3000)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, f"{DOCUMENT}\n\nTell the keeper's story at length.")
        # the first tokens show at once; later ones wait on the redraw budget, which this polling spends
        await wait_until(pilot, lambda: len(app.session.messages[-1].token_ids) >= 1, 180, "the first tokens")
        prompt, stream = app.session.previous.ids, app.answer
        app.exit()  # Ctrl+Q: the app waits for the stopped answer's cache to be written
    assert stream.drain()[-1] == AnswerEnd("stopped")
    assert read_prompt_cache(engine_of(default_model), path, prompt) == len(prompt) - 1


def make_app_of(loaded, path, **settings):
    from tui_harness import make_app

    return make_app(loaded, SamplingConfig(temperature=0), prompt_cache=path, **settings)
