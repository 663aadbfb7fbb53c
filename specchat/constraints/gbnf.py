"""GBNF, llama.cpp's grammar format, read into rules: each rule a list of alternatives, each alternative a sequence
of elements (a set of characters, or another rule).

The format as llama.cpp reads it: `name ::= alternatives`, one rule a line (a group or a `|` may go on over
lines); literals `"..."`, character sets `[a-z]` / `[^...]`, `.` (any character), rule names, groups `( ... )`,
the repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`; escapes `\\n \\r \\t \\\\ \\" \\[ \\] \\-`, `\\xHH`,
`\\uHHHH`, `\\UHHHHHHHH`; `#` comments. The text must derive from `root`. Characters are Unicode code points.
"""

from __future__ import annotations

from specchat.constraints.rules import ANY, MAX_REPEAT, Chars, Element, GrammarError, Rules, RuleSet

ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "/": "/"}
HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def parse_gbnf(text: str) -> Rules:
    """The rules of a GBNF text (`GrammarError` naming the line, or the rule, at fault)."""
    return _Parser(text).parse()


class _Parser:
    def __init__(self, text: str):
        self.text, self.pos = text, 0
        self.index: dict[str, int] = {}  # a rule's name -> its index
        self.rules = RuleSet()
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
            if self.rules.rules[index] is not None:
                self._fail(f"rule {self.rule!r} is defined twice")
            self.rules.rules[index] = self._alternatives(nested=False)
            if self.pos < len(self.text) and self.text[self.pos] not in "\r\n":
                self._fail(f"unexpected {self.text[self.pos]!r}")
            self._space(newlines=True)
        undefined = [name for name, rule in zip(self.rules.names, self.rules.rules) if rule is None]
        if undefined:
            raise GrammarError(f"rule {undefined[0]!r} is used but not defined")
        if "root" not in self.index:
            raise GrammarError("the grammar has no rule named 'root'")
        return self.rules.finish(self.index["root"])

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
                item = (self.rules.add(group, self._made),)
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
        low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(char) or self._bounds()
        return self.rules.repeated(item, low, high, self._made)

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
            self.index[name] = self.rules.add(None, name)
        return self.index[name]

    @property
    def _made(self) -> str:
        """The name of a rule a group or a repetition makes: its rule's, "/" (which no name holds) and a number."""
        return f"{self.rule}/{len(self.rules.rules)}"

    def _fail(self, message: str):
        line = self.text.count("\n", 0, self.pos) + 1
        column = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        raise GrammarError(f"grammar line {line}, column {column}: {message}")


def _is_name_char(char: str) -> bool:
    return char.isascii() and (char.isalnum() or char in "-_")
