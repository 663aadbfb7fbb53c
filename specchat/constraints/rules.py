"""Grammars as the automaton (grammar.py) runs them, whatever format they were written in (GBNF, a regular
expression): rules, each a list of alternatives, each a sequence of elements (a set of characters, or another rule).

Repetitions become rules of their own, as llama.cpp rewrites them: `x*` a rule `x r | (nothing)`, `x{2,4}` two x
then `(x (x)?)?`. A rule that can reach itself before any character with more to match after it (left recursion)
is refused, as llama.cpp refuses it: the automaton's stacks would grow without end. A repetition of what may be
empty (`("a"?)*`, a regex's `(a|)*`) reaches itself last, which the automaton follows as a tail call: it is taken,
where llama.cpp refuses it.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

MAX_REPEAT = 2000  # llama.cpp's bound on {m,n}'s numbers


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
    """`GrammarError` where a rule can reach itself before any character with something left to match after it: the
    automaton's stacks would grow without end. (Reaching itself last, as a repetition of what may be empty does, is
    a tail call: the stack comes back to one already met.)"""
    nullable = [False] * len(rules.names)
    changed = True
    while changed:  # a rule is nullable when one of its alternatives is all nullable rules
        changed = False
        for rule, alternatives in enumerate(rules.alternatives):
            if not nullable[rule] and any(all(isinstance(e, int) and nullable[e] for e in alt) for alt in alternatives):
                nullable[rule] = changed = True
    leading: list[set[int]] = []  # the rules each rule may enter before a character
    stacking: list[tuple[int, int]] = []  # those entries that leave the caller something to match: (caller, rule)
    for caller, alternatives in enumerate(rules.alternatives):
        firsts = set()
        for alternative in alternatives:
            for index, element in enumerate(alternative):
                if isinstance(element, Chars):
                    break
                firsts.add(element)
                if index < len(alternative) - 1:
                    stacking.append((caller, element))
                if not nullable[element]:
                    break
        leading.append(firsts)
    component = _components(leading)
    for caller, rule in stacking:
        if component[caller] == component[rule]:  # the rule leads back to the caller: a cycle that stacks
            name = next((n for n in (rules.names[rule], rules.names[caller]) if "/" not in n), rules.names[rule])
            raise GrammarError(f"rule {name.split('/')[0]!r} is left-recursive: it can reach itself before any "
                               f"character")  # fmt: skip


def _components(edges: list[set[int]]) -> list[int]:
    """Each node's strongly connected component (Kosaraju's two passes, without recursion)."""
    count = len(edges)
    order, seen = [], [False] * count
    for root in range(count):
        if seen[root]:
            continue
        seen[root] = True
        path = [(root, iter(edges[root]))]
        while path:
            node, others = path[-1]
            other = next(others, None)
            if other is None:
                order.append(node)
                path.pop()
            elif not seen[other]:
                seen[other] = True
                path.append((other, iter(edges[other])))
    backward: list[list[int]] = [[] for _ in range(count)]
    for node, others in enumerate(edges):
        for other in others:
            backward[other].append(node)
    component = [-1] * count
    for root in reversed(order):
        if component[root] >= 0:
            continue
        component[root], waiting = root, [root]
        while waiting:
            for other in backward[waiting.pop()]:
                if component[other] < 0:
                    component[other] = root
                    waiting.append(other)
    return component
