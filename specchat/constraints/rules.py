"""Grammars as the automaton (grammar.py) runs them, whatever format they were written in (GBNF, a regular
expression): rules, each a list of alternatives, each a sequence of elements (a set of characters, or another rule).

Repetitions become rules of their own, as llama.cpp rewrites them: `x*` a rule `x r | (nothing)`, `x{2,4}` two x
then `(x (x)?)?`. A rule that can reach itself before any character (left recursion) is refused, as llama.cpp
refuses it: the automaton could never tell where such a rule ends.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

MAX_REPEAT = 2000  # llama.cpp's bound on {m,n}'s numbers
MAX_NESTING = 300  # rules entered one within another before a character (the automaton recurses through them)


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


class RuleSet:
    """Rules being written: each a list of alternatives (None: named, not yet written)."""

    def __init__(self):
        self.rules: list[list[tuple[Element, ...]] | None] = []
        self.names: list[str] = []

    def add(self, alternatives: list[tuple[Element, ...]] | None, name: str) -> int:
        self.rules.append(alternatives)
        self.names.append(name)
        return len(self.rules) - 1

    def star(self, item: tuple[Element, ...], name: str) -> int:
        """A rule for `item*`: item then itself, or nothing."""
        index = self.add(None, name)
        self.rules[index] = [(*item, index), ()]
        return index

    def repeated(self, item: tuple[Element, ...], low: int, high: int | None, name: str) -> tuple[Element, ...]:
        """`item` `low` to `high` times (None: no most), as elements; `name`s the new rules."""
        out = item * low
        if high is None:
            return (*out, self.star(item, name))
        optional: tuple[Element, ...] = ()
        for _ in range(high - low):  # (x (x (x)?)?)?, innermost first
            optional = (self.add([(*item, *optional), ()], name),)
        return (*out, *optional)

    def finish(self, root: int) -> Rules:
        """The rules, left recursion refused."""
        rules = Rules(tuple(self.names), tuple(tuple(alternatives) for alternatives in self.rules), root)
        refuse_left_recursion(rules)
        return rules


def refuse_left_recursion(rules: Rules) -> None:
    """`GrammarError` where a rule can reach itself before any character, or rules nest more than MAX_NESTING deep
    before one (the automaton enters them one call within another)."""
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
    depth = [0] * len(rules.names)  # the most rules entered from one before a character
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
                depth[rule] = 1 + max((depth[each] for each in leading[rule]), default=0)
                if depth[rule] > MAX_NESTING:
                    raise GrammarError(f"rules nest more than {MAX_NESTING} deep before a character")
                path.pop()
            elif state[other] == 1:
                name = rules.names[other]
                if "/" in name:
                    raise GrammarError(f"rule {name.split('/')[0]!r} repeats what may be empty (left recursion)")
                raise GrammarError(f"rule {name!r} is left-recursive: it can reach itself before any character")
            elif state[other] == 0:
                state[other] = 1
                path.append((other, iter(leading[other])))
