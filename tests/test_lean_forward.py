"""The lean forward (the compiled CPU decoder) computes transformers' forward, and every verified tree row
bitwise what a decode step at its position computes; fused projections give what the separate ones did."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_model, transformers_forward
from transformers import DynamicCache

from specchat.engine.attention import use_attention
from specchat.engine.cache import TreeCache
from specchat.engine.generate import CPU_PREFILL_ROWS, Engine
from specchat.engine.lean_forward import LeanForward, lean_forward
from specchat.engine.target_forward import canonical, held_kv_cache
from specchat.engine.tree import DraftTree, tree_batch
from specchat.errors import SpecchatError
from specchat.kernels.cpu.cpu_decoder import DENSE_PRODUCT, cpu_decoder
from specchat.loading import load_model
from specchat.quant.fused import Rows, Side, fuse_projections
from specchat.quant.gguf_linear import GGUFLinear
from specchat.quant.int4_linear import Int4Linear
from specchat.quant.int8_linear import Int8Linear
from specchat.quant.quantize import quantize_model

CPU = torch.device("cpu")


def _model(family: str, dtype: torch.dtype, *, quantize: str | None = None, head_dim: int = 64):
    """A tiny model whose 1024-token vocabulary holds the prompts here (a smaller head: the same products, in less
    time)."""
    model = tiny_model(family, head_dim=head_dim, vocab_size=1024).to(dtype)
    if quantize:
        quantize_model(model, quantize, dtype=dtype)
    return model


def _transformers_logits(model, tokens, positions, mask, cache):
    """transformers' forward over `cache` (its own `DynamicCache`), `mask` dense [1, 1, rows, prefix + rows]."""
    out = transformers_forward(model, cache, input_ids=tokens[None], position_ids=positions[None], attention_mask=mask)
    return out.logits[0]


def _dense_mask(batch, prefix: int) -> torch.Tensor:
    """The tree's mask with the committed prefix prepended: what a forward without a tree kernel takes."""
    visible = torch.ones(batch.tree_mask.shape[0], prefix, dtype=torch.bool)
    return torch.cat([visible, batch.tree_mask], dim=1)[None, None]


@torch.inference_mode()
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "smollm3"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_prefill_and_tree_verification_match_transformers_in_float32(family, head_dim):
    model = _model(family, torch.float32, head_dim=head_dim)
    lean = LeanForward(model, cpu_decoder())  # fuses q/k/v and gate/up in place: transformers runs them too
    prompt = torch.randint(3, 1000, (40,), generator=torch.Generator().manual_seed(0))
    tree = DraftTree([5, 6, 7, 8, 9], [-1, 0, 0, 1, 3], ["test"] * 5)
    batch = tree_batch(tree, 11, 40, CPU)
    caches = TreeCache(2, 128), DynamicCache(config=model.config)
    prefill = lean(prompt, torch.arange(40), None, caches[0]).logits
    expected_prefill = _transformers_logits(model, prompt, torch.arange(40), None, caches[1])
    caches[0].commit()
    verified = lean(batch.input_ids, batch.position_ids, batch.tree_mask, caches[0]).logits
    expected = _transformers_logits(model, batch.input_ids, batch.position_ids, _dense_mask(batch, 40), caches[1])
    torch.testing.assert_close(prefill, expected_prefill, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(verified, expected, atol=2e-4, rtol=1e-4)


@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_feature_layers_are_the_residual_stream_entering_each_layer(dtype):
    """What EAGLE-3 reads: transformers' hidden states i < L are the stream entering layer i; the layer count names
    the last layer's output (transformers' last entry is after the final norm)."""
    model = _model("llama", dtype)
    lean = LeanForward(model, cpu_decoder())
    prompt = torch.randint(3, 1000, (24,), generator=torch.Generator().manual_seed(0))
    out = lean(prompt, torch.arange(24), None, TreeCache(2, 64), feature_layers=(1, 0, 2))
    expected = model(prompt[None], output_hidden_states=True).hidden_states
    width = model.config.hidden_size
    first = out.features[:, :width].float() - expected[1][0].float()
    assert first.norm() <= (1e-5 if dtype == torch.float32 else 2e-2) * expected[1][0].float().norm()  # bf16 rounding
    assert torch.equal(out.features[:, width : 2 * width], model.model.embed_tokens(prompt))
    assert torch.equal(out.features[:, 2 * width :], out.hidden)
    assert lean(prompt, torch.arange(24), None, TreeCache(2, 64)).features.shape == (24, 0)


@torch.inference_mode()
def test_a_long_prefill_after_a_cached_prefix_matches_transformers_in_float32():
    """Long prefills attend in chunks of rows (`kCausalChunk`): 600 rows after 40 cached ones take ten."""
    model = _model("llama", torch.float32)
    lean = LeanForward(model, cpu_decoder())
    tokens = torch.randint(3, 1000, (640,), generator=torch.Generator().manual_seed(1))
    caches = TreeCache(2, 1024), DynamicCache(config=model.config)
    lean(tokens[:40], torch.arange(40), None, caches[0])
    _transformers_logits(model, tokens[:40], torch.arange(40), None, caches[1])
    caches[0].commit()
    logits = lean(tokens[40:], torch.arange(40, 640), None, caches[0]).logits
    expected = _transformers_logits(model, tokens[40:], torch.arange(40, 640), None, caches[1])
    torch.testing.assert_close(logits, expected, atol=2e-4, rtol=1e-4)


def _random_tree(nodes: int, seed: int) -> DraftTree:
    generator = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, nodes)]
    return DraftTree([100 + i for i in range(nodes)], parents, ["test"] * nodes)


def _chain(nodes: int) -> DraftTree:
    return DraftTree([100 + i for i in range(nodes)], list(range(-1, nodes - 1)), ["test"] * nodes)


@torch.inference_mode()
# bf16 dots (llama; qwen3 with its q/k norms), then the other cache precisions (fp16 and fp32 on dense and int4
# matrices), a bf16 cache beside fp32 activations and the int8 cache
@pytest.mark.parametrize(("family", "dtype", "quantize", "kv_cache"), [
    ("llama", torch.bfloat16, None, "auto"), ("llama", torch.bfloat16, "int4", "auto"),
    ("llama", torch.bfloat16, "int8", "auto"), ("qwen3", torch.bfloat16, "int4", "auto"),
    ("llama", torch.float16, None, "auto"), ("llama", torch.float16, "int4", "auto"),
    ("llama", torch.float32, None, "auto"), ("llama", torch.float32, "int4", "auto"),
    ("llama", torch.float32, "int4", "bf16"), ("qwen3", torch.float32, None, "bf16"),
    ("llama", torch.bfloat16, "int4", "int8"), ("llama", torch.float16, "int4", "int8"),
])  # fmt: skip
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("prefix", [1, 15, 63, 130])  # key counts on both sides of the 16- and 64-key blocks
def test_each_verified_row_is_bitwise_its_decode_step(family, dtype, quantize, kv_cache, head_dim, prefix, cpu_isa):
    if cpu_isa != "native" and prefix in (1, 63):  # the other builds on the prefixes past a block's edge
        pytest.skip("the native build covers every prefix")
    model = _model(family, dtype, quantize=quantize, head_dim=head_dim)
    use_attention(model, "canonical")
    lean = lean_forward(model)
    assert lean is not None
    prompt = torch.randint(3, 1000, (prefix,), generator=torch.Generator().manual_seed(prefix))
    cache = TreeCache(2, 256, kv_cache)
    lean(prompt, torch.arange(prefix), None, cache)
    cache.commit()
    for tree in (_random_tree(20, seed=prefix), _chain(17)):
        batch = tree_batch(tree, 11, prefix, CPU)
        out = lean(batch.input_ids, batch.position_ids, batch.tree_mask, cache)
        # Depth first, each row decoded once on its ancestors' decode steps (the cache cut back to its parent's).
        paths = sorted([0] + [1 + node for node in tree.path_to(row - 1)] for row in range(len(tree) + 1))
        for path in paths:
            cache.truncate(prefix + len(path) - 1)
            row = path[-1]
            one = lean(batch.input_ids[row : row + 1], batch.position_ids[row : row + 1], None, cache)
            cache.commit()
            assert torch.equal(one.logits[0], out.logits[row]), f"row {row} of {len(tree) + 1}"
            assert torch.equal(one.hidden[0], out.hidden[row])
        cache.truncate(prefix)


@torch.inference_mode()
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("heads", [4, 3])  # the value sums take queries in pairs: an odd group ends on a single one
@pytest.mark.parametrize(("dtype", "kv_cache"), [(torch.bfloat16, "auto"), (torch.float32, "bf16")],
                         ids=["bf16", "fp32"])  # fmt: skip
def test_a_decode_step_spread_over_the_threads_is_bitwise_one_threads(head_dim, heads, dtype, kv_cache, cpu_isa):
    """One KV head, two threads (and four, more than this machine may have): a decode step's attention over a long
    prefix goes over them (the scores by keys, the value sums by parts of the head dims), and gives bitwise what one
    thread computes alone, and what a tree's root row computes; a tree's rows spread over four threads (three units
    of two rows) are one thread's."""
    model = tiny_model("llama", head_dim=head_dim, kv_heads=1, heads=heads).to(dtype)
    use_attention(model, "canonical")
    lean = lean_forward(model)
    prefix = 1100  # past the 1024 keys a step spreads from
    cache = TreeCache(2, prefix + 32, kv_cache)
    prompt = torch.randint(3, 1000, (prefix,), generator=torch.Generator().manual_seed(5))
    lean(prompt, torch.arange(prefix), None, cache)
    cache.commit()
    threads = torch.get_num_threads()
    try:
        steps = []
        for count in (1, 4, 2):
            torch.set_num_threads(count)
            steps.append(lean(torch.tensor([7]), torch.tensor([prefix]), None, cache).logits[0])
        assert torch.equal(steps[0], steps[1]) and torch.equal(steps[0], steps[2])
        batch = tree_batch(_chain(5), 7, prefix, CPU)
        verified = []
        for count in (1, 4):
            torch.set_num_threads(count)
            verified.append(lean(batch.input_ids, batch.position_ids, batch.tree_mask, cache).logits)
        assert torch.equal(verified[0][0], steps[0]) and torch.equal(verified[0], verified[1])
    finally:
        torch.set_num_threads(threads)


@torch.inference_mode()
@pytest.mark.parametrize(("dtype", "quantize", "kv_cache"), [
    (torch.bfloat16, "int4", "auto"), (torch.bfloat16, "int8", "auto"), (torch.float16, "int4", "auto"),
    (torch.float32, None, "auto"), (torch.float32, "int4", "bf16"), (torch.bfloat16, "int4", "int8"),
])  # fmt: skip
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_each_prefill_row_is_bitwise_its_decode_step(dtype, quantize, kv_cache, head_dim, cpu_isa):
    """Causal rows attend in chunks of 64 (`kCausalChunk`): 150 rows after 15 cached ones cross three chunk
    boundaries, and every row still gets what decoding it alone gets (matmuls that are row-independent)."""
    model = _model("llama", dtype, quantize=quantize, head_dim=head_dim)
    use_attention(model, "canonical")
    lean = lean_forward(model)
    tokens = torch.randint(3, 1000, (165,), generator=torch.Generator().manual_seed(head_dim))
    cache = TreeCache(2, 256, kv_cache)
    lean(tokens[:15], torch.arange(15), None, cache)
    cache.commit()
    out = lean(tokens[15:], torch.arange(15, 165), None, cache)
    logits, hidden = out.logits, out.hidden
    cache.truncate(15)
    for row in range(150):
        position = torch.arange(15 + row, 16 + row)
        one = lean(tokens[15 + row : 16 + row], position, None, cache)
        cache.commit()
        assert torch.equal(one.logits[0], logits[row]), f"row {row}"
        assert torch.equal(one.hidden[0], hidden[row])


@torch.inference_mode()
def test_a_bf16_cache_beside_fp32_activations_holds_bf16_and_reads_as_the_activations():
    """What a drafter reads of the target's cache (`read`) comes in the activations' dtype; auto picks the bf16 cache
    for quantized weights under fp32 activations alone, as llama.cpp keeps an f16 cache beside f32 ones."""
    model = _model("llama", torch.float32, quantize="int4")
    use_attention(model, "canonical")
    assert held_kv_cache(model, "auto") == "bf16" and held_kv_cache(model, "int8") == "int8"
    assert held_kv_cache(_model("llama", torch.bfloat16, quantize="int4"), "auto") == "auto"
    if DENSE_PRODUCT:  # fp32 on dense weights is the reference: its cache stays fp32
        assert held_kv_cache(_model("llama", torch.float32), "auto") == "auto"
    cache = TreeCache(2, 64, "bf16")
    lean_forward(model)(torch.arange(3, 23), torch.arange(20), None, cache)
    cache.commit()
    keys, values = cache.layers[1].read(slice(0, 20))
    assert keys.dtype == values.dtype == torch.float32 and cache.dtype == torch.float32
    assert cache.layers[1].keys.dtype == torch.bfloat16
    assert torch.equal(keys, cache.layers[1].keys[0, :, :20].float())


def test_a_bf16_cache_refuses_fp16_activations_in_one_line(tokenizer):
    model = _model("llama", torch.float16, quantize="int4")
    use_attention(model, "canonical")
    with pytest.raises(SpecchatError, match="--kv-cache bf16 holds keys beside fp32 or bf16 activations"):
        Engine(model, tokenizer, max_len=64, kv_cache="bf16")


def test_lean_forward_serves_llama_family_models_it_was_compiled_for():
    assert canonical(tiny_model("llama", head_dim=64)) == DENSE_PRODUCT  # fp32: the decoder's own dense product
    assert lean_forward(_model("qwen3", torch.bfloat16)) is not None  # q/k norms: in the decoder
    assert lean_forward(_model("llama", torch.bfloat16, head_dim=16)) is None
    assert lean_forward(_model("llama", torch.bfloat16)) is not None


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
                               dtype=torch.bfloat16)  # fmt: skip
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
        # a dense projection stays what it was, its weights now rows of the fused ones: one copy held
        assert isinstance(getattr(parent, name), torch.nn.Linear if kind == "dense" else Rows)
        assert torch.equal(getattr(parent, name)(x), expected)
    again = fuse_projections(parent, ("a", "b", "c"))  # found again, not stacked twice
    assert again is fused if kind != "dense" else again.weight.data_ptr() == fused.weight.data_ptr()
    if kind == "dense":
        assert parent.b.weight.data_ptr() == fused.weight[128].data_ptr()
        assert set(parent.state_dict()) == {f"{name}.{part}" for name in "abc" for part in ("weight", "bias")}


def test_projections_that_cannot_stack_run_side_by_side():
    parent = _projections("int4", dims=(48, 64))  # 4-bit codes stack at multiples of 64 rows only
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    expected = torch.cat([parent.a(x), parent.b(x)], dim=-1)
    fused = fuse_projections(parent, ("a", "b"))
    assert isinstance(fused, Side)
    assert torch.equal(fused(x), expected)


def test_gguf_projections_of_different_block_types_stack_into_one_layer():
    """q/k/v of a GGUF file may mix types (the 1.5B's are Q4_K and Q6_K): one layer multiplies them in one
    call, each projection's outputs bitwise what it gives alone, biases included."""
    from gguf import GGMLQuantizationType as Q
    from gguf_files import random_blocks

    rng = np.random.default_rng(3)
    parent = torch.nn.Module()
    for name, kind, out in zip("abc", (Q.Q4_K, Q.Q6_K, Q.Q8_0), (64, 32, 16)):
        blocks = torch.from_numpy(random_blocks(kind, out, 256, rng))
        setattr(parent, name, GGUFLinear(blocks, int(kind), 256, dtype=torch.float32, bias=torch.randn(out)))
    x = torch.randn(5, 256)
    separate = [getattr(parent, name)(x) for name in "abc"]
    weights = torch.cat([getattr(parent, name).dequantize() for name in "abc"])
    fused = fuse_projections(parent, ("a", "b", "c"))
    assert isinstance(fused, GGUFLinear) and fused.format == "q4_k+q6_k+q8_0"
    assert torch.equal(fused(x), torch.cat(separate, dim=-1))
    assert torch.equal(fused.dequantize(), weights)
    for name, expected in zip("abc", separate):
        assert torch.equal(getattr(parent, name)(x), expected)


@torch.inference_mode()
def test_every_layers_queries_are_the_torch_decoders_and_the_last_is_the_default():
    """What TokenSwift's partial cache ranks keys by: each layer's rotated queries, from either decoder."""
    from specchat.engine.torch_decoder import TorchDecoder

    model = _model("llama", torch.float32)
    lean = LeanForward(model, cpu_decoder())
    tokens = torch.randint(3, 1000, (12,), generator=torch.Generator().manual_seed(2))
    every = lean(tokens, torch.arange(12), None, TreeCache(2, 32), every_layer=True).queries
    last = lean(tokens, torch.arange(12), None, TreeCache(2, 32)).queries
    assert every.shape == (2, 12, 4, 64) and torch.equal(every[-1], last)
    decoder = TorchDecoder.from_model(model)
    cache = decoder.new_cache(32)
    cache.claim(12)
    theirs = decoder(tokens, torch.arange(12), cache, every_layer=True).queries
    torch.testing.assert_close(every, theirs, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_an_engine_prefills_a_long_prompt_in_pieces_bitwise_as_in_one_forward():
    """The engine feeds the CPU decoder CPU_PREFILL_ROWS prompt rows a forward: 600 rows of the embedded model in
    two pieces give the hidden states and the cache one forward over all of them gives."""
    loaded = load_model(None)
    engine = Engine(loaded.model, loaded.tokenizer, max_len=700)
    assert engine.canonical and CPU_PREFILL_ROWS < 600
    ids = torch.randint(3, 40000, (600,), generator=torch.Generator().manual_seed(0))
    pieces = engine.target_states(ids.tolist())
    whole_cache = TreeCache(loaded.model.config.num_hidden_layers, engine.max_len, engine.cache.kv_cache)
    whole = engine.forward(ids, torch.arange(len(ids)), None, whole_cache).hidden
    assert torch.equal(pieces, whole)
    assert torch.equal(engine.cache.layers[-1].read(slice(0, 600))[0], whole_cache.layers[-1].read(slice(0, 600))[0])
