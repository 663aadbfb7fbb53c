"""The torch decoder (`specchat.engine.torch_decoder`) against transformers' forward, and its tree verification
against decode steps, on tiny random llama / mistral / qwen2 / qwen3 / phi3 / granite / smollm3 models (rope
scaling included). On a CPU its ops run their torch bodies; on CUDA the Triton kernels, and the CUDA graphs
(`specchat.engine.cuda_graphs`) are checked against the uncaptured forward."""

from __future__ import annotations

import gc

import pytest
import torch
from drafters_for_tests import rerun
from transformers import AutoConfig, AutoModelForCausalLM

from specchat.bench.synthetic import random_tree
from specchat.collector import collector_paused
from specchat.engine import torch_decoder
from specchat.engine.torch_decoder import PIECE, TorchDecoder
from specchat.engine.tree import tree_batch
from specchat.errors import SpecchatError

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
VOCAB = 512
LLAMA3_ROPE = {
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}  # fmt: skip
FAMILIES = {
    "llama": {"rope_parameters": LLAMA3_ROPE},  # Llama 3.1's scaling, with a context short enough to matter here
    "mistral": {},
    "qwen2": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},  # q/k/v biases
    "qwen3": {"head_dim": 32, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                  "original_max_position_embeddings": 256}},  # q/k norms; YaRN
    "phi3": {"original_max_position_embeddings": 256, "pad_token_id": 0,  # fused q/k/v and gate/up; LongRoPE
             "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                 "original_max_position_embeddings": 256, "short_factor": [1.0, 1.1, 1.3, 1.2] * 2,
                                 "long_factor": [1.0, 2.0, 4.0, 8.0] * 2}},
    "granite": {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.05,
                "logits_scaling": 8.0},  # its multipliers
    "smollm3": {"no_rope_layers": [1, 0], "pad_token_id": 0},  # its second layer without RoPE (NoPE)
}  # fmt: skip


def model_of(family: str, dtype=torch.float32, seed: int = 0):
    config = AutoConfig.for_model(
        family, vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.3, **FAMILIES[family],
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.to(DEVICE).eval().requires_grad_(False)


def prompt(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def forward(decoder, cache, tokens, positions, tree_mask=None, **kwargs):
    """One forward as the engine runs it: its rows claimed after the cache's prefix, left pending."""
    cache.claim(tokens.shape[0])
    return decoder(tokens, positions, cache, tree_mask, **kwargs)


def decode(decoder, cache, tokens: list[int]) -> torch.Tensor:
    """Logits [vocab] of the last of `tokens`, each run as one decode step after the cache's prefix."""
    for token in tokens:
        out = forward(decoder, cache, torch.tensor([token], device=DEVICE), torch.tensor([cache.length], device=DEVICE))
        cache.commit()
    return out.logits[-1]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_greedy_tokens_match_transformers_in_fp32(family):
    model = model_of(family)
    decoder = TorchDecoder.from_model(model)
    cache = decoder.new_cache(64)
    ids = prompt(20)
    with torch.inference_mode():
        out = forward(decoder, cache, ids, torch.arange(20, device=DEVICE))
        torch.testing.assert_close(out.logits, model(ids[None]).logits[0], atol=1e-4, rtol=1e-4)
        cache.commit()
        ours, theirs = ids.tolist(), ids.tolist()
        logits = out.logits[-1]
        for _ in range(12):
            ours.append(int(logits.argmax()))
            logits = decode(decoder, cache, ours[-1:])
            theirs.append(int(model(torch.tensor([theirs], device=DEVICE)).logits[0, -1].argmax()))
    assert ours == theirs


def test_feature_layers_are_the_residual_stream_entering_each_layer():
    model = model_of("llama")
    decoder = TorchDecoder.from_model(model)
    ids = prompt(20)
    with torch.inference_mode():
        out = forward(decoder, decoder.new_cache(64), ids, torch.arange(20, device=DEVICE), feature_layers=(1, 2, 0))
        expected = model(ids[None], output_hidden_states=True).hidden_states
    width = model.config.hidden_size
    torch.testing.assert_close(out.features[:, :width], expected[1][0], atol=1e-4, rtol=1e-4)
    assert torch.equal(out.features[:, width : 2 * width], out.hidden)
    torch.testing.assert_close(out.features[:, 2 * width :], expected[0][0])


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_logits_are_as_close_to_fp32_as_transformers_bf16_forward(family):
    """Both bf16 forwards against the fp32 forward of the same weights: ours rounds no worse than transformers'
    (its RoPE products and residual sums are rounded once, not twice)."""
    model = model_of(family)
    ids = prompt(24)
    with torch.inference_mode():
        truth = model(ids[None]).logits[0, -1:]
        model.to(torch.bfloat16)
        theirs = model(ids[None]).logits[0, -1:]
        decoder = TorchDecoder.from_model(model)
        ours = forward(decoder, decoder.new_cache(32), ids, torch.arange(24, device=DEVICE), last_only=True).logits
    assert ours.dtype == torch.bfloat16 and ours.shape == theirs.shape
    error = {name: (logits.float() - truth).abs().max() for name, logits in (("ours", ours), ("theirs", theirs))}
    assert error["ours"] <= 1.5 * error["theirs"] + 0.005 * truth.abs().max()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_tree_rows_equal_the_decode_steps_at_their_positions(family):
    """Each verified node's logits are those of decoding its path after the prefix; after `commit` of one path
    the cache holds what decoding that path wrote."""
    decoder = TorchDecoder.from_model(model_of(family))
    ids = prompt(30)
    tree = random_tree(12, seed=2, vocab=VOCAB)
    cache = decoder.new_cache(64)
    with torch.inference_mode():
        forward(decoder, cache, ids, torch.arange(30, device=DEVICE))
        cache.commit()
        batch = tree_batch(tree, int(ids[-1]), 29, DEVICE)  # the root re-run at the last prompt position
        cache.truncate(29)
        out = forward(decoder, cache, batch.input_ids, batch.position_ids, batch.tree_mask)
        assert out.queries.shape == (13, 4, decoder.head_dim) and out.hidden.shape == (13, 64)
        paths = [[]]
        for token, parent in zip(tree.tokens, tree.parents):
            paths.append(paths[parent + 1] + [token])
        for row, path in enumerate(paths):
            cache.truncate(29)
            want = decode(decoder, cache, [int(ids[-1]), *path])
            torch.testing.assert_close(out.logits[row], want, atol=1e-4, rtol=1e-4)
        deepest = max(range(len(paths)), key=lambda row: len(paths[row]))
        cache.truncate(29)
        out = forward(decoder, cache, batch.input_ids, batch.position_ids, batch.tree_mask)
        kept = torch.tensor([0] + [row for row in range(1, 13) if paths[row] == paths[deepest][: len(paths[row])]])
        cache.commit(kept)
        after_commit = decode(decoder, cache, [7])
        cache.truncate(29)
        torch.testing.assert_close(after_commit, decode(decoder, cache, [int(ids[-1]), *paths[deepest], 7]),
                                   atol=1e-4, rtol=1e-4)  # fmt: skip


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bf16_tree_rows_are_bitwise_the_decode_steps_at_their_positions(family):
    """Exactness itself: in bf16, whose roundings flip near-ties, each verified node's logits are bitwise those of
    decoding its path after the prefix (on a CPU: row-independent bf16 products and canonical attention; on CUDA:
    products at one row count and attention in the order a row's position fixes)."""
    decoder = TorchDecoder.from_model(model_of(family, torch.bfloat16))
    ids = prompt(30)
    tree = random_tree(12, seed=2, vocab=VOCAB)
    cache = decoder.new_cache(64)
    with torch.inference_mode():
        forward(decoder, cache, ids[:-1], torch.arange(29, device=DEVICE))
        cache.commit()
        batch = tree_batch(tree, int(ids[-1]), 29, DEVICE)
        verified = forward(decoder, cache, batch.input_ids, batch.position_ids, batch.tree_mask).logits.clone()
        paths = [[]]
        for token, parent in zip(tree.tokens, tree.parents):
            paths.append(paths[parent + 1] + [token])
        for row, path in enumerate(paths):
            cache.truncate(29)
            assert torch.equal(verified[row], decode(decoder, cache, [int(ids[-1]), *path])), f"row {row}"


@pytest.mark.skipif(DEVICE.type != "cpu", reason="a CPU's products")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_products_on_a_cpu_give_each_row_the_bits_it_has_alone(dtype):
    """A forward's bf16 / fp16 products on a CPU at a real layer's shape (a 1.5B's gate/up): each of 13 rows bitwise
    the row multiplied alone, the residual added in the product too (oneDNN's kernels, torch's default, give most
    rows other bits on an AVX-512 CPU without BF16)."""
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(8960, 1536, generator=generator) * 0.05).to(dtype)
    x, residual = torch.randn(13, 1536, generator=generator).to(dtype), torch.randn(13, 8960, generator=generator)
    residual = residual.to(dtype)
    with torch_decoder._row_independent_products(DEVICE, dtype):
        rows, added = torch_decoder._linear(x, weight), torch_decoder._add_projection(residual, x, weight, None)
        for row in range(13):
            assert torch.equal(rows[row], torch_decoder._linear(x[row : row + 1], weight)[0]), f"row {row}"
            alone = torch_decoder._add_projection(residual[row : row + 1], x[row : row + 1], weight, None)
            assert torch.equal(added[row], alone[0]), f"row {row} with the residual"


def test_products_padded_to_whole_pieces_compute_what_the_rows_alone_do(monkeypatch):
    """On CUDA a forward of up to 2 * PIECE rows multiplies them zero-padded to whole pieces of PIECE rows: forced
    here on a CPU, whose products keep rows apart, every output and every key written is bitwise the unpadded
    forward's, at one piece (1, 13 rows), two (65), and none past them (130: a prefill's rows as they are)."""
    decoder = TorchDecoder.from_model(model_of("qwen2", torch.bfloat16))  # biases too
    ids = prompt(200)

    def run(rows: int):
        cache = decoder.new_cache(256)
        with torch.inference_mode():
            forward(decoder, cache, ids[:50], torch.arange(50, device=DEVICE))
            cache.commit()
            out = forward(decoder, cache, ids[50 : 50 + rows], torch.arange(50, 50 + rows, device=DEVICE),
                          every_layer=True, feature_layers=(0, 1))  # fmt: skip
        return [out.logits, out.hidden, out.queries, out.features, cache.keys, cache.values]

    unpadded = {rows: run(rows) for rows in (1, 13, 65, 130)}
    widths = {rows: rows if rows > 2 * PIECE else -(-rows // PIECE) * PIECE for rows in (1, 13, 65, 130)}
    monkeypatch.setattr(torch_decoder, "_width", lambda rows, device: widths.get(rows, rows))
    monkeypatch.setattr(torch_decoder, "_pieces", lambda x: x.shape[0] == 2 * PIECE)
    for rows, want in unpadded.items():
        assert all(torch.equal(a, b) for a, b in zip(run(rows), want)), rows


def padded(batch, rows: int):
    """A tree's batch padded to `rows` rows as the CUDA graphs pad it: pad rows see only themselves."""
    real = batch.input_ids.shape[0]
    mask = torch.eye(rows, dtype=torch.bool, device=DEVICE)
    mask[:real, :real] = batch.tree_mask
    pad = rows - real
    tokens = torch.cat([batch.input_ids, batch.input_ids.new_zeros(pad)])
    return tokens, torch.cat([batch.position_ids, batch.position_ids[:1].expand(pad)]), mask


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the CPU compile check")
def test_the_forward_compiles_whole_and_50_steps_of_varying_trees_in_one_bucket_never_recompile():
    decoder = TorchDecoder.from_model(model_of("qwen3"))
    cache = decoder.new_cache(128)
    compiled = torch.compile(decoder.__call__, fullgraph=True, dynamic=False, backend="aot_eager")
    with torch.inference_mode():
        forward(decoder, cache, prompt(16), torch.arange(16, device=DEVICE))
        cache.commit()
        with torch._dynamo.config.patch(error_on_recompile=True):
            for step in range(50):
                tree = random_tree(step % 8, seed=step, vocab=VOCAB)
                batch = tree_batch(tree, 5, cache.length, DEVICE)
                tokens, positions, mask = padded(batch, 8)
                cache.claim(8)
                got = compiled(tokens, positions, cache, mask).logits[: len(tree) + 1]
                want = forward(decoder, cache, batch.input_ids, batch.position_ids, batch.tree_mask).logits
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
                cache.commit([0])


def test_a_config_it_cannot_compute_is_refused_in_one_line():
    config = AutoConfig.for_model("llama", rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4})
    place = {"dtype": torch.float32, "device": torch.device("cpu")}
    with pytest.raises(SpecchatError, match="dynamic"):
        TorchDecoder(config, [], torch.zeros(1, 1), torch.zeros(1), torch.zeros(1, 1), **place)
    with pytest.raises(SpecchatError, match="sliding"):
        TorchDecoder(AutoConfig.for_model("mistral"), [], torch.zeros(1, 1), torch.zeros(1), torch.zeros(1, 1), **place)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_cuda_graphs_replay_the_forward_at_every_length_and_tree_size(family, monkeypatch):
    """On a CPU, capture's stand-in reruns each forward and fails where it dispatched other ops or host values than
    at its capture (the committed length, a tree's size: what a graph would freeze)."""
    from specchat.engine import cuda_graphs
    from specchat.engine.cuda_graphs import GraphedDecoder

    if DEVICE.type != "cuda":
        monkeypatch.setattr(cuda_graphs, "graph_of", rerun)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    decoder = TorchDecoder.from_model(model_of(family))
    cache = decoder.new_cache(400)
    with torch.inference_mode():
        forward(decoder, cache, prompt(40), torch.arange(40, device=DEVICE))
        cache.commit()
        graphs = GraphedDecoder(decoder, cache, buckets=(1, 4, 16))
        for step, nodes in enumerate([0, 3, 0, 15, 7, 1, 0, 20]):  # 21 rows: past every bucket, uncaptured
            batch = tree_batch(random_tree(nodes, seed=step, vocab=VOCAB), 9, cache.length, DEVICE)
            cache.claim(nodes + 1)
            got = graphs(batch.input_ids, batch.position_ids, batch.tree_mask)
            got = [got.logits.clone(), got.queries.clone()]
            want = forward(decoder, cache, batch.input_ids, batch.position_ids, batch.tree_mask)
            torch.testing.assert_close(got[0], want.logits, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(got[1], want.queries, atol=1e-4, rtol=1e-4)
            cache.commit([0])
            cache.claim(step * 7)  # the next step at another length
            cache.commit()
        cache.claim(1)
        decode_step = graphs(torch.tensor([3], device=DEVICE), torch.tensor([cache.length], device=DEVICE))
        want = forward(decoder, cache, torch.tensor([3], device=DEVICE), torch.tensor([cache.length], device=DEVICE))
        torch.testing.assert_close(decode_step.logits, want.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("drafter, budget", [("none", 9), ("random tree", 9), ("longspec", 9), ("tokenswift", 9),
                                             ("random tree", None), ("tokenswift", None)])  # fmt: skip
def test_the_engine_through_its_bucket_graphs_equals_it_uncaptured(drafter, budget, tokenizer, monkeypatch,
                                                                   tmp_path):  # fmt: skip
    """The engine's GPU path on a CPU: the torch decoder's forwards over its cache replayed from their bucket graphs
    (capture's stand-in checks each replay against its capture), steps launched ahead, LongSpec's depths and
    TokenSwift's draft forward over its partial cache graphed too (GLIDE's graphed chain: `test_glide.py`); the text
    equals the uncaptured engine's, turn after turn, at a fixed budget and at the adaptive one (its calibration's
    forwards replayed too)."""
    from drafters_for_tests import RandomTreeDrafter
    from test_longspec import random_layer
    from test_tokenswift_drafter import random_heads

    from specchat.drafters.longspec import drafter as longspec
    from specchat.drafters.tokenswift.drafter import TokenSwiftDrafter
    from specchat.engine import cuda_graphs
    from specchat.engine.attention import use_attention
    from specchat.engine.generate import Engine
    from specchat.engine.sampling import SamplingConfig

    if DEVICE.type != "cuda":
        monkeypatch.setattr(cuda_graphs, "graph_of", rerun)  # every capture's, the drafters' too
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    model = model_of("llama")
    use_attention(model, "hybrid")
    drafters = {"none": lambda engine: None, "random tree": lambda engine: RandomTreeDrafter(vocab_size=VOCAB, seed=1),
                "longspec": lambda engine: longspec.LongSpecDrafter(engine.target, random_layer(model)),
                "tokenswift": lambda engine: TokenSwiftDrafter(engine.target, random_heads(model), kv_budget=48,
                                                               lag=16)}  # fmt: skip
    texts = []
    for graphed in (False, True):
        monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / str(graphed)))  # each engine times its own forwards
        engine = Engine(model, tokenizer, max_len=128)
        engine.forward.graphed = engine.launch_ahead = graphed
        draft = drafters[drafter](engine)
        if drafter == "longspec" and graphed:
            monkeypatch.setattr(draft, "_graphed", lambda: True)
        engine.set_drafter(draft, budget)
        first = prompt(30).tolist()
        turns = [first, None]
        out = []
        for turn in turns:
            ids = turn if turn is not None else first + out[0][:10] + [5, 6]
            events = engine.generate(ids, sampling=SamplingConfig(suppress=(2,)), max_new_tokens=30)
            out.append([t for event in events for t in event.tokens])
        texts.append(out)
        if graphed:
            assert engine.forward.graphs and sorted(engine.forward.graphs[()].buckets)[-1] == 65
            assert drafter != "longspec" or draft.graphs
            assert drafter != "tokenswift" or engine.forward.draft_graph is not None
            assert budget or (tmp_path / "True" / "verify_cost.json").exists()
    assert texts[0] == texts[1]


def test_the_collector_is_held_while_capturing_and_left_as_it_was():
    """`capture` holds Python's collector off around a capture (`test_cuda.py` captures with it), and leaves it off
    where it was off."""
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
