"""The attention choice picks the decoder the engine runs (canonical: the compiled CPU decoder; hybrid: the torch
decoder), each gives the target's greedy tokens with trees verified, and bad choices get clear errors."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_FAMILIES, tiny_model
from drafters_for_tests import RandomTreeDrafter
from test_speculative import VOCAB, assert_cache_is_fresh_prefill, model_and_greedy, run

from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.engine.attention import attention_of, use_attention
from specchat.engine.generate import Engine
from specchat.engine.lean_forward import LeanForward
from specchat.engine.prompt import encode_prompt
from specchat.engine.target_forward import TorchForward
from specchat.errors import SpecchatError
from specchat.kernels.cpu.cpu_decoder import DENSE_PRODUCT


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("budget", [5, 64])
def test_greedy_with_hybrid_attention_equals_autoregressive(family, budget, tokenizer):
    model, prompt, greedy = model_and_greedy(family, seed=3)  # greedy by transformers' own forward
    hybrid = tiny_model(family, vocab_size=VOCAB, seed=3)
    use_attention(hybrid, "hybrid")
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=budget, reference=prompt + greedy, p_correct=0.7)
    engine = Engine(hybrid, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
    assert isinstance(engine.forward, TorchForward)
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
def test_default_model_speculative_equals_autoregressive_on_the_torch_decoder(default_model, monkeypatch):
    model, tokenizer = default_model.model, default_model.tokenizer
    monkeypatch.setattr(model, "specchat_attention", "hybrid", raising=False)  # the shared model's choice, for now
    ids = encode_prompt(tokenizer, "Repeat this list twice: apple, pear, plum, fig, kiwi, lime, date.")
    outputs = []
    for drafter in (None, NgramDrafter()):
        engine = Engine(model, tokenizer, max_len=len(ids) + 64, drafter=drafter, draft_budget=8)
        assert isinstance(engine.forward, TorchForward)
        outputs.append(run(engine, ids, 64)[0])
    assert outputs[0] == outputs[1]


@pytest.mark.slow
def test_bf16_tree_rows_of_the_torch_decoder_are_its_decode_steps(tokenizer):
    """bf16 on a CPU: the torch decoder's CPU attention sums each row in the order its position fixes and its
    matmuls are row-independent, so a speculative output is its autoregressive one bit for bit, as the CPU
    decoder's is."""
    model = tiny_model("llama", vocab_size=VOCAB, head_dim=64, seed=5).to(torch.bfloat16)
    prompt = list(range(40, 60))
    outputs = {}
    for attention in ("canonical", "hybrid"):
        use_attention(model, attention)
        for drafter in (None, NgramDrafter()):
            engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=8)
            assert isinstance(engine.forward, LeanForward if attention == "canonical" else TorchForward)
            outputs[attention, drafter is None] = run(engine, prompt * 3, 80)[0]
    assert outputs["canonical", False] == outputs["canonical", True]
    assert outputs["hybrid", False] == outputs["hybrid", True]


def test_attention_choices_and_errors(tokenizer):
    model = tiny_model("llama", vocab_size=VOCAB, head_dim=64)
    assert attention_of(model) == "auto"
    # fp32: the CPU decoder where its own dense product takes the matrices (x86), else the torch decoder
    assert isinstance(Engine(model, tokenizer, max_len=32).forward, LeanForward if DENSE_PRODUCT else TorchForward)
    with pytest.raises(SpecchatError, match=r"canonical attention runs llama, mistral, qwen2, qwen3, phi3, granite, "
                       r"smollm3, gemma3_text, gemma2 models of head_dim 64, 96, 128, 256 on a CPU"):  # fmt: skip
        use_attention(tiny_model("qwen3", vocab_size=VOCAB, head_dim=16), "canonical")
    use_attention(model, "canonical")  # chosen: the CPU decoder runs fp32 anywhere
    assert isinstance(Engine(model, tokenizer, max_len=32).forward, LeanForward)
    use_attention(model, "hybrid")
    assert attention_of(model) == "hybrid"
    assert isinstance(Engine(model, tokenizer, max_len=32).forward, TorchForward)
    with pytest.raises(SpecchatError, match="unknown attention 'sdpa'"):
        use_attention(model, "sdpa")
    bf16 = tiny_model("llama", vocab_size=VOCAB, head_dim=64).to(torch.bfloat16)  # auto: the CPU decoder
    assert isinstance(Engine(bf16, tokenizer, max_len=32).forward, LeanForward)
    sliding = tiny_model("mistral", vocab_size=VOCAB)
    sliding.config.sliding_window = 256  # smaller than its 1024 positions: the window matters
    with pytest.raises(SpecchatError, match="sliding-window"):
        use_attention(sliding, "auto")
