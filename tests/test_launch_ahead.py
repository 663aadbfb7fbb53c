"""A step's drafting and verification forward launched before the caller handles the last step's event
(`Engine.launch_ahead`: on by default on a GPU, where the device runs them while the host streams text; forced here
on a CPU): the same text and cache as without it, with or without a drafter, one forward a step, none launched past
the end; any other forward over the cache (a measured autoregressive step, a drafter's rows) overwrites a launched
step's rows, which the step then computes again for the tree it drafted once, and a new request drops it."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter, ScoredChainDrafter
from test_longspec import random_layer
from test_speculative import VOCAB, random_prompt
from test_tokenswift_drafter import random_heads

from specchat.drafters.longspec.drafter import LongSpecDrafter
from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.drafters.tokenswift.drafter import TokenSwiftDrafter
from specchat.engine.generate import Engine
from specchat.engine.sampling import SamplingConfig
from specchat.engine.tree import DraftTree

SAMPLED = SamplingConfig(temperature=1.0, top_p=0.9, seed=3, suppress=(2,))
GREEDY = SamplingConfig(suppress=(2,))


class Counted:
    """An engine's target forward, counting its calls."""

    def __init__(self, forward):
        self.forward, self.calls = forward, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.forward(*args, **kwargs)


def engines(tokenizer):
    model = tiny_model("llama", vocab_size=VOCAB)
    plain, ahead = Engine(model, tokenizer, max_len=256), Engine(model, tokenizer, max_len=256)
    ahead.launch_ahead = True
    for engine in (plain, ahead):
        engine.forward = Counted(engine.forward)
    return plain, ahead


def text(engine: Engine, prompt: list[int], n: int, sampling: SamplingConfig, *, between=None, **options) -> list[int]:
    """The tokens of a generation; after each event but the last, whether a step was launched, and `between` called
    (as a caller between steps)."""
    tokens = []
    for event in engine.generate(prompt, sampling=sampling, max_new_tokens=n, **options):
        tokens += event.tokens
        if event.finish_reason is None:
            assert (engine._queued is not None) == engine.launch_ahead
            if between is not None:
                between(engine)
        else:
            assert engine._queued is None
    return tokens


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_queued_steps_give_the_same_text_and_cache_turn_after_turn(sampling, tokenizer):
    plain, ahead = engines(tokenizer)
    prompt = random_prompt(30, seed=1)
    first = [text(engine, prompt, 40, sampling) for engine in (plain, ahead)]
    assert first[0] == first[1] and len(first[0]) == 40
    follow_up = prompt + first[0][:10] + [5, 6, 7]  # a second turn over part of the cached prefix
    second = [text(engine, follow_up, 25, sampling) for engine in (plain, ahead)]
    assert second[0] == second[1]
    assert plain.ids == ahead.ids and plain.cache.length == ahead.cache.length
    layer = ahead.cache.layers[-1]
    assert (layer.keys[..., : layer.length, :] == plain.cache.layers[-1].keys[..., : layer.length, :]).all()
    assert plain.forward.calls == ahead.forward.calls  # one forward a step: none repeated, none past the end


@pytest.mark.parametrize("drafter", [False, True], ids=["plain", "ngram"])
@pytest.mark.parametrize("between", ["measured step", "other rows"])
def test_a_forward_between_steps_has_the_launched_step_verified_again_and_a_new_text_drops_it(between, drafter,
                                                                                               tokenizer):  # fmt: skip
    """Between steps the chat's overlay and the writer measure a decode step, and the target may run over other rows
    left pending in the engine's cache (`TargetView.forward`): the launched step's rows are overwritten, and the
    step verifies its tree again, drafted once. A text left before its end leaves a step launched, which the next
    text drops."""
    plain, ahead = engines(tokenizer)
    prompt = random_prompt(30, seed=2)
    proposals = {}
    if drafter:
        for engine in (plain, ahead):
            engine.set_drafter(NgramDrafter(), 6)
            propose = engine.drafter.propose
            seen = proposals[engine.launch_ahead] = []
            engine.drafter.propose = lambda *args, propose=propose, seen=seen: seen.append(propose(*args)) or seen[-1]

    def forward(engine):
        if between == "measured step":
            engine.autoregressive_step_seconds(repeats=1)
        else:
            with torch.inference_mode():
                engine.target.forward(torch.tensor([7, 8]), torch.arange(2) + engine.cache.length, engine.cache)

    want = text(plain, prompt, 30, GREEDY, between=forward)
    assert text(ahead, prompt, 30, GREEDY, between=forward) == want
    if drafter:
        assert len(proposals[True]) == len(proposals[False]) > 0
        assert [tree.tokens for tree in proposals[True]] == [tree.tokens for tree in proposals[False]]
    for engine in (plain, ahead):
        events = engine.generate(prompt + want[:5], sampling=GREEDY, max_new_tokens=20)
        next(events), next(events)  # left after two steps, a step queued
        events.close()
    other = random_prompt(20, seed=3)
    assert text(ahead, other, 20, GREEDY) == text(plain, other, 20, GREEDY)


DRAFTERS = {
    "ngram": lambda engine: NgramDrafter(),
    "random tree": lambda engine: RandomTreeDrafter(vocab_size=VOCAB, seed=1),
    "longspec": lambda engine: LongSpecDrafter(engine.target, random_layer(engine.model)),
    "tokenswift": lambda engine: TokenSwiftDrafter(engine.target, random_heads(engine.model), lag=16,
                                                   device_layout=True),  # scored, left on the device: cut unread
}


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("budget", [6, None], ids=["fixed", "adaptive"])
def test_launched_drafts_give_the_same_text_and_cache(drafter, budget, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))  # the adaptive budget's calibration goes here
    plain, ahead = engines(tokenizer)
    prompt = random_prompt(30, seed=5)
    for engine in (plain, ahead):
        engine.set_drafter(DRAFTERS[drafter](engine), budget)
        text(engine, random_prompt(30, seed=6), 2, GREEDY)  # the adaptive budget calibrates (once per machine)
        engine.forward.calls = 0
    steps = {}
    for engine in (plain, ahead):
        proposals = steps[engine.launch_ahead] = []
        propose = engine.drafter.propose
        engine.drafter.propose = lambda *args, propose=propose, seen=proposals: seen.append(propose(*args)) or seen[-1]
    want = text(plain, prompt, 40, GREEDY)
    assert text(ahead, prompt, 40, GREEDY) == want
    assert plain.ids == ahead.ids
    if budget is not None:  # the adaptive budget follows the steps' timings: its trees differ from run to run
        assert [(t.tokens, t.parents) for t in steps[True]] == [(t.tokens, t.parents) for t in steps[False]]
        assert plain.forward.calls == ahead.forward.calls


def test_a_scored_tree_cut_unread_is_launched_ahead_and_verified_again(tokenizer, tmp_path, monkeypatch):
    """At the adaptive budget a scored tree left on the device is cut unread to the size the last one chose, launched
    ahead, and verified again where a measured step comes between: the text is the target's."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    plain, ahead = engines(tokenizer)
    prompt = random_prompt(30, seed=5)
    want = text(plain, prompt, 40, GREEDY)
    cuts, first = [], DraftTree.first
    monkeypatch.setattr(DraftTree, "first", lambda tree, n: cuts.append(n) or first(tree, n))
    ahead.set_drafter(ScoredChainDrafter(prompt + want, vocab_size=VOCAB), None)
    def measured_step(engine):
        engine.autoregressive_step_seconds(repeats=1)

    assert text(ahead, prompt, 40, GREEDY, between=measured_step) == want and cuts


def test_known_tokens_are_launched_as_a_chain(tokenizer):
    plain, ahead = engines(tokenizer)
    prompt = random_prompt(30, seed=4)
    known = text(plain, prompt, 30, GREEDY)
    for engine in (plain, ahead):
        engine.forward.calls = 0
    runs = [text(engine, prompt, 30, GREEDY, known=known[:12], fresh=True) for engine in (plain, ahead)]
    assert runs[0] == runs[1] == known and plain.forward.calls == ahead.forward.calls
