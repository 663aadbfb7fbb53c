"""JSON's syntax as a byte automaton: which bytes may come next in a JSON object being written.

A state is a small immutable tuple (hashable: token masks are cached by it), `feed(state, byte)` the state after
one more byte or None where the byte cannot continue valid JSON (RFC 8259). The text must be one object, as
OpenAI's JSON mode and ollama's `format: "json"` ask, from its first byte (a model that would open a code fence
first otherwise pads with spaces) and with at most `MAX_WHITESPACE` whitespace bytes in a row (a small model can
otherwise pad forever, never closing the object). Strings take any byte from 0x20 up but `"` and
`\\` (UTF-8 sequences are not checked), escapes as the RFC lists them.
"""

from __future__ import annotations

MAX_WHITESPACE = 64

# Modes: where in the text the next byte falls.
TOP, VALUE, FIRST_ITEM, FIRST_KEY, KEY, COLON, AFTER = range(7)  # between tokens; whitespace may come
STRING, ESCAPE, UNICODE = 7, 8, 9  # in a string (`extra`: 1 for a key); UNICODE: `extra` hex digits read, + 4 for a key
MINUS, ZERO, INTEGER, POINT, FRACTION, E, E_SIGN, EXPONENT = range(10, 18)  # in a number
LITERAL = 18  # in true / false / null: `extra` is what is left of it
DONE = 19  # the object is closed: only the end may come

WHITESPACE = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'"\\/bfnrt')
STRING_MODES = frozenset((STRING, ESCAPE, UNICODE))
NUMBER_MODES = frozenset(range(MINUS, EXPONENT + 1))
NUMBER_ENDS = frozenset((ZERO, INTEGER, FRACTION, EXPONENT))  # a number may end in these
LITERALS = {ord("t"): b"rue", ord("f"): b"alse", ord("n"): b"ull"}
CLOSE = {ord("}"): "{", ord("]"): "["}

# A state: (mode, stack of open containers as a string of "{" and "[", whitespace bytes in a row, extra).
State = tuple[int, str, int, object]

START: State = (TOP, "", 0, None)
start = START  # this module is a syntax as token_masks.py reads one: start, feed, complete, steady, split_spaces
STRING_STEADY = frozenset(range(0x20, 0x100)) - {0x22, 0x5C}  # the bytes a string takes as they are


def complete(state: State) -> bool:
    """Whether the text so far is one whole JSON object."""
    return state[0] == DONE


def steady(state: State) -> frozenset[int]:
    """The bytes that leave `state` as it is: inside a string, outside any escape, every byte from 0x20 up but `"`
    and `\\` (UTF-8 sequences are not checked)."""
    return STRING_STEADY if state[0] == STRING else frozenset()


def split_spaces(state: State) -> tuple[State, int]:
    """`state` less its run of whitespace bytes, and the run's length (token_masks.py caches masks by the first)."""
    mode, stack, spaces, extra = state
    return (mode, stack, 0, extra), spaces


def feed(state: State, byte: int) -> State | None:
    """The state after `byte`, or None where valid JSON cannot go on with it."""
    mode, stack, spaces, extra = state
    if mode == STRING and byte == 0x22:  # the closing quote
        return (COLON, stack, 0, None) if extra else _after_value(stack)
    if mode in STRING_MODES:
        return string_feed(state, byte)
    if mode == LITERAL:
        if byte != extra[0]:
            return None
        return (LITERAL, stack, 0, extra[1:]) if len(extra) > 1 else _after_value(stack)
    if mode in NUMBER_MODES:
        after = number_mode(mode, byte)
        if after is not None:
            return (after, stack, 0, None)
        if mode not in NUMBER_ENDS:
            return None
        return feed(_after_value(stack), byte)  # the number ended: the byte follows it
    if byte in WHITESPACE:
        return (mode, stack, spaces + 1, extra) if mode not in (TOP, DONE) and spaces < MAX_WHITESPACE else None
    if mode == TOP:
        return (FIRST_KEY, "{", 0, None) if byte == ord("{") else None
    if mode in (VALUE, FIRST_ITEM):
        if mode == FIRST_ITEM and byte == ord("]"):
            return _close(stack, byte)
        return _value(stack, byte)
    if mode in (FIRST_KEY, KEY):
        if byte == 0x22:
            return (STRING, stack, 0, True)
        return _close(stack, byte) if mode == FIRST_KEY and byte == ord("}") else None
    if mode == COLON:
        return (VALUE, stack, 0, None) if byte == ord(":") else None
    if mode == AFTER:
        if byte == ord(","):
            return (KEY if stack[-1] == "{" else VALUE, stack, 0, None)
        return _close(stack, byte)
    return None  # DONE


def string_feed(state: tuple, byte: int) -> tuple | None:
    """The state after `byte` inside a string (STRING, ESCAPE or UNICODE mode), but for its closing quote, whose
    sequel depends on where the string stands (the caller's); `extra` says whether the string is a key, and its
    escapes carry that on (UNICODE adds 4 to the hex digits read)."""
    mode, containers, _, extra = state
    if mode == STRING:
        if byte == 0x5C:
            return (ESCAPE, containers, 0, extra)
        return state if byte >= 0x20 else None
    if mode == ESCAPE:
        if byte == ord("u"):
            return (UNICODE, containers, 0, 4 if extra else 0)
        return (STRING, containers, 0, extra) if byte in ESCAPES else None
    if byte not in HEX:
        return None
    read, key = extra % 4 + 1, extra >= 4
    return (STRING, containers, 0, key) if read == 4 else (UNICODE, containers, 0, extra + 1)


def _value(stack: str, byte: int) -> State | None:
    """The state after a value's first byte."""
    if byte == 0x22:
        return (STRING, stack, 0, False)
    if byte == ord("{"):
        return (FIRST_KEY, stack + "{", 0, None)
    if byte == ord("["):
        return (FIRST_ITEM, stack + "[", 0, None)
    if byte == ord("-"):
        return (MINUS, stack, 0, None)
    if byte in DIGITS:
        return (ZERO if byte == ord("0") else INTEGER, stack, 0, None)
    if byte in LITERALS:
        return (LITERAL, stack, 0, LITERALS[byte])
    return None


def _close(stack: str, byte: int) -> State | None:
    """The state after `}` or `]`, where it closes the innermost open container."""
    if CLOSE.get(byte) != stack[-1:]:
        return None
    return _after_value(stack[:-1])


def _after_value(stack: str) -> State:
    return (AFTER, stack, 0, None) if stack else (DONE, "", 0, None)


def number_mode(mode: int, byte: int, integers: bool = False) -> int | None:
    """The number mode after `byte`, or None where the number cannot go on with it (with `integers`, neither a
    fraction nor an exponent may come)."""
    digit = byte in DIGITS
    if mode == MINUS:
        return (ZERO if byte == ord("0") else INTEGER) if digit else None
    if mode in (ZERO, INTEGER):
        if digit:
            return INTEGER if mode == INTEGER else None
        if integers:
            return None
        return POINT if byte == ord(".") else E if byte in b"eE" else None
    if mode == POINT:
        return FRACTION if digit else None
    if mode == FRACTION:
        return FRACTION if digit else E if byte in b"eE" else None
    if mode == E:
        return EXPONENT if digit else E_SIGN if byte in b"+-" else None
    return EXPONENT if digit else None  # E_SIGN, EXPONENT
