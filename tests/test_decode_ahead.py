"""A decode step's forward queued before the caller handles the last step's event (`Engine.decode_ahead`: on by
default on a GPU, where the device runs it while the host streams text; forced here on a CPU): the same text and
cache as without it, one forward a token, none queued past the end, and any other forward over the cache (a
measured autoregressive step, a new request) drops a queued one."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from test_speculative import VOCAB, random_prompt

from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.engine.generate import Engine
from specchat.engine.sampling import SamplingConfig

SAMPLED = SamplingConfig(temperature=1.0, top_p=0.9, seed=3, suppress=(2,))
GREEDY = SamplingConfig(suppress=(2,))


class Counted:
    """An engine's target forward, counting its calls."""

    def __init__(self, forward):
        self.forward, self.calls = forward, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.forward(*args, **kwargs)


def engines(tokenizer, **options):
    model = tiny_model("llama", vocab_size=VOCAB)
    plain, ahead = Engine(model, tokenizer, max_len=256, **options), Engine(model, tokenizer, max_len=256, **options)
    ahead.decode_ahead = True
    for engine in (plain, ahead):
        engine.forward = Counted(engine.forward)
    return plain, ahead


def text(engine: Engine, prompt: list[int], n: int, sampling: SamplingConfig, *, between=None) -> list[int]:
    """The tokens of a generation; after each event but the last, whether a step was queued, and `between` called
    (as a caller between steps)."""
    tokens = []
    for event in engine.generate(prompt, sampling=sampling, max_new_tokens=n):
        tokens += event.tokens
        if event.finish_reason is None:
            assert (engine._queued is not None) == engine.decode_ahead
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


@pytest.mark.parametrize("between", ["measured step", "other rows"])
def test_a_text_left_before_its_end_and_a_forward_between_steps_drop_the_queued_one(between, tokenizer):
    """Between steps the chat's overlay measures a decode step, and a drafter may run the target over rows of its
    own left pending in the engine's cache (`TargetView.forward`): the queued step's row is overwritten."""
    plain, ahead = engines(tokenizer)
    prompt = random_prompt(30, seed=2)

    def forward(engine):
        if between == "measured step":
            engine.autoregressive_step_seconds(repeats=1)
        else:
            with torch.inference_mode():
                engine.target.forward(torch.tensor([7, 8]), torch.arange(2) + engine.cache.length, engine.cache)

    want = text(plain, prompt, 30, GREEDY, between=forward)
    assert text(ahead, prompt, 30, GREEDY, between=forward) == want
    for engine in (plain, ahead):
        events = engine.generate(prompt + want[:5], sampling=GREEDY, max_new_tokens=20)
        next(events), next(events)  # left after two steps, a step queued
        events.close()
    other = random_prompt(20, seed=3)
    assert text(ahead, other, 20, GREEDY) == text(plain, other, 20, GREEDY)


def test_a_drafter_or_known_tokens_queue_nothing(tokenizer):
    _, ahead = engines(tokenizer, drafter=NgramDrafter(), draft_budget=4)
    prompt = random_prompt(30, seed=4)
    for event in ahead.generate(prompt, sampling=GREEDY, max_new_tokens=20):
        assert ahead._queued is None
    ahead.set_drafter(None)
    known = text(ahead, prompt, 20, GREEDY)
    for event in ahead.generate(prompt, sampling=GREEDY, max_new_tokens=20, known=known[:12], fresh=True):
        assert (ahead._queued is not None) == (event.finish_reason is None and len(ahead.ids) >= len(prompt) + 12)
