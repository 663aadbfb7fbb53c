"""The architecture adapters: every part specchat reads of a model comes through `parts(model)`."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from specchat.architectures import ADAPTERS, parts
from specchat.errors import SpecchatError


@pytest.mark.parametrize("family", sorted(ADAPTERS))
def test_the_adapter_finds_the_parts_that_compute_the_models_output(family):
    """The embedding, layers, final norm and head it names, run as a pre-norm decoder (each half's output normed
    where the layer has such norms, each layer rotated by its RoPE, scores and logits capped where it caps them), give
    transformers' own logits: the adapter points at the modules that matter, in the order that matters."""
    model = tiny_model(family)
    for name, weight in model.named_parameters():
        if "norm" in name:  # ones at initialisation: a norm mistaken for another would go unseen
            weight.uniform_(0.5, 1.5)
    decoder = parts(model)
    ids = torch.tensor([[1, 5, 9, 14, 3]])
    positions = torch.arange(ids.shape[1])[None]
    x = decoder.embed(ids)
    mask = torch.full((5, 5), float("-inf")).triu(1)
    for layer in decoder.layers:
        cos, sin = decoder.rotaries[layer.rope](x, positions)
        h = layer.input_norm(x)
        heads = [part(h).view(1, 5, -1, layer.head_dim).transpose(1, 2) for part in (layer.q, layer.k, layer.v)]
        q, k, v = heads
        if layer.q_norm is not None:
            q, k = layer.q_norm(q), layer.k_norm(k)
        q, k = (t * cos[:, None] + _rotated_half(t) * sin[:, None] for t in (q, k))
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        scores = (q @ k.transpose(-1, -2)) * layer.scaling
        scores = _capped(scores, decoder.attention_cap) + mask
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 5, -1)
        for out, norm in ((layer.o(out), layer.attention_output_norm), (None, layer.mlp_output_norm)):
            out = layer.mlp(layer.mlp_norm(x)) if out is None else out
            x = x + (out if norm is None else norm(out)) * decoder.residual_scale
    ours = _capped(decoder.head(decoder.norm(x)) / decoder.logit_scale, decoder.logit_cap)
    torch.testing.assert_close(ours, model(ids).logits, rtol=1e-4, atol=1e-4)


def _capped(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma 2's soft cap (none where `cap` is 0)."""
    return torch.tanh(x / cap) * cap if cap else x


def _rotated_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def test_a_model_of_another_architecture_is_refused_in_one_line():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(SpecchatError, match=r"^the model is a gpt2; specchat runs llama, mistral, qwen2, qwen3, "
                                            r"granite, phi3, smollm3, gemma3_text, gemma2 models$"):
        parts(model)


def test_a_draft_reading_the_last_layer_rotates_as_that_layer_does():
    """LongSpec's and GLIDE's drafts attend to the target's last-layer keys with queries of their own, rotated by
    `TargetView.rotary`: that layer's RoPE, so a NoPE last layer (SmolLM3's) rotates them by the identity."""
    from specchat.engine.cache import TreeCache
    from specchat.engine.drafter import TargetView

    x, positions = torch.zeros(1, 3, 16), torch.arange(7)[None]
    smollm3 = tiny_model("smollm3")  # its last layer without RoPE
    cos, sin = TargetView.of(smollm3, TreeCache(2, 16)).rotary(x, positions)
    assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(sin, torch.zeros_like(sin)) and cos.shape[1] == 7
    llama = tiny_model("llama")
    assert TargetView.of(llama, TreeCache(2, 16)).rotary is parts(llama).rotary
