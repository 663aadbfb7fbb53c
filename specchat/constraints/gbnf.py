"""GBNF, llama.cpp's grammar format, read into rules: each rule a list of alternatives, each alternative a sequence
of elements (a set of characters, or another rule).

The format as llama.cpp reads it: `name ::= alternatives`, one rule a line (a group or a `|` may go on over
lines); literals `"..."`, character sets `[a-z]` / `[^...]`, `.` (any character), rule names, groups `( ... )`,
the repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`; escapes `\\n \\r \\t \\\\ \\" \\[ \\] \\-`, `\\xHH`,
`\\uHHHH`, `\\UHHHHHHHH`; `#` comments. The text must derive from `root`. Repetitions become rules of their own (as
llama.cpp rewrites them): `x*` a rule `x r | (nothing)`, `x{2,4}` two x then `(x (x)?)?`. Characters are Unicode
code points. A rule that can reach itself before any character (left recursion) is refused, as llama.cpp refuses
it: the automaton could never tell where such a rule ends.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

MAX_REPEAT = 2000  # llama.cpp's bound on {m,n}'s numbers
ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "/": "/"}
HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class GrammarError(ValueError):
    """A grammar that cannot be read or held, with the line or rule at fault."""


@dataclass(frozen=True)
class Chars:
    """A set of code points: those in `ranges` (inclusive pairs), or when `negated` all others."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False)  # the ranges merged, sorted
    _ends: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        merged: list[list[int]] = []
        for lo, hi in sorted(self.ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        object.__setattr__(self, "_starts", tuple(lo for lo, _ in merged))
        object.__setattr__(self, "_ends", tuple(hi for _, hi in merged))

    def __contains__(self, code: int) -> bool:
        at = bisect_right(self._starts, code) - 1
        return (at >= 0 and code <= self._ends[at]) != self.negated

    def bounds(self) -> tuple[int, ...]:
        """The code points where membership may change: each range's first and one past its last."""
        return (*self._starts, *(hi + 1 for hi in self._ends))

    def meets(self, lo: int, hi: int) -> bool:
        """Whether some code point from `lo` to `hi` is in the set (whether a partial UTF-8 sequence may match)."""
        at = bisect_right(self._starts, lo) - 1
        covered = at >= 0 and lo <= self._ends[at]  # lo is in a range (the merged ranges leave gaps between them)
        if not self.negated:
            return covered or at + 1 < len(self._starts) and self._starts[at + 1] <= hi
        return not covered or self._ends[at] < hi


ANY = Chars(((0, 0x10FFFF),))
Element = Chars | int  # an int: the index of a rule


@dataclass(frozen=True)
class Rules:
    """A grammar: `alternatives[rule]` the sequences that rule derives; `names[rule]` its name (a group's or a
    repetition's rule: the name of the rule it appears in, "/" and its index)."""

    names: tuple[str, ...]
    alternatives: tuple[tuple[tuple[Element, ...], ...], ...]
    root: int


def parse_gbnf(text: str) -> Rules:
    """The rules of a GBNF text (`GrammarError` naming the line, or the rule, at fault)."""
    return _Parser(text).parse()


class _Parser:
    def __init__(self, text: str):
        self.text, self.pos = text, 0
        self.index: dict[str, int] = {}  # a rule's name -> its index
        self.rules: list[list[tuple[Element, ...]] | None] = []  # None: referred to, not yet defined
        self.names: list[str] = []
        self.rule = ""  # the rule being read, for the names of the rules its repetitions make

    def parse(self) -> Rules:
        self._space(newlines=True)
        while self.pos < len(self.text):
            self.rule = self._name()
            self._space(newlines=False)
            if not self.text.startswith("::=", self.pos):
                self._fail("expected '::='")
            self.pos += 3
            self._space(newlines=True)
            index = self._rule_index(self.rule)
            if self.rules[index] is not None:
                self._fail(f"rule {self.rule!r} is defined twice")
            self.rules[index] = self._alternatives(nested=False)
            if self.pos < len(self.text) and self.text[self.pos] not in "\r\n":
                self._fail(f"unexpected {self.text[self.pos]!r}")
            self._space(newlines=True)
        undefined = [name for name, rule in zip(self.names, self.rules) if rule is None]
        if undefined:
            raise GrammarError(f"rule {undefined[0]!r} is used but not defined")
        if "root" not in self.index:
            raise GrammarError("the grammar has no rule named 'root'")
        rules = Rules(tuple(self.names), tuple(tuple(alternatives) for alternatives in self.rules), self.index["root"])
        _refuse_left_recursion(rules)
        return rules

    # -- the text's parts ---------------------------------------------------------------------------------------

    def _alternatives(self, nested: bool) -> list[tuple[Element, ...]]:
        out = [self._sequence(nested)]
        while self.pos < len(self.text) and self.text[self.pos] == "|":
            self.pos += 1
            self._space(newlines=True)
            out.append(self._sequence(nested))
        return out

    def _sequence(self, nested: bool) -> tuple[Element, ...]:
        out: list[Element] = []
        last: tuple[Element, ...] | None = None  # the item a repetition would apply to
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == '"':
                self.pos += 1
                item: tuple[Element, ...] = tuple(Chars(((code, code),)) for code in self._literal())
            elif char == "[":
                self.pos += 1
                item = (self._chars(),)
            elif char == ".":
                self.pos += 1
                item = (ANY,)
            elif char == "(":
                self.pos += 1
                self._space(newlines=True)
                group = self._alternatives(nested=True)
                if self.pos >= len(self.text) or self.text[self.pos] != ")":
                    self._fail("expected ')'")
                self.pos += 1
                item = (self._new_rule(group),)
            elif _is_name_char(char):
                item = (self._rule_index(self._name()),)
            elif char in "*+?{":
                if last is None:
                    self._fail(f"{char!r} repeats nothing")
                del out[len(out) - len(last) :]
                item, last = self._repeated(last), None
                out.extend(item)
                self._space(newlines=nested)
                continue
            elif char == "<":
                self._fail("token references (<...>) are not supported")
            else:
                break
            out.extend(item)
            last = item
            self._space(newlines=nested)
        return tuple(out)

    def _repeated(self, item: tuple[Element, ...]) -> tuple[Element, ...]:
        """`item` under the repetition at the cursor, as elements (new rules for what it repeats)."""
        char = self.text[self.pos]
        self.pos += 1
        if char == "*":
            return (self._star(item),)
        if char == "+":
            return (*item, self._star(item))
        if char == "?":
            return (self._new_rule([item, ()]),)
        low, high = self._bounds()
        out = item * low
        if high is None:
            return (*out, self._star(item))
        optional: tuple[Element, ...] = ()
        for _ in range(high - low):  # (x (x (x)?)?)?, innermost first
            optional = (self._new_rule([(*item, *optional), ()]),)
        return (*out, *optional)

    def _star(self, item: tuple[Element, ...]) -> int:
        """A rule for `item*`: item then itself, or nothing."""
        index = self._new_rule([])
        self.rules[index] = [(*item, index), ()]
        return index

    def _bounds(self) -> tuple[int, int | None]:
        """`{m}`, `{m,}` or `{m,n}` after its brace: (m, n), n None where open."""
        self._space(newlines=False)
        low = self._number()
        self._space(newlines=False)
        high: int | None = low
        if self.text.startswith(",", self.pos):
            self.pos += 1
            self._space(newlines=False)
            high = self._number() if self.pos < len(self.text) and self.text[self.pos].isdigit() else None
            self._space(newlines=False)
        if not self.text.startswith("}", self.pos):
            self._fail("expected '}'")
        self.pos += 1
        if high is not None and high < low:
            self._fail(f"repetition {{{low},{high}}}: the maximum is below the minimum")
        return low, high

    def _number(self) -> int:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isdigit():
            self.pos += 1
        if start == self.pos:
            self._fail("expected a number")
        value = int(self.text[start : self.pos])
        if value > MAX_REPEAT:
            self._fail(f"repetition count {value} is above {MAX_REPEAT}")
        return value

    def _literal(self) -> list[int]:
        out = []
        while True:
            if self.pos >= len(self.text) or self.text[self.pos] in "\r\n":
                self._fail("unterminated string")
            if self.text[self.pos] == '"':
                self.pos += 1
                return out
            out.append(self._char())

    def _chars(self) -> Chars:
        negated = self.text.startswith("^", self.pos)
        self.pos += negated
        ranges = []
        while True:
            self._within_set()
            if self.text[self.pos] == "]":
                self.pos += 1
                return Chars(tuple(ranges), negated)
            low = self._char()
            high = low
            if self.text.startswith("-", self.pos) and not self.text.startswith("-]", self.pos):
                self.pos += 1
                self._within_set()
                high = self._char()
                if high < low:
                    self._fail("a character range runs backwards")
            ranges.append((low, high))

    def _within_set(self) -> None:
        if self.pos >= len(self.text) or self.text[self.pos] in "\r\n":
            self._fail("unterminated character set")

    def _char(self) -> int:
        """The code point at the cursor, escapes read."""
        if self.pos >= len(self.text):
            self._fail("unexpected end of grammar")
        char = self.text[self.pos]
        self.pos += 1
        if char != "\\":
            return ord(char)
        if self.pos >= len(self.text):
            self._fail("unexpected end of grammar")
        escape = self.text[self.pos]
        self.pos += 1
        if escape in ESCAPES:
            return ord(ESCAPES[escape])
        if escape in HEX_ESCAPES:
            digits = self.text[self.pos : self.pos + HEX_ESCAPES[escape]]
            if len(digits) != HEX_ESCAPES[escape] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self._fail(f"\\{escape} needs {HEX_ESCAPES[escape]} hex digits")
            self.pos += len(digits)
            code = int(digits, 16)
            if code > 0x10FFFF:
                self._fail(f"\\{escape}{digits} is past the last code point")
            return code
        self._fail(f"unknown escape \\{escape}")

    def _name(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and _is_name_char(self.text[self.pos]):
            self.pos += 1
        if start == self.pos:
            self._fail("expected a rule name")
        return self.text[start : self.pos]

    def _space(self, newlines: bool) -> None:
        """Past blanks and comments (and line ends where `newlines`)."""
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "#":
                while self.pos < len(self.text) and self.text[self.pos] not in "\r\n":
                    self.pos += 1
            elif char in " \t" or newlines and char in "\r\n":
                self.pos += 1
            else:
                return

    # -- rules --------------------------------------------------------------------------------------------------

    def _rule_index(self, name: str) -> int:
        if name not in self.index:
            self.index[name] = len(self.rules)
            self.rules.append(None)
            self.names.append(name)
        return self.index[name]

    def _new_rule(self, alternatives: list[tuple[Element, ...]]) -> int:
        self.rules.append(alternatives)
        self.names.append(f"{self.rule}/{len(self.rules)}")  # no rule's own name holds a "/"
        return len(self.rules) - 1

    def _fail(self, message: str):
        line = self.text.count("\n", 0, self.pos) + 1
        column = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        raise GrammarError(f"grammar line {line}, column {column}: {message}")


def _is_name_char(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char in "-_")


def _refuse_left_recursion(rules: Rules) -> None:
    """`GrammarError` where a rule can reach itself before any character."""
    nullable = [False] * len(rules.names)
    changed = True
    while changed:  # a rule is nullable when one of its alternatives is all nullable rules
        changed = False
        for rule, alternatives in enumerate(rules.alternatives):
            if not nullable[rule] and any(all(isinstance(e, int) and nullable[e] for e in alt) for alt in alternatives):
                nullable[rule] = changed = True
    leading = []  # the rules each rule may begin with
    for alternatives in rules.alternatives:
        firsts = set()
        for alternative in alternatives:
            for element in alternative:
                if isinstance(element, Chars):
                    break
                firsts.add(element)
                if not nullable[element]:
                    break
        leading.append(firsts)
    state = [0] * len(rules.names)  # 0 unseen, 1 on the path, 2 done
    for root in range(len(rules.names)):  # depth first, with a stack of (rule, its leading rules left)
        if state[root]:
            continue
        state[root] = 1
        path = [(root, iter(leading[root]))]
        while path:
            rule, others = path[-1]
            other = next(others, None)
            if other is None:
                state[rule] = 2
                path.pop()
            elif state[other] == 1:
                name = rules.names[other]
                if "/" in name:
                    raise GrammarError(f"rule {name.split('/')[0]!r} repeats what may be empty (left recursion)")
                raise GrammarError(f"rule {name!r} is left-recursive: it can reach itself before any character")
            elif state[other] == 0:
                state[other] = 1
                path.append((other, iter(leading[other])))
