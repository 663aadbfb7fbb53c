"""A step waits for the device once, at the acceptance: the host reads the target's choices, and with them a tree its
drafter left on the device (LongSpec's, GLIDE's, TokenSwift's, EAGLE-3's), as each drafts on a GPU. Where the host
lays a tree out (TokenSwift on a CPU, where reads cost nothing), its proposal reads once, at its end. None waits
between its depths.

Counted on a CPU with `QueueDrains`, the model of CUDA's synchronous copies, over trees deep enough that a wait a
depth would show; `test_cuda.py` counts the real synchronisations on a GPU.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import ScoredChainDrafter, random_eagle3
from queue_drains import QueueDrains
from test_composite_drafter import AlwaysBoth
from test_glide import random_draft
from test_longspec import random_layer
from test_tokenswift_drafter import random_heads

from specchat.drafters import composite as composite_module
from specchat.drafters.composite import CompositeDrafter
from specchat.drafters.eagle3.drafter import Eagle3Drafter
from specchat.drafters.glide.drafter import GlideDrafter
from specchat.drafters.longspec.drafter import BEAM_WIDTHS, LongSpecDrafter
from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.drafters.tokenswift.drafter import TokenSwiftDrafter
from specchat.drafters.tree_rows import TreeRows
from specchat.engine.attention import use_attention
from specchat.engine.budget import AdaptiveBudget
from specchat.engine.generate import Engine
from specchat.engine.host_data import to_device
from specchat.engine.keyed_draws import PositionNoise
from specchat.engine.sampling import SamplingConfig
from specchat.engine.tree import ROOT, DraftTree

PROMPT = [5, 9, 14, 3, 22, 9, 14, 3, 40, 41, 7] * 3
GREEDY = SamplingConfig()
SAMPLED = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, seed=3)


def longspec(widths: tuple[int, ...] = BEAM_WIDTHS):
    return lambda engine, model: LongSpecDrafter(engine.target, random_layer(model), widths=widths)


def eagle3_unpruned(engine, model):
    """EAGLE-3 as it drafts on a GPU: every depth expands its best nodes, read only at the end."""
    drafter = Eagle3Drafter(engine.target, random_eagle3(model, vocab=61))
    drafter.prunes = False
    return drafter


def tokenswift(forward: bool, device_layout: bool = True):
    """TokenSwift as it drafts on a GPU: its tree laid out on the device; or on the host, as on a CPU."""
    return lambda engine, model: TokenSwiftDrafter(engine.target, random_heads(model), forward=forward,
                                                   device_layout=device_layout)  # fmt: skip


DRAFTERS = {  # name -> (drafter over the engine's target, sampling, the trees' least depth, waits in its proposal)
    "longspec": (longspec(), GREEDY, 5, 0),
    "longspec-sampled": (longspec(), SAMPLED, 5, 0),
    "longspec-chain": (longspec(widths=(1,) * 64), GREEDY, 64, 0),
    "glide": (lambda engine, model: GlideDrafter(engine.target, random_draft(model.config)), GREEDY, 4, 0),
    "tokenswift": (tokenswift(forward=True), GREEDY, 4, 0),
    "tokenswift-sampled": (tokenswift(forward=True), SAMPLED, 4, 0),
    "tokenswift-verified-state": (tokenswift(forward=False), GREEDY, 3, 0),
    "tokenswift-host-layout": (tokenswift(forward=True, device_layout=False), GREEDY, 4, 1),
    "eagle3": (eagle3_unpruned, GREEDY, 4, 0),
}


def counted_steps(engine: Engine, sampling: SamplingConfig, tokens: int = 12, prompt: list[int] = PROMPT):
    """Per decode step after the first: (drains in the drafter's proposal, drains in the whole step: its launch, its
    verification and the drafter's commit, the tree, what caused them)."""
    proposals, launches, steps, commits = [], [], [], []
    drafter, propose, launch, step = engine.drafter, engine.drafter.propose, engine._launch, engine._step

    def counted(call, into):
        def counted_call(*args, **kwargs):
            with QueueDrains() as drains:
                out = call(*args, **kwargs)
            into.append((drains, out))
            return out

        return counted_call

    drafter.propose, drafter.commit = counted(propose, proposals), counted(drafter.commit, commits)
    engine._launch, engine._step = counted(launch, launches), counted(step, steps)
    list(engine.generate(prompt, sampling=sampling, max_new_tokens=tokens))
    return [(drafted.drains, launched.drains + verified.drains + committed.drains, tree,
             launched.causes + verified.causes + committed.causes)
            for (drafted, tree), (launched, _), (verified, _), (committed, _)
            in zip(proposals[1:], launches[1:], steps[1:], commits[2:])]  # commits[0]: the prefill's token


@pytest.mark.parametrize("attention", ["auto", "hybrid"], ids=["cpu-decoder", "torch-decoder"])
@pytest.mark.parametrize("name", DRAFTERS)
def test_a_step_waits_for_the_device_at_the_acceptance_and_where_a_tree_is_sized_by_its_values(name, attention,
                                                                                              tokenizer):  # fmt: skip
    model = tiny_model("llama", vocab_size=64)
    use_attention(model, attention)
    make, sampling, depth, drafted = DRAFTERS[name]
    engine = Engine(model, tokenizer, max_len=400)
    engine.set_drafter(make(engine, model), 64)
    steps = counted_steps(engine, sampling)
    assert steps and all(tree.depth >= depth for _, _, tree, _ in steps)  # deep trees: a wait a depth would show
    for drafting, step, _, causes in steps:
        assert drafting == drafted, causes
        if sampling.greedy:  # and reading the target's choices (sampling reads more: top-k's ties)
            assert step == drafted + 1, causes


def test_a_keyed_step_over_a_beam_waits_once_as_on_a_gpu(monkeypatch, tokenizer):
    """`specchat chat --model llama3.1-8b --drafter longspec` samples at temperature 0.6 and top-p 0.9 (the model's
    own defaults) from LongSpec's beam. With its keyed draws as a GPU draws them, every token of every row raced at
    once at the text indices the verified rows' positions give on the device, a step over the beam, which stays on
    the device, waits once too."""
    choose = PositionNoise.choose
    monkeypatch.setattr(PositionNoise, "choose", lambda noise, probs, rows: choose(noise, probs, rows, dense=True))
    model = tiny_model("llama", vocab_size=64)
    engine = Engine(model, tokenizer, max_len=400)
    engine.set_drafter(longspec()(engine, model), 64)
    steps = counted_steps(engine, SamplingConfig(temperature=0.6, top_p=0.9, seed=5))
    assert steps and all(tree.depth >= 5 for _, _, tree, _ in steps)
    for drafting, step, _, causes in steps:
        assert (drafting, step) == (0, 1), causes


def test_heads_merged_with_the_lookup_wait_once_a_step(tokenizer, monkeypatch):
    """TokenSwift's tree left on the device and the lookup's short matches (a text of few tokens, none copied):
    merged on the device, each greedy step waits once, at the acceptance."""
    merges = []
    merge = composite_module.merged_on_device
    monkeypatch.setattr(composite_module, "merged_on_device", lambda *args: merges.append(1) or merge(*args))
    model = tiny_model("llama", vocab_size=64)
    use_attention(model, "hybrid")
    engine = Engine(model, tokenizer, max_len=400)
    drafter = CompositeDrafter(tokenswift(forward=True)(engine, model), NgramDrafter())
    drafter.modes = AlwaysBoth()
    engine.set_drafter(drafter, 24)
    rng = random.Random(3)
    prompt = [rng.randrange(64) for _ in range(80)]  # every token of the vocabulary follows some other
    steps = counted_steps(engine, GREEDY, 40, prompt=prompt)
    assert len(merges) >= len(steps) // 2 and len(steps) > 4
    assert [(drafting, step) for drafting, step, _, _ in steps] == [(0, 1)] * len(steps), [c for *_, c in steps]


def test_guessing_keyed_draws_adds_no_wait(tokenizer):
    """Where the target samples, TokenSwift's draft forward guesses its first keyed draw, racing its
    distribution under the same noise: the noise's keys go to the device without a wait, so the proposal still
    waits for nothing."""
    model = tiny_model("llama", vocab_size=64)
    engine = Engine(model, tokenizer, max_len=400)
    engine.set_drafter(tokenswift(forward=True)(engine, model), 64)
    steps = counted_steps(engine, SAMPLED)
    assert steps and all(tree.depth >= 4 for _, _, tree, _ in steps)
    for drafting, _, _, causes in steps:
        assert drafting == 0, causes


def test_a_scored_tree_left_on_the_device_is_cut_without_a_wait(tokenizer, tmp_path, monkeypatch):
    """At the adaptive budget a scored tree keeps the nodes whose scores pay for their rows. One left on the device,
    best first (TokenSwift's and EAGLE-3's on a GPU), is cut to the size the last tree's scores chose and sized
    itself once the acceptance has read it: its step waits once, as at a fixed budget, and the output is the
    target's."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    model = tiny_model("llama", vocab_size=64)
    engine = Engine(model, tokenizer, max_len=400)
    reference = PROMPT + [t for event in engine.generate(PROMPT, sampling=GREEDY, max_new_tokens=80)
                          for t in event.tokens]  # fmt: skip
    sized, cuts = [], {}  # each tree's size; id(a tree proposed) -> (the last tree's size, its cut, read later)
    size, first = AdaptiveBudget.size, DraftTree.first

    def recorded_size(policy, scores, seconds):
        n = size(policy, scores, seconds)
        if scores:  # a tree's, not a step's without one
            sized.append(n)
        return n

    def recorded_first(tree, n):
        cuts[id(tree)] = (sized[-1], cut := first(tree, n))
        return cut

    monkeypatch.setattr(AdaptiveBudget, "size", recorded_size)
    monkeypatch.setattr(DraftTree, "first", recorded_first)
    drafter = ScoredChainDrafter(reference, vocab_size=64, depth=8)  # trees that pay: drafting goes on
    engine.set_drafter(drafter, None)
    steps = counted_steps(engine, GREEDY, tokens=80)
    assert drafter.ids == reference[: len(drafter.ids)] and len(drafter.ids) >= len(reference)
    cut_steps = [step for step in steps if id(step[2]) in cuts]
    assert len(cut_steps) >= len(steps) // 2  # the first tree read, and any after a tree that kept nothing
    for drafting, step, proposed, causes in cut_steps:
        last, tree = cuts[id(proposed)]
        assert len(tree) == min(last, len(proposed)) and tree.tokens == proposed.tokens[: len(tree)]
        assert tree.scores == proposed.scores[: len(tree)]
        assert (drafting, step) == (0, 1), causes


def test_without_a_drafter_a_step_waits_once(tokenizer):
    model = tiny_model("llama", vocab_size=64)
    engine = Engine(model, tokenizer, max_len=400)
    engine.set_drafter(NgramDrafter(), 24)  # the lookup runs on the host: no tensor at all
    for drafting, step, _, causes in counted_steps(engine, GREEDY):
        assert (drafting, step) == (0, 1), causes


def test_tree_rows_grow_from_device_rows_and_host_lists():
    """Parents given as a tensor of rows (a beam's choice, left on the device) or as a list (ROOT: below a root that
    is no row) give each row its ancestors and itself."""
    tree = TreeRows()
    assert tree.add([ROOT, ROOT]) == range(0, 2)
    assert tree.add(torch.tensor([1, 0, 1])) == range(2, 5)
    assert tree.add([4, ROOT]) == range(5, 7)
    seen = [row.nonzero()[:, 0].tolist() for row in tree.seen(range(0, 7))]
    assert seen == [[0], [1], [1, 2], [0, 3], [1, 4], [1, 4, 5], [6]]


def test_the_model_of_device_waits_counts_what_it_should():
    """A read after queued work drains the queue, a second read right after it does not, and neither does a
    pinned (asynchronous) copy of host data; a blocking copy of host data after work does."""
    x = torch.arange(8.0)
    with QueueDrains() as drains:
        y = x * 2
        y.tolist()
        int(y[3])
        to_device([1, 2, 3], "cpu")
        z = y + 1
        torch.tensor([1, 2])
        bool(z[1] > 0)
    assert drains.drains == 3 and [cause.split()[0] for cause in drains.causes] == [
        "tolist", "aten.lift_fresh.default", "aten._local_scalar_dense.default"]  # fmt: skip
