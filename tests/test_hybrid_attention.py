"""Hybrid tree attention inside stock transformers models: same logits as SDPA with a dense mask, same
greedy tokens as autoregressive decoding, and the attention choice resolved with clear errors."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_FAMILIES, tiny_model
from drafters_for_tests import RandomTreeDrafter
from test_speculative import VOCAB, assert_cache_is_fresh_prefill, model_and_greedy, random_prompt, run

from specchat.drafters.ngram import NgramDrafter
from specchat.engine.attention import HYBRID, use_attention
from specchat.engine.cache import TreeCache
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.tree import DraftTree, tree_batch
from specchat.errors import SpecchatError


def _tree_logits(model, prompt: list[int], tree: DraftTree, *, tree_only: bool) -> torch.Tensor:
    """Prefill `prompt` but its last token, then verify `tree` below it, as the engine does."""
    cache = TreeCache(model.config.num_hidden_layers, 128)
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompt[:-1]]), past_key_values=cache, use_cache=True)
        cache.commit()
        batch = tree_batch(tree, prompt[-1], cache.length, torch.device("cpu"))
        out = model(
            input_ids=batch.input_ids[None],
            position_ids=batch.position_ids[None],
            attention_mask=batch.attention_mask(cache.length, tree_only=tree_only),
            past_key_values=cache,
            use_cache=True,
        )
    return out.logits[0]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tree_mask_reaches_the_hybrid_function_and_logits_match_sdpa(family):
    """A branching tree: if the [1, 1, n, n] mask were dropped or misread, sibling rows would differ."""
    sdpa, hybrid = tiny_model(family, vocab_size=VOCAB, seed=7), tiny_model(family, vocab_size=VOCAB, seed=7)
    assert use_attention(hybrid, "hybrid") == HYBRID
    tree = DraftTree([11, 12, 13, 14, 15, 16], [-1, -1, 0, 0, 3, 1], ["t"] * 6)
    prompt = random_prompt(20, seed=7)
    want = _tree_logits(sdpa, prompt, tree, tree_only=False)
    got = _tree_logits(hybrid, prompt, tree, tree_only=True)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # another summation order (seen: 1.06e-5 apart)
    chain = _tree_logits(sdpa, prompt, DraftTree([11, 13], [-1, 0], ["t"] * 2), tree_only=False)
    # node 2's row sees only 11, 13 (a 3-row forward rounds differently from a 7-row one)
    torch.testing.assert_close(got[[0, 1, 3]], chain, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("budget", [5, 64])
def test_greedy_with_hybrid_attention_equals_autoregressive(family, budget, tokenizer):
    model, prompt, greedy = model_and_greedy(family, seed=3)  # greedy by transformers with SDPA
    hybrid = tiny_model(family, vocab_size=VOCAB, seed=3)
    use_attention(hybrid, "hybrid")
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=budget, reference=prompt + greedy, p_correct=0.7)
    engine = Engine(hybrid, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
    assert engine.tree_only_masks
    out, events = run(engine, prompt, 60)
    assert out == greedy[:60]
    assert events[-1].stats.accepted > 0
    second = prompt + out + [5, 6, 7]  # a second turn prefills a suffix over the cached prefix
    expected, _ = run(Engine(model, tokenizer, max_len=256), second, 20)
    drafter.reference = second + expected
    out2, _ = run(engine, second, 20)
    assert out2 == expected
    assert_cache_is_fresh_prefill(engine, second + out2)


@pytest.mark.slow
def test_default_model_hybrid_equals_sdpa_equals_autoregressive(default_model):
    model, tokenizer = default_model.model, default_model.tokenizer
    ids = encode_prompt(tokenizer, "Repeat this list twice: apple, pear, plum, fig, kiwi, lime, date.")
    before = model.config._attn_implementation
    try:
        outputs = {}
        for attention, drafter in (("sdpa", None), ("sdpa", NgramDrafter()), ("hybrid", NgramDrafter())):
            use_attention(model, attention)
            engine = Engine(model, tokenizer, max_len=len(ids) + 64, drafter=drafter, draft_budget=8)
            outputs[attention, drafter is None] = run(engine, ids, 64)[0]
    finally:
        model.set_attn_implementation(before)
    assert outputs["sdpa", False] == outputs["hybrid", False] == outputs["sdpa", True]


def test_attention_choices_and_errors():
    model = tiny_model("llama", vocab_size=VOCAB)
    assert use_attention(model, "auto") == ("sdpa" if model.device.type == "cpu" else HYBRID)  # Triton: CUDA only
    assert use_attention(model, "hybrid") == HYBRID
    assert use_attention(model, "eager") == "eager" == model.config._attn_implementation
    with pytest.raises(SpecchatError, match="unknown attention 'flex'"):
        use_attention(model, "flex")
    sliding = tiny_model("mistral", vocab_size=VOCAB)
    sliding.config.sliding_window = 256  # smaller than its 1024 positions: the window matters
    with pytest.raises(SpecchatError, match="sliding-window"):
        use_attention(sliding, "hybrid")
    assert use_attention(sliding, "auto") == "sdpa"
