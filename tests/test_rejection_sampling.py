"""Recursive rejection sampling (`specchat.engine.verify.accept_sampled`) is exact, and accepts more.

When a drafter samples a node's children from its own distribution q — without replacement: child i from q
with the earlier siblings removed and renormalised, which is what its `draft_probs` row holds — the
verifier tries them in order, accepting child i with probability min(1, r(x_i) / q_i(x_i)) and otherwise
moving on with the residual r <- norm(max(r - q_i, 0)) (r starts as the target's p), the bonus drawn from
the final r. Proven here:

1. on constructed distributions over a 6-token vocabulary, no model: over thousands of seeded trials with
   fresh children every trial, the first committed token (the accepted child's, else the bonus) is
   distributed exactly as p (chi-square at p = 0.001) — for q close to p, q far from p, q with zeros where
   p > 0, p with zeros where q > 0, and k = 1, 2, 4 children; the first child is accepted with probability
   sum_x min(p(x), q(x)) (the standard speculative-sampling acceptance rate); deterministic children (all-zero
   `draft_probs` rows, alone or mixed with sampled siblings) fall back to one target draw per node and stay
   exact; a depth-2 tree gives the exact joint p(x1) p(x2 | x1);
2. the test has power: the same trials verified by wrong rules — ignoring the residual (every child tested
   against p, the bonus drawn from p), testing every child against p instead of the residual, or a drafter
   that records the undivided q for every sibling drawn without replacement — are rejected by the same
   chi-square test;
3. end to end: `Engine.generate` on a tiny 8-token model with a drafter that samples depth-2 trees from its
   own distribution produces the first three tokens with exactly the target-only joint distribution (plain
   temperature 1, and top-k + top-p + penalty with a drafter whose q has zeros where p > 0 and mass where
   p = 0); at temperature 1 it commits clearly more drafted tokens than per-node verification of the very
   same trees without `draft_probs`; a buggy drafter's `draft_probs` is caught there too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from chi_square import CHI2_CRITICAL_P001, assert_fits, assert_rejected, chi_square
from conftest import tiny_model
from drafters_for_tests import SampledTreeDrafter, sample_children
from test_sampling_verification import CONFIGS, PROMPT, Target, exact_joint

from specchat.engine.generate import Engine
from specchat.engine.sampling import Processed, SamplingConfig, process_rows
from specchat.engine.tree import ROOT, DraftTree
from specchat.engine.verify import Verdict, accept_sampled, verify

# --- chi-square -----------------------------------------------------------------------------------------

def test_critical_values_are_the_0_001_quantiles():
    for df, value in CHI2_CRITICAL_P001.items():
        tail = torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(value / 2.0))
        assert abs(float(tail) - 0.001) < 2e-6, (df, float(tail))


def test_chi_square_pools_and_detects():
    exact = {"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.04, "e": 0.01}
    assert chi_square(Counter(a=500, b=300, c=150, d=40, e=10), exact) == (0.0, 4)
    # d and e pooled expect 5: too few, so they join c
    assert chi_square(Counter(a=50, b=30, c=15, d=4, e=1), exact)[1] == 2
    assert_rejected(Counter(a=600, b=250, c=100, d=40, e=10), exact, "a skewed sample")
    with pytest.raises(AssertionError, match="probability 0"):
        chi_square(Counter(a=10, z=1), exact)


# --- 1. accept_sampled on constructed distributions -----------------------------------------------------

V = 6
P = [0.35, 0.25, 0.15, 0.12, 0.08, 0.05]
DISTRIBUTIONS = {  # name: (target p, drafter q)
    "q_close_to_p": (P, [0.33, 0.27, 0.14, 0.13, 0.07, 0.06]),
    "q_far_from_p": (P, P[::-1]),
    "q_zero_where_p_positive": (P, [0.4, 0.0, 0.3, 0.2, 0.1, 0.0]),  # k = 4 exhausts q's support
    "p_zero_where_q_positive": ([0.4, 0.3, 0.0, 0.2, 0.0, 0.1], [0.1, 0.1, 0.3, 0.1, 0.3, 0.1]),
}
TRIALS = 2500
UNIFORM = [1 / V] * V  # the rows of the children themselves: only drawn from after an accepted child


def tensor(probs: list[float]) -> torch.Tensor:
    t = torch.tensor(probs, dtype=torch.float32)
    return t / t.sum()


def first_token(tree: DraftTree, verdict: Verdict) -> int:
    return tree.tokens[verdict.path[0]] if verdict.path else verdict.bonus


def one_level_trials(p, q, k, *, seed, rows="drawn", verifier=accept_sampled, trials=TRIALS):
    """Trials of a one-level tree: up to k children of the root drawn from q without replacement, fresh every
    trial, verified against p. `rows` is what the tree records as draft_probs: "drawn" (each child's own
    sampling distribution), "first" (the undivided q for every child: a drafter bug) or "zero" (deterministic
    nodes). Returns the counts of the first committed token and how often the first child was accepted."""
    p, q = tensor(p), tensor(q)
    generator = torch.Generator().manual_seed(seed)
    counts, first_accepted = Counter(), 0
    for _ in range(trials):
        tokens, dists = sample_children(q, k, generator)
        draft_probs = {
            "drawn": lambda: torch.stack(dists),
            "first": lambda: q.expand(len(tokens), V),
            "zero": lambda: torch.zeros(len(tokens), V),
        }[rows]()
        tree = DraftTree(tokens, [ROOT] * len(tokens), ["sampled"] * len(tokens), draft_probs)
        probs = torch.stack([p] + [tensor(UNIFORM)] * len(tokens))
        verdict = verifier(tree, probs, generator)
        counts[first_token(tree, verdict)] += 1
        first_accepted += verdict.path[:1] == [0]
    return counts, first_accepted / trials


def exact_of(p: list[float]) -> dict[int, float]:
    p = tensor(p).double()
    return {t: float(p[t]) for t in range(V)}


def sigma(rate: float, trials: int) -> float:
    return (rate * (1 - rate) / trials) ** 0.5


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_first_token_is_distributed_as_p(name, k):
    p, q = DISTRIBUTIONS[name]
    counts, first_rate = one_level_trials(p, q, k, seed=100 * k + len(name))
    assert_fits(counts, exact_of(p), f"recursive rejection sampling, {name}, k = {k}")
    # the first child is drawn from q itself and accepted with probability sum_x min(p(x), q(x))
    expected_rate = float(torch.minimum(tensor(p), tensor(q)).sum())
    assert abs(first_rate - expected_rate) < 5 * sigma(expected_rate, TRIALS) + 1e-9, (first_rate, expected_rate)


def test_acceptance_rate_of_one_child_is_the_overlap_of_p_and_q():
    """k = 1 is standard speculative sampling: accepted with probability sum_x min(p, q) = 1 - TV(p, q),
    which beats matching an independent target draw (sum_x p q) and is certain when q = p."""
    p, far = DISTRIBUTIONS["q_far_from_p"]
    trials = 2000
    for q in (far, [0.6, 0.1, 0.1, 0.1, 0.05, 0.05], P):
        _, rate = one_level_trials(P, q, 1, seed=7, trials=trials)
        overlap = float(torch.minimum(tensor(p), tensor(q)).sum())
        assert abs(rate - overlap) < 5 * sigma(overlap, trials) + 1e-9, (q, rate, overlap)
        assert overlap >= float((tensor(p) * tensor(q)).sum())
    assert rate == 1.0  # q = p


@pytest.mark.parametrize("name", ["q_far_from_p", "p_zero_where_q_positive"])
def test_deterministic_children_fall_back_to_one_draw_per_node(name):
    """All-zero draft_probs rows: the children are fixed proposals, matched against one target draw; the
    first child is then accepted with probability p(its token), and the output is still exactly p."""
    p, q = DISTRIBUTIONS[name]
    counts, first_rate = one_level_trials(p, q, 2, seed=5, rows="zero")
    assert_fits(counts, exact_of(p), f"deterministic children, {name}")
    # with "zero" rows the children are still drawn from q, so the first child's acceptance is E_q[p(x)]
    expected_rate = float((tensor(p) * tensor(q)).sum())
    assert abs(first_rate - expected_rate) < 5 * sigma(expected_rate, TRIALS), (first_rate, expected_rate)


def test_fixed_children_and_mixed_siblings_are_exact():
    """The likeliest tokens of p as fixed children (the adversarial proposal), and sampled siblings mixed with
    a deterministic one (the node falls back to one draw): both exact."""
    p = tensor(P)
    generator = torch.Generator().manual_seed(3)
    fixed = DraftTree([0, 1], [ROOT, ROOT], ["fixed"] * 2, torch.zeros(2, V))
    counts_fixed, counts_mixed, taken = Counter(), Counter(), Counter()
    for _ in range(TRIALS):
        verdict = accept_sampled(fixed, torch.stack([p] * 3), generator)
        counts_fixed[first_token(fixed, verdict)] += 1
        tokens, dists = sample_children(tensor(P[::-1]), 2, generator)
        deterministic = next(t for t in range(V) if t not in tokens)
        mixed = DraftTree(
            [*tokens, deterministic], [ROOT] * 3, ["sampled", "sampled", "fixed"], torch.stack([*dists, torch.zeros(V)])
        )
        verdict = accept_sampled(mixed, torch.stack([p] * 4), generator)
        counts_mixed[first_token(mixed, verdict)] += 1
        taken[len(verdict.path)] += 1
    assert_fits(counts_fixed, exact_of(P), "fixed children")
    assert_fits(counts_mixed, exact_of(P), "sampled siblings mixed with a deterministic one")
    # per-node matching of fixed tokens 0 and 1 accepts with probability p(0) + p(1)
    assert abs(sum(counts_fixed[t] for t in (0, 1)) / TRIALS - 0.6) < 5 * sigma(0.6, TRIALS)


def test_depth_two_joint_is_exact():
    """Three children of the root, two under each, all sampled from the drafter's own conditional q: the first
    two committed tokens (extended by one target draw when the step committed a single token, as the next
    step would) have the joint p(x1) p(x2 | x1). Covers accepting a child then running rejection sampling
    again from that child's own target row, and the bonus after an accepted child."""
    g = torch.Generator().manual_seed(11)
    p0, q0 = tensor(P), tensor(P[::-1])
    p1 = torch.rand(V, V, generator=g) ** 3  # p(x2 | x1): peaked, with a few near-zero entries
    p1[:, 2] = 0  # and a token the target never draws after a first token, which q proposes
    p1 = p1 / p1.sum(-1, keepdim=True)
    q1 = (torch.rand(V, V, generator=g) + 0.05).softmax(-1)  # q(x2 | x1): flat
    trials = 3000
    counts, accepted = Counter(), Counter()
    for _ in range(trials):
        tokens, parents, rows = [], [], []
        first, dists = sample_children(q0, 3, g)
        tokens += first
        parents += [ROOT] * len(first)
        rows += dists
        for parent, x1 in enumerate(first):
            second, dists = sample_children(q1[x1], 2, g)
            tokens += second
            parents += [parent] * len(second)
            rows += dists
        tree = DraftTree(tokens, parents, ["sampled"] * len(tokens), torch.stack(rows))
        probs = torch.stack([p0] + [p1[t] if tree.depths[i] == 1 else tensor(UNIFORM) for i, t in enumerate(tokens)])
        verdict = accept_sampled(tree, probs, g)
        out = [tree.tokens[node] for node in verdict.path] + [verdict.bonus]
        if len(out) == 1:
            out.append(int(torch.multinomial(p1[out[0]], 1, generator=g)))
        counts[tuple(out[:2])] += 1
        accepted[len(verdict.path)] += 1
    joint = (p0[:, None].double() * p1.double()).tolist()
    exact = {(a, b): joint[a][b] for a in range(V) for b in range(V)}
    assert_fits(counts, exact, "depth-2 recursive rejection sampling")
    assert accepted[2] > trials // 10, accepted  # depth 2 was really reached


def test_verify_routes_sampled_trees():
    """`verify` uses recursive rejection sampling only when sampling and draft_probs is present; greedy
    verification ignores draft_probs."""
    logits = torch.log(tensor(P))[None].expand(2, V)
    tree = DraftTree([5], [ROOT], ["sampled"], tensor(P[::-1])[None])
    greedy = verify(tree, Processed(logits), SamplingConfig(), torch.Generator().manual_seed(0))
    assert greedy == Verdict([], 0)  # the argmax, 5 rejected
    sampling = SamplingConfig(temperature=1.0)
    # token 5 has q = 0.35 and p = 0.05: recursive rejection accepts it with probability 1/7, whereas
    # one target draw matches it with probability 0.05
    hits = sum(
        verify(tree, process_rows(logits, sampling), sampling, torch.Generator().manual_seed(s)).path == [0]
        for s in range(2000)
    )
    assert abs(hits / 2000 - 0.05 / 0.35) < 5 * sigma(1 / 7, 2000), hits


# --- 2. the test has power: wrong rules are caught ------------------------------------------------------


def accept_without_residual(tree: DraftTree, probs: torch.Tensor, generator) -> Verdict:
    """Wrong: every child of the root is tested against p itself, and after rejecting them all the bonus is
    resampled from p instead of the residual norm(max(r - q, 0))."""
    p = probs[0]
    for kid, (token, q) in enumerate(zip(tree.tokens, tree.draft_probs)):
        if torch.rand((), generator=generator) * q[token] < p[token]:
            return Verdict([kid], int(torch.multinomial(probs[kid + 1], 1, generator=generator)))
    return Verdict([], int(torch.multinomial(p, 1, generator=generator)))


def accept_ratio_against_p(tree: DraftTree, probs: torch.Tensor, generator) -> Verdict:
    """Wrong: the residual is kept and the bonus drawn from it, but every child is accepted with probability
    min(1, p(x) / q_i(x)) — against p itself instead of the current residual (only multi-child nodes go
    wrong: the first child's test is right)."""
    p = residual = probs[0]
    for kid, (token, q) in enumerate(zip(tree.tokens, tree.draft_probs)):
        if torch.rand((), generator=generator) * q[token] < p[token]:
            return Verdict([kid], int(torch.multinomial(probs[kid + 1], 1, generator=generator)))
        left = (residual - q).clamp(min=0)
        residual = left / left.sum() if left.sum() > 0 else residual
    return Verdict([], int(torch.multinomial(residual, 1, generator=generator)))


@pytest.mark.parametrize(
    "wrong, name, k",
    [
        ("without_residual", "q_far_from_p", 1),
        ("without_residual", "p_zero_where_q_positive", 2),
        ("ratio_against_p", "q_far_from_p", 2),
        ("ratio_against_p", "p_zero_where_q_positive", 4),
        ("same_q_for_all_siblings", "q_far_from_p", 4),
        ("same_q_for_all_siblings", "p_zero_where_q_positive", 4),
    ],
)
def test_wrong_rules_are_caught(wrong, name, k):
    p, q = DISTRIBUTIONS[name]
    seed = 100 * k + len(name)  # the very trials the right rule passes on in test_first_token_is_distributed_as_p
    if wrong == "same_q_for_all_siblings":  # the verifier is right, the drafter's draft_probs are not
        counts, _ = one_level_trials(p, q, k, seed=seed, rows="first")
    else:
        verifier = {"without_residual": accept_without_residual, "ratio_against_p": accept_ratio_against_p}
        counts, _ = one_level_trials(p, q, k, seed=seed, verifier=verifier[wrong])
    assert_rejected(counts, exact_of(p), f"{wrong}, {name}, k = {k}")


# --- 3. end to end: the engine with a drafter that samples its trees ------------------------------------

VOCAB = 8
TOKENS = 3  # the joint of the first three generated tokens: the prefill's, then the first tree step's two
# The power at hand: a drafter whose draft_probs are wrong gives chi2 = 157 against 54 (p = 0.001) at 600 samples
# (test_engine_catches_a_drafter_with_wrong_draft_probs); recursive rejection sampling's gain over per-node
# verification is 19 standard errors at 1000 samples (24 at 1500), where the test asks for 5.
SAMPLES = 1000
BUDGET = 16
WIDTHS = (3, 2)  # 3 children of the root, 2 under each: 9 nodes, depth 2
EOS = {2}


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2", vocab_size=VOCAB, seed=1)


def draft_distribution(target: Target, kind: str):
    """The drafter's q(context), from the target's raw logits: 'flat' = softmax at temperature 2; 'top4' =
    the softmax cut to its 4 likeliest tokens (so q has zeros where the processed p is positive, and mass
    where top-k / top-p / the penalty zeroed p); 'anti' = softmax of the negated logits (the target's least
    likely tokens first)."""

    def q(context: tuple[int, ...]) -> torch.Tensor:
        logits = target.logits(context)[0]
        if kind == "flat":
            return (logits / 2).softmax(-1)
        if kind == "anti":
            return (-logits).softmax(-1)
        probs = logits.softmax(-1)
        return torch.where(probs >= probs.topk(4).values[-1], probs, 0)

    return q


def engine_run(model, tokenizer, drafter, sampling: SamplingConfig, samples: int = SAMPLES):
    """`samples` generations with engine seeds 0, 1, ...: the outputs' counts, per generation the number of
    drafted tokens committed by the first tree step (its accepted path: depth 2 always fits in TOKENS), and
    per generation the first tree's (tokens, parents) — None when the prefill drew EOS."""
    engine = Engine(model, tokenizer, max_len=64, drafter=drafter, draft_budget=BUDGET)
    assert set(engine.eos_ids) == EOS
    counts, accepted, first_trees = Counter(), [], []
    for seed in range(samples):
        proposed = len(drafter.proposals)
        events = list(engine.generate(PROMPT, sampling=replace(sampling, seed=seed), max_new_tokens=TOKENS))
        counts[tuple(t for event in events for t in event.tokens)] += 1
        first = drafter.proposals[proposed] if len(drafter.proposals) > proposed else None
        first_trees.append(None if first is None else (first.tokens, first.parents))
        accepted.append(sum(origin == drafter.kind for origin in events[1].origins) if len(events) > 1 else 0)
    return counts, accepted, first_trees


def test_engine_with_sampled_trees_is_lossless_and_accepts_more(model, tokenizer):
    """Temperature 1, a drafter flatter than the target: recursive rejection sampling is exact, and on the
    very same first trees (same prompt, engine seed and drafter seed per request) it commits clearly more
    drafted tokens than per-node verification of those trees without draft_probs (also exact)."""
    sampling = CONFIGS["t1"]
    target = Target(model, sampling)
    exact = exact_joint(target, PROMPT, TOKENS)
    q = draft_distribution(target, "flat")

    rrs = SampledTreeDrafter(q, widths=WIDTHS, seed=10_000, record="drawn")
    counts, accepted, first_trees = engine_run(model, tokenizer, rrs, sampling)
    assert all(tree.draft_probs is not None and tree.depth == 2 for tree in rrs.proposals)
    assert_fits(counts, exact, "engine, recursive rejection sampling of sampled trees")

    per_node = SampledTreeDrafter(q, widths=WIDTHS, seed=10_000, record=None)
    counts_per_node, accepted_per_node, first_trees_per_node = engine_run(model, tokenizer, per_node, sampling)
    assert all(tree.draft_probs is None for tree in per_node.proposals)
    assert_fits(counts_per_node, exact, "engine, per-node verification of the same drafter's trees")

    assert first_trees == first_trees_per_node
    mean, mean_per_node = sum(accepted) / SAMPLES, sum(accepted_per_node) / SAMPLES
    diffs = [a - b for a, b in zip(accepted, accepted_per_node)]
    spread = (sum((d - (mean - mean_per_node)) ** 2 for d in diffs) / (SAMPLES - 1) / SAMPLES) ** 0.5
    assert mean - mean_per_node > 5 * spread, (mean, mean_per_node, spread)
    assert mean > 1, mean  # most first steps accept depth 2


def test_engine_with_sampled_trees_under_processed_sampling_is_lossless(model, tokenizer):
    """Top-k + top-p + the repetition penalty (each node's p from its own processed row and history), with a
    drafter whose q ignores all that: drafted tokens outside p's support, and p's tokens outside q's."""
    sampling = CONFIGS["processed"]
    target = Target(model, sampling)
    exact = exact_joint(target, PROMPT, TOKENS)
    drafter = SampledTreeDrafter(draft_distribution(target, "top4"), widths=WIDTHS, seed=20_000)
    counts, accepted, _ = engine_run(model, tokenizer, drafter, sampling, samples=1200)
    assert sum(accepted) > 1200 // 2, sum(accepted)
    assert_fits(counts, exact, "engine, recursive rejection sampling under top-k, top-p and the penalty")


def test_engine_catches_a_drafter_with_wrong_draft_probs(model, tokenizer):
    """The end-to-end test has power too: a drafter that proposes the target's unlikely tokens and records the
    undivided q for siblings it drew without replacement biases the output, and the engine run is rejected."""
    sampling = CONFIGS["t1"]
    target = Target(model, sampling)
    exact = exact_joint(target, PROMPT, TOKENS)
    buggy = SampledTreeDrafter(draft_distribution(target, "anti"), widths=(4,), seed=30_000, record="first")
    counts, _, _ = engine_run(model, tokenizer, buggy, sampling, samples=600)
    assert_rejected(counts, exact, "a drafter whose draft_probs ignore sampling without replacement")
