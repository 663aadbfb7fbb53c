"""The adaptive tree budget weighs measured verification cost against observed acceptance."""

from __future__ import annotations

import json
import random
import time

import pytest

from specchat.engine.budget import PROBE_SHARE, AdaptiveBudget, proposers
from specchat.engine.tree import ROOT, DraftTree, siblings_bounded
from specchat.engine.verify_cost import (
    LIVE_TIMINGS,
    PLAIN_STEP_EVERY,
    STALE_AFTER,
    VerifyCost,
    cached_verify_cost,
    measure_verify_cost,
    priced_context,
)

CPU_LIKE = VerifyCost((0, 1, 2, 4, 8, 16, 32, 64), (1.0, 1.7, 1.8, 1.85, 1.9, 2.0, 2.6, 3.8))
GPU_LIKE = VerifyCost((0, 1, 2, 4, 8, 16, 32, 64), (1.0, 1.0, 1.0, 1.0, 1.01, 1.02, 1.04, 1.1))


def observe_chain(policy, depth, accepted, origin="model", **kwargs):
    """A chain of `depth` nodes from one drafter, its first `accepted` nodes accepted."""
    policy.observe(DraftTree(list(range(depth)), list(range(-1, depth - 1)), [origin] * depth), list(range(accepted)),
                   **kwargs)


def test_relative_cost_interpolates_between_measured_sizes():
    assert CPU_LIKE.relative(0) == 1.0
    assert CPU_LIKE.relative(12) == (1.9 + 2.0) / 2
    assert CPU_LIKE.relative(128) == 3.8 * 2


def test_rejected_drafts_turn_drafting_off_probes_back_off_then_stop():
    policy = AdaptiveBudget(CPU_LIKE, probe_every=8)
    for _ in range(30):
        observe_chain(policy, 4, accepted=0)
    assert policy.budget == 0
    probes = []
    for step in range(200):
        budget = policy.next_budget()
        if budget:
            probes.append(step)
            if len(probes) == 2:
                policy.observe(DraftTree.empty(), [])  # the drafter had nothing: the probe waits for a tree
                continue
            observe_chain(policy, 3, accepted=0)  # a probe that did not pay
    # a small tree after 8 idle steps, again after 16 and once more when the drafter had nothing, then after 32;
    # then
    # drafting is off for good (each probe verifies several rows: they kept the default below plain decoding)
    assert probes == [7, 23, 24, 55] and policy.off_for_good
    assert all(policy.next_budget() == 0 for _ in range(500))


def test_a_probe_that_pays_turns_drafting_back_on():
    policy = AdaptiveBudget(CPU_LIKE, probe_every=4)
    for _ in range(30):
        observe_chain(policy, 4, accepted=0)
    while not policy.next_budget():
        pass
    observe_chain(policy, 3, accepted=0)  # one failed probe: the next comes later
    while not policy.next_budget():
        pass
    observe_chain(policy, 3, accepted=3)  # copyable text is back
    assert policy.failed_probes == 0
    for _ in range(60):  # the probes that follow find it accepted too, until drafting pays again
        while not policy.next_budget():
            pass
        observe_chain(policy, 3, accepted=3)
        if policy.budget:
            break
    assert policy.budget > 0 and not policy.off_for_good


def test_long_acceptances_grow_the_budget_where_verification_is_cheap():
    cpu, gpu = AdaptiveBudget(CPU_LIKE), AdaptiveBudget(GPU_LIKE)
    for policy in (cpu, gpu):
        for _ in range(40):
            observe_chain(policy, 16, accepted=14)
    assert cpu.budget >= 7
    assert gpu.budget >= cpu.budget
    assert gpu.expected_tokens(16) > 10


def test_the_budget_follows_the_text():
    policy = AdaptiveBudget(CPU_LIKE)
    for _ in range(40):
        observe_chain(policy, 16, accepted=16)
    copying = policy.budget
    for _ in range(100):  # about four half-lives of the decay
        observe_chain(policy, 2, accepted=0)
    assert copying >= 7 and policy.budget == 0


def test_depths_are_priced_at_their_acceptance_below_an_accepted_depth():
    """Chains of 5 whose every level is accepted 80% of the time where the level above was: a step commits
    1 + 0.8 + 0.8^2 + ... + 0.8^5 tokens on average, and that is the price, not a product of the rates at
    which each depth was accepted among all trees."""
    policy = AdaptiveBudget(CPU_LIKE, decay=1.0)
    for step in range(5**5):  # every pattern of levels, each accepted in 4 of 5
        accepted = 0
        while accepted < 5 and step % 5:
            accepted, step = accepted + 1, step // 5
        observe_chain(policy, 5, accepted)
    assert abs(policy.expected_tokens(5) - sum(0.8**d for d in range(6))) < 0.01


def test_copies_accepted_whole_grow_their_chains_where_deeper_trees_pay():
    """On the 1.5B's cost curve at 16K (7 nodes 2.4x a decode step), chains of 3 accepted whole grow to 7: a
    depth not seen yet is priced at the rate of the depth above, not at an even chance."""
    long_context = VerifyCost((0, 1, 3, 7, 15), (1.0, 1.14, 1.44, 2.37, 4.6))
    policy = AdaptiveBudget(long_context)
    for _ in range(20):
        observe_chain(policy, 3, accepted=3, budget=3, origin="copy")
    assert policy.budget >= 7


def test_a_few_chains_accepted_whole_do_not_buy_a_large_tree():
    """The depths of one tree are one event (a copy is right or wrong), not independent evidence: on the 1.5B's
    cost curve at 1K tokens (31 nodes 4.9x a decode step), two chains of 7 accepted whole leave the budget at 7."""
    short_context = VerifyCost((0, 1, 3, 7, 15, 31, 63), (1.0, 1.13, 1.16, 1.57, 2.77, 4.85, 9.59))
    policy = AdaptiveBudget(short_context)
    for _ in range(2):
        observe_chain(policy, 7, accepted=7, budget=7, origin="copy")
    assert policy.budget == 7


def test_empty_trees_say_nothing_about_acceptance():
    policy = AdaptiveBudget(CPU_LIKE)
    before = policy.expected_tokens(8)
    policy.observe(DraftTree.empty(), [])
    assert policy.expected_tokens(8) == before


def test_calibration_is_monotone_times_trees_up_to_three_steps_and_is_cached(tmp_path):
    calls = []

    def verify_forward(n):
        def forward():
            calls.append(n)
            time.sleep(0.01 * (1 + n))  # the root's 10 ms, then 10 ms a node: wide of a loaded machine's jitter

        return forward

    cost = measure_verify_cost(verify_forward, sizes=(0, 1, 4, 9), repeats=3)
    assert cost.sizes == (0, 1, 4, 9) and list(cost.seconds) == sorted(cost.seconds)
    assert calls.count(0) == 5 and calls.count(4) == 4 and 9 not in calls  # warm-ups, then the repeats
    assert cost.seconds[3] == pytest.approx(cost.seconds[2] * 9 / 4)  # 4 nodes cost five steps: 9 in proportion

    path = tmp_path / "verify_cost.json"
    first = cached_verify_cost(path, "model|fp32|cpu", lambda: cost)
    again = cached_verify_cost(path, "model|fp32|cpu", lambda: VerifyCost((0,), (9.0,)))
    assert first == again == VerifyCost(cost.sizes, cost.seconds)
    assert list(json.loads(path.read_text())) == ["model|fp32|cpu"]


def test_the_budget_prices_drafting_and_reads_the_depth_trees_really_reach():
    chain, beam = AdaptiveBudget(GPU_LIKE), AdaptiveBudget(GPU_LIKE)
    for _ in range(50):
        observe_chain(chain, 15, 12, budget=15)
        observe_beam(beam, 15, budget=15)  # 15 nodes, but only two levels deep
    assert beam.expected_tokens(15) <= 3 < chain.expected_tokens(15)
    slow = AdaptiveBudget(GPU_LIKE)
    base = GPU_LIKE.seconds[0]
    for _ in range(50):  # one token accepted per tree, which costs three decode steps to draft: no longer pays
        for n in slow.candidates[1:]:
            observe_chain(slow, n, accepted=1, budget=n, draft_seconds=3 * base)
    assert slow.budget == 0
    fast = AdaptiveBudget(GPU_LIKE)
    for _ in range(50):
        for n in fast.candidates[1:]:
            observe_chain(fast, n, accepted=1, budget=n, draft_seconds=0.0)
    assert fast.budget > 0


def observe_beam(policy, nodes, **kwargs):
    """A tree of `nodes` nodes only two levels deep, a path of two accepted."""
    parents = [ROOT] * 3 + [i // 4 for i in range(nodes - 3)]
    policy.observe(DraftTree(list(range(nodes)), parents, ["model"] * nodes), [0, 3], **kwargs)


def test_each_origin_counts_the_nodes_it_proposed_with_their_ancestors():
    # model: a -> b, a -> c; n-gram: a -> b -> d (a and b merged into the model's nodes), x at the root
    tree = DraftTree([1, 2, 3, 4, 5], [ROOT, 0, 0, 1, ROOT], ["model", "model", "model", "ngram", "ngram"])
    assert proposers(tree) == {"model": {0, 1, 2}, "ngram": {0, 1, 3, 4}}


def test_copies_keep_their_price_beside_a_model_part_that_is_mostly_wrong():
    """A composite whose model part is rejected at depth 1 while the n-gram chains it proposes on a third of
    the steps are accepted whole: the budget stays sized for the copies."""
    mixed = AdaptiveBudget(CPU_LIKE)
    for step in range(90):
        model = DraftTree([1, 2, 3], [ROOT, 0, 1], ["model"] * 3)
        if step % 3:
            mixed.observe(model, [], budget=mixed.budget or 7)
        else:  # the copy's chain beside the model's
            tree = DraftTree([1, 2, 3, 9, 9, 9, 9], [ROOT, 0, 1, ROOT, 3, 4, 5], ["model"] * 3 + ["ngram"] * 4)
            mixed.observe(tree, [3, 4, 5, 6], budget=mixed.budget or 7)
    assert mixed.budget >= 3
    assert mixed.origins["model"].expected_tokens(3) < 1.1 < 4 < mixed.origins["ngram"].expected_tokens(7)


def test_drafting_time_is_priced_per_mode():
    """Copies found on every step, accepted whole; on one step in three the model part joins them, its draft
    forward costing ten decode steps. Averaged over all steps that time would make the copies' trees cost more
    than they commit; priced apart, steps with the copies alone keep the budget sized for them."""
    base = CPU_LIKE.seconds[0]
    policy = AdaptiveBudget(CPU_LIKE)
    copy = DraftTree([9, 9, 9, 9], [ROOT, 0, 1, 2], ["ngram"] * 4)
    with_model = DraftTree([9, 9, 9, 9, 1, 2, 3], [ROOT, 0, 1, 2, ROOT, 4, 5], ["ngram"] * 4 + ["model"] * 3)
    budgets = []
    for step in range(90):
        tree, seconds = (with_model, 10 * base) if step % 3 == 0 else (copy, 0.0)
        budgets.append(policy.budget)
        policy.observe(tree, [0, 1, 2, 3], budget=policy.budget or 7, draft_seconds=seconds)
    assert min(budgets[30:]) >= 7
    ngram, both = frozenset({"ngram"}), frozenset({"ngram", "model"})
    assert policy.relative_cost(7, ngram) < 2 < 10 < policy.relative_cost(7, both)


def test_a_probe_whose_drafting_costs_more_than_its_tokens_fails():
    """TokenSwift-like drafting on a small CPU model: a draft forward per step, some tokens accepted, not enough."""
    policy = AdaptiveBudget(CPU_LIKE, probe_every=4)
    for _ in range(30):
        observe_chain(policy, 4, accepted=0)
    for _ in range(3):
        while not (budget := policy.next_budget()):
            pass
        observe_chain(policy, 3, accepted=1, budget=budget, draft_seconds=2.0)  # two decode steps' time
    assert policy.off_for_good


def test_each_tree_is_sized_for_the_kinds_that_draft_it():
    """A composite whose model part's guesses are rejected beyond depth 1 and whose lookup's chains of 7 are
    accepted whole: a step the lookup drafts alone gets the lookup's budget, not the one-node trees that suit
    the model. Drafting pays while one mode pays."""
    policy = AdaptiveBudget(CPU_LIKE)
    model, ngram = frozenset({"model"}), frozenset({"ngram"})
    for _ in range(30):
        observe_chain(policy, 3, accepted=1, origin="model", budget=3, mode=model, draft_seconds=0.0)
        observe_chain(policy, 7, accepted=7, origin="ngram", budget=7, mode=ngram)
    assert policy.next_budget(model) == 1
    assert policy.next_budget(ngram) == policy.next_budget() == policy.budget >= 7


def test_a_part_that_drafted_in_the_room_another_left_keeps_the_depth_its_own_trees_reach():
    """A model part's chains of 3 reach depth 3 on the steps it leads; on the others the lookup led with 2 nodes
    and the model drafted the 1 node left. Counted there, its trees of 3 nodes would seem 1 deep and be sized
    smaller than they pay."""
    policy = AdaptiveBudget(CPU_LIKE)
    led = DraftTree([1, 2, 3], [ROOT, 0, 1], ["model"] * 3, leaders=frozenset({"model"}))
    followed = DraftTree([1, 7, 8], [ROOT, ROOT, 1], ["model", "ngram", "ngram"], leaders=frozenset({"ngram"}))
    for _ in range(10):
        policy.observe(led, [0, 1], budget=3)
        policy.observe(followed, [0], budget=3)
    assert policy.origins["model"].depth[3] == 3
    assert policy.origins["ngram"].depth[3] == 2
    assert policy.origins["model"].proposed[0] > policy.origins["model"].proposed[2]  # its acceptance counts both


def test_one_shallow_tree_does_not_lock_a_dynamic_drafter_into_small_trees():
    """Trees of 3 nodes are mostly chains whose first two nodes are accepted; now and then the drafter, unsure,
    makes a beam of 3 (depth 1). Priced by that last beam alone, 3 nodes would promise what 1 node does at
    more cost, the budget would fall to 1 and no tree of 3 would come again to correct it."""
    policy = AdaptiveBudget(GPU_LIKE, max_budget=3)
    for step in range(40):
        budget = policy.next_budget()
        if budget == 3 and step % 8 == 7:
            policy.observe(DraftTree([1, 2, 3], [ROOT] * 3, ["model"] * 3), [0], budget=3)
        else:
            observe_chain(policy, budget, min(budget, 2), budget=budget)
    assert policy.budget == 3
    assert 1 < policy.origins["model"].depth[3] < 3


def test_a_calibration_stands_for_contexts_up_to_the_next_power_of_two():
    assert [priced_context(n) for n in (0, 1, 1024, 1025, 2048, 16000, 16384, 16385)] == [
        1024, 1024, 1024, 2048, 2048, 16384, 16384, 32768,
    ]


def test_timed_forwards_move_the_prices_of_their_size_class():
    """A class's factor is the median ratio of its latest timings to the calibration, starting from the factor it
    was priced at; a class not timed takes the factor of the nearest one timed, ties to the smaller."""
    cost = VerifyCost((0, 1, 3, 7), (1.0, 1.05, 1.2, 1.6))
    cost.observe(2, 1.125)  # class 3, as calibrated (2 nodes interpolate to 1.125)
    assert cost.factors == {3: 1.0} and cost.relative(7) == 1.6
    for _ in range(2):
        cost.observe(0, 0.8)  # the decode step got faster; the trees did not
    assert cost.relative(3) == 1.2 / 0.8 and cost.relative(7) == 1.6 / 0.8  # 7 takes 3's factor
    assert cost.relative(1) == 1.05  # 1 is as near 0 as 3: it takes the smaller's factor
    for seconds in (1.0, 1.0, 1.0):
        cost.observe(0, seconds)
    assert cost.factors[0] == 1.0  # the median of 1.0 (its first price), 0.8, 0.8, 1.0, 1.0, 1.0
    for _ in range(LIVE_TIMINGS):
        cost.observe(0, 0.9)
    assert cost.factors[0] == 0.9  # only the latest timings count


def test_one_slow_forward_does_not_move_a_price():
    """A forward slowed by something else (6x its cost, as one after a prompt's prefill was) is outvoted, even
    when it is its class's first timing."""
    cost = VerifyCost((0, 1, 3, 7), (1.0, 1.05, 1.2, 1.6))
    cost.observe(0, 1.0)
    cost.observe(3, 7.2)
    assert cost.relative(3) == 1.2
    for seconds in (1.2, 1.3, 7.2, 1.2):
        cost.observe(3, seconds)
    assert cost.relative(3) == 1.2


def test_a_class_not_timed_lately_takes_its_neighbours_factor():
    cost = VerifyCost((0, 1, 3, 7), (1.0, 1.05, 1.2, 1.6))
    cost.observe(0, 1.0)
    for _ in range(3):
        cost.observe(3, 2.4)  # 3 nodes were slow for a while
    assert cost.relative(3) == 2.4
    for _ in range(STALE_AFTER):
        cost.observe(7, 1.6)  # then only 7-node trees ran, at their calibrated cost
    assert set(cost.factors) == {7} and cost.relative(3) == 1.2


def test_a_slow_forward_does_not_lock_the_budget_out_of_the_best_tree():
    """The 1.5B's costs on the Zen 4 (ms): decode 40, 3 nodes 42, 7 nodes 64, as calibrated; chains accepted at
    0.6 a depth, so 3 nodes pay best. One 3-node forward took 239 ms; averaged into the price of 3 nodes it moved
    the budget to 7 nodes, and 3 nodes, never timed again, kept their price for good."""
    true_ms = {0: 40.0, 1: 41.0, 3: 42.0, 7: 64.0, 15: 120.0}
    cost = VerifyCost((0, 1, 3, 7, 15), tuple(true_ms.values()))
    policy, budgets, rng = AdaptiveBudget(cost), [], random.Random(0)
    for step in range(400):
        budget = policy.next_budget()
        budgets.append(budget)
        accepted = next((d for d in range(budget) if rng.random() >= 0.6), budget)
        seconds = 239.0 if step == 100 else true_ms[budget]
        observe_chain(policy, budget, accepted, budget=budget, verify_seconds=seconds)
    assert budgets[100] == 3 and budgets[101:].count(3) >= len(budgets[101:]) - 10  # and a plain step now and then


def test_while_drafting_a_plain_step_times_the_decode_step_now_and_then():
    policy = AdaptiveBudget(VerifyCost((0, 1, 3, 7), (1.0, 1.0, 1.0, 1.0)))
    plain = []
    for step in range(3 * PLAIN_STEP_EVERY + 3):
        budget = policy.next_budget()
        if not budget:
            plain.append(step)
            policy.observe(DraftTree.empty(), [], verify_seconds=1.0)
        else:
            observe_chain(policy, budget, budget, budget=budget, verify_seconds=1.0)
    assert plain == [PLAIN_STEP_EVERY, 2 * PLAIN_STEP_EVERY + 1, 3 * PLAIN_STEP_EVERY + 2]


def test_a_calibration_timed_under_load_is_corrected_by_the_forwards_decoding_times():
    """The 1.5B's costs on the Zen 4 (ms): decode 33, 3 nodes 40, 7 nodes 64; timed while another process loaded
    the CPU, the decode step took 60 and 7 nodes cost 1.05x it. With chains accepted at 0.6 a depth, 3 nodes pay
    best at the real costs: the timings of decoding bring the budget there, where the calibration alone kept 7."""
    true_ms = {0: 33.0, 1: 34.0, 3: 40.0, 7: 64.0, 15: 120.0}

    def last_budgets(timed: bool) -> list[int]:
        loaded = VerifyCost((0, 1, 3, 7, 15), (60.0, 60.0, 61.0, 63.0, 90.0))
        policy, budgets, rng = AdaptiveBudget(loaded), [], random.Random(0)
        for _ in range(300):
            budget = policy.next_budget()
            budgets.append(budget)
            accepted = next((d for d in range(budget) if rng.random() >= 0.6), budget)
            observe_chain(policy, budget, accepted, budget=budget, verify_seconds=true_ms[budget] if timed else None)
        if timed:
            assert [round(loaded.relative(n), 2) for n in (1, 3)] == [1.0, 1.21]
            assert abs(loaded.relative(7) - 64 / 33) < 0.05  # not timed lately: priced by 3's factor
        return budgets[-100:]

    assert last_budgets(timed=False) == [7] * 100
    assert last_budgets(timed=True).count(3) >= 96  # and a plain step or two; 7 nodes again once their timings expire


def test_siblings_chances_given_their_parent_sum_to_at_most_one():
    paths = {(1,): (0.9, "a"), (2,): (0.6, "b"), (1, 3): (0.45, "a"), (1, 4): (0.45, "b"), (5,): (0.1, "c")}
    bounded = siblings_bounded(paths)
    assert bounded[(1,)][0] == pytest.approx(0.9 / 1.6) and bounded[(2,)] == (pytest.approx(0.6 / 1.6), "b")
    assert bounded[(1, 3)][0] == pytest.approx(0.9 / 1.6 * 0.5)  # its parent's half, as given
    assert siblings_bounded({(1,): (0.5, "a"), (1, 2): (0.2, "a")}) == {(1,): (0.5, "a"), (1, 2): (0.2, "a")}


def test_a_scored_tree_keeps_the_nodes_whose_chances_pay_for_their_rows():
    policy = AdaptiveBudget(VerifyCost((0, 1, 3, 7, 15), (1.0, 1.1, 1.3, 1.8, 2.8)))
    tree = DraftTree.best({(1,): (0.9, "a"), (1, 2): (0.8, "a"), (3,): (0.05, "b"), (1, 2, 4): (0.7, "a")}, 4)
    assert tree.tokens == [1, 2, 4, 3] and tree.scores == [0.9, 0.8, 0.7, 0.05]
    assert policy.size(tree.scores, 0.0) == 3  # the fourth node adds 0.05 tokens for 1.3 -> 1.43x a step: not worth it
    assert tree.cut(3).tokens == [1, 2, 4] and tree.cut(3).parents == [ROOT, 0, 1]
    assert policy.size(tree.scores, 0.0) == policy.size(tree.scores, 0.02)  # drafting done is paid whatever is kept
    for step in range(40):  # a tenth of what its scores promise is accepted: no node pays for its row
        policy.observe(tree.cut(3), [0] if step % 4 == 0 else [], budget=3)
    assert policy.size(tree.scores, 0.0) == 0
    assert policy.scored_budget() == 15


def test_one_slow_scored_tree_does_not_put_the_probes_off():
    """Weak guesses drafted in a tenth of a decode step, one probe's in three steps (a graph captured anew): the
    probes come as often as the usual drafting allows, not after the 150 steps that one tree's time would ask."""
    policy = AdaptiveBudget(VerifyCost((0, 1, 3, 7, 15), (1.0, 1.3, 1.6, 2.2, 3.4)))
    weak = DraftTree.best({(1,): (0.1, "a"), (1, 2): (0.05, "a")}, 2)
    probe_after = round(0.1 / PROBE_SHARE)  # steps whose time a probe's drafting may take PROBE_SHARE of
    asked = []
    for step in range(6 * probe_after):
        asked.append(budget := policy.scored_budget())
        if budget:
            kept = weak.cut(policy.size(weak.scores, 3.0 if step == probe_after else 0.1))
            policy.observe(kept, [], budget=len(kept))
    assert asked == [15, *[0] * (probe_after - 1)] * 6


def test_the_least_chance_worth_a_node_pays_for_its_mean_verification_cost_at_the_expected_speed():
    cpu = AdaptiveBudget(VerifyCost((0, 1, 3, 7, 15), (1.0, 1.1, 1.3, 1.8, 2.8)))
    assert cpu.least_chance() == pytest.approx(1.8 / 15)  # speed and calibration at their priors, 1
    assert AdaptiveBudget(GPU_LIKE).least_chance() < 0.002  # rows nearly free: every node is worth one
    tree = DraftTree.best({(1,): (0.9, "a"), (1, 2): (0.8, "a")}, 2)
    for _ in range(40):  # half of what the scores promise is accepted: a score is worth half a token
        cpu.observe(tree, [0], budget=2)
    assert cpu.least_chance() == pytest.approx(1.8 / 15 * cpu.scored[0] / cpu.scored[1])
    assert cpu.least_chance() > 1.5 * 1.8 / 15


def test_scored_drafting_that_does_not_pay_stops_but_for_probes():
    """Guesses whose chances never pay for a row, drafted in a tenth of a decode step: the drafting alone makes a
    step slower than a plain one, so the budget asks for nothing but a probe whenever the steps since the last
    make its drafting PROBE_SHARE of their time, and a probe whose nodes pay turns drafting back on."""
    policy = AdaptiveBudget(VerifyCost((0, 1, 3, 7, 15), (1.0, 1.3, 1.6, 2.2, 3.4)))
    weak = DraftTree.best({(1,): (0.1, "a"), (1, 2): (0.05, "a")}, 2)
    strong = DraftTree.best({(1,): (0.9, "a"), (1, 2): (0.8, "a")}, 2)
    asked = []
    for step in range(24):
        asked.append(budget := policy.scored_budget())
        if budget:
            tree = strong if step == 20 else weak
            kept = tree.cut(policy.size(tree.scores, 0.1))
            policy.observe(kept, list(range(len(kept))) if tree is strong else [], budget=len(kept))
    probe_after = round(0.1 / PROBE_SHARE)  # steps whose time a probe's drafting may take PROBE_SHARE of
    assert asked[:20] == [15, *[0] * (probe_after - 1)] * (20 // probe_after)  # weak trees cut to nothing
    assert asked[20:] == [15, 15, 15, 15]  # the strong probe's two nodes paid: drafting is back on
