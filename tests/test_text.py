"""`TextStream` turns streamed token ids into exactly the text a one-shot decode gives, and honours stop strings.

Proven here, with the default model's real tokenizer: token-at-a-time (or chunked) streaming reproduces
`tokenizer.decode(ids, skip_special_tokens=True)` for English, runs of spaces and newlines, special tokens and
multi-byte characters split across tokens, never emitting U+FFFD and never lagging once a character is whole;
the output stops right before a stop string (also one spanning several tokens or added in one chunk with text
after it), never shows a stop string's text, holds back a possible stop prefix until `flush()`; with several
stop strings the earliest wins; empty stop strings are ignored.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from specchat.engine.text import TextStream
from specchat.loading import embedded_checkpoint

FFFD = "\ufffd"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(embedded_checkpoint())


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def stream(tok, ids: list[int], stop: tuple[str, ...] = (), chunk: int = 1, stop_feeding: bool = True):
    """Feed `ids` `chunk` at a time, as the engine does (no more tokens once stopped).

    Returns (the text of each add, the flushed tail, the stream)."""
    s = TextStream(tok, stop)
    pieces = []
    for i in range(0, len(ids), chunk):
        pieces.append(s.add(ids[i : i + chunk]))
        if stop_feeding and s.stopped:
            break
    return pieces, s.flush(), s


ENGLISH = "Hello world, it's a test. The quick brown fox jumps over the lazy dog; 3.14 isn't 22/7!"
WHITESPACE = "a  b\n\n  c\t d   e\n\n\n\nf      g \n"
MULTIBYTE = "héllo 😀 日本語 ünïcödé 🎉👍🏽 naïve café — Ωμέγα, привет, 🇫🇷!"
CHAT = "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nnext"


@pytest.mark.parametrize("text", [ENGLISH, WHITESPACE, MULTIBYTE, CHAT], ids=["english", "spaces", "utf8", "chat"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_streaming_reproduces_one_shot_decode(tok, text, chunk):
    ids = encode(tok, text)
    full = tok.decode(ids, skip_special_tokens=True)
    pieces, tail, s = stream(tok, ids, chunk=chunk)
    assert "".join(pieces) + tail == full
    assert tail == ""  # without stop strings nothing is held back
    assert not s.stopped
    assert all(FFFD not in piece for piece in pieces)


@pytest.mark.parametrize("text", [ENGLISH, WHITESPACE, MULTIBYTE])
def test_streamed_text_is_never_late_nor_wrong(tok, text):
    """After each token the shown text is a prefix of the final text, and equals the decode of the ids so far
    whenever that decode holds no incomplete character."""
    ids = encode(tok, text)
    full = tok.decode(ids, skip_special_tokens=True)
    s = TextStream(tok)
    shown = ""
    for i, token in enumerate(ids):
        shown += s.add([token])
        assert full.startswith(shown)
        so_far = tok.decode(ids[: i + 1], skip_special_tokens=True)
        if FFFD not in so_far:
            assert shown == so_far


def test_multibyte_characters_do_span_several_tokens(tok):
    """The utf8 case above really exercises partial characters: single tokens decode to U+FFFD."""
    ids = encode(tok, MULTIBYTE)
    partial = [i for i in ids if FFFD in tok.decode([i])]
    assert len(partial) >= 10
    assert tok.decode(ids) == MULTIBYTE


# --- stop strings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, stop, expected",
    [
        ("The answer is 42.\nUser: what next", "\nUser:", "The answer is 42."),  # stop spans 3 tokens
        ("Done. ###END### trailing words", "###END###", "Done. "),  # 3 tokens, one of them partly
        ("Say foobar now", "oob", "Say f"),  # stop inside a token and across a token boundary
        ("STOP right at the start", "STOP", ""),
        ("hi 😀 there and more", "😀", "hi "),  # stop made of a character split over two tokens
        ("日本語のテキストです。終わり", "終わり", "日本語のテキストです。"),
    ],
)
@pytest.mark.parametrize("chunk", [1, 2, 100])
def test_output_ends_right_before_the_stop_string(tok, text, stop, expected, chunk):
    ids = encode(tok, text)
    assert len(ids) > 2
    pieces, tail, s = stream(tok, ids, (stop,), chunk=chunk)
    assert s.stopped
    assert "".join(pieces) + tail == expected
    assert tail == ""  # once stopped, nothing is held back
    assert all(FFFD not in piece for piece in pieces)
    shown = ""
    for piece in pieces:  # no step ever showed text that the stop later took back
        shown += piece
        assert expected.startswith(shown)


def test_text_after_the_stop_in_the_same_add_is_dropped(tok):
    """A speculative step commits several tokens at once: the ones after the stop string never show."""
    ids = encode(tok, "Before.\nUser: after words")
    pieces, tail, s = stream(tok, ids, ("\nUser:",), chunk=len(ids))
    assert pieces == ["Before."] and tail == "" and s.stopped


def test_stop_string_must_end_in_new_text(tok):
    """A stop string whose characters arrive over many adds is found when its last character arrives."""
    ids = encode(tok, "alpha beta gamma delta epsilon")
    stop = " gamma delta"
    s = TextStream(tok, (stop,))
    shown = ""
    for i, token in enumerate(ids):
        shown += s.add([token])
        text_so_far = tok.decode(ids[: i + 1])
        assert s.stopped == (stop in text_so_far)
        if s.stopped:
            break
    assert shown + s.flush() == "alpha beta"


def test_prefix_of_a_stop_string_is_held_back_then_flushed(tok):
    ids = encode(tok, "Hello wor")
    pieces, tail, s = stream(tok, ids, ("world",))
    assert not s.stopped
    assert "".join(pieces) == "Hello"  # " wor" may still become "world"
    assert tail == " wor"
    assert s.flush() == ""  # flushing twice gives nothing more


def test_held_back_text_is_released_once_it_cannot_be_a_stop(tok):
    ids = encode(tok, "Hello wormhole and more text here")
    pieces, tail, s = stream(tok, ids, ("world",))
    assert not s.stopped
    assert "".join(pieces) + tail == "Hello wormhole and more text here"
    assert "Hello wormhole" in "".join(pieces)  # released before the end, not only by flush
    assert len(tail) <= len("world") - 1


@pytest.mark.parametrize("stops", [("STOP2", "STOP1"), ("STOP1", "STOP2")])
@pytest.mark.parametrize("chunk", [1, 100])
def test_earliest_of_several_stop_strings_wins(tok, stops, chunk):
    ids = encode(tok, "one STOP1 two STOP2 three")
    pieces, tail, s = stream(tok, ids, stops, chunk=chunk)
    assert s.stopped and "".join(pieces) + tail == "one "


@pytest.mark.parametrize("chunk", [1, 100])
def test_earliest_of_overlapping_stop_strings_wins(tok, chunk):
    """'Say foobar now' holds "foob" (from 4) and "bar" (from 7); both complete with token 'bar'."""
    ids = encode(tok, "Say foobar now")
    assert [tok.decode([i]) for i in ids] == ["Say", " foo", "bar", " now"]
    results = {}
    for stops in [("foob", "bar"), ("bar", "foob")]:
        pieces, tail, s = stream(tok, ids, stops, chunk=chunk)
        assert s.stopped
        results[stops] = "".join(pieces) + tail
    assert results == {("foob", "bar"): "Say ", ("bar", "foob"): "Say "}


def test_nothing_is_emitted_after_a_stop_even_if_fed_more(tok):
    ids = encode(tok, "He said END. More words follow")
    pieces, tail, s = stream(tok, ids, ("END",), stop_feeding=False)
    assert s.stopped
    assert "".join(pieces) + tail == "He said "


def test_empty_stop_strings_are_ignored(tok):
    ids = encode(tok, ENGLISH)
    full = tok.decode(ids)
    pieces, tail, s = stream(tok, ids, ("",))
    assert not s.stopped and tail == "" and "".join(pieces) == full  # no hold-back either
    pieces, tail, s = stream(tok, ids, ("", "zzz"))
    assert not s.stopped and "".join(pieces) + tail == full and len(tail) == 2  # holds back len("zzz") - 1
    pieces, tail, s = stream(tok, ids, ("", "fox"))
    assert s.stopped and "".join(pieces) + tail == full[: full.index("fox")]
