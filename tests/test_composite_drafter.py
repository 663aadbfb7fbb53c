"""Composite drafts (`--drafter longspec+ngram`): two drafters' trees merged into one, verified losslessly.

- the merge keeps the first tree, adds the second's new nodes (siblings distinct, origins kept, the first
  drafter's origin where both proposed a token), stays within the budget and leaves out nodes whose
  parent did not fit; on crafted and on random trees;
- the n-gram tree is kept whole and the model drafts within the rest of the budget, while the lookup's trees
  match more of the committed tokens than the model's; else the model leads; a long copy leads a model whose
  top guess is right more often;
- the model drafts only while drafting with both parts commits more tokens per second than n-gram alone:
  the choice on a crafted clock, then a slow drafter that is never right (left out but for probes) and an
  oracle (kept);
- greedy output with LongSpec (a random layer) + n-gram equals target-only greedy decoding, and both
  drafters' tokens are accepted; sampled output passes the chi-square test of target-only sampling, while
  the same merge keeping every draft row of the first drafter (also where the n-gram drafter proposed a
  child of the same node) is caught by it;
- `A+B` parses in the registry (paths with '+' included), resolves and builds per part, and bad composites
  are one line, in the CLI too.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace

import pytest
import torch
from chi_square import assert_fits
from conftest import tiny_model
from queue_drains import QueueDrains
from test_cli import assert_one_line_error, specchat
from test_longspec import generate, random_layer, widths
from test_sampling_verification import PROMPT, TOKENS, Target, exact_joint

from specchat.drafters import DrafterChoice, build_drafter, parse_drafter, resolve_drafter
from specchat.drafters.composite import CompositeDrafter, matched_run, merge_trees, merged_on_device
from specchat.drafters.longspec.drafter import LongSpecDrafter
from specchat.drafters.longspec.model import LongSpecConfig, LongSpecLayer, save_longspec
from specchat.drafters.mode_choice import BOTH, FIRST_STEPS, SECOND, ModeChoice
from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.engine.drafter import DraftsAlone
from specchat.engine.events import COPY, TARGET
from specchat.engine.generate import Engine
from specchat.engine.sampling import SamplingConfig
from specchat.engine.tree import ROOT, DraftTree, TreeBuilder, best_first
from specchat.errors import SpecchatError
from specchat.profiles import load_profiles

REPETITIVE = [5, 9, 12, 7, 5, 9, 12, 7, 5, 9, 12, 7, 5, 9]


def paths(tree: DraftTree) -> list[tuple[int, ...]]:
    """Each node's tokens from the root's child down to it: what identifies a node across trees."""
    return [tuple(tree.tokens[node] for node in tree.path_to(i)) for i in range(len(tree))]


def assert_well_formed(tree: DraftTree, budget: int) -> None:
    assert len(tree) <= budget
    assert len(set(zip(tree.parents, tree.tokens))) == len(tree)  # siblings distinct
    DraftTree(tree.tokens, tree.parents, tree.origins)  # parents precede children


# --- the merge ------------------------------------------------------------------------------------------


def test_the_second_tree_joins_the_first_without_duplicates():
    first = DraftTree([10, 11, 12, 13], [ROOT, ROOT, 0, 2], ["longspec"] * 4)
    second = DraftTree.from_chains([[10, 12, 14], [15, 16], [11]], "ngram", 64)
    merged = merge_trees(first, second, 64)
    assert merged.tokens == [10, 11, 12, 13, 14, 15, 16]
    assert merged.parents == [ROOT, ROOT, 0, 2, 2, ROOT, 5]
    assert merged.origins == ["longspec"] * 4 + ["ngram"] * 3  # 10, 12 and 11 keep the first drafter's origin
    assert_well_formed(merged, 64)
    # the budget cuts the second's nodes in its order, and a node whose parent was cut goes with it
    assert merge_trees(first, second, 6).tokens == [10, 11, 12, 13, 14, 15]
    assert merge_trees(first, second, 5).tokens == [10, 11, 12, 13, 14]
    assert merge_trees(first, second, 3).tokens == [10, 11, 12]
    assert merge_trees(first, DraftTree.empty(), 64) == first
    assert merge_trees(DraftTree.empty(), second, 64).tokens == second.tokens


def random_tree(rng: random.Random, origin: str, size: int) -> DraftTree:
    builder = TreeBuilder()
    for _ in range(size):
        builder.add(rng.choice([ROOT, *range(len(builder))]), rng.randrange(3), origin)  # 3 tokens: many repeats
    return builder.build()


@pytest.mark.parametrize("seed", range(20))
def test_random_trees_merge_into_their_union_within_the_budget(seed):
    rng = random.Random(seed)
    first, second = random_tree(rng, "first", rng.randint(0, 12)), random_tree(rng, "second", rng.randint(0, 12))
    union = set(paths(first)) | set(paths(second))
    for budget in range(1, len(union) + 2):
        merged = merge_trees(first, second, budget)
        assert_well_formed(merged, budget)
        assert len(merged) == min(budget, len(union))
        assert set(paths(merged)) <= union
        assert set(paths(first)[:budget]) <= set(paths(merged))  # the first tree comes first
        for path, origin in zip(paths(merged), merged.origins):
            assert origin == ("first" if path in paths(first) else "second")


# --- the composite drafter ------------------------------------------------------------------------------


class AlwaysBoth(ModeChoice):
    """Both parts draft every step: what the merge tests check, whatever the timings say."""

    def committed(self, tokens: int, second_alone: int | None = None) -> None:
        pass


def merging(first, second, composite=CompositeDrafter) -> CompositeDrafter:
    drafter = composite(first, second)
    drafter.modes = AlwaysBoth()
    return drafter


class RecordingComposite(CompositeDrafter):
    """The composite as it is, keeping every tree it proposed."""

    def __init__(self, first, second):
        super().__init__(first, second)
        self.modes = AlwaysBoth()
        self.trees: list[tuple[int, DraftTree]] = []

    def propose(self, budget, sampling, least_chance=0.0, noise=None):
        tree = super().propose(budget, sampling, least_chance, noise)
        self.trees.append((budget, tree))
        return tree


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("budget", [4, 16])
def test_greedy_output_equals_the_target_alone(family, chain, budget, tokenizer):
    model = tiny_model(family, vocab_size=64, seed={"llama": 0, "qwen2": 3}[family])
    engine = Engine(model, tokenizer, max_len=256)
    expected = generate(engine, REPETITIVE, 96)
    longspec = LongSpecDrafter(engine.target, random_layer(model), widths=widths(chain))
    drafter = RecordingComposite(longspec, NgramDrafter())
    engine.set_drafter(drafter, budget)
    events = list(engine.generate(REPETITIVE, max_new_tokens=96))
    assert [t for event in events for t in event.tokens] == expected
    accepted = Counter(origin for event in events for origin in event.origins if origin != TARGET)
    assert set(accepted) <= {"longspec", "ngram"} and accepted["ngram"] > 0, accepted
    if not chain:  # the beam's tokens are accepted too (the random chain's rarely are)
        assert accepted["longspec"] > 0, accepted
    for asked, tree in drafter.trees:
        assert_well_formed(tree, asked)
    assert any({"longspec", "ngram"} <= set(tree.origins) for _, tree in drafter.trees)
    assert generate(engine, REPETITIVE + expected[:20], 30) == expected[20:50]  # the next turn reuses the cache


@pytest.mark.parametrize("budget", [1, 3, 7, 16, 31])
def test_the_ngram_tree_is_kept_whole_and_the_model_drafts_within_the_rest(budget, tokenizer):
    model = tiny_model("llama", vocab_size=64)
    engine = Engine(model, tokenizer, max_len=256)
    beam, ngram = LongSpecDrafter(engine.target, random_layer(model)), NgramDrafter()
    drafter = merging(beam, ngram)
    engine.set_drafter(drafter, budget)
    checked = 0
    for _ in engine.generate(REPETITIVE, max_new_tokens=48):  # between steps, as the engine would call it
        alone = ngram.propose(budget)
        tree = drafter.propose(budget, SamplingConfig())
        assert_well_formed(tree, budget)
        assert tree.origins.count("longspec") == budget - len(alone)  # a beam fills what it is given
        assert set(paths(alone)) <= set(paths(tree))  # the n-gram drafter's tree is all there
        checked += len(alone) > 0
    assert checked > 0


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_steps(choice: ModeChoice, clock: Clock, steps: int, cost: dict, tokens: dict) -> list[str]:
    """`steps` steps as the composite drives the choice, each ending in one commit; the modes chosen."""
    modes = []
    for _ in range(steps):
        modes.append(choice.mode)
        clock.now += cost[choice.mode]
        choice.committed(tokens[choice.mode])
    return modes


def test_the_mode_that_commits_more_tokens_per_second_is_chosen_and_the_other_probed():
    clock = Clock()
    choice = ModeChoice(probe_every=16, clock=clock)
    choice.committed(1)  # the prefill's token: the first step starts
    # The model's draft costs 3 ms a step and adds half a token: 2.5 tokens in 8 ms against 2 in 5 ms.
    modes = run_steps(choice, clock, 64, cost={BOTH: 0.008, SECOND: 0.005}, tokens={BOTH: 2.5, SECOND: 2})
    assert modes[:4] == [BOTH, BOTH, BOTH, SECOND]  # each tried (the model three times), then the faster
    assert [i + 1 for i, mode in enumerate(modes[4:], 4) if mode == BOTH] == [16, 32, 48, 64]  # probes
    # The text changes: the model now adds three tokens a step (5 in 8 ms); the probes see it.
    modes = run_steps(choice, clock, 64, cost={BOTH: 0.008, SECOND: 0.005}, tokens={BOTH: 5, SECOND: 2})
    assert modes[-16:].count(BOTH) == 15 and modes[-16:].count(SECOND) == 1


def test_the_second_alone_is_counted_on_every_step_and_timed_on_its_own():
    """While both parts draft, what the lookup alone would have committed is counted on each step, so its own
    steps only time it: probed every 64 steps, and a lucky probe (4 tokens where it would have committed 1 on
    the steps before) does not hand it the steps after."""
    clock = Clock()
    choice = ModeChoice(clock=clock)
    choice.committed(1)  # the prefill's token: the first step starts
    modes = []
    for step in range(200):
        modes.append(choice.mode)
        clock.now += 0.008 if choice.mode == BOTH else 0.005  # 2 tokens in 8 ms against 1 in 5 ms
        lucky = step > 100
        choice.committed(2 if choice.mode == BOTH else 4 if lucky else 1, second_alone=1)
    assert modes[:4] == [BOTH, BOTH, BOTH, SECOND]  # each tried, then the faster
    assert [i + 1 for i, mode in enumerate(modes[4:], 4) if mode == SECOND] == [64, 128, 192]


def test_the_time_before_a_request_is_no_step():
    clock = Clock()
    choice = ModeChoice(clock=clock)
    clock.now += 1.0  # loading, then the first request's prefill
    choice.committed(1)
    assert choice.seconds == {BOTH: 0.0, SECOND: 0.0}
    clock.now += 0.25
    choice.committed(3)
    assert (choice.tokens, choice.seconds) == ({BOTH: 3.0, SECOND: 0.0}, {BOTH: 0.25, SECOND: 0.0})
    choice.restart()  # a new request: the time since the last commit (the user typing, a prefill) was no step
    clock.now += 5.0
    choice.committed(1)
    assert choice.seconds == {BOTH: 0.25, SECOND: 0.0}


class Always(DraftsAlone):
    """A drafter that guesses the same one token every step."""

    def __init__(self, kind: str, token: int):
        self.kind, self.token = kind, token

    def prefill(self, ids, hidden, reused):
        pass

    def commit(self, tokens, hidden):
        pass

    def propose(self, budget, sampling, least_chance=0.0, noise=None):
        return DraftTree([self.token], [ROOT], [self.kind]) if budget else DraftTree.empty()


def test_the_part_whose_trees_matched_more_leads():
    """In trees of one node, the lookup leads at first (as a composite always let it), then the part whose guess
    has been the target's next token more often; when the text turns, the lead follows."""
    composite = CompositeDrafter(Always("model", 1), Always("ngram", 2))
    ticks = itertools.count()
    composite.modes = ModeChoice(clock=lambda: next(ticks), probe_every=1000)  # no probes of the lookup alone
    leads = []
    for target_token in [1] * 30 + [2] * 60:
        tree = composite.propose(1, SamplingConfig())
        leads.append(tree.origins[0])
        assert tree.leaders == {tree.origins[0]}  # the budget learns depths only from the part that led
        composite.commit([target_token], None)
    assert leads[0] == "ngram" and leads[4] == "ngram"  # the lookup alone is timed once after the first steps
    assert leads[5:30] == ["model"] * 25  # right every step, where the lookup never was
    assert "ngram" in leads[30:60] and leads[60:] == ["ngram"] * 30


class Copy(DraftsAlone):
    """A lookup that proposes a chain of 4 tokens every step, right (all of it) one step in three."""

    kind = "ngram"

    def __init__(self):
        self.step = 0

    def prefill(self, ids, hidden, reused):
        pass

    def commit(self, tokens, hidden):
        self.step += 1

    def propose(self, budget, sampling, least_chance=0.0, noise=None):
        tokens = [5, 6, 7, 8] if self.step % 3 == 0 else [9, 9, 9, 9]
        return DraftTree(tokens[:budget], [ROOT, 0, 1, 2][:budget], [self.kind] * min(budget, 4))




def test_a_long_copy_leads_a_model_whose_top_guess_is_right_more_often():
    """The model's one-node guess is right 3 steps in 4, the lookup's top guess 1 in 3 but then with 3 more
    tokens: its trees match more (1.33 against 0.75 tokens a step) and it leads, its chains whole."""
    model = Always("model", 5)
    composite = CompositeDrafter(model, Copy())
    composite.modes = AlwaysBoth()
    leads = []
    for step in range(60):
        model.token = 5 if step % 4 else 0  # wrong every fourth step
        tree = composite.propose(4, SamplingConfig())
        leads.append(tree.origins[0])
        composite.commit([5, 6, 7, 8, 1] if step % 3 == 0 else [5, 2], None)
    assert leads[10:] == ["ngram"] * 50


class Scored(Always):
    """A drafter whose nodes carry chances, as TokenSwift's heads: a fixed set of paths."""

    scores_nodes = True

    def __init__(self, paths):
        super().__init__("tokenswift", 0)
        self.paths, self.calls = paths, 0

    def propose(self, budget, sampling, least_chance=0.0, noise=None):
        self.calls += 1
        return DraftTree.best(self.paths, budget)


def test_scored_parts_merge_by_their_chances_and_a_copy_is_drafted_alone():
    heads = Scored({(9,): (0.9, "tokenswift"), (9, 8): (0.5, "tokenswift")})
    composite = CompositeDrafter(heads, NgramDrafter())
    composite.modes = AlwaysBoth()
    composite.prefill([5, 6, 7, 5], None, 0)  # "5" occurred: 6 next, at a one-token match's 0.21
    tree = composite.propose(3, SamplingConfig())
    assert tree.tokens == [9, 8, 6] and tree.origins == ["tokenswift", "tokenswift", "ngram"]  # best first
    assert tree.scores == pytest.approx([0.9 / 1.11, 0.9 / 1.11 * 0.5 / 0.9, 0.21 / 1.11])  # siblings sum to 1
    passage = list(range(10, 20))
    composite.prefill([*passage, 0, *passage[:8]], None, 0)  # the last 8 tokens occurred: a copy
    tree = composite.propose(3, SamplingConfig())
    assert tree.tokens == [18, 19, 0] and set(tree.origins) == {COPY} and heads.calls == 1


class QueuedScored(Scored):
    """`Scored`'s paths as TokenSwift drafts them on a GPU: ranked on the device, left there."""

    def __init__(self, paths):
        super().__init__(paths)
        tree = DraftTree.best(paths, len(paths))
        self.candidates = (torch.tensor(tree.tokens), torch.tensor(tree.parents),
                           torch.tensor(tree.scores, dtype=torch.float64), torch.tensor(tree.depths))  # fmt: skip

    def propose(self, budget, sampling, least_chance=0.0, noise=None):
        self.calls += 1
        return best_first(*self.candidates, min(budget, len(self.paths))).tree(self.kind, len(self.paths))


def test_a_scored_tree_left_on_the_device_is_merged_there_unread():
    """A tree the heads left on the device (a GPU's) is not read to be merged, with nothing or with the lookup's
    nodes: the step waits for the device once, at the acceptance."""
    heads = QueuedScored({(9,): (0.9, "tokenswift"), (9, 8): (0.5, "tokenswift")})
    composite = CompositeDrafter(heads, NgramDrafter())
    composite.modes = AlwaysBoth()
    for text, tokens, scores in (([5, 6, 7, 8], [9, 8], [0.9, 0.5]),  # no token occurred twice: nothing looked up
                                 ([5, 6, 7, 5], [9, 8, 6], [0.9 / 1.11, 0.5 / 1.11, 0.21 / 1.11])):  # 6 after 5
        composite.prefill(text, None, 0)
        with QueueDrains() as drains:
            tree = composite.propose(3, SamplingConfig())
        assert drains.drains == 0, drains.causes
        assert tree.queued_scores is not None and tree.tokens == tokens and tree.scores == pytest.approx(scores)


def test_a_tree_merged_on_the_device_is_the_one_merged_on_the_host():
    """Trees that share paths (a small vocabulary), scores tied and not: the merge on the device keeps the tree
    `DraftTree.best` keeps of both trees' paths, node for node, with the same origins and scores."""
    rng = random.Random(6)
    names = ("tokenswift", "ngram")
    for _ in range(60):
        first, second = (DraftTree.best(random_paths(rng, names), 64) for _ in range(2))
        kinds = torch.tensor([names.index(origin) for origin in first.origins])
        queued = DraftTree.queued(torch.tensor(first.tokens), torch.tensor(first.parents), names, depth=first.depth,
                                  scores=torch.tensor(first.scores, dtype=torch.float64), kinds=kinds)  # fmt: skip
        union = {**second.paths(), **{path: value for path, value in first.paths().items()
                                      if value[0] > second.paths().get(path, (-1.0,))[0]}}  # fmt: skip
        for budget in range(1, max(len(first), len(second)) + 1):
            with QueueDrains() as drains:
                merged = merged_on_device(queued, second, budget)
            assert drains.drains == 0, drains.causes
            host = DraftTree.best(union, budget)
            assert (merged.tokens, merged.parents, merged.origins) == (host.tokens, host.parents, host.origins)
            assert merged.scores == pytest.approx(host.scores, rel=1e-12)


def random_paths(rng: random.Random, origins: tuple[str, ...]) -> dict:
    """Up to 12 token paths over 3 tokens, each below a path given, scored no likelier than their parents (ties
    too), each of a random origin."""
    paths: dict[tuple[int, ...], tuple[float, str]] = {}
    for _ in range(rng.randint(1, 12)):
        above = rng.choice([(), *paths])
        path = (*above, rng.randrange(3))
        if path not in paths and len(path) <= 4:
            chance = paths[above][0] if above else 1.0
            paths[path] = (rng.choice([chance, chance / 2, chance * rng.random()]), rng.choice(origins))
    return paths


def test_the_kinds_that_draft_next_follow_the_mode_chosen_at_the_last_commit():
    composite = CompositeDrafter(Always("model", 1), Always("ngram", 2))
    ticks = itertools.count()
    composite.modes = ModeChoice(clock=lambda: float(next(ticks)))
    kinds = []
    # the prefill's token, the first steps with both parts, one with the lookup alone, one with both again
    for tokens in ([1], [1], [1], [1], [2], [1, 2]):
        composite.commit(tokens, None)
        kinds.append(composite.next_kinds())
    assert kinds == [{"model", "ngram"}] * 3 + [{"ngram"}] + [{"model", "ngram"}] * 2


def test_the_composite_tells_its_mode_choice_what_the_lookup_alone_would_have_committed():
    seen = []

    class Recording(AlwaysBoth):
        def committed(self, tokens: int, second_alone: int | None = None) -> None:
            seen.append((tokens, second_alone))

    composite = CompositeDrafter(Always("model", 5), Copy())
    composite.modes = Recording()
    composite.commit([1], None)  # the prefill's token: no step was in flight
    for tokens in ([9, 9, 3], [5, 2], [5, 6, 7, 8, 1], [9, 9]):  # the lookup drafts 9 9 9 9, 9 9 9 9, 5 6 7 8, ...
        composite.propose(4, SamplingConfig())
        composite.commit(tokens, None)
    assert seen == [(1, None), (3, 3), (2, 1), (5, 5), (2, 2)]  # its matched run and the target's next token


def test_a_matched_run_follows_the_committed_tokens_down_the_tree():
    tree = DraftTree([1, 2, 3, 4, 5], [ROOT, 0, 1, ROOT, 3], ["x"] * 5)  # 1 -> 2 -> 3 and 4 -> 5
    assert [matched_run(tree, tokens) for tokens in ([1, 2, 3, 7], [1, 2, 9], [4, 5], [4, 6], [7], [1, 2, 3])] == [
        3, 2, 2, 1, 0, 3]  # fmt: skip


class Slow(DraftsAlone):
    """A drafter that is slow and seldom right: always the same one token."""

    kind = "model"

    def __init__(self):
        self.calls = 0

    def prefill(self, ids, hidden, reused):
        pass

    def commit(self, tokens, hidden):
        pass

    def propose(self, budget, sampling, least_chance=0.0, noise=None):
        self.calls += 1
        time.sleep(0.05)  # far above a tiny-model step, even on a loaded machine
        return DraftTree([63], [ROOT], [self.kind])


class Oracle(DraftsAlone):
    """A drafter that knows the target's greedy answer: it proposes the next tokens of it as a chain."""

    kind = "model"

    def __init__(self, answer: list[int]):
        self.answer = answer
        self.calls = self.done = 0

    def prefill(self, ids, hidden, reused):
        self.done = -1  # the first commit is the first answer token

    def commit(self, tokens, hidden):
        self.done += len(tokens)

    def propose(self, budget, sampling, least_chance=0.0, noise=None):
        self.calls += 1
        chain = self.answer[self.done + 1 : self.done + 1 + budget]
        return DraftTree.from_chains([chain], self.kind, budget) if chain else DraftTree.empty()


class RoomLeft(NgramDrafter):
    """N-gram lookup that counts the steps whose tree left room for the model."""

    def __init__(self, budget: int):
        super().__init__()
        self.budget = budget
        self.room = 0

    def propose(self, budget, sampling=None, least_chance=0.0, noise=None):
        tree = super().propose(budget, sampling, least_chance, noise)
        self.room += len(tree) < self.budget
        return tree


def test_the_model_drafts_only_where_it_pays(tokenizer):
    model = tiny_model("llama", vocab_size=64)
    engine = Engine(model, tokenizer, max_len=256)
    prompt = [5, 9, 14, 3, 22, 9, 14, 3, 40, 41, 7]
    expected = generate(engine, prompt, 96)
    slow, ngram = Slow(), RoomLeft(8)
    engine.set_drafter(CompositeDrafter(slow, ngram), 8)
    assert generate(engine, prompt, 96) == expected
    assert slow.calls <= FIRST_STEPS[BOTH] + ngram.room / 16 + 3, (slow.calls, ngram.room)  # tried, then probed
    oracle, ngram = Oracle(expected), RoomLeft(8)
    composite = CompositeDrafter(oracle, ngram)
    ticks = itertools.count()
    composite.modes = ModeChoice(clock=lambda: next(ticks))  # a step is one tick: tokens decide, whatever the load
    engine.set_drafter(composite, 8)
    assert generate(engine, prompt, 96) == expected
    assert oracle.calls >= 0.8 * ngram.room > 0, (oracle.calls, ngram.room)


# --- sampling -------------------------------------------------------------------------------------------


def flat_draft(model) -> LongSpecLayer:
    """A random LongSpec layer with small weights: its distributions are far from one-hot, so its guesses
    often coincide with n-gram tokens without being certain."""
    torch.manual_seed(3)
    layer = LongSpecLayer(LongSpecConfig.for_target(model.config))
    for parameter in layer.parameters():
        parameter.data.normal_(0, 0.02 if parameter.dim() > 1 else 1.0)
    return layer


class OneEach(CompositeDrafter):
    """Each drafter proposes one child of the root and both are merged: the model's guess and the n-gram's token
    then often meet."""

    def propose(self, budget, sampling, least_chance=0.0, noise=None):
        second = self.second.propose(1, sampling)
        return merge_trees(self.first.propose(1, sampling), second, 2)


SAMPLES = 1000  # as test_sampling_verification's, whose per-path verifier is caught at that size


def sampled_outputs(engine: Engine, sampling: SamplingConfig, samples: int = SAMPLES) -> tuple[Counter, Counter]:
    outputs, origins = Counter(), Counter()
    for seed in range(samples):
        events = list(engine.generate(PROMPT, sampling=replace(sampling, seed=seed), max_new_tokens=TOKENS))
        outputs[tuple(t for event in events for t in event.tokens)] += 1
        origins.update(origin for event in events for origin in event.origins)
    return outputs, origins


def test_sampled_output_is_distributed_as_target_sampling(tokenizer):
    model = tiny_model("qwen2", vocab_size=8, seed=1)
    sampling = SamplingConfig(temperature=1.0)
    exact = exact_joint(Target(model, sampling), PROMPT, TOKENS)
    engine = Engine(model, tokenizer, max_len=64)
    chain = LongSpecDrafter(engine.target, flat_draft(model), widths=(1, 1))
    engine.set_drafter(merging(chain, NgramDrafter()), 2)  # the first step gives the 2nd and 3rd tokens
    outputs, origins = sampled_outputs(engine, sampling)
    assert origins["longspec"] > SAMPLES // 100 and origins["ngram"] > SAMPLES // 20, origins  # n-gram drafts first
    assert_fits(outputs, exact, "longspec+ngram")
    engine.set_drafter(merging(chain, NgramDrafter(), OneEach), 2)
    assert_fits(sampled_outputs(engine, sampling)[0], exact, "one child of the root from each, merged")


def test_scored_trees_cut_to_size_keep_sampled_output_distributed_as_target_sampling(tokenizer):
    """The adaptive budget cuts a scoring drafter's tree to the nodes worth verifying: what is verified is
    chosen by the drafts' scores and live timings, never by the target's draws."""
    model = tiny_model("qwen2", vocab_size=8, seed=1)
    sampling = SamplingConfig(temperature=1.0)
    exact = exact_joint(Target(model, sampling), PROMPT, TOKENS)
    engine = Engine(model, tokenizer, max_len=64)
    engine.set_drafter(NgramDrafter(), None)
    outputs, origins = sampled_outputs(engine, sampling)
    assert origins["ngram"] > SAMPLES // 20, origins
    assert_fits(outputs, exact, "n-gram lookup, scored trees cut by the adaptive budget")


# --- the registry and the CLI ---------------------------------------------------------------------------


def test_composites_parse_in_the_registry(tmp_path):
    assert parse_drafter("longspec+ngram") == DrafterChoice(
        "longspec+ngram", parts=(DrafterChoice("longspec"), DrafterChoice("ngram"))
    )
    choice = parse_drafter(f"longspec:{tmp_path}/a+b+ngram")  # a '+' in a path ends it only before a name
    assert choice.parts == (DrafterChoice("longspec", tmp_path / "a+b"), DrafterChoice("ngram"))
    assert str(choice) == f"longspec:{tmp_path}/a+b+ngram"
    assert parse_drafter(f"longspec:{tmp_path}/a+b") == DrafterChoice("longspec", tmp_path / "a+b")
    assert str(parse_drafter("glide+longspec:/d")) == "glide+longspec:/d"
    for text, message in [
        ("ngram+ngram", "combine two different drafters, not ngram twice"),
        ("longspec:/a+longspec:/b", "not longspec twice"),
        ("longspec+eagle", "unknown drafter 'eagle'; available: none, ngram, longspec, glide"),
        ("eagle+ngram", "unknown drafter 'eagle'"),
        ("none+ngram", "none drafts nothing"),
        ("longspec+ngram+glide", "a composite combines two drafters, as A+B"),
        ("longspec+", "a composite combines two drafters"),
        ("none:x+longspec", "the none drafter takes no checkpoint"),
        ("longspec:+ngram", "give the checkpoint directory after the colon"),
    ]:
        with pytest.raises(SpecchatError, match=re.escape(message)) as error:
            parse_drafter(text)
        assert "\n" not in str(error.value)


def test_the_registry_imports_no_torch():
    code = ("import sys; from specchat.drafters import parse_drafter as p; p('longspec+ngram'); "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert result.stdout.strip() == "False"


def test_composites_resolve_and_build_per_part(tmp_path, tokenizer):
    profiles = load_profiles()
    resolved = resolve_drafter(parse_drafter("longspec+ngram"), profiles["vicuna-7b-16k"], "vicuna-7b-16k")
    assert resolved.parts[0].repo == "sail/longspec-vicuna-7b-v1.5-16k" and str(resolved) == "longspec+ngram"
    with pytest.raises(SpecchatError, match="has no published glide drafter"):
        resolve_drafter(parse_drafter("glide+ngram"), profiles["smollm2-135m"], "smollm2-135m")
    model = tiny_model("llama", vocab_size=64)
    save_longspec(tmp_path / "draft", random_layer(model))
    engine = Engine(model, tokenizer, max_len=64)
    choice = parse_drafter(f"longspec:{tmp_path / 'draft'}+ngram")
    drafter = build_drafter(resolve_drafter(choice, profiles["smollm2-135m"], "smollm2-135m"), engine.target)
    assert isinstance(drafter.first, LongSpecDrafter) and isinstance(drafter.second, NgramDrafter)
    assert drafter.kind == "longspec+ngram"
    with pytest.raises(SpecchatError, match="no such checkpoint directory") as error:
        build_drafter(parse_drafter(f"glide:{tmp_path / 'missing'}+ngram"), engine.target)
    assert "\n" not in str(error.value)
    with pytest.raises(SpecchatError, match="missing: no such checkpoint directory"):  # before any model loads
        resolve_drafter(parse_drafter(f"ngram+glide:{tmp_path / 'missing'}"), profiles["smollm2-135m"], "smollm2-135m")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("run", "hi", "--drafter", "glide+ngram"), ("no published glide drafter", "it has: none, ngram, longspec")),
        (("run", "hi", "--drafter", "ngram+ngram"), ("not ngram twice",)),
        (("chat", "--drafter", "ngram+psychic"), ("unknown drafter 'psychic'",)),
        (("bench", "--drafter", "none,glide+ngram"), ("no published glide drafter",)),
    ],
)
def test_bad_composites_are_one_line_in_the_cli(args, needles):
    assert_one_line_error(specchat(*args, warm=True), *needles)


@pytest.mark.slow
def test_run_with_a_local_longspec_checkpoint_and_ngram_matches_autoregressive(default_model, tmp_path):
    torch.manual_seed(0)
    save_longspec(tmp_path / "draft", LongSpecLayer(LongSpecConfig.for_target(default_model.model.config)),
                  draft_vocab=torch.arange(8192))  # fmt: skip
    prompt = "Repeat this list exactly, twice: red, green, blue, yellow, purple, orange, black, white."
    common = ("run", prompt, "--temperature", "0", "--json", "-n", "48")
    ar = json.loads(specchat(*common, "--drafter", "none", warm=True).stdout)
    drafter = f"longspec:{tmp_path / 'draft'}+ngram"
    result = specchat(*common, "--drafter", drafter, "--draft-budget", "8", warm=True)
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)
    assert spec["token_ids"] == ar["token_ids"]
    assert spec["drafter"] == drafter and "ngram" in spec["origins"]
