"""Which tokens of a vocabulary may come next under a byte automaton (a syntax: JSON's, a JSON Schema's, a GBNF
grammar's): one bool mask a state.

A syntax is `start`, `feed(state, byte)` (the state after one more byte, None where it cannot follow),
`complete(state)` (the text may end here), `steady(state)` (the bytes that leave the state as it is; one from 0x80
up stands for the UTF-8 characters it begins or continues) and `split_spaces(state)` (the state less its run of
whitespace bytes, and the run's length). States are hashable.

A token may come next when the automaton accepts every byte of it. Checking each of 150K tokens byte by byte
would take seconds a state, so the vocabulary is sorted by its bytes: the tokens that share a prefix are then a
range of rows, and a walk feeds each prefix once, leaving a range as soon as its next byte is refused (outside a
string most ranges end after a byte or two). Where the state has steady bytes (inside a JSON string, every byte from
0x20 up but `"` and `\\`; in a grammar's free text, the characters its repetition takes), the tokens made only of
such bytes from there on, in well-formed UTF-8, are accepted as a block and only the others are fed one by one.
Masks are cached by state, less its count of whitespace bytes in a row: a token fits after k of them if it fits
after none and its own leading whitespace is at most `MAX_WHITESPACE` - k (whatever follows a non-whitespace byte no
longer depends on k). So a JSON text meets few distinct states.
"""

from __future__ import annotations

import codecs
from collections import OrderedDict
from functools import cache

import numpy as np
import torch

from specchat.constraints.json_syntax import MAX_WHITESPACE, WHITESPACE

CACHED_MASKS = 512  # states whose masks are kept, least recently used dropped first
CACHED_STEADY_SETS = 64  # sets of steady bytes whose per-token tables are kept
SHORT_TOKEN = 16  # bytes: 98% of a 150K vocabulary's tokens are no longer
BLOCK_ROWS = 32  # fewer tokens than this left in a range are walked byte by byte: finding the steady bytes costs more


class Vocabulary:
    """A model's `size` ids (its logits may outnumber the tokenizer's tokens) whose bytes are `pieces` (None: a
    special token, never allowed), sorted by their bytes once for every syntax's masks."""

    def __init__(self, pieces: list[bytes | None], size: int):
        self.size, self.pieces = size, pieces
        ids = sorted((i for i, piece in enumerate(pieces) if piece and i < size), key=lambda i: pieces[i])
        self.ids = np.array(ids, dtype=np.int64)  # row -> id
        self.sorted_pieces = [pieces[i] for i in ids]
        lengths = np.array([len(piece) for piece in self.sorted_pieces])
        width = int(lengths.max()) + 1
        padded = b"".join(piece.ljust(width, b"\0") for piece in self.sorted_pieces)
        self.bytes = np.frombuffer(padded, dtype=np.uint8).reshape(len(ids), width).astype(np.int16)
        self.bytes[np.arange(width) >= lengths[:, None]] = -1  # -1 after a token's end
        self.whole_utf8 = np.array([well_formed_utf8(piece) for piece in self.sorted_pieces])  # of each row
        self._long = np.flatnonzero(lengths > SHORT_TOKEN)
        self._unsteady: OrderedDict[frozenset[int], np.ndarray] = OrderedDict()
        whitespace = np.zeros(257, dtype=bool)  # byte -> whitespace; the last entry, -1's, a token's end
        whitespace[list(WHITESPACE)] = True
        self.leading_whitespace = torch.zeros(size, dtype=torch.int32)  # of each id
        self.leading_whitespace[self.ids] = torch.from_numpy(np.argmin(whitespace[self.bytes], axis=1).astype(np.int32))

    def last_unsteady(self, steady: frozenset[int]) -> np.ndarray:
        """[rows]: the index of each token's last byte outside `steady` (-1: none), kept for the latest sets."""
        last = self._unsteady.get(steady)
        if last is None:
            inside = np.zeros(257, dtype=bool)  # byte -> in `steady`; the last entry, -1's, pads a token's end
            inside[list(steady)] = True
            inside[256] = True
            last = _last_true(~inside[self.bytes[:, :SHORT_TOKEN]])  # most tokens are short: their bytes first
            last[self._long] = _last_true(~inside[self.bytes[self._long]])
            self._unsteady[steady] = last
            if len(self._unsteady) > CACHED_STEADY_SETS:
                self._unsteady.popitem(last=False)
        else:
            self._unsteady.move_to_end(steady)
        return last


class TokenMasks:
    """The masks of `syntax` (as above) over `vocabulary`, the `end_ids` allowed exactly where the text is
    complete."""

    def __init__(self, vocabulary: Vocabulary, syntax, end_ids: frozenset[int]):
        self.vocabulary, self.syntax = vocabulary, syntax
        self.end_ids = torch.tensor(sorted(end_ids), dtype=torch.long)
        self._masks: OrderedDict[tuple, torch.Tensor] = OrderedDict()

    def allowed(self, state: tuple) -> torch.Tensor:
        """[size] bool: the ids that may come next in `state`."""
        key, spaces = self.syntax.split_spaces(state)
        mask = self._masks.get(key)
        if mask is None:
            mask = self._compute(key)
            self._masks[key] = mask
            if len(self._masks) > CACHED_MASKS:
                self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(key)
        if spaces:
            mask = mask & (self.vocabulary.leading_whitespace <= MAX_WHITESPACE - spaces)
        return mask

    def _compute(self, state: tuple) -> torch.Tensor:
        out = np.zeros(self.vocabulary.size, dtype=bool)
        self._walk(state, 0, len(self.vocabulary.ids), 0, out)
        mask = torch.from_numpy(out)
        if self.syntax.complete(state):  # a closed value takes nothing more (but padding); a number may go on
            mask[self.end_ids] = True
        return mask

    def _walk(self, state: tuple, lo: int, hi: int, depth: int, out: np.ndarray) -> None:
        """Mark in `out` the tokens of rows [lo, hi), which share their first `depth` bytes, that the automaton
        takes whole from `state` (where it is after those bytes)."""
        vocabulary, syntax = self.vocabulary, self.syntax
        column = vocabulary.bytes[lo:hi, depth]
        ended = int(np.searchsorted(column, 0))  # tokens of exactly `depth` bytes sort first
        out[vocabulary.ids[lo : lo + ended]] = True
        lo, column = lo + ended, column[ended:]
        if lo == hi:
            return
        steady = syntax.steady(state) if hi - lo >= BLOCK_ROWS else None
        if steady:
            plain = (vocabulary.last_unsteady(steady)[lo:hi] < depth) & vocabulary.whole_utf8[lo:hi]
            out[vocabulary.ids[lo:hi][plain]] = True
            for row in np.flatnonzero(~plain) + lo:
                if feed_bytes(syntax, state, vocabulary.sorted_pieces[row][depth:]) is not None:
                    out[vocabulary.ids[row]] = True
            return
        starts = np.flatnonzero(np.diff(column)) + 1
        for start, end in zip(np.r_[0, starts], np.r_[starts, len(column)]):
            after = syntax.feed(state, int(column[start]))
            if after is not None:
                self._walk(after, lo + int(start), lo + int(end), depth + 1, out)


def _last_true(matrix: np.ndarray) -> np.ndarray:
    """Each row's last True column (-1: none)."""
    return np.where(matrix.any(axis=1), matrix.shape[1] - 1 - np.argmax(matrix[:, ::-1], axis=1), -1)


def feed_bytes(syntax, state: tuple | None, data: bytes) -> tuple | None:
    """The state of `syntax` after every byte of `data`, or None where one cannot follow."""
    for byte in data:
        if state is None:
            return None
        state = syntax.feed(state, byte)
    return state


def well_formed_utf8(data: bytes) -> bool:
    """Whether `data` is UTF-8 characters, the last one possibly begun and not finished."""
    try:
        data.decode()  # whole characters, as most tokens are (a surrogate's bytes are refused here too)
        return True
    except UnicodeDecodeError:
        pass
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(data, final=False)
    except UnicodeDecodeError:
        return False
    begun = decoder.getstate()[0]
    return not (begun[:1] == b"\xed" and begun[1:2] >= b"\xa0")  # a surrogate's, which the decoder takes until whole


def vocabulary_bytes(tokenizer) -> list[bytes | None]:
    """Each token id's bytes as the tokenizer writes them (byte-level BPE as GPT-2, Llama 3 and Qwen encode them,
    or SentencePiece pieces with `▁` spaces and `<0xNN>` bytes); None for added and special tokens, which a
    constrained text never holds."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    added = set(getattr(tokenizer, "added_tokens_decoder", {})) | set(tokenizer.all_special_ids)
    decoder = _byte_decoder()
    byte_level = all(piece is None or all(char in decoder for char in piece) for piece in pieces[:1000])
    # byte-level BPE's characters to the Latin-1 characters of their bytes; any other character to one Latin-1
    # cannot encode, so a piece that holds one has no bytes
    latin1 = {code: decoder.get(chr(code), 0x100) for code in range(0x100 + len(decoder))}
    out: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if piece is None or i in added:
            out.append(None)
        elif byte_level:
            try:
                out.append(piece.translate(latin1).encode("latin-1"))
            except UnicodeEncodeError:
                out.append(None)
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            out.append(bytes([int(piece[3:5], 16)]))
        else:
            out.append(piece.replace("\u2581", " ").encode())
    return out


@cache
def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's characters back to bytes: printable bytes stand for themselves, the others for the
    characters from U+0100 on, in byte order (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars
