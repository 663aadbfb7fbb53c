"""The lean forward computes what transformers' forward computes on the same model, and fused projections
what the separate ones did: bit for bit."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter

from specchat.drafters.ngram import NgramDrafter
from specchat.engine.attention import use_attention
from specchat.engine.cache import TreeCache
from specchat.engine.generate import Engine
from specchat.engine.lean_forward import lean_forward
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling import SamplingConfig
from specchat.engine.tree import DraftTree, tree_batch
from specchat.quant.fused import Rows, Side, fuse_projections
from specchat.quant.int4_linear import Int4Linear
from specchat.quant.int8_linear import Int8Linear
from specchat.quant.quantize import quantize_model


def _canonical(family: str, quantize: str | None = None):
    model = tiny_model(family).to(torch.bfloat16)
    if quantize:
        quantize_model(model, quantize, dtype=torch.bfloat16)
    use_attention(model, "canonical")
    return model


def _transformers_logits(model, tokens, positions, mask, cache):
    out = model(input_ids=tokens[None], position_ids=positions[None], attention_mask=mask, past_key_values=cache,
                use_cache=True)  # fmt: skip
    return out.logits[0]


@torch.inference_mode()
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("quantize", [None, "int4", "int8"])
def test_prefill_and_tree_verification_equal_transformers(family, quantize):
    model = _canonical(family, quantize)
    lean = lean_forward(model)  # fuses q/k/v and gate/up in place: transformers then runs the fused layers too
    assert lean is not None
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 1000, (40,), generator=generator)
    tree = DraftTree([5, 6, 7, 8, 9], [-1, 0, 0, 1, 3], ["test"] * 5)
    caches = TreeCache(2, 128), TreeCache(2, 128)
    logits = []
    for run, cache in zip((lean, None), caches):
        prefill = (lean(prompt, torch.arange(40), None, cache)[0] if run else
                   _transformers_logits(model, prompt, torch.arange(40), None, cache))  # fmt: skip
        cache.commit()
        batch = tree_batch(tree, 11, 40, torch.device("cpu"))
        mask = batch.attention_mask(40, tree_only=True)
        verified = (lean(batch.input_ids, batch.position_ids, mask[0, 0], cache)[0] if run else
                    _transformers_logits(model, batch.input_ids, batch.position_ids, mask, cache))  # fmt: skip
        logits.append((prefill, verified))
    assert torch.equal(logits[0][0], logits[1][0])
    assert torch.equal(logits[0][1], logits[1][1])


def test_lean_forward_serves_canonical_llama_family_models_only():
    assert lean_forward(tiny_model("llama")) is None  # fp32 on CPU: SDPA, transformers' forward
    assert lean_forward(_canonical("qwen3")) is None  # q/k norms: not a plain Llama layer
    assert lean_forward(_canonical("llama")) is not None


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["none", "ngram", "random"])
def test_engine_output_is_the_same_through_transformers(drafter):
    """The default CPU load (q4_1, bf16, canonical) decodes the same ids through either forward."""
    from specchat.loading import load_model

    loaded = load_model(None, device="cpu")
    ids = encode_prompt(loaded.tokenizer, "List ten fruits and describe the taste of each one.")
    outputs = []
    for lean in (True, False):
        make = {"none": lambda: None, "ngram": NgramDrafter,
                "random": lambda: RandomTreeDrafter(vocab_size=49152, seed=3, p_correct=0.5)}[drafter]  # fmt: skip
        engine = Engine(loaded.model, loaded.tokenizer, max_len=len(ids) + 64, drafter=make(),
                        draft_budget=None if drafter == "none" else 8)  # fmt: skip
        assert engine.lean is not None
        if not lean:
            engine.lean = None
        events = engine.generate(ids, sampling=SamplingConfig(temperature=0.0), max_new_tokens=48)
        outputs.append([token for event in events for token in event.tokens])
    assert outputs[0] == outputs[1]


def _projections(kind: str, dims=(128, 64, 32), in_features=64):
    torch.manual_seed(0)
    parent = torch.nn.Module()
    for name, out in zip("abc", dims):
        weight = torch.randn(out, in_features)
        if kind == "dense":
            layer = torch.nn.Linear(in_features, out, bias=True).to(torch.bfloat16)
        elif kind == "int4":
            scale = torch.rand(out, in_features // 32) * 0.1
            layer = Int4Linear(torch.randint(0, 16, (out, in_features)), scale, -8 * scale, group_size=32,
                               dtype=torch.bfloat16)  # fmt: skip
        else:
            layer = Int8Linear(weight.clamp(-127, 127).to(torch.int8), torch.rand(out, in_features // 32) * 0.01,
                               group_size=32, dtype=torch.bfloat16)  # fmt: skip
        setattr(parent, name, layer)
    return parent


@pytest.mark.parametrize("kind", ["dense", "int4", "int8"])
def test_fused_projections_give_the_same_outputs_once(kind):
    parent = _projections(kind)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    separate = [getattr(parent, name)(x) for name in "abc"]
    fused = fuse_projections(parent, ("a", "b", "c"))
    assert torch.equal(fused(x), torch.cat(separate, dim=-1))
    for name, expected in zip("abc", separate):
        assert isinstance(getattr(parent, name), Rows)
        assert torch.equal(getattr(parent, name)(x), expected)
    assert fuse_projections(parent, ("a", "b", "c")) is fused  # found again, not stacked twice


def test_projections_that_cannot_stack_run_side_by_side():
    parent = _projections("int4", dims=(48, 64))  # 4-bit codes stack at multiples of 64 rows only
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    expected = torch.cat([parent.a(x), parent.b(x)], dim=-1)
    fused = fuse_projections(parent, ("a", "b"))
    assert isinstance(fused, Side)
    assert torch.equal(fused(x), expected)
