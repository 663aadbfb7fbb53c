"""A regular expression read into grammar rules (rules.py): the texts it matches whole, as vLLM's `regex`
structured output asks for them.

Python's syntax, the part that describes a set of texts: literals and escaped characters, `.` (any character but a
newline), sets `[...]` / `[^...]` with ranges, `\\d \\w \\s` and their negations (ASCII, as xgrammar reads them),
`\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH \\UHHHHHHHH`, groups `(...)`, `(?:...)` and named ones, `|`, the quantifiers `*
+ ? {m} {m,} {m,n} {,n}` (lazy and possessive ones match the same texts), and `^` / `$` at the pattern's ends (the
match is whole anyway). What looks around or back (lookarounds, backreferences, `\\b`), flags and anchors inside
the pattern describe no set of texts a grammar can hold: refused by name.
"""

from __future__ import annotations

import re

from specchat.constraints.rules import MAX_REPEAT, Chars, Element, GrammarError, Rules, RuleSet

LAST = 0x10FFFF
CLASSES = {  # \d \w \s as sets of ranges; their capitals are the complements
    "d": ((0x30, 0x39),),
    "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    "s": ((0x09, 0x0D), (0x20, 0x20)),
}
CHARACTERS = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a"}
HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
NOT_A_SET = {"b": "word boundaries (\\b)", "B": "word boundaries (\\B)", "A": "anchors (\\A)", "Z": "anchors (\\Z)",
             "z": "anchors (\\z)", "k": "backreferences", "p": "Unicode properties (\\p)",
             "P": "Unicode properties (\\P)"}  # fmt: skip
ANY_BUT_NEWLINE = Chars(((0x0A, 0x0A),), negated=True)
BOUNDS = re.compile(r"\{(\d*)(,(\d*))?\}")
ROOT = "pattern"


def parse_regex(pattern: str) -> Rules:
    """The rules of the texts `pattern` matches whole (`GrammarError` naming what it cannot hold, and where)."""
    return _Parser(pattern).parse()


class _Parser:
    def __init__(self, pattern: str):
        self.text, self.pos = pattern, 0
        self.rules = RuleSet()

    def parse(self) -> Rules:
        root = self.rules.add(None, ROOT)
        if self.text.startswith("^"):
            self.pos = 1
        end = len(self.text) - 1 if self.text.endswith("$") and not self.text.endswith("\\$") else len(self.text)
        self.rules.rules[root] = self._alternatives(end)
        if self.pos < end:
            self._fail("unbalanced ')'")
        return self.rules.finish(root)

    def _alternatives(self, end: int) -> list[tuple[Element, ...]]:
        out = [self._sequence(end)]
        while self.pos < end and self.text[self.pos] == "|":
            self.pos += 1
            out.append(self._sequence(end))
        return out

    def _sequence(self, end: int) -> tuple[Element, ...]:
        out: list[Element] = []
        last: tuple[Element, ...] | None = None
        while self.pos < end and self.text[self.pos] not in "|)":
            char = self.text[self.pos]
            bounds = BOUNDS.match(self.text, self.pos) if char == "{" else None
            if char in "*+?" or bounds and (bounds[1] or bounds[3]):
                if last is None:
                    self._fail(f"{char!r} repeats nothing")
                del out[len(out) - len(last) :]
                out.extend(self._repeated(last, bounds))
                last = None
                continue
            self.pos += 1
            if char == "(":
                item: tuple[Element, ...] = (self._group(end),)
            elif char == "[":
                item = (self._set(),)
            elif char == ".":
                item = (ANY_BUT_NEWLINE,)
            elif char == "\\":
                item = (self._escape(in_set=False),)
            elif char in "^$":
                self._fail(f"anchors ({char}) inside a pattern are not supported")
            else:
                item = (_one(ord(char)),)
            out.extend(item)
            last = item
        return tuple(out)

    def _repeated(self, item: tuple[Element, ...], bounds: re.Match | None) -> tuple[Element, ...]:
        if bounds is None:
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[self.text[self.pos]]
            self.pos += 1
        else:
            low = int(bounds[1] or 0)
            high = low if bounds[2] is None else int(bounds[3]) if bounds[3] else None
            if max(low, high or 0) > MAX_REPEAT:
                self._fail(f"a repetition count above {MAX_REPEAT}")
            if high is not None and high < low:
                self._fail(f"repetition {bounds[0]}: the maximum is below the minimum")
            self.pos = bounds.end()
        if self.pos < len(self.text) and self.text[self.pos] in "?+":  # lazy or possessive: the same texts
            self.pos += 1
        return self.rules.repeated(item, low, high, self._made)

    def _group(self, end: int) -> int:
        if self.text.startswith("?", self.pos):
            named = re.compile(r"\?(P?<[A-Za-z_]\w*>|:)").match(self.text, self.pos)
            if named is None:
                self._fail("lookarounds, flags and other (?...) groups are not supported")
            self.pos = named.end()
        index = self.rules.add(None, self._made)
        self.rules.rules[index] = self._alternatives(end)
        if self.pos >= end or self.text[self.pos] != ")":
            self._fail("missing ')'")
        self.pos += 1
        return index

    def _set(self) -> Chars:
        negated = self.text.startswith("^", self.pos)
        self.pos += negated
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.pos >= len(self.text):
                self._fail("unterminated character set")
            char = self.text[self.pos]
            if char == "]" and not first:
                self.pos += 1
                return Chars(tuple(ranges), negated)
            first = False
            self.pos += 1
            low = self._escape(in_set=True) if char == "\\" else _one(ord(char))
            if len(low.ranges) != 1 or low.negated or low.ranges[0][0] != low.ranges[0][1]:
                ranges.extend(_ranges(low))  # \d, \W, ... inside a set
                continue
            if self.text.startswith("-", self.pos) and self.pos + 1 < len(self.text) and self.text[self.pos + 1] != "]":
                self.pos += 1
                char = self.text[self.pos]
                self.pos += 1
                high = self._escape(in_set=True) if char == "\\" else _one(ord(char))
                if len(high.ranges) != 1 or high.negated or high.ranges[0][0] != high.ranges[0][1]:
                    self._fail("a range must end in one character")
                if high.ranges[0][0] < low.ranges[0][0]:
                    self._fail("a character range runs backwards")
                ranges.append((low.ranges[0][0], high.ranges[0][0]))
            else:
                ranges.append(low.ranges[0])

    def _escape(self, in_set: bool) -> Chars:
        """The characters of the escape after a backslash."""
        if self.pos >= len(self.text):
            self._fail("a pattern cannot end in a backslash")
        char = self.text[self.pos]
        self.pos += 1
        if char.lower() in CLASSES:
            return Chars(CLASSES[char.lower()], negated=char.isupper())
        if char in CHARACTERS:
            return _one(ord(CHARACTERS[char]))
        if char == "b" and in_set:
            return _one(0x08)
        if char in HEX_ESCAPES:
            digits = self.text[self.pos : self.pos + HEX_ESCAPES[char]]
            if len(digits) != HEX_ESCAPES[char] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self._fail(f"\\{char} needs {HEX_ESCAPES[char]} hex digits")
            self.pos += len(digits)
            if int(digits, 16) > LAST:
                self._fail(f"\\{char}{digits} is past the last code point")
            return _one(int(digits, 16))
        if char in NOT_A_SET or char.isdigit():
            self._fail(f"{NOT_A_SET.get(char, 'backreferences')} are not supported")
        if char.isalnum():
            self._fail(f"unknown escape \\{char}")
        return _one(ord(char))

    @property
    def _made(self) -> str:
        return f"{ROOT}/{len(self.rules.rules)}"

    def _fail(self, message: str):
        raise GrammarError(f"regex, at character {self.pos}: {message}")


def _one(code: int) -> Chars:
    return Chars(((code, code),))


def _ranges(chars: Chars) -> list[tuple[int, int]]:
    """`chars` as plain ranges (a negated set's complement written out)."""
    if not chars.negated:
        return list(chars.ranges)
    out, start = [], 0
    for lo, hi in sorted(chars.ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = max(start, hi + 1)
    return [*out, (start, LAST)] if start <= LAST else out

