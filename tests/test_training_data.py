"""Self-distillation data: prompts from the standard library, package docs and chat; the target's own answers
in resumable shards; bench prompts kept out."""

from __future__ import annotations

import gzip
import itertools
import json
import textwrap
from array import array

import pytest
from test_cli import assert_one_line_error, specchat
from tui_harness import tiny_loaded

from specchat.bench.prompts import PROMPT_SETS
from specchat.engine.generate import Engine
from specchat.engine.sampling_config import SamplingConfig
from specchat.errors import SpecchatError
from specchat.training import book_data
from specchat.training import prompts as prompt_sources
from specchat.training.data import DataRecipe, build_data, read_records
from specchat.training.prompts import Prompt, all_prompts, doc_prompts, file_prompts, stdlib_prompts
from specchat.training.samples import samples_of
from specchat.training.text_data import CHARS_PER_TOKEN, TEXT_TOKENS, build_text_data, stdlib_chunks

MODULE = textwrap.dedent('''
    """A module."""

    def area(width, height=1):
        """The area of a rectangle of this width and height, in square units."""
        return width * height


    def _private(x):
        """Private helpers are not prompts, whatever their docstring says."""
        return x


    def terse(x):
        """Too short."""
        return x


    class Counter:
        """Counts things one at a time and reports how many it has seen so far."""

        def add(self):
            self.n += 1
''')


@pytest.fixture
def stdlib(tmp_path):
    root = tmp_path / "lib"
    (root / "shapes").mkdir(parents=True)
    (root / "shapes" / "plane.py").write_text(MODULE)
    (root / "_hidden.py").write_text(MODULE)  # private module
    (root / "test_shapes.py").write_text(MODULE)  # tests
    return root


def test_stdlib_prompts_explain_summarize_and_write_documented_public_code(stdlib):
    prompts = stdlib_prompts(stdlib)
    assert [p.source for p in prompts] == ["stdlib-explain", "stdlib-summarize", "stdlib-write",
                                           "stdlib-explain", "stdlib-summarize"]  # fmt: skip
    explain, summarize, write, class_explain, _ = (p.turns[0] for p in prompts)
    assert explain.startswith("Explain what this function from Python's `shapes.plane` module does:")
    assert "def area(width, height=1):" in explain and "return width * height" in explain
    assert summarize == ("Summarize this documentation of `shapes.plane.area` in a few sentences:\n\n"
                         "The area of a rectangle of this width and height, in square units.")  # fmt: skip
    assert write == ("Write a Python function `area(width, height=1)`: "
                     "The area of a rectangle of this width and height, in square units.")  # fmt: skip
    assert class_explain.startswith("Explain what this class from Python's `shapes.plane` module does:")


def test_doc_prompts_read_plain_and_gzipped_readmes(tmp_path):
    text = "This tool compresses files. " * 20
    (tmp_path / "zip-tool").mkdir()
    (tmp_path / "zip-tool" / "README.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "README").write_text("Too short to summarize.")
    prompts = doc_prompts(tmp_path)
    assert [p.source for p in prompts] == ["docs-summarize", "docs-explain"]
    assert prompts[0].turns[0] == f"Summarize this README of the `zip-tool` package:\n\n{text.strip()}"
    assert doc_prompts(tmp_path / "missing") == []


def test_all_prompts_are_unique_mixed_seeded_and_keep_the_bench_out(stdlib, tmp_path, monkeypatch):
    bench_prompt = PROMPT_SETS["chat"][0]
    chat = prompt_sources.chat_prompts()
    monkeypatch.setattr(prompt_sources, "chat_prompts", lambda: chat + [Prompt("chat", (bench_prompt,))] * 2)
    prompts = all_prompts(0, stdlib=stdlib, docs=None)
    assert len({p.id for p in prompts}) == len(prompts) == len(chat) + 5
    assert bench_prompt not in {p.turns[0] for p in prompts}
    assert {p.source.split("-")[0] for p in prompts[:2]} == {"chat", "stdlib"}  # families taken in turn
    assert all_prompts(0, stdlib=stdlib, docs=None) == prompts
    assert all_prompts(1, stdlib=stdlib, docs=None) != prompts
    assert any(len(p.turns) == 2 for p in chat)  # follow-up turns


def _recipe(**changes) -> DataRecipe:
    return DataRecipe(**{"model": "tiny-llama", "weights": "float32", "dtype": "float32", "seed": 0,
                         "max_new_tokens": 6, "heldout": 0.3, "sampled": 0.5, **changes})  # fmt: skip


PROMPTS = [Prompt("chat", (f"Tell me about the number {i}.",)) for i in range(12)] + [
    Prompt("chat", ("Name a colour.", "Another one."))
]


def test_the_targets_own_answers_in_shards_with_splits_and_resume(tokenizer, tmp_path, monkeypatch):
    loaded = tiny_loaded(tokenizer)
    out = tmp_path / "data"
    first = build_data(loaded, out, PROMPTS, _recipe(), tokens=20)
    assert first.answer_tokens >= 20 and first.records < len(PROMPTS)
    records = first_records = list(read_records(out))
    assert {r["split"] for r in records} == {"train", "heldout"}
    assert len(list(read_records(out, "train"))) + len(list(read_records(out, "heldout"))) == len(records)
    greedy = next(r for r in records if r["sampling"] == "greedy")
    engine = Engine(loaded.model, loaded.tokenizer, max_len=2048)
    expected = [t for e in engine.generate(greedy["prompt_ids"], sampling=SamplingConfig(), max_new_tokens=6)
                for t in e.tokens]  # fmt: skip
    assert greedy["answer_ids"] == expected  # the target's own output, exactly
    assert greedy["messages"][0]["role"] == "user" and greedy["messages"][-1]["role"] == "assistant"

    shard = next(out.glob("*-00000.jsonl"))
    shard.write_text(shard.read_text() + '{"id": "cut by a stop')  # a run stopped mid-line
    done = build_data(loaded, out, PROMPTS, _recipe(), tokens=10_000)  # resumes: every prompt, once
    records = list(read_records(out))
    assert done.records == len(PROMPTS) == len({r["id"] for r in records})
    assert [r["turn"] for r in records if r["id"] == PROMPTS[-1].id] == [0, 1]
    for split in ("train", "heldout"):  # what the first run wrote stays, the rest follows it
        before = [r for r in first_records if r["split"] == split]
        assert list(read_records(out, split))[: len(before)] == before
    assert all(json.loads(line) for path in out.glob("*.jsonl") for line in path.read_text().splitlines())
    with pytest.raises(SpecchatError, match="another recipe .*max_new_tokens 6 -> 8"):
        build_data(loaded, out, PROMPTS, _recipe(max_new_tokens=8), tokens=10)


def test_full_shards_are_sealed_as_gzip_and_read_back_in_order(tokenizer, tmp_path, monkeypatch):
    """Shards of 3 records: each full one is sealed as .jsonl.gz, the growing one stays plain; a plain copy a
    stop left beside its sealed one is not read twice, and a resumed run goes on after the sealed shards."""
    from specchat.training import data

    monkeypatch.setattr(data, "RECORDS_PER_SHARD", 3)
    loaded = tiny_loaded(tokenizer)
    out = tmp_path / "data"
    build_data(loaded, out, PROMPTS[:8], _recipe(heldout=0.0), tokens=10_000)
    names = sorted(path.name for path in out.glob("train-*"))
    assert names == ["train-00000.jsonl.gz", "train-00001.jsonl.gz", "train-00002.jsonl"]
    first = list(read_records(out))
    assert len(first) == 8 and len(gzip.decompress((out / names[0]).read_bytes()).splitlines()) == 3

    (out / "train-00001.jsonl").write_bytes(gzip.decompress((out / names[1]).read_bytes()))  # stopped mid-seal
    assert list(read_records(out)) == first
    done = build_data(loaded, out, PROMPTS, _recipe(heldout=0.0), tokens=10_000)
    records = list(read_records(out))
    assert done.records == len(PROMPTS) == len({r["id"] for r in records}) and records[:8] == first


def _long_module(lines: int) -> str:
    return "\n".join(f"value_{i} = compute({i}, 'a line of code of about forty characters')" for i in range(lines))


@pytest.fixture
def stdlib_text(tmp_path):
    root = tmp_path / "text"
    (root / "shapes").mkdir(parents=True)
    (root / "pydoc_data").mkdir()
    (root / "shapes" / "plane.py").write_text(_long_module(300))
    (root / "small.py").write_text("x = 1\n")
    (root / "pydoc_data" / "topics.py").write_text(MODULE)  # the long bench sets' text: never trained on
    (root / "_hidden.py").write_text(MODULE)
    (root / "test_shapes.py").write_text(MODULE)
    return root


def test_stdlib_text_comes_in_chunks_of_whole_lines_bench_tests_and_private_modules_skipped(stdlib_text):
    chunks = list(stdlib_chunks(0, stdlib_text))
    assert {chunk.module for chunk in chunks} == {"shapes.plane", "small"}
    plane = [chunk for chunk in chunks if chunk.module == "shapes.plane"]
    assert "\n".join(chunk.text for chunk in plane) == _long_module(300)  # every line, once, in order
    assert plane[0].first_line == 1 and plane[-1].last_line == 300
    assert all(a.last_line + 1 == b.first_line for a, b in itertools.pairwise(plane))
    assert all(len(chunk.text) < TEXT_TOKENS * CHARS_PER_TOKEN + 80 for chunk in plane) and len(plane) > 1
    assert len({chunk.id for chunk in chunks}) == len(chunks)
    orders = {next(stdlib_chunks(seed, stdlib_text)).module for seed in range(8)}
    assert orders == {"shapes.plane", "small"}  # the seed orders the modules


def test_text_records_show_the_text_as_an_answer_in_resumable_shards(tokenizer, stdlib_text, tmp_path):
    loaded = tiny_loaded(tokenizer)
    out = tmp_path / "data"
    recipe = _recipe(kind="text", max_new_tokens=TEXT_TOKENS, sampled=0.0, heldout=0.3)
    first = build_text_data(loaded, out, recipe, tokens=1, chunks=stdlib_chunks(0, stdlib_text))
    assert first.records == 1
    done = build_text_data(loaded, out, recipe, tokens=10**9, chunks=stdlib_chunks(0, stdlib_text))  # resumes
    records = list(read_records(out))
    chunks = list(stdlib_chunks(0, stdlib_text))
    assert done.records == len(records) == len(chunks) and {r["split"] for r in records} == {"train", "heldout"}
    by_id = {record["id"]: record for record in records}
    for chunk in chunks:
        record = by_id[chunk.id]
        fenced = loaded.tokenizer.encode(f"```python\n{chunk.text}\n```", add_special_tokens=False)
        assert record["answer_ids"] == fenced[:TEXT_TOKENS] and record["sampling"] == "text"
        assert loaded.tokenizer.decode(record["prompt_ids"]).count(chunk.module) == 1
    assert not any(sample.greedy for sample in samples_of(records))  # never in greedy chain tau
    with pytest.raises(SpecchatError, match="another recipe .*kind text -> answers"):
        build_data(loaded, out, PROMPTS, _recipe(max_new_tokens=TEXT_TOKENS, sampled=0.0), tokens=10)


def test_train_data_rejects_bad_options_in_one_line(tmp_path):
    assert_one_line_error(specchat("train", "data", "--out", str(tmp_path), "--heldout", "1.5"), "--heldout")
    assert_one_line_error(specchat("train", "data", "--out", str(tmp_path), "--tokens", "0"), "--tokens")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "Hello"}\n{"turns": ["Hi", ""]}\n')
    assert_one_line_error(specchat("train", "data", "--out", str(tmp_path / "d"), "--prompts", str(bad)), "bad.jsonl:2")
    assert_one_line_error(specchat("train", "data", "--out", str(tmp_path / "d"), "--prompts", str(tmp_path / "no")),
                          "no such prompts file")
    assert_one_line_error(specchat("train", "data", "--out", str(tmp_path / "d"), "--prompts", str(bad), "--text"),
                          "--prompts")
    assert not (tmp_path / "d").exists()


def test_a_prompts_file_is_answered_in_its_order_without_duplicates_or_bench_prompts(tokenizer, tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [{"prompt": "Name a fruit."}, {"turns": ["Name a city.", "Another one."]}, {"prompt": "Name a fruit."},
             {"prompt": PROMPT_SETS["chat"][1]}, {"prompt": "Name a river."}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    prompts = file_prompts(path)
    assert [p.turns for p in prompts] == [("Name a fruit.",), ("Name a city.", "Another one."), ("Name a river.",)]
    for text, error in [("[1]", "mine.jsonl:1: expected"), ('{"turns": []}', "non-empty"), ('{"prompt": 3}', ":1:"),
                        ("{not json", "expected"), (json.dumps({"prompt": PROMPT_SETS["code"][0]}), "no prompts")]:
        path.write_text(text + "\n")
        with pytest.raises(SpecchatError, match=error):
            file_prompts(path)
    path.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(SpecchatError, match="not UTF-8"):
        file_prompts(path)

    loaded, out = tiny_loaded(tokenizer), tmp_path / "data"
    build_data(loaded, out, prompts, _recipe(heldout=0.0, prompts="mine.jsonl"), tokens=10_000)
    records = list(read_records(out))
    assert [(r["id"], r["turn"]) for r in records] == [(prompts[0].id, 0), (prompts[1].id, 0), (prompts[1].id, 1),
                                                        (prompts[2].id, 0)]  # fmt: skip
    assert records[2]["messages"][2] == {"role": "user", "content": "Another one."}
    assert {r["source"] for r in records} == {"file"}
    with pytest.raises(SpecchatError, match="another recipe .*prompts mine.jsonl -> None"):
        build_data(loaded, out, PROMPTS, _recipe(heldout=0.0), tokens=10)


def test_the_targets_own_books_cut_into_records_held_out_whole_and_resumed(tokenizer, tmp_path, monkeypatch):
    """Books at the writer's settings, cut into records of BOOK_ANSWER tokens after BOOK_CONTEXT tokens of the
    book (its prompt before the first); a book is held out or trained on whole; a rerun writes only the books
    still missing."""
    monkeypatch.setattr(book_data, "BOOK_ANSWER", 20)
    monkeypatch.setattr(book_data, "BOOK_CONTEXT", 8)
    loaded = tiny_loaded(tokenizer)
    out = tmp_path / "data"
    recipe = _recipe(kind="books", max_new_tokens=50, sampled=1.0, heldout=0.5)
    first = book_data.build_book_data(loaded, out, recipe, tokens=1)
    assert (first.records, first.answer_tokens) == (3, 50)
    records = list(read_records(out))
    (book,) = (out / "books").glob("*.txt")
    ids = array("I", book.with_name(book.name + ".specchat.ids").read_bytes()).tolist()
    generated = ids[-50:]
    assert [r["answer_ids"] for r in records] == [generated[:20], generated[20:40], generated[40:]]
    assert records[0]["prompt_ids"] == ids[:-50]  # the chat prompt
    assert [r["prompt_ids"] for r in records[1:]] == [generated[12:20], generated[32:40]]
    settings = records[0]["sampling"]
    assert (settings["temperature"], settings["min_p"], settings["penalty"]) == (1.0, 0.1, 1.2)
    assert not any(sample.greedy for sample in samples_of(records))  # never in greedy chain tau

    done = book_data.build_book_data(loaded, out, recipe, tokens=200)  # resumes: three books more
    records = list(read_records(out))
    assert (done.records, done.answer_tokens) == (12, 200) == (len(records), sum(len(r["answer_ids"]) for r in records))
    assert [r for r in records if r["source"] == records[0]["source"]] == records[:3]  # the first book, once
    sources = {r["source"] for r in records}
    splits = {source: {r["split"] for r in records if r["source"] == source} for source in sources}
    assert len(splits) == 4 and all(len(split) == 1 for split in splits.values())
    assert len(list((out / "books").glob("*.txt"))) == 4


def test_books_are_not_text(tmp_path):
    assert_one_line_error(specchat("train", "data", "--out", str(tmp_path), "--books", "100", "--text"), "--books")
