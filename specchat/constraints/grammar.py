"""A grammar (GBNF's, or a regular expression's) as a byte automaton (token_masks.py's syntax): which bytes may come
next in a text the grammar derives.

The automaton is a pushdown one over code points, as llama.cpp's: a position in the grammar is a stack of frames
(rule, alternative, element index), the innermost last; a state is the set of stacks whose next element is a set
of characters (the empty stack: the text may end), with the bytes of a UTF-8 character begun and not yet whole. A
rule met at the end of its caller's alternative replaces the caller's frame instead of stacking on it, so `x*`
(rewritten as a rule that ends by calling itself) runs in constant depth, even where x may be empty. States are
immutable and hashable, and every step is kept: the masks walk meets the same few states again and again.

A byte that begins a UTF-8 character is taken only where some stack may take a character it can begin, so no
token ends in a character the grammar could never finish.
"""

from __future__ import annotations

from specchat.constraints.gbnf import parse_gbnf
from specchat.constraints.regex import parse_regex
from specchat.constraints.rules import Chars, Rules

Stack = tuple[tuple[int, int, int], ...]  # frames (rule, alternative, next element), the innermost last
State = tuple[frozenset[Stack], bytes]  # the stacks, and a UTF-8 character's bytes read so far
KEPT_STEPS = 1 << 20  # (state, byte) steps remembered before they are forgotten all at once
NON_ASCII = frozenset(range(0x80, 0x100))
UTF8_FIRST = {2: 0x80, 3: 0x800, 4: 0x10000}  # the least code point an n-byte sequence may write


class Grammar:
    """The automaton of `rules` (`from_gbnf`, `from_regex`: `rules.GrammarError` where the text cannot be read or
    held)."""

    def __init__(self, rules: Rules):
        self.rules = rules
        self._expanded: dict[Stack, frozenset[Stack]] = {}
        self._steps: dict[tuple[State, int], State | None] = {}
        self._steady: dict[State, frozenset[int]] = {}
        root = self.rules.root
        stacks = frozenset().union(*(self._expand(((root, a, 0),)) for a in range(len(self.rules.alternatives[root]))))
        self.start: State = (stacks, b"")

    @classmethod
    def from_gbnf(cls, text: str) -> Grammar:
        return cls(parse_gbnf(text))

    @classmethod
    def from_regex(cls, pattern: str) -> Grammar:
        """The texts `pattern` matches whole."""
        return cls(parse_regex(pattern))

    def complete(self, state: State) -> bool:
        return not state[1] and () in state[0]

    def steady(self, state: State) -> frozenset[int]:
        """The ASCII bytes that leave `state` as it is, and every byte from 0x80 up where every other character
        does (a negated set repeated: free text)."""
        steady = self._steady.get(state)
        if steady is None:
            steady = frozenset(byte for byte in range(0x80) if self.feed(state, byte) == state)
            if self._keeps_non_ascii(state):
                steady |= NON_ASCII
            self._steady[state] = steady
        return steady

    def _keeps_non_ascii(self, state: State) -> bool:
        """Whether every character from U+0080 up leaves `state` as it is: tried once between each two points where
        a set of characters the stacks may take next changes."""
        stacks, begun = state
        if begun:
            return False
        bounds = {0x80, 0xD800, 0xE000}.union(*(self._next(stack).bounds() for stack in stacks if stack))
        points = sorted(point for point in bounds if 0x80 <= point <= 0x10FFFF and not 0xD800 <= point < 0xE000)
        return all(self._advance(stacks, point) == stacks for point in points)

    @staticmethod
    def split_spaces(state: State) -> tuple[State, int]:
        return state, 0  # whitespace is the grammar's to count

    def feed(self, state: State, byte: int) -> State | None:
        key = (state, byte)
        if key not in self._steps:
            if len(self._steps) >= KEPT_STEPS:
                self._steps.clear()
                self._steady.clear()
            self._steps[key] = self._feed(state, byte)
        return self._steps[key]

    def _feed(self, state: State, byte: int) -> State | None:
        stacks, begun = state
        if not begun and byte < 0x80:
            after = self._advance(stacks, byte)
            return (after, b"") if after else None
        if begun and not 0x80 <= byte <= 0xBF:
            return None
        read = begun + bytes([byte])
        length = _utf8_length(read[0])
        if length is None:
            return None
        if len(read) == length:
            try:
                code = ord(read.decode("utf-8"))
            except UnicodeDecodeError:  # overlong, a surrogate, past U+10FFFF
                return None
            after = self._advance(stacks, code)
            return (after, b"") if after else None
        rest = length - len(read)  # the code points the character may still become
        lo = max(_code_point(read + b"\x80" * rest), UTF8_FIRST[length])
        hi = min(_code_point(read + b"\xbf" * rest), 0x10FFFF)
        if lo > hi or 0xD800 <= lo and hi <= 0xDFFF:
            return None
        if not any(stack and self._next(stack).meets(lo, hi) for stack in stacks):
            return None
        return (stacks, read)

    def _advance(self, stacks: frozenset[Stack], code: int) -> frozenset[Stack]:
        """The stacks after the character `code` (empty where none takes it)."""
        out: set[Stack] = set()
        for stack in stacks:
            if stack and code in self._next(stack):
                rule, alternative, index = stack[-1]
                out |= self._expand((*stack[:-1], (rule, alternative, index + 1)))
        return frozenset(out)

    def _next(self, stack: Stack) -> Chars:
        rule, alternative, index = stack[-1]
        return self.rules.alternatives[rule][alternative][index]

    def _expand(self, stack: Stack) -> frozenset[Stack]:
        """The stacks `stack` stands for, each one's next element a set of characters (or the empty stack): ended
        frames popped, rules entered by each of their alternatives, until every stack waits for a character. A rule
        entered at the end of its caller's alternative replaces the caller's frame (a tail call), so a repetition of
        what may be empty comes back to a stack already met, and stops there."""
        known = self._expanded.get(stack)
        if known is not None:
            return known
        met: set[Stack] = set()
        ready: set[Stack] = set()
        waiting = [stack]
        while waiting:
            each = self._popped(waiting.pop())
            if each in met:
                continue
            met.add(each)
            if not each:
                ready.add(())
                continue
            rule, alternative, index = each[-1]
            element = self.rules.alternatives[rule][alternative][index]
            if isinstance(element, Chars):
                ready.add(each)
                continue
            rest = self._popped((*each[:-1], (rule, alternative, index + 1)))
            waiting += [(*rest, (element, a, 0)) for a in range(len(self.rules.alternatives[element]))]
        out = self._expanded[stack] = frozenset(ready)
        return out

    def _popped(self, stack: Stack) -> Stack:
        """`stack` less its innermost frames whose alternatives have no element left."""
        while stack and stack[-1][2] == len(self.rules.alternatives[stack[-1][0]][stack[-1][1]]):
            stack = stack[:-1]
        return stack


def _utf8_length(first: int) -> int | None:
    """The bytes of a UTF-8 sequence that begins with `first` (None: no sequence begins so)."""
    if 0xC2 <= first <= 0xDF:
        return 2
    if 0xE0 <= first <= 0xEF:
        return 3
    if 0xF0 <= first <= 0xF4:
        return 4
    return None


def _code_point(data: bytes) -> int:
    """The code point a whole UTF-8 sequence's bits spell (overlong or not)."""
    code = data[0] & (0x7F >> len(data))
    for byte in data[1:]:
        code = code << 6 | byte & 0x3F
    return code
