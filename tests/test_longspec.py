"""LongSpec drafting is lossless and reads the target as the paper's draft does.

- greedy output equals target-only greedy decoding (beam trees and chains: widths of 1, fixed and adaptive
  budgets) on tiny random targets with random drafts, and on the real default model with a random-weight draft;
- sampled output over its chains passes the chi-square test of target-only sampling;
- the ring buffer's window attention equals dense attention restricted to the last `window` positions,
  and the draft's memory is the same at 1K and 6K tokens of context;
- checkpoints load in both published layouts; pickles and misshapen drafts are refused in one line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from chi_square import assert_fits
from conftest import tiny_model
from drafters_for_tests import rerun
from test_model_drafter import small_policy
from test_sampling_verification import CONFIGS, PROMPT, SAMPLES, TOKENS, Target, exact_joint

from specchat.drafters.checkpoint import write_checkpoint
from specchat.drafters.draft_layers import rotate
from specchat.drafters.longspec.drafter import BEAM_WIDTHS, LongSpecDrafter
from specchat.drafters.longspec.model import LongSpecConfig, LongSpecLayer, load_longspec, save_longspec
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_chat
from specchat.engine.sampling import SamplingConfig
from specchat.errors import SpecchatError


def random_layer(model, *, seed: int = 0, **changes) -> LongSpecLayer:
    torch.manual_seed(seed)
    layer = LongSpecLayer(LongSpecConfig.for_target(model.config, **changes))
    for parameter in layer.parameters():  # larger than the default init, so drafts are not all alike
        parameter.data.normal_(0, 0.2 if parameter.dim() > 1 else 1.0)
    return layer


def widths(chain: bool) -> tuple[int, ...]:
    """A greedy chain's widths (one token a depth, as deep as any budget here), or the beam's."""
    return (1,) * 64 if chain else BEAM_WIDTHS


def generate(engine: Engine, prompt: list[int], n: int, sampling=SamplingConfig()) -> list[int]:
    return [t for event in engine.generate(prompt, sampling=sampling, max_new_tokens=n) for t in event.tokens]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("budget", [8, 20, None])
def test_greedy_output_equals_the_target_alone(family, chain, budget, tokenizer):
    model = tiny_model(family, vocab_size=64)
    prompt = [5, 9, 14, 3, 22, 9, 14, 3, 40, 41, 7]
    engine = Engine(model, tokenizer, max_len=160)
    expected = generate(engine, prompt, 60)
    engine.set_drafter(LongSpecDrafter(engine.target, random_layer(model), widths=widths(chain)), budget)
    assert generate(engine, prompt, 60) == expected
    assert generate(engine, prompt + expected[:20], 30) == expected[20:50]  # the next turn reuses the cache


@pytest.mark.parametrize("policy", ["streaming", "retrieval"])
def test_cross_attention_reads_the_policys_part_of_the_target_cache_and_stays_lossless(policy, tokenizer):
    """SpecExtend's retrieval (or streaming) applied to LongSpec: cross-attention reads the chunks the target
    attends to, not its whole last layer; the output is still the target's."""
    model = tiny_model("llama", vocab_size=64)
    prompt = torch.randint(3, 64, (150,), generator=torch.Generator().manual_seed(3)).tolist()
    engine = Engine(model, tokenizer, max_len=300)
    expected = generate(engine, prompt, 60)
    drafter = LongSpecDrafter(engine.target, random_layer(model))
    drafter.use_cache_policy(small_policy(policy, engine))
    engine.set_drafter(drafter, 8)
    assert generate(engine, prompt, 60) == expected
    keys, values, length = drafter.target_kv
    assert length is None  # a selection, read as called
    assert keys.shape[1] == len(drafter.read) < int(drafter.read[-1]) - 40  # well under the context it covers
    layer = engine.cache.layers[-1]
    assert torch.equal(keys, layer.keys[0, :, drafter.read]) and torch.equal(values, layer.values[0, :, drafter.read])


@pytest.mark.parametrize("chain", [False, True])
def test_a_graphed_proposal_reads_the_whole_cache_to_its_length_and_drafts_as_called(chain, tokenizer, monkeypatch):
    """What a GPU captures: the depths over the target's whole last layer, read to the root's length on the device
    (the prefix-attention op: its CPU body here, its kernel held to the reference in test_decoder_kernels.py), from
    the root's buffers; every proposal of a generation equals the one drafted as called, and the graphs are one per
    shape, captured once."""
    model = tiny_model("llama", vocab_size=64)
    prompt = torch.randint(3, 64, (90,), generator=torch.Generator().manual_seed(5)).tolist()
    engine = Engine(model, tokenizer, max_len=200)
    expected = generate(engine, prompt, 10)
    proposals = {}
    for graphed in (False, True):
        drafter = LongSpecDrafter(engine.target, random_layer(model), widths=widths(chain))
        monkeypatch.setattr(drafter, "_graphed", lambda graphed=graphed: graphed)
        monkeypatch.setattr("specchat.engine.cuda_graphs.graph_of", rerun)
        seen = proposals[graphed] = []
        propose = drafter.propose
        drafter.propose = lambda *args, propose=propose, seen=seen: seen.append(propose(*args)) or seen[-1]
        engine.set_drafter(drafter, 7)
        assert generate(engine, prompt, 10) == expected
    assert [(t.tokens, t.parents) for t in proposals[True]] == [(t.tokens, t.parents) for t in proposals[False]]
    assert len(proposals[True]) > 3 and list(drafter.graphs) == [(1,) * 7 if chain else (4, 3)]


def test_the_beam_follows_the_reference_widths_within_the_budget(tokenizer):
    model = tiny_model("llama", vocab_size=64)
    engine = Engine(model, tokenizer, max_len=120)
    drafter = LongSpecDrafter(engine.target, random_layer(model))
    engine.set_drafter(drafter, 64)
    seen = []
    propose = drafter.propose
    drafter.propose = lambda *args: seen.append(propose(*args)) or seen[-1]
    generate(engine, list(range(10, 30)), 4)
    tree = seen[0]
    assert [tree.depths.count(d) for d in range(1, 6)] == [4, 16, 16, 16, 12]  # 64 nodes: the last level is cut
    assert len(set(zip(tree.parents, tree.tokens))) == len(tree)  # siblings distinct


def test_sampling_over_its_chains_is_distributed_as_target_sampling(tokenizer):
    model = tiny_model("qwen2", vocab_size=8, seed=1)
    for name in ("processed",):  # temperature, top-k, top-p and the penalty at once
        sampling = CONFIGS[name]
        exact = exact_joint(Target(model, sampling), PROMPT, TOKENS)
        engine = Engine(model, tokenizer, max_len=64)
        drafter = LongSpecDrafter(engine.target, random_layer(model, seed=3), widths=(1, 1))
        engine.set_drafter(drafter, 2)  # the first step's two tokens are the 2nd and 3rd tested
        counts, drafted = Counter(), 0
        # SAMPLES (1000) as in test_sampling_verification, whose per-path verifier is caught at that size with
        # chi2 >= 167 against <= 60
        for seed in range(SAMPLES):
            events = list(engine.generate(PROMPT, sampling=replace(sampling, seed=seed), max_new_tokens=TOKENS))
            counts[tuple(t for event in events for t in event.tokens)] += 1
            drafted += sum(origin == "longspec" for event in events for origin in event.origins)
        assert drafted > SAMPLES // 4, drafted  # the draft's guesses were really accepted
        assert_fits(counts, exact, f"LongSpec's chains under {name}")


def test_a_draft_vocabulary_s_chains_under_sampling_write_autoregressive_decoding_s_text(tokenizer):
    """Chains drafted in a draft vocabulary's columns, mapped to target ids, verified under sampling that suppresses
    ids inside it (10) and outside it (41): the output is plain decoding's, drafted tokens accepted."""
    model = tiny_model("llama", vocab_size=64)
    prompt = [5, 9, 14, 3, 22, 9, 14, 3, 40, 41, 7]
    sampling = SamplingConfig(temperature=1.5, seed=1, suppress=(10, 41))
    alone = [t for event in Engine(model, tokenizer, max_len=400).generate(prompt, sampling=sampling,
                                                                            max_new_tokens=200) for t in event.tokens]
    engine = Engine(model, tokenizer, max_len=400)
    engine.set_drafter(LongSpecDrafter(engine.target, random_layer(model), draft_vocab=torch.arange(0, 64, 2),
                                       widths=(1,) * 4), 4)  # fmt: skip
    events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=200))
    assert [t for event in events for t in event.tokens] == alone and not {10, 41} & set(alone)
    assert any(origin == "longspec" for event in events for origin in event.origins)


def test_window_attention_equals_dense_attention_over_the_last_window(tokenizer):
    model = tiny_model("llama", vocab_size=64)
    window, prompt = 16, [int(t) for t in torch.randint(3, 64, (70,), generator=torch.Generator().manual_seed(0))]
    engine = Engine(model, tokenizer, max_len=120)
    layer = random_layer(model, window=window)
    drafter = LongSpecDrafter(engine.target, layer, widths=(1,))
    engine.set_drafter(drafter, 1)
    generate(engine, prompt, 1)
    captured = {}
    forward = layer.forward
    layer.forward = lambda *args, **kwargs: captured.setdefault("out", forward(*args, **kwargs))
    drafter.propose(1, SamplingConfig())
    with torch.inference_mode():
        expected = _dense_root_output(engine, layer, drafter.ids, window)
    torch.testing.assert_close(captured["out"], expected)


def _dense_root_output(engine, layer, ids, window):
    """The root's draft output, densely: every position's own keys, the root's query, the last `window` keys."""
    model = engine.model
    ids = torch.tensor(ids)
    positions = torch.arange(len(ids))
    cos, sin = (t[0] for t in model.model.rotary_emb(torch.zeros(1), positions[None]))
    x = model.model.embed_tokens(ids)
    keys, values = layer.own_kv(x, cos, sin)
    h = layer.input_layernorm(x[-1:])
    q = rotate(layer._heads(layer.self_attn.q_proj(h), layer.config.num_attention_heads), cos[-1:], sin[-1:])
    attended = F.scaled_dot_product_attention(q[None], keys[None, :, -window:], values[None, :, -window:],
                                              enable_gqa=True)[0]
    x_root = x[-1:] + layer.self_attn.o_proj(layer._merge(attended))
    target_layer = engine.cache.layers[-1]
    h = layer.post_self_attention_layernorm(x_root)
    q = rotate(layer._heads(layer.cross_attn.q_proj(h), layer.config.num_attention_heads), cos[-1:], sin[-1:])
    n = len(ids) - 1
    crossed = F.scaled_dot_product_attention(
        q[None], target_layer.keys[:, :, :n], target_layer.values[:, :, :n], enable_gqa=True
    )[0]
    x_root = x_root + layer.cross_attn.o_proj(layer._merge(crossed))
    return x_root + layer.mlp(layer.post_cross_attention_layernorm(x_root))


def test_draft_memory_does_not_grow_with_the_context(tokenizer):
    model = tiny_model("llama", vocab_size=64)
    model.config.max_position_embeddings = 8192  # default RoPE: the window only bounds the engine's cache
    sizes = []
    for context in (1000, 3000):
        engine = Engine(model, tokenizer, max_len=context + 16)  # the tree's slots come on top
        drafter = LongSpecDrafter(engine.target, random_layer(model))
        engine.set_drafter(drafter, 20)
        generate(engine, [int(t) for t in torch.randint(3, 64, (context,))], 4)
        sizes.append(drafter.memory_bytes())
    assert sizes[0] == sizes[1] > 0


@pytest.mark.slow
def test_a_random_draft_on_the_default_model_keeps_its_output(default_model):
    model = default_model.model
    prompt = encode_chat(default_model.tokenizer, [{"role": "user", "content": "Write a short poem about the sea."}])
    engine = Engine(model, default_model.tokenizer, max_len=len(prompt) + 40)
    expected = generate(engine, prompt, 32)
    draft_vocab = torch.arange(0, 49152, 6)  # a reduced draft vocabulary
    engine.set_drafter(LongSpecDrafter(engine.target, random_layer(model), draft_vocab=draft_vocab), 15)
    assert generate(engine, prompt, 32) == expected


# --- checkpoints -----------------------------------------------------------------------------------------


def test_checkpoints_load_in_both_published_layouts(tmp_path):
    model = tiny_model("llama", vocab_size=64)
    layer = random_layer(model)
    save_longspec(tmp_path / "ours", layer, draft_vocab=torch.tensor([3, 5, 7]))
    loaded, vocab = load_longspec(tmp_path / "ours", model.config)
    assert vocab.tolist() == [3, 5, 7]
    assert all(torch.equal(a, b) for a, b in zip(layer.state_dict().values(), loaded.state_dict().values()))
    # the reference trainer's prefix, and the unused cross-attention k/v projections, as released
    tensors = {f"draft_model.{k}": v for k, v in layer.state_dict().items()}
    tensors["draft_model.cross_attn.k_proj.weight"] = torch.zeros(32, 64)
    tensors["draft_model.cross_attn.v_proj.weight"] = torch.zeros(32, 64)
    write_checkpoint(tmp_path / "released", model.config.to_dict(), tensors)
    loaded, vocab = load_longspec(tmp_path / "released", model.config)
    assert vocab is None
    assert all(torch.equal(a, b) for a, b in zip(layer.state_dict().values(), loaded.state_dict().values()))


def test_bad_checkpoints_are_refused_in_one_line(tmp_path):
    model = tiny_model("llama", vocab_size=64)
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(SpecchatError, match="never unpickles"):
        load_longspec(tmp_path / "pickled", model.config)
    with pytest.raises(SpecchatError, match="never unpickles"):
        load_longspec(tmp_path / "pickled" / "pytorch_model.bin", model.config)
    with pytest.raises(SpecchatError, match="no such checkpoint"):
        load_longspec(tmp_path / "missing", model.config)
    other = tiny_model("llama", vocab_size=64)
    other.config.num_attention_heads = 8
    other.config.head_dim = 8
    save_longspec(tmp_path / "other", LongSpecLayer(LongSpecConfig.for_target(other.config)))
    with pytest.raises(SpecchatError, match="8 heads.*the target has hidden 64, 4 heads") as error:
        load_longspec(tmp_path / "other", model.config)
    assert "\n" not in str(error.value)
    layer = random_layer(model)
    tensors = dict(layer.state_dict())
    del tensors["mlp.up_proj.weight"]
    write_checkpoint(tmp_path / "partial", layer.config.to_dict(), tensors)
    with pytest.raises(SpecchatError, match="lacks mlp.up_proj.weight"):
        load_longspec(tmp_path / "partial", model.config)
