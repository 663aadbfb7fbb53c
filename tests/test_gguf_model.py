"""Any GGUF file as `--model`: a tiny random qwen2 model written with gguf-py (every block type among its
matrices, q/k/v biases, the embedded model's tokenizer) loads on its own blocks, and speculative decoding on
it equals autoregressive decoding, greedy and seeded sampling, through the CPU decoder and through the torch
decoder (bf16). Files that cannot run are refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from drafters_for_tests import RandomTreeDrafter
from gguf import GGMLQuantizationType as Q
from gguf_files import LAYOUTS, llama3_frequency_factors, random_blocks, write_tiny_model
from test_cli import specchat
from test_mapped_pages import PAGE, resident_bytes

from specchat.architectures import parts
from specchat.architectures.rope import rope_of_frequency_factors
from specchat.bench.bandwidth import weight_bytes
from specchat.drafters.longspec.drafter import LongSpecDrafter
from specchat.drafters.longspec.model import LongSpecConfig, LongSpecLayer
from specchat.drafters.model.model import load_draft_model
from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.drafters.tokenswift.drafter import TokenSwiftDrafter
from specchat.drafters.tokenswift.model import TokenSwiftConfig, TokenSwiftHeads
from specchat.engine.generate import Engine
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.torch_decoder import TorchDecoder
from specchat.errors import SpecchatError
from specchat.loading import embedded_gguf_path, gguf_checkpoint_dir, load_model
from specchat.quant.gguf_linear import GGUFEmbedding, GGUFLinear

GREEDY = SamplingConfig(suppress=(2,))
SAMPLED = SamplingConfig(temperature=1.0, top_p=0.95, seed=5, suppress=(2,))


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory):
    """A tiny GGUF file by architecture, written and converted (its tokenizer read) once per module; the llama one
    has Llama 3.1's RoPE scaling, as a `rope_freqs` tensor."""
    paths = {}

    def of(architecture: str) -> Path:
        if architecture not in paths:
            folder = tmp_path_factory.mktemp("gguf")
            factors = llama3_frequency_factors(8.0) if architecture == "llama" else None  # Llama 3.1's way
            paths[architecture] = write_tiny_model(folder / f"tiny-{architecture}.gguf", embedded_gguf_path(),
                                                   architecture=architecture, frequency_factors=factors,
                                                   layers=3 if architecture == "qwen2" else 2)  # fmt: skip
        return paths[architecture]

    return of


@pytest.fixture(scope="module")
def tiny_gguf(tiny_ggufs):
    return tiny_ggufs("qwen2")


def prefill_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits [len(ids), vocab] of one causal forward of the torch decoder over `ids`."""
    decoder = TorchDecoder.from_model(model, max_positions=len(ids))
    cache = decoder.new_cache(len(ids))
    cache.claim(len(ids))
    return decoder(ids, torch.arange(len(ids)), cache).logits


def generate(engine, prompt, n, sampling):
    events = engine.generate(prompt, sampling=sampling, max_new_tokens=n)
    return [t for event in events for t in event.tokens]


def test_loads_on_its_own_blocks(tiny_gguf):
    loaded = load_model(str(tiny_gguf))
    model = loaded.model
    assert model.config.model_type == "qwen2" and loaded.dtype == "bfloat16"
    attention = model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, GGUFLinear) and attention.q_proj.bias is not None
    assert isinstance(model.model.embed_tokens, GGUFEmbedding)
    formats = {module.format for module in model.modules() if isinstance(module, GGUFLinear)}
    assert formats == {kind.name.lower() for kind in LAYOUTS}  # its three layers hold every block type
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("Hello, world")) == "Hello, world"


def test_the_file_pages_under_tiled_matrices_are_not_resident(tiny_gguf):
    """A matrix repacked in tiles is read from its copy: the file's pages under it leave the process (else an 8B
    Q4_K_M counted its 4.9 GB twice). What is read after (the embedding's rows) reads the file's bytes: every test
    of a GGUF model's output runs on a model loaded so."""
    model = load_model(str(tiny_gguf)).model
    mapping = model.model.embed_tokens.blocks.data_ptr()  # the embedding reads its rows from the mapped file
    tiled = sum(matrix.numel() for module in model.modules() if isinstance(module, GGUFLinear)
                for matrix, units in zip(module.matrices, module.unit_rows) if units > 1)  # fmt: skip
    assert tiled > 1000 * PAGE
    assert resident_bytes(mapping) < tiled / 10  # tensors' edge pages, norms and biases (pages kept: over `tiled`)


def test_a_gguf_file_loads_by_any_name(tmp_path, tiny_gguf):
    """An ollama blob is named sha256-...: a file is read as a GGUF whatever its name, its first bytes checked."""
    blob = tmp_path / "sha256-6a0746a1ec1a"
    blob.symlink_to(tiny_gguf)
    named, blobbed = load_model(str(tiny_gguf)), load_model(str(blob))
    ids = torch.tensor(named.tokenizer.encode("Hello, world"))
    with torch.inference_mode():
        assert torch.equal(prefill_logits(named.model, ids), prefill_logits(blobbed.model, ids))
    assert blobbed.source.gguf and blobbed.tokenizer.encode("Hello, world") == ids.tolist()


@pytest.mark.parametrize(
    "attention, drafter, sampling",
    [("auto", "ngram", GREEDY), ("auto", "random", GREEDY), ("auto", "random", SAMPLED),
     ("hybrid", "random", GREEDY), ("auto", "longspec", GREEDY), ("auto", "longspec", SAMPLED),
     ("auto", "tokenswift", GREEDY), ("auto", "tokenswift", SAMPLED)],
    # bf16 activations. auto: the CPU decoder; hybrid: the torch decoder on the same layers. Not fp32, the reference:
    # its attention rounds a tree row and a decode step differently (docs/design.md, "Row independence"), and the
    # blocks' int8 activations can turn that into other codes.
    ids=["cpu-ngram-greedy", "cpu-random-greedy", "cpu-random-sampled", "torch-random-greedy",
         "cpu-longspec-greedy", "cpu-longspec-sampled", "cpu-tokenswift-greedy", "cpu-tokenswift-sampled"],
)  # fmt: skip
def test_speculation_equals_autoregressive(tiny_gguf, attention, drafter, sampling):
    loaded = load_model(str(tiny_gguf), attention=attention)
    prompt = torch.randint(3, 2000, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    prompt = prompt + prompt[:12]  # something for the n-gram drafter to find
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    assert engine.canonical == (attention == "auto")  # the CPU decoder's forward, else the torch decoder's
    expected = generate(engine, prompt, 80, sampling)
    if drafter == "longspec":  # a draft layer of the target's shapes (random: a 1.5B's is trained, same code)
        torch.manual_seed(0)
        layer = LongSpecLayer(LongSpecConfig.for_target(loaded.model.config, intermediate=64))
        made = LongSpecDrafter(engine.target, layer, draft_vocab=torch.arange(1000))  # odd-sized: a dense head
    elif drafter == "tokenswift":  # random heads over a draft vocabulary, from the last verified state (a CPU's way)
        torch.manual_seed(0)
        heads = TokenSwiftHeads(TokenSwiftConfig.for_target(loaded.model.config), draft_vocab=torch.arange(0, 2000, 2))
        for head in heads.medusa_layers:
            torch.nn.init.normal_(head.linear.weight, std=0.05)
        made = TokenSwiftDrafter(engine.target, heads, forward=False, lag=8)
        assert all(isinstance(head.linear, GGUFLinear) for head in made.heads.medusa_layers)  # Q4_K beside a GGUF
    else:
        made = NgramDrafter() if drafter == "ngram" else RandomTreeDrafter(
            vocab_size=2000, seed=3, reference=prompt + expected, p_correct=0.8)  # fmt: skip
    engine.set_drafter(made, 16)
    events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=80))
    assert [t for event in events for t in event.tokens] == expected
    if drafter == "random":
        assert events[-1].stats.accepted > 0


@pytest.mark.parametrize("architecture", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculation_equals_autoregressive_on_every_cpu_path(tiny_ggufs, architecture, sampling, cpu_isa):
    """Each decoder build this machine runs (its own, and the AVX2 one on an AVX-512 CPU), bf16 and an int8
    cache: the target alone and the target verifying trees give the same tokens."""
    loaded = load_model(str(tiny_ggufs(architecture)))
    prompt = torch.randint(3, 2000, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    for kv_cache in ("auto", "int8"):
        engine = Engine(loaded.model, loaded.tokenizer, max_len=512, kv_cache=kv_cache)
        expected = generate(engine, prompt, 40, sampling)
        engine.set_drafter(RandomTreeDrafter(vocab_size=2000, seed=4, reference=prompt + expected, p_correct=0.8), 16)
        events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=40))
        assert [t for event in events for t in event.tokens] == expected, kv_cache
        assert events[-1].stats.accepted > 0


def test_a_gguf_model_stops_where_llama_cpp_stops(tiny_gguf):
    """At the file's EOS (the embedded tokenizer's `<|im_end|>`, 2) and at every special token spelled as an end of
    turn (its `<|endoftext|>`, 0), as llama.cpp does: a file names one EOS where a repo lists several."""
    loaded = load_model(str(tiny_gguf))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    assert engine.eos_ids == {0, 2}
    only_endoftext = SamplingConfig(suppress=tuple(range(1, loaded.model.config.vocab_size)))
    events = list(engine.generate([5, 6, 7], sampling=only_endoftext, max_new_tokens=8))
    assert [t for event in events for t in event.tokens] == [0] and events[-1].finish_reason == "eos"


def test_llama_3_rope_scaling_is_read_from_the_files_frequency_factors(tiny_ggufs):
    """A Llama 3.1 GGUF file says its RoPE scaling only as a `rope_freqs` tensor, whose factors divide each rotary
    pair's frequency (llama.cpp's way): the loaded config says Llama 3's scaling, and every decoder's frequencies
    (transformers' rotary module, the torch decoder's tables) are the base ones over the file's factors."""
    loaded = load_model(str(tiny_ggufs("llama")), dtype="float32")
    rope = loaded.model.config.rope_parameters
    assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0
    base = 1 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    wanted = base / torch.tensor(llama3_frequency_factors(8.0), dtype=torch.float64)
    assert torch.allclose(parts(loaded.model).rotary.inv_freq.double(), wanted, rtol=1e-6)
    tables = TorchDecoder.from_model(loaded.model, max_positions=4096)
    assert torch.allclose(tables.cos[4000].double(), (4000 * wanted).cos(), atol=1e-3)  # fp32 angles near 4000


def test_frequency_factors_other_than_llama_3s_are_refused():
    base = {"rope_type": "default", "rope_theta": 10000.0}
    factors = torch.tensor(llama3_frequency_factors(8.0))
    assert rope_of_frequency_factors(base, 64, factors)["factor"] == 8.0
    for other in (llama3_frequency_factors(8.0, old_context=4096), [2.0] * 32, [1.0] * 16):
        with pytest.raises(ValueError, match="is not Llama 3's RoPE scaling"):
            rope_of_frequency_factors(base, 64, torch.tensor(other))


@pytest.mark.parametrize("context", [3001, 3072])  # an odd and an even prefix: bf16 value rows go in pairs
def test_speculation_equals_autoregressive_after_3k_tokens(tiny_gguf, context):
    """Verified trees read a 3K-token cache through the same attention as decode steps (the long-context case)."""
    loaded = load_model(str(tiny_gguf))
    prompt = torch.randint(3, 2000, (context - 200,), generator=torch.Generator().manual_seed(2)).tolist()
    prompt += prompt[:200]
    engine = Engine(loaded.model, loaded.tokenizer, max_len=context + 64)
    expected = generate(engine, prompt, 48, GREEDY)
    engine.set_drafter(RandomTreeDrafter(vocab_size=2000, seed=4, reference=prompt + expected, p_correct=0.8), 16)
    events = list(engine.generate(prompt, sampling=GREEDY, max_new_tokens=48))
    assert [t for event in events for t in event.tokens] == expected
    assert events[-1].stats.accepted > 0


def test_speculation_equals_autoregressive_past_the_trained_window_stretched_by_yarn(tiny_ggufs):
    """`--yarn 2` reads past the file's 4096-token window, and verified trees there are the target's own steps; a
    file whose RoPE is scaled already (Llama 3.1's) is refused."""
    loaded = load_model(str(tiny_ggufs("qwen2")), yarn=2)
    assert loaded.model.config.max_position_embeddings == 8192 and loaded.yarn == 2
    prompt = torch.randint(3, 2000, (4200,), generator=torch.Generator().manual_seed(5)).tolist()
    prompt += prompt[:100]
    engine = Engine(loaded.model, loaded.tokenizer, max_len=len(prompt) + 64)
    expected = generate(engine, prompt, 32, GREEDY)
    engine.set_drafter(RandomTreeDrafter(vocab_size=2000, seed=4, reference=prompt + expected, p_correct=0.8), 16)
    events = list(engine.generate(prompt, sampling=GREEDY, max_new_tokens=32))
    assert [t for event in events for t in event.tokens] == expected
    assert events[-1].stats.accepted > 0
    with pytest.raises(SpecchatError, match=r"this model's is scaled already \(llama3\)"):
        load_model(str(tiny_ggufs("llama")), yarn=2)


def test_a_draft_model_reads_positions_as_its_stretched_target_does(tiny_ggufs):
    """Beside a target stretched by `--yarn`, a plain-RoPE GGUF draft is stretched to the target's window."""
    path = tiny_ggufs("qwen2")
    draft = load_draft_model(path, load_model(str(path), yarn=2).model).model
    assert draft.config.max_position_embeddings == 8192 and draft.config.rope_parameters["factor"] == 2
    assert parts(draft).rotary.attention_scaling > 1
    beside_plain = load_draft_model(path, load_model(str(path)).model).model
    assert beside_plain.config.rope_parameters["rope_type"] == "default"


def test_embedded_llama_file_on_the_block_kernels_matches_its_dequantized_weights():
    """The embedded file (llama: q/k rows un-permuted) through GGUFLinear gives the logits of its weights dequantized
    in fp32 (transformers' forward): with fp32 activations in two int8 terms, closely; in bf16 (one term, whose
    rounding flips chaotically over 30 layers), on the mean error, the largest held only loosely. The kernels' own
    arithmetic is checked tightly in test_gguf_kernels.py."""
    from transformers import AutoTokenizer

    from specchat.loading import embedded_checkpoint
    from specchat.quant.gguf_model import dequantized_model, load_gguf_model

    config_dir = embedded_checkpoint(dense=False)
    tokenizer = AutoTokenizer.from_pretrained(config_dir)
    reference = dequantized_model(embedded_gguf_path(), config_dir)
    ids = torch.tensor(tokenizer.encode("The capital of France is Paris, and the capital of Italy is"))
    with torch.inference_mode():
        want = reference(ids[None]).logits[0]
        for dtype, mean, largest in ((torch.float32, 0.002, 0.02), (torch.bfloat16, 0.015, 0.12)):
            got = prefill_logits(load_gguf_model(embedded_gguf_path(), config_dir, dtype), ids).float()
            assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
            assert (got - want).abs().mean() <= mean * want.abs().max(), dtype
            assert (got - want).abs().max() <= largest * want.abs().max(), dtype


def test_refusals_are_one_line(tmp_path, tiny_gguf):
    with pytest.raises(SpecchatError, match="no such GGUF file"):
        load_model(str(tmp_path / "missing.gguf"))
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(SpecchatError, match="not a GGUF file"):
        load_model(str(text))
    text.rename(tmp_path / "notes")  # by any name
    with pytest.raises(SpecchatError, match="not a GGUF file"):
        load_model(str(tmp_path / "notes"))
    with pytest.raises(SpecchatError, match="GGUF files run on a CPU|already quantized"):
        load_model(str(tiny_gguf), quantize="q4_k_m")


@pytest.mark.parametrize("kept", [0.9999, 0.5, 0.01])
def test_a_truncated_file_is_refused_in_one_line(tmp_path, tiny_gguf, kept):
    """Cut in its data, its tensor table or its metadata (an interrupted download): one line that says so."""
    whole = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: int(len(whole) * kept)])
    with pytest.raises(SpecchatError, match="truncated") as refused:
        load_model(str(cut))
    assert "\n" not in str(refused.value)


def test_unsupported_tensor_type_is_named(tmp_path):
    path = _with_tq2_0(tmp_path / "tq2.gguf")
    with pytest.raises(SpecchatError, match="'blk.0.ffn_up.weight' is TQ2_0"):
        load_model(str(path))
    assert not gguf_checkpoint_dir(path).exists()  # refused before the slow tokenizer conversion


def _with_tq2_0(path):
    """A one-layer model whose up projection is TQ2_0 (ternary: no kernel here)."""
    from gguf import GGUFWriter
    from gguf_files import tokenizer_fields

    writer = GGUFWriter(str(path), "qwen2")
    tokenizer_fields(writer, embedded_gguf_path())
    for key, value in [("context_length", 2048), ("embedding_length", 256), ("block_count", 1),
                       ("feed_forward_length", 512), ("head_count", 4), ("head_count_kv", 2)]:  # fmt: skip
        getattr(writer, f"add_{key}")(value)
    writer.add_layer_norm_rms_eps(1e-6)
    rng = np.random.default_rng(0)
    writer.add_tensor("blk.0.ffn_up.weight", rng.integers(0, 256, (512, 66), dtype=np.uint8), raw_dtype=Q.TQ2_0)
    writer.add_tensor("token_embd.weight", random_blocks(Q.Q8_0, 49152, 256, rng), raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_cli_runs_a_gguf_path(tiny_gguf):
    result = specchat("run", "Hi", "--model", str(tiny_gguf), "-n", "8", "--temperature", "0", "--json", warm=True)
    assert result.returncode == 0, result.stderr
    assert '"weights": ' in result.stdout and '"new_tokens": 8' in result.stdout
    missing = specchat("run", "Hi", "--model", "./nope.gguf", warm=True)
    assert missing.returncode != 0 and missing.stderr.strip().count("\n") == 0
    assert "no such GGUF file" in missing.stderr


def test_verify_cost_of_a_real_model_through_the_engine(tiny_gguf):
    from specchat.bench.verify_cost import model_verify_cost

    loaded = load_model(str(tiny_gguf))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=200)
    rows = model_verify_cost(engine, contexts=[64, 128], trees=[0, 3, 15], repeats=1)
    assert [(row.context, row.nodes) for row in rows] == [(64, 0), (64, 3), (64, 15), (128, 0), (128, 3), (128, 15)]
    assert all(row.ms > 0 for row in rows) and rows[0].over_decode == 1.0
    decode, tree = rows[0], rows[1]  # a decode step's bytes: every matrix's blocks and the cache's 64 tokens
    assert decode.gb_s > 0 and decode.of_copy > 0 and tree.gb_s is None and tree.of_copy is None
    blocks = sum(t.numel() for m in loaded.model.modules() if isinstance(m, GGUFLinear) for t in m.matrices)
    assert weight_bytes(loaded.model) >= blocks
    with pytest.raises(SpecchatError, match="room for the tree"):
        model_verify_cost(engine, contexts=[engine.cache.max_len - 10], trees=[15], repeats=1)


def test_the_real_qwen_coder_files_keep_their_output():
    """Qwen2.5-Coder-1.5B Q4_K_M (Q4_K, Q6_K) as target, its 0.5B (mostly Q5_0, a Q8_0 head) as draft, and the
    TokenSwift heads, LongSpec and GLIDE drafts shipped for it: output with each drafter equals autoregressive
    decoding, greedy and seeded sampling at the model card's settings. Needs the real files (`specchat models` says
    where they go); CI has none."""
    from specchat.drafters import build_drafter, parse_drafter, resolve_drafter
    from specchat.engine.prompt import encode_prompt
    from specchat.loading import profile_gguf
    from specchat.profiles import load_profiles

    profile = load_profiles()["qwen2.5-coder-1.5b"]
    if profile_gguf(profile, download=False) is None:
        pytest.skip("the Qwen2.5-Coder-1.5B GGUF is not on this machine")
    loaded = load_model("qwen2.5-coder-1.5b")
    prompt = encode_prompt(loaded.tokenizer, "Write a Python function that reverses a linked list.")
    engine = Engine(loaded.model, loaded.tokenizer, max_len=len(prompt) + 40)
    assert engine.eos_ids == {151643, 151645}  # <|endoftext|> and <|im_end|>, as the model's own repo lists them
    sampled = SamplingConfig(temperature=0.7, top_p=0.8, top_k=20, seed=3)
    expected = {sampling: generate(engine, prompt, 32, sampling) for sampling in (GREEDY, sampled)}
    for name in ("ngram", "model", "tokenswift", "tokenswift+ngram", "longspec", "longspec+ngram", "glide",
                 "glide+ngram"):
        choice = resolve_drafter(parse_drafter(name), loaded.source.profile, loaded.source.name)
        engine.set_drafter(build_drafter(choice, engine.target), 4)
        for sampling, tokens in expected.items():
            assert generate(engine, prompt, 32, sampling) == tokens, (name, sampling)


def test_the_weights_are_named_by_the_format_most_values_are_in():
    """A Q3_K_M file holds more Q4_K and Q5_K matrices than Q3_K ones, but most of its values in Q3_K: its reports
    say q3_k."""
    from torch import nn

    from specchat.quant.formats import weight_format

    rng = np.random.default_rng(0)
    layers = [GGUFLinear(torch.from_numpy(random_blocks(kind, rows, 256, rng)), int(kind), 256, dtype=torch.bfloat16)
              for kind, rows in [(Q.Q3_K, 64), (Q.Q4_K, 16), (Q.Q4_K, 16), (Q.Q5_K, 8)]]  # fmt: skip
    assert weight_format(nn.Sequential(*layers)) == "q3_k"
