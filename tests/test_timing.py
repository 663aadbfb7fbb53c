"""The one timer and the one verification forward that calibration and the benchmarks share."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from specchat.engine.cache import TreeCache
from specchat.engine.target_forward import target_forward
from specchat.engine.timing import Timer
from specchat.engine.tree import DraftTree
from specchat.engine.verify_forward import chain_tree, verification_forward


def test_timer_warms_up_then_takes_the_median(monkeypatch):
    clock = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0])  # timed calls of 1, 3 and 2 seconds
    monkeypatch.setattr("specchat.engine.timing.time.perf_counter", lambda: next(clock))
    calls = []
    assert Timer(repeats=3, warmup=2).seconds(lambda: calls.append(1)) == 2.0
    assert len(calls) == 5  # two warm-up calls, three timed ones


def test_timer_interleaves_calls_round_by_round():
    order = []
    seconds = Timer(repeats=2, warmup=1).seconds_each({"a": lambda: order.append("a"), "b": lambda: order.append("b")})
    assert order == ["a", "b"] * 3
    assert set(seconds) == {"a", "b"} and all(value >= 0 for value in seconds.values())


def test_timer_rejects_nonsense():
    with pytest.raises(ValueError):
        Timer(repeats=0)
    with pytest.raises(ValueError):
        Timer(warmup=-1)
    assert Timer("cpu", cold_l2=True).flush is None  # an L2 flush is for CUDA only


def _forward(model, cache):
    run = target_forward(model, cache)

    def forward(tokens, *, positions, tree_mask):
        return run(tokens, positions, tree_mask, cache).logits

    return forward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the torch decoder, the CPU decoder
def test_verification_forward_commits_nothing_and_computes_decode_steps(dtype):
    model = tiny_model("llama", head_dim=64).to(dtype)
    cache = TreeCache(2, 64)
    forward = _forward(model, cache)
    forward(torch.arange(10, 30), positions=torch.arange(20), tree_mask=None)  # a prefill of 20 tokens
    cache.commit()
    keys = cache.layers[0].keys.clone()

    call = verification_forward(forward, cache, torch.device("cpu"), tree=3, root_token=7)
    logits = call()
    assert logits.shape[0] == 4 and cache.length == 20 and cache.layers[0].pending == 0
    assert torch.equal(call(), logits)  # the same forward again: nothing was committed
    assert torch.equal(cache.layers[0].keys[:, :, :20], keys[:, :, :20])

    # Row i is the decode step after the root and i chain tokens (token 0 each).
    for i, token in enumerate([7, 0, 0, 0]):
        step = forward(torch.tensor([token]), positions=torch.tensor([20 + i]), tree_mask=None)
        cache.commit()
        torch.testing.assert_close(step[0], logits[i], rtol=1e-4, atol=1e-4)


def test_a_tree_of_size_zero_is_the_root_alone():
    assert len(chain_tree(0)) == 0 and chain_tree(3).parents == [-1, 0, 1]
    cache = TreeCache(1, 8)
    seen = []
    call = verification_forward(lambda tokens, *, positions, tree_mask: seen.append((tokens, positions, tree_mask)),
                                cache, torch.device("cpu"), tree=DraftTree.empty())  # fmt: skip
    call()
    ((tokens, positions, mask),) = seen
    assert tokens.tolist() == [0] and positions.tolist() == [0] and mask is None
