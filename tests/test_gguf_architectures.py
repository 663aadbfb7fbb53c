"""Gemma 3, Phi-3, Granite and SmolLM3 from a GGUF file: tiny random models written as llama.cpp's converter writes them
(Gemma 3: norms holding 1 + w, a sliding window on one layer in two, its own RoPE base there, heads 256 wide; Phi-3 as
Phi-4-mini: fused q/k/v and gate/up, LongRoPE over 3/4 of each head, and a window on every layer, as Phi-3-mini's;
Granite: its embedding, residual, attention and logit multipliers; SmolLM3: no RoPE in every fourth layer)
run through the CPU decoder as transformers runs the same weights, past the window too; every verified tree row is
bitwise the decode step at its position; speculation equals the target alone."""

from __future__ import annotations

import pytest
import torch
from drafters_for_tests import RandomTreeDrafter
from gguf_files import GEMMA2_WINDOW, GEMMA3_WINDOW, PHI3_TRAINED, PHI3_WINDOW, tensor_values, write_tiny_model
from test_gguf_model import GREEDY, SAMPLED, generate

from specchat.architectures import gemma3_model, llama_model, parts
from specchat.drafters.model.drafter import ModelDrafter
from specchat.drafters.model.model import load_draft_model
from specchat.engine.attention import use_attention
from specchat.engine.cache import TreeCache
from specchat.engine.generate import Engine
from specchat.engine.lean_forward import lean_forward
from specchat.engine.prompt_cache import identity
from specchat.engine.target_forward import forward_path
from specchat.engine.tree import DraftTree, tree_batch
from specchat.errors import SpecchatError
from specchat.loading import embedded_gguf_path, gguf_checkpoint, load_model
from specchat.quant.gguf_model import dequantized_model, load_gguf_model

CPU = torch.device("cpu")
ARCHITECTURES = ("gemma3", "gemma2", "phi3", "granite", "smollm3")
# granite and smollm3 have none: prompts of the same size
WINDOW = {"gemma3": GEMMA3_WINDOW, "gemma2": GEMMA2_WINDOW, "phi3": PHI3_WINDOW, "granite": 24, "smollm3": 24}
LAYERS = {"smollm3": 4}  # its fourth is a NoPE layer; the others' files have 2
# what transformers builds, its layers' windows, specchat's modules
EXPECTED = {"gemma3": ("Gemma3ForCausalLM", [GEMMA3_WINDOW, 0], gemma3_model.CausalLM),
            "gemma2": ("Gemma2ForCausalLM", [GEMMA2_WINDOW, 0], gemma3_model.CausalLM),
            "phi3": ("Phi3ForCausalLM", [PHI3_WINDOW, PHI3_WINDOW], llama_model.CausalLM),
            "granite": ("GraniteForCausalLM", [0, 0], llama_model.CausalLM),
            "smollm3": ("SmolLM3ForCausalLM", [0, 0, 0, 0], llama_model.CausalLM)}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """Each architecture's tiny model with F32 matrices and with every block type, with its converted config."""
    made = {}

    def of(architecture: str, kind: str):
        if (architecture, kind) not in made:
            folder = tmp_path_factory.mktemp(architecture)
            path = write_tiny_model(folder / f"tiny-{architecture}-{kind}.gguf", embedded_gguf_path(),
                                    architecture=architecture, unquantized=kind == "f32",
                                    layers=LAYERS.get(architecture, 2))  # fmt: skip
            made[architecture, kind] = path, gguf_checkpoint(path)
        return made[architecture, kind]

    return of


def _transformers_last_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens[None]).logits[0, -1]


def assert_computes_transformers_forward(ours, theirs, window: int) -> None:
    """The CPU decoder's forward of `ours` (fp32 activations) against transformers' `theirs`: a prefill of twice the
    window, then a tree whose rows sit at other depths."""
    lean = lean_forward(ours)
    assert lean is not None
    length = 2 * window + 5
    prompt = torch.randint(3, 2000, (length,), generator=torch.Generator().manual_seed(0))
    cache = TreeCache(ours.config.num_hidden_layers, 256)
    prefill = lean(prompt, torch.arange(length), None, cache).logits
    cache.commit()
    for row in (0, window - 1, window, length - 1):
        want = _transformers_last_logits(theirs, prompt[: row + 1])
        torch.testing.assert_close(prefill[row], want, atol=2e-4, rtol=1e-4)
    tree = DraftTree([5, 6, 7, 8, 9], [-1, 0, 0, 1, 3], ["test"] * 5)
    batch = tree_batch(tree, 11, length, CPU)
    verified = lean(batch.input_ids, batch.position_ids, batch.tree_mask, cache).logits
    for row in range(len(tree) + 1):
        path = [11] + [tree.tokens[node] for node in tree.path_to(row - 1)] if row else [11]
        want = _transformers_last_logits(theirs, torch.cat([prompt, torch.tensor(path)]))
        torch.testing.assert_close(verified[row], want, atol=2e-4, rtol=1e-4)


@torch.inference_mode()
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_cpu_decoder_computes_transformers_model_past_the_window(tiny_files, architecture):
    """fp32 activations, F32 weights, against transformers' model of the file dequantized (Gemma's norms given back
    as w)."""
    path, config_dir = tiny_files(architecture, "f32")
    ours, theirs = load_gguf_model(path, config_dir, torch.float32), dequantized_model(path, config_dir)
    kind, windows, own = EXPECTED[architecture]
    assert isinstance(ours, own) and type(theirs).__name__ == kind
    assert [layer.window for layer in parts(ours).layers] == windows
    rotating = [layer.rotates for layer in parts(ours).layers]
    assert rotating == [layer.rotates for layer in parts(theirs).layers] == [i % 4 < 3 for i in range(len(windows))]
    assert_computes_transformers_forward(ours, theirs, WINDOW[architecture])


@torch.inference_mode()
@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("prefix", [-3, 17, 96])  # from the window's size: its rows' windows start at 0 or beyond
def test_each_verified_row_is_bitwise_its_decode_step(tiny_files, architecture, prefix, cpu_isa):
    """bf16 on the file's blocks: trees whose rows' windows start at different keys (and before the cache's
    start, near the window's edge)."""
    path, config_dir = tiny_files(architecture, "blocks")
    prefix += WINDOW[architecture]
    model = load_gguf_model(path, config_dir, torch.bfloat16)
    use_attention(model, "canonical")
    lean = lean_forward(model)
    prompt = torch.randint(3, 2000, (prefix,), generator=torch.Generator().manual_seed(prefix))
    cache = TreeCache(model.config.num_hidden_layers, 256)
    lean(prompt, torch.arange(prefix), None, cache)
    cache.commit()
    generator = torch.Generator().manual_seed(prefix)
    parents = [-1] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, 20)]
    tree = DraftTree([100 + i for i in range(20)], parents, ["test"] * 20)
    batch = tree_batch(tree, 11, prefix, CPU)
    out = lean(batch.input_ids, batch.position_ids, batch.tree_mask, cache)
    for row in range(len(tree) + 1):
        path = [0] + [1 + node for node in tree.path_to(row - 1)] if row else [0]
        cache.truncate(prefix)
        for step in path:  # the row's ancestors decoded one by one, then the row
            one = lean(batch.input_ids[step : step + 1], batch.position_ids[step : step + 1], None, cache)
            cache.commit()
        assert torch.equal(one.logits[0], out.logits[row]), f"row {row}"
    cache.truncate(prefix)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculation_equals_autoregressive(tiny_files, architecture, sampling, cpu_isa):
    assert_speculation_equals_autoregressive(load_model(str(tiny_files(architecture, "blocks")[0])), sampling)


def assert_speculation_equals_autoregressive(loaded, sampling) -> None:
    """A random tree drafter, most nodes right, over 60 tokens: the target alone's output, on the CPU decoder."""
    prompt = torch.randint(3, 2000, (70,), generator=torch.Generator().manual_seed(2)).tolist()
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    assert engine.canonical
    expected = generate(engine, prompt, 60, sampling)
    engine.set_drafter(RandomTreeDrafter(vocab_size=2000, seed=3, reference=prompt + expected, p_correct=0.8), 16)
    events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=60))
    assert [t for event in events for t in event.tokens] == expected
    assert events[-1].stats.accepted > 0


@pytest.mark.parametrize("architecture", ["gemma3", "gemma2", "phi3", "granite", "qwen3"])
def test_a_file_drafting_for_itself_predicts_the_target(tiny_files, tmp_path, architecture):
    """The draft model runs a file's layers in torch (`drafters/model`): its per-head q/k norms, Gemma's output
    norms, windows, two RoPEs and soft caps. A file drafting for itself under the full cache proposes what the target
    then says, past the window too (a wrong norm, window or rotation would show at once), and the output is the
    target's."""
    path = tiny_files(architecture, "blocks")[0] if architecture in ARCHITECTURES else \
        write_tiny_model(tmp_path / "tiny-qwen3.gguf", embedded_gguf_path(), architecture="qwen3")  # fmt: skip
    loaded = load_model(str(path))
    prompt = torch.randint(3, 2000, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    expected = generate(engine, prompt, 100, GREEDY)
    draft = load_draft_model(str(path), loaded.model, loaded.tokenizer)
    engine.set_drafter(ModelDrafter(engine.target, draft, policy="full"), 6)
    events = list(engine.generate(prompt, sampling=GREEDY, max_new_tokens=100))
    assert [t for event in events for t in event.tokens] == expected
    stats = events[-1].stats
    assert stats.accepted >= 0.9 * stats.drafted_depth > 0


@torch.inference_mode()
def test_a_smollm3_file_drafts_through_its_nope_layers(tiny_files):
    """The draft model runs a file's layers in torch, a NoPE layer rotated by the identity: a SmolLM3 file's draft
    logits over a prompt are transformers' (its fourth layer rotated moves them by tenths; random weights leave its
    argmax mostly where it was, so drafting for itself would not tell)."""
    path, config_dir = tiny_files("smollm3", "f32")
    loaded = load_model(str(path), dtype="float32")
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    drafter = ModelDrafter(engine.target, load_draft_model(str(path), loaded.model, loaded.tokenizer), policy="full")
    prompt = torch.randint(3, 2000, (40,), generator=torch.Generator().manual_seed(5))
    drafter.new_request(prompt.tolist(), 0)
    want = _transformers_last_logits(dequantized_model(path, config_dir), prompt)
    torch.testing.assert_close(drafter._catch_up().float(), want, atol=2e-4, rtol=1e-4)


def test_longrope_takes_its_long_factors_for_a_cache_past_the_trained_window(tiny_files):
    """As transformers rotates a sequence longer than the trained window (and llama.cpp a context larger than it):
    fitted to a larger cache, the rotary tables are LongRoPE's long ones, scaled by its attention factor."""
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    path, config_dir = tiny_files("phi3", "blocks")
    rotary = parts(load_gguf_model(path, config_dir, torch.float32)).rotary
    config = AutoConfig.from_pretrained(config_dir)
    for capacity in (PHI3_TRAINED, PHI3_TRAINED + 1):
        rotary.fit(capacity)
        inv_freq, scaling = ROPE_INIT_FUNCTIONS["longrope"](config, seq_len=capacity)
        assert torch.equal(rotary.inv_freq, inv_freq) and rotary.attention_scaling == pytest.approx(scaling)
    assert not torch.equal(*(ROPE_INIT_FUNCTIONS["longrope"](config, seq_len=n)[0] for n in (10, PHI3_TRAINED + 1)))


def test_a_prompt_cache_is_not_read_back_under_other_rope_factors(tiny_files):
    """Keys rotated by LongRoPE's short factors are not a prefill's under its long ones: the cache file's identity
    names the tables the engine was fitted to."""
    loaded = load_model(str(tiny_files("phi3", "blocks")[0]))
    short, long = (identity(Engine(loaded.model, loaded.tokenizer, max_len=n)) for n in (256, PHI3_TRAINED + 8))
    assert short != long
    assert identity(Engine(loaded.model, loaded.tokenizer, max_len=512)) == short


@pytest.mark.parametrize("kind", ["BF16", "F16"])
def test_an_unquantized_file_runs_on_its_values_mapped_not_copied(tmp_path, kind):
    """A BF16 or F16 file's matrices are its mapped memory (fp16 kept beside bf16 activations: each weight exact in
    the product); Gemma's embedding scales rows as they are looked up (in fp32, rounded once), its table the tied
    head's, unscaled. It speculates exactly (an F16 file in fp32 activations too, on the CPU decoder)."""
    path = write_tiny_model(tmp_path / f"tiny-gemma3-{kind}.gguf", embedded_gguf_path(), architecture="gemma3",
                            unquantized=kind, tied=True)  # fmt: skip
    loaded = load_model(str(path))
    model = loaded.model
    o = parts(model).layers[0].o.weight
    dtype = torch.bfloat16 if kind == "BF16" else torch.float16
    table = tensor_values(path, "token_embd.weight", dtype)
    assert o.dtype == dtype and torch.equal(o, tensor_values(path, "blk.0.attn_output.weight", dtype))
    assert o.untyped_storage().data_ptr() != 0 and not o.untyped_storage().resizable()  # mapped, not a copy
    ids = torch.tensor([5, 77, 1999])
    scale = model.config.hidden_size**0.5
    assert torch.equal(parts(model).embed(ids), (table[ids].float() * scale).to(torch.bfloat16))
    assert torch.equal(parts(model).head.weight, table)
    assert_speculation_equals_autoregressive(loaded, SAMPLED)
    if kind == "F16":  # fp32 activations: every matrix still multiplies each row on its own, on the CPU decoder
        loaded = load_model(str(path), dtype="float32")
        assert forward_path(loaded.model).startswith("CPU decoder")
        assert_speculation_equals_autoregressive(loaded, GREEDY)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_an_unquantized_file_quantized_as_it_loads_speculates_exactly(tmp_path, sampling, monkeypatch):
    """`--quantize q4_k_m` on a BF16 file: hidden size 256 takes Q4_K and Q6_K; one Q6_K table for the tied head and
    embedding."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))  # its conversion and kept blocks
    path = write_tiny_model(tmp_path / "tiny-gemma3-BF16.gguf", embedded_gguf_path(), architecture="gemma3",
                            unquantized="BF16", tied=True)  # fmt: skip
    loaded = load_model(str(path), quantize="q4_k_m")
    decoder = parts(loaded.model)
    assert decoder.layers[0].v.format == "q4_k" and decoder.layers[1].v.format == "q6_k"  # the last eighth
    assert decoder.embed.format == decoder.head.format == "q6_k"
    assert_speculation_equals_autoregressive(loaded, sampling)


def test_what_gemma3_cannot_run_on_is_refused_in_one_line(tiny_files):
    path, _ = tiny_files("gemma3", "blocks")
    loaded = load_model(str(path))
    with pytest.raises(SpecchatError, match="int8 does not run sliding-window layers"):
        Engine(loaded.model, loaded.tokenizer, max_len=64, kv_cache="int8")
    with pytest.raises(SpecchatError, match="torch decoder"):
        load_model(str(path), attention="hybrid")
    with pytest.raises(SpecchatError, match="rotates its kinds of layers"):
        load_model(str(path), yarn=2.0)
