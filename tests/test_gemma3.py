"""Gemma 3 from a GGUF file: tiny random models written as llama.cpp's converter writes Gemma 3 (norms holding
1 + w, a sliding window on one layer in two, its own RoPE base there, heads 256 wide) run through the CPU
decoder as transformers' Gemma3ForCausalLM runs the same weights, past the window too; every verified tree row
is bitwise the decode step at its position; speculation equals the target alone."""

from __future__ import annotations

import shutil

import pytest
import torch
from drafters_for_tests import RandomTreeDrafter
from gguf_files import GEMMA3_WINDOW, write_tiny_model
from test_gguf_model import GREEDY, SAMPLED, generate

from specchat.architectures import gemma3_model, parts
from specchat.drafters.model.drafter import ModelDrafter
from specchat.drafters.model.model import load_draft_model
from specchat.engine.attention import use_attention
from specchat.engine.cache import TreeCache
from specchat.engine.generate import Engine
from specchat.engine.lean_forward import lean_forward
from specchat.engine.tree import DraftTree, tree_batch
from specchat.errors import SpecchatError
from specchat.loading import embedded_gguf_path, gguf_checkpoint, gguf_checkpoint_dir, load_model
from specchat.quant.gguf_model import dequantized_model, load_gguf_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def gemma3_files(tmp_path_factory):
    """The tiny Gemma 3 with F32 matrices and with every block type, each with its converted config."""
    folder = tmp_path_factory.mktemp("gemma3")
    made = {}
    for kind, unquantized in (("f32", True), ("blocks", False)):
        path = write_tiny_model(folder / f"tiny-gemma3-{kind}.gguf", embedded_gguf_path(), architecture="gemma3",
                                unquantized=unquantized)  # fmt: skip
        made[kind] = path, gguf_checkpoint(path)
    yield made
    for path, _ in made.values():
        shutil.rmtree(gguf_checkpoint_dir(path), ignore_errors=True)


def _transformers_last_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens[None]).logits[0, -1]


@torch.inference_mode()
def test_the_cpu_decoder_computes_transformers_gemma3_past_the_window(gemma3_files):
    """fp32 activations, F32 weights: a prefill of twice the window, then a tree whose rows sit at other depths,
    against transformers' model of the file dequantized (its norms given back as w)."""
    path, config_dir = gemma3_files["f32"]
    ours, theirs = load_gguf_model(path, config_dir, torch.float32), dequantized_model(path, config_dir)
    assert isinstance(ours, gemma3_model.CausalLM) and type(theirs).__name__ == "Gemma3ForCausalLM"
    assert ours.config.layer_types == theirs.config.layer_types == ["sliding_attention", "full_attention"]
    assert [layer.window for layer in parts(ours).layers] == [GEMMA3_WINDOW, 0]
    lean = lean_forward(ours)
    assert lean is not None
    length = 2 * GEMMA3_WINDOW + 5
    prompt = torch.randint(3, 2000, (length,), generator=torch.Generator().manual_seed(0))
    cache = TreeCache(2, 256)
    prefill = lean(prompt, torch.arange(length), None, cache).logits
    cache.commit()
    for row in (0, GEMMA3_WINDOW - 1, GEMMA3_WINDOW, length - 1):
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
@pytest.mark.parametrize("prefix", [GEMMA3_WINDOW - 3, GEMMA3_WINDOW + 17, 3 * GEMMA3_WINDOW])
def test_each_verified_row_is_bitwise_its_decode_step(gemma3_files, prefix, cpu_isa):
    """bf16 on the file's blocks: trees whose rows' windows start at different keys (and before the cache's
    start, near the window's edge)."""
    path, config_dir = gemma3_files["blocks"]
    model = load_gguf_model(path, config_dir, torch.bfloat16)
    use_attention(model, "canonical")
    lean = lean_forward(model)
    prompt = torch.randint(3, 2000, (prefix,), generator=torch.Generator().manual_seed(prefix))
    cache = TreeCache(2, 256)
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


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculation_equals_autoregressive(gemma3_files, sampling, cpu_isa):
    path, _ = gemma3_files["blocks"]
    loaded = load_model(str(path))
    prompt = torch.randint(3, 2000, (70,), generator=torch.Generator().manual_seed(2)).tolist()
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    assert engine.canonical
    expected = generate(engine, prompt, 60, sampling)
    engine.set_drafter(RandomTreeDrafter(vocab_size=2000, seed=3, reference=prompt + expected, p_correct=0.8), 16)
    events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=60, reproducible=True))
    assert [t for event in events for t in event.tokens] == expected
    assert events[-1].stats.accepted > 0


@pytest.mark.parametrize("architecture", ["gemma3", "qwen3"])
def test_a_file_drafting_for_itself_predicts_the_target(gemma3_files, tmp_path, architecture):
    """The draft model runs a file's layers in torch (`drafters/model`): its per-head q/k norms, Gemma's output
    norms, windows and two RoPEs. A file drafting for itself under the full cache proposes what the target
    then says, past the window too (a wrong norm, window or rotation would show at once), and the output is the
    target's."""
    path = gemma3_files["blocks"][0] if architecture == "gemma3" else \
        write_tiny_model(tmp_path / "tiny-qwen3.gguf", embedded_gguf_path(), architecture="qwen3")  # fmt: skip
    loaded = load_model(str(path))
    prompt = torch.randint(3, 2000, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    expected = generate(engine, prompt, 100, GREEDY)
    draft = load_draft_model(str(path), loaded.model, loaded.tokenizer)
    engine.set_drafter(ModelDrafter(engine.target, draft, policy="full"), 6)
    events = list(engine.generate(prompt, sampling=GREEDY, max_new_tokens=100, reproducible=True))
    assert [t for event in events for t in event.tokens] == expected
    stats = events[-1].stats
    assert stats.accepted >= 0.9 * stats.drafted_depth > 0


def test_what_gemma3_cannot_run_on_is_refused_in_one_line(gemma3_files):
    path, _ = gemma3_files["blocks"]
    loaded = load_model(str(path))
    with pytest.raises(SpecchatError, match="int8 does not run sliding-window layers"):
        Engine(loaded.model, loaded.tokenizer, max_len=64, kv_cache="int8")
    with pytest.raises(SpecchatError, match="torch decoder"):
        load_model(str(path), attention="hybrid")
    with pytest.raises(SpecchatError, match="rotates its kinds of layers"):
        load_model(str(path), yarn=2.0)
