"""The n-gram lookup drafter: continuations of the context's last k-grams, and a copy of a long passage as a
kind of its own, whose chains the budget sizes apart from the short matches'."""

from __future__ import annotations

import pytest

from specchat.drafters.ngram.drafter import COPY_MATCH, NgramDrafter, match_rate
from specchat.engine.budget import AdaptiveBudget
from specchat.engine.events import COPY
from specchat.engine.tree import ROOT, DraftTree
from specchat.engine.verify_cost import VerifyCost


def drafter_of(ids: list[int]) -> NgramDrafter:
    drafter = NgramDrafter()
    drafter.prefill(ids)
    return drafter


def test_short_matches_are_scored_by_how_much_of_the_context_they_match():
    drafter = drafter_of([1, 2, 3, 40, 9, 2, 3, 50, 9, 3, 60, 9, 2, 3])
    assert drafter.next_kinds() == {"ngram"}
    # "9 2 3" ended at 6 (50 next: 0.61), "2 3" also at 2 (40: 0.46), "3" also at 9 (60: 0.21); as siblings
    # their chances are scaled to sum to 1; 50's child 9 follows a match of 4 (0.72)
    tree = drafter.propose(3)
    assert tree.tokens == [50, 40, 9] and tree.parents == [ROOT, ROOT, 0] and set(tree.origins) == {"ngram"}
    scale = match_rate(3) + match_rate(2) + match_rate(1)
    assert tree.scores == pytest.approx([0.61 / scale, 0.46 / scale, 0.61 / scale * match_rate(4)])
    assert drafter.propose(2).tokens == [50, 40]  # 40 (0.36) over 50's child (0.34)
    assert drafter_of([5, 6, 7, 8, 5]).propose(2).tokens == [6, 7]  # a 1-gram match alone


def test_a_long_match_is_copied_from_the_occurrence_that_matches_furthest_back():
    passage = list(range(100, 130))  # 30 tokens
    older = [7] + passage + [1, 2, 3, 4, 5]  # the passage, 31 tokens matched with its 7
    newer = passage[-COPY_MATCH:] + [6, 6, 6]  # only its last COPY_MATCH tokens
    drafter = drafter_of(older + [0] * 5 + newer + [0] * 5 + [7] + passage)
    assert drafter.next_kinds() == {COPY}
    tree = drafter.propose(4)
    assert tree.tokens[:4] == [1, 2, 3, 4] and tree.parents[:4] == [ROOT, 0, 1, 2]
    assert set(tree.origins) == {COPY} and len(tree) == 4  # the budget holds the second source's branch out
    eight = drafter.propose(8)  # the newer source's 6, scored at a match of 8, comes in beside the older's chain
    assert eight.tokens == [1, 2, 3, 4, 5, 0, 6, 0] and eight.parents[5:7] == [4, ROOT]  # best first
    assert drafter.copy_sources()[0] == 30  # the older occurrence: 31 tokens matched, against COPY_MATCH
    assert [drafter._match_length(end) for end in drafter.copy_sources()] == [31, COPY_MATCH]


def test_the_kind_follows_the_context_as_tokens_are_committed():
    drafter = drafter_of(list(range(20)) + [99])
    assert drafter.next_kinds() == {"ngram"}
    drafter.commit(list(range(COPY_MATCH - 1)))
    assert drafter.next_kinds() == {"ngram"}  # COPY_MATCH - 1 tokens of the start again: not yet a copy
    drafter.commit([COPY_MATCH - 1])
    assert drafter.next_kinds() == {COPY}
    assert drafter.propose(3).tokens == [COPY_MATCH, COPY_MATCH + 1, COPY_MATCH + 2]
    drafter.commit([5])  # the copy broke off
    assert drafter.next_kinds() == {"ngram"}


def test_a_copy_is_tried_even_after_drafting_went_off_for_good():
    """Short matches that never paid turned drafting off; a copy, a kind never tried, still gets a tree, and
    once its chains are accepted whole it keeps long ones while the short matches stay off."""
    cost = VerifyCost((0, 1, 3, 7, 15), (1.0, 1.2, 1.5, 2.2, 3.4))
    policy = AdaptiveBudget(cost, probe_every=2)
    ngram, copy = frozenset({"ngram"}), frozenset({COPY})
    while not policy.off_for_good:
        if budget := policy.next_budget(ngram):
            chain = DraftTree(list(range(budget)), list(range(-1, budget - 1)), ["ngram"] * budget)
            policy.observe(chain, [], budget=budget, mode=ngram)
    assert policy.next_budget(ngram) == 0
    for _ in range(30):
        budget = policy.next_budget(copy)
        assert budget
        chain = DraftTree(list(range(budget)), list(range(-1, budget - 1)), [COPY] * budget)
        policy.observe(chain, list(range(budget)), budget=budget, mode=copy)
    assert policy.next_budget(copy) >= 3 and policy.next_budget(ngram) == 0
