"""The int8 KV cache (`--kv-cache int8`): its layout kept through commits, its codes close to what was written,
and generation over it lossless against plain decoding over it, with drafters that read it too."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from specchat.bench.prompts import long_document
from specchat.drafters import build_drafter, parse_drafter, resolve_drafter
from specchat.engine.attention import use_attention
from specchat.engine.cache import TreeCache
from specchat.engine.generate import Engine
from specchat.engine.lean_forward import lean_forward
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.loading import load_model

HEADS, DIM = 2, 64


def _written(cache: TreeCache, rows: torch.Tensor) -> None:
    """rows [2, heads, n, D] as the pending keys and values of every layer."""
    cache.allocate(rows.shape[1], rows.shape[3], rows.dtype, rows.device)
    for layer in cache.layers:
        layer.update(rows[0][None], rows[1][None])


def test_codes_and_scales_give_back_what_was_written():
    cache = TreeCache(1, 40, "int8")
    rows = torch.randn(2, HEADS, 37, DIM, generator=torch.Generator().manual_seed(0))
    rows[0, :, :, :32] *= 20  # a block of large dims beside small ones: keys are scaled by blocks of 32
    rows[0, 1, 5] = 0  # an all-zero key
    _written(cache, rows)
    keys, values = cache.layers[0].read(slice(0, 37))
    key_blocks = rows[0].abs().unflatten(-1, (DIM // 32, 32)).amax(-1, keepdim=True)
    assert ((keys - rows[0]).abs().unflatten(-1, (DIM // 32, 32)) <= key_blocks / 254 * 1.01).all()
    assert ((values - rows[1]).abs() <= rows[1].abs().amax(-1, keepdim=True) / 254 * 1.01).all()
    assert torch.equal(keys[1, 5], torch.zeros(DIM))


def test_a_commit_keeps_the_chosen_slots_in_order_across_tiles():
    cache = TreeCache(1, 64, "int8")
    rows = torch.randn(2, HEADS, 30, DIM, generator=torch.Generator().manual_seed(1))
    _written(cache, rows[:, :, :14])
    cache.commit()
    _written(cache, rows[:, :, 14:])  # pending slots 14..29 span two tiles of 16
    before = cache.layers[0].read(slice(0, 30))
    kept = [0, 3, 4, 9, 15]
    cache.commit(kept)
    after = cache.layers[0].read(slice(0, 14 + len(kept)))
    order = list(range(14)) + [14 + k for k in kept]
    for mine, theirs in zip(after, before):
        assert torch.equal(mine, theirs[:, order])


@pytest.fixture(scope="module")
def embedded_bf16():
    return load_model(None, dtype="auto", device="cpu")


@torch.inference_mode()
def test_the_decoder_and_the_cache_layer_agree_on_where_codes_lie(embedded_bf16):
    """`read` gives back the keys and values the compiled decoder wrote (its first layer's, within their
    quantization, against a bf16 cache's), and a cache written by `update` decodes as the decoder's own does (a
    layout read wrongly moves the logits by tens)."""
    model = embedded_bf16.model
    lean = lean_forward(model)
    tokens = torch.randint(3, 1000, (40,), generator=torch.Generator().manual_seed(0))
    layers = model.config.num_hidden_layers
    written, copied, plain = TreeCache(layers, 64, "int8"), TreeCache(layers, 64, "int8"), TreeCache(layers, 64)
    for cache in (written, plain):
        lean(tokens[:39], torch.arange(39), None, cache)
        cache.commit()
    (keys, values), (bf16_keys, bf16_values) = (cache.layers[0].read(slice(0, 39)) for cache in (written, plain))
    for ours, theirs, width in ((keys, bf16_keys, 32), (values, bf16_values, values.shape[-1])):  # scaled together
        blocks = theirs.float().unflatten(-1, (-1, width))
        error = (ours.float().unflatten(-1, (-1, width)) - blocks).abs()
        assert (error <= blocks.abs().amax(-1, keepdim=True) / 127).all()
    copied.allocate_like(plain)
    for mine, theirs in zip(copied.layers, plain.layers):
        keys, values = theirs.read(slice(0, 39))
        mine.update(keys[None], values[None])
    copied.commit()
    step = tokens[39:], torch.tensor([39]), None
    own, again = (lean(*step, cache).logits[0].float() for cache in (written, copied))
    assert (own - again).abs().max() < 0.1 * own.abs().max()


@torch.inference_mode()
def test_attention_over_an_int8_cache_stays_close_to_attention_over_bf16(embedded_bf16):
    """Scores and value sums in integers approximate the bf16 cache's attention over 200 tokens of real text: every
    row's logits within a small part of their range (7% at worst here), the same greedy token at nearly every row
    (99% here); a scale lost anywhere breaks both."""
    model = embedded_bf16.model
    lean = lean_forward(model)
    tokens = torch.tensor(embedded_bf16.tokenizer.encode(long_document(300))[:200])
    layers = model.config.num_hidden_layers
    int8, bf16 = (lean(tokens, torch.arange(200), None, TreeCache(layers, 208, kv)).logits.float()
                  for kv in ("int8", "auto"))  # fmt: skip
    assert ((int8 - bf16).abs().amax(-1) < 0.15 * bf16.abs().amax(-1)).all()
    assert (int8.argmax(-1) == bf16.argmax(-1)).float().mean() > 0.95


@torch.inference_mode()
@pytest.mark.parametrize("name", ["ngram", "longspec"])
def test_speculation_over_an_int8_cache_decodes_what_plain_decoding_over_it_does(embedded_bf16, name):
    """Greedy: token for token, with a drafter that reads no cache and with one that reads the target's (LongSpec's
    cross-attention over its last layer, dequantized)."""
    model, tokenizer = embedded_bf16.model, embedded_bf16.tokenizer
    prompt = encode_prompt(tokenizer, "List the planets of the solar system, one line each, with a fact about each.")

    def greedy(drafter: str | None) -> tuple[list[int], int]:
        engine = Engine(model, tokenizer, max_len=len(prompt) + 80, kv_cache="int8")
        if drafter:
            choice = resolve_drafter(parse_drafter(drafter), embedded_bf16.source.profile, embedded_bf16.source.name)
            engine.set_drafter(build_drafter(choice, engine.target), 6)
        tokens, accepted = [], 0
        for event in engine.generate(prompt, sampling=SamplingConfig(), max_new_tokens=80):
            tokens += event.tokens
            accepted = event.stats.accepted
        return tokens, accepted

    plain, _ = greedy(None)
    speculative, accepted = greedy(name)
    assert speculative == plain and accepted > 0


def test_an_int8_cache_needs_the_compiled_decoder(tokenizer):
    """The torch decoder reads no int8 cache: a one-line refusal."""
    model = tiny_model("llama", head_dim=64)
    use_attention(model, "hybrid")
    with pytest.raises(SpecchatError, match="needs the compiled CPU decoder"):
        Engine(model, tokenizer, max_len=64, kv_cache="int8")
