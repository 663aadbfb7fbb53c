"""The static tree cache holds exactly the KV a fresh forward computes, allocated once, compacted on commit."""

from __future__ import annotations

import psutil
import pytest
import torch
from conftest import TINY_FAMILIES, fresh_kv, tiny_model

from specchat.drafters.glide.model import GlideConfig, GlideKV
from specchat.drafters.longspec.model import RingKV
from specchat.drafters.model.working_cache import WorkingCache
from specchat.engine.budget import MAX_BUDGET
from specchat.engine.cache import Rollback, TreeCache
from specchat.engine.generate import Engine
from specchat.engine.sampling import SamplingConfig


def run(engine: Engine, prompt: list[int], n: int, **sampling) -> list[int]:
    config = SamplingConfig(**sampling)
    return [t for e in engine.generate(prompt, sampling=config, max_new_tokens=n) for t in e.tokens]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_cache_equals_fresh_forward(family, tokenizer):
    model = tiny_model(family)
    engine = Engine(model, tokenizer, max_len=128)
    prompt = list(range(100, 117))
    out = run(engine, prompt, 30, temperature=0.8, seed=3)
    committed = prompt + out
    assert engine.cache.length == len(committed) - 1  # the last token (root) is not cached yet
    for layer, (keys, values) in zip(engine.cache.layers, fresh_kv(model, committed[:-1])):
        # fp32 sums in another order than transformers' (fused projections, residuals added in the matmuls)
        torch.testing.assert_close(layer.keys[:, :, : layer.length], keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(layer.values[:, :, : layer.length], values, atol=1e-4, rtol=1e-4)


def test_memory_is_allocated_once(tokenizer):
    model = tiny_model("llama")
    engine = Engine(model, tokenizer, max_len=200)
    prompt = list(range(100, 120))
    out = run(engine, prompt, 5)
    pointers = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in engine.cache.layers]
    assert all(layer.keys.shape[2] == 200 + MAX_BUDGET for layer in engine.cache.layers)  # room for a tree
    out += run(engine, prompt + out + [300, 301], 40)  # a second turn reuses the same session cache
    assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in engine.cache.layers] == pointers


def test_a_cpu_cache_takes_memory_as_its_slots_are_written():
    """Capacity is address space: a 1 GiB cache commits the pages its written slots lie in, and reads as zeros
    where nothing was written, int8 codes and scales alike."""
    process = psutil.Process()
    cache = TreeCache(num_layers=8, max_len=65536)
    before = process.memory_info().rss
    cache.allocate(4, 128, torch.bfloat16, torch.device("cpu"))  # 8 layers x 4 heads x 64K slots x 256 B x 2
    assert cache.keys.numel() * 2 * 2 == 2**30
    cache.layers[0].update(torch.ones(1, 4, 10, 128), torch.ones(1, 4, 10, 128))
    assert process.memory_info().rss - before < 16 * 2**20
    assert cache.keys[0, 0, :, :10].eq(1).all() and cache.keys[0, 0, :, 10:].eq(0).all() and not cache.values[1].any()
    int8 = TreeCache(num_layers=2, max_len=4096, kv_cache="int8")
    int8.allocate(2, 64, torch.bfloat16, torch.device("cpu"))
    assert all(not part.any() for layer in int8.layers for part in layer._held())


def _allocated(layers: int, max_len: int, *, heads: int = 1, dim: int = 1) -> TreeCache:
    cache = TreeCache(num_layers=layers, max_len=max_len)
    cache.allocate(heads, dim, torch.float32, torch.device("cpu"))
    return cache


def test_commit_keeps_chosen_pending_slots_in_order():
    cache = _allocated(2, 16)
    for layer in cache.layers:
        layer.update(torch.arange(3.0).view(1, 1, 3, 1), -torch.arange(3.0).view(1, 1, 3, 1))
    cache.commit()
    for layer in cache.layers:  # a "tree" of 4 pending tokens: keep offsets 0, 2, 3
        layer.update(torch.tensor([10.0, 11, 12, 13]).view(1, 1, 4, 1), torch.zeros(1, 1, 4, 1))
        assert layer.pending == 4 and layer.length == 3
    cache.commit([0, 2, 3])
    assert cache.length == 6
    for layer in cache.layers:
        assert layer.keys[0, 0, :6, 0].tolist() == [0, 1, 2, 10, 12, 13]
        assert layer.values[0, 0, :3, 0].tolist() == [0, -1, -2]


def test_truncate_is_a_pointer_move():
    cache = _allocated(1, 8, dim=2)
    cache.layers[0].update(torch.ones(1, 1, 5, 2), torch.ones(1, 1, 5, 2))
    cache.commit()
    cache.truncate(2)
    assert cache.length == 2
    cache.layers[0].update(torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    cache.commit()
    assert cache.length == 3 and cache.layers[0].keys[0, 0, :3].tolist() == [[1, 1], [1, 1], [0, 0]]


def test_one_commit_moves_every_layers_kept_slots():
    """The keys and values of every layer are one tensor each: a verified path moves in one copy."""
    cache = _allocated(3, 8, heads=2, dim=4)
    assert cache.keys.shape == (3, 1, 2, 8, 4) and cache.length_tensor.tolist() == [0]
    cache.claim(5)
    cache.keys[:, :, :, :5] = torch.arange(5.0).view(1, 1, 1, 5, 1)
    cache.commit(torch.tensor([0, 3, 4]))
    assert cache.length == 3 and all(layer.length == 3 for layer in cache.layers)
    assert cache.layers[2].keys[0, 1, :3, 0].tolist() == [0, 3, 4]
    cache.claim(1)
    assert cache.length_tensor.tolist() == [3]  # the device length the kernels read


def _tree_cache():
    cache = _allocated(2, 16, heads=2, dim=4)

    def write(start: int, count: int) -> None:
        for layer in cache.layers:
            layer.update(torch.randn(1, 2, count, 4), torch.randn(1, 2, count, 4))
        cache.commit()

    return cache, write


def _ring():
    ring = RingKV(8, 2, 4, dtype=torch.float32, device=torch.device("cpu"))
    return ring, lambda start, count: ring.write(start, torch.randn(2, count, 4), torch.randn(2, count, 4))


def _glide_kv():
    kv = GlideKV(GlideConfig.for_target(tiny_model("llama").config), 16, dtype=torch.float32,
                 device=torch.device("cpu"))
    return kv, lambda start, count: kv.commit(start + count)  # the draft's forward writes the slots itself


def _working_cache():
    rotary = tiny_model("llama").model.rotary_emb
    cache = WorkingCache(2, 2, 16, 16, 16, dtype=torch.float32, device=torch.device("cpu"), rotaries=[rotary])

    def write(start: int, count: int) -> None:
        keys = torch.randn(2, 2, count, 16)
        cache.append(keys, torch.randn_like(keys), keys)

    return cache, write


@pytest.mark.parametrize("make", [_tree_cache, _ring, _glide_kv, _working_cache], ids=lambda make: make.__name__[1:])
def test_every_cache_rolls_back_through_the_same_contract(make):
    """The target's cache and the drafters' own share `length` and `truncate` (PartialKV's is tested with its
    target in test_tokenswift_drafter.py): a cut never grows the cache, and writing resumes at the cut."""
    cache, write = make()
    assert isinstance(cache, Rollback)
    write(0, 6)
    assert cache.length == 6
    cache.truncate(9)
    assert cache.length == 6
    cache.truncate(4)
    assert cache.length == 4
    write(4, 3)
    assert cache.length == 7


def test_a_ring_forgets_what_it_truncates():
    ring, write = _ring()
    write(0, 6)
    ring.truncate(4)
    assert ring.visible(torch.tensor([5])).sum() == 4  # positions 0..3, not 4 and 5


def test_overflow_is_an_error():
    cache = _allocated(1, 4, dim=2)
    with pytest.raises(RuntimeError, match="KV cache full"):
        cache.layers[0].update(torch.ones(1, 1, 5, 2), torch.ones(1, 1, 5, 2))


def test_next_turn_reuses_the_cached_prefix_and_matches_a_fresh_session(tokenizer):
    model = tiny_model("qwen2")
    prompt = list(range(200, 230))
    session = Engine(model, tokenizer, max_len=256)
    first = run(session, prompt, 20)
    second_prompt = prompt + first + list(range(400, 410))
    events = list(session.generate(second_prompt, sampling=SamplingConfig(), max_new_tokens=30))
    assert events[-1].stats.reused_tokens == len(prompt) + len(first) - 1
    fresh = run(Engine(model, tokenizer, max_len=256), second_prompt, 30)
    assert [t for e in events for t in e.tokens] == fresh
