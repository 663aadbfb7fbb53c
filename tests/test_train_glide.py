"""Training drafters that read the target's cache: GLIDE's block-wise lag, a short run on real text lowering
the held-out loss (GLIDE and LongSpec), and a trained GLIDE checkpoint that decodes losslessly."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from safetensors import safe_open
from test_cli import assert_one_line_error, specchat_in_process
from test_train_longspec import _data_dir
from test_train_longspec import _objective as longspec_objective
from tui_harness import tiny_loaded

from specchat.drafters.glide.drafter import build
from specchat.drafters.glide.model import GlideConfig, GlideModel
from specchat.drafters.glide.objective import BLOCK, GlideObjective
from specchat.drafters.glide.train import train_glide
from specchat.engine.generate import Engine
from specchat.engine.sampling_config import SamplingConfig
from specchat.training.features import SampleFeatures, target_features
from specchat.training.indices import block_lag_visibility
from specchat.training.samples import Sample
from specchat.training.trainer import TrainRecipe, train


@pytest.fixture(scope="module")
def loaded(tokenizer):
    return tiny_loaded(tokenizer)


def glide_objective(loaded) -> GlideObjective:
    model = loaded.model
    torch.manual_seed(0)
    draft = GlideModel(GlideConfig.for_target(model.config, num_hidden_layers=1, shared_vocab=True))
    embeddings, head = model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    return GlideObjective(draft, embeddings, head, torch.arange(model.config.vocab_size), model.model.rotary_emb)


def real_text_samples(tokenizer, count: int, length: int = 48) -> list[Sample]:
    """Consecutive pieces of this repository's own source, half prompt and half answer."""
    ids = tokenizer.encode(open(json.__file__).read() + open(textwrap.__file__).read())
    return [Sample(tuple(ids[i * length : (i + 1) * length]), length // 2, True) for i in range(count)]


def test_a_glide_row_never_sees_target_kv_of_its_own_block(loaded):
    objective = glide_objective(loaded)
    sample = Sample(tuple(range(100, 112)), 6, True)
    keys, values = torch.randn(2, 2, 12, 16).unbind(0)  # the tiny model's kv heads x head_dim
    labels = torch.zeros(12, dtype=torch.int32)
    mask = block_lag_visibility(12, BLOCK)
    with torch.no_grad():
        out = objective._forward(sample, SampleFeatures(keys, values, labels), mask)
        seen = values.clone()
        seen[:, 7] += 5.0  # position 7, in block 1: seen by the rows of block 2 (10, 11) only
        changed = (objective._forward(sample, SampleFeatures(keys, seen, labels), mask) - out).abs().sum(-1) > 1e-5
    assert changed.nonzero().flatten().tolist() == [10, 11]


@pytest.mark.parametrize("kind", ["glide", "longspec"])
def test_a_short_run_on_real_text_lowers_the_heldout_loss(kind, loaded, tokenizer, tmp_path):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    samples = real_text_samples(tokenizer, 40)
    train_samples, heldout = [s for i, s in enumerate(samples) if i % 10], samples[::10]  # pieces of the same files
    features = target_features(engine, tmp_path, "train", train_samples)
    heldout_features = target_features(engine, tmp_path, "heldout", heldout)
    objective = glide_objective(loaded) if kind == "glide" else longspec_objective(loaded)
    before = objective.evaluate(heldout, heldout_features)["loss"]
    recipe = TrainRecipe(epochs=4, batch=4, lr=3e-3, evaluations=1, autocast=False)
    done = train(objective, train_samples, features, heldout, heldout_features, recipe, tmp_path / kind)
    assert done.log[-1]["heldout_loss"] < before - 0.5  # nats per row (glide ~1.4 lower, longspec ~0.8)


def test_train_glide_writes_a_checkpoint_that_decodes_losslessly(loaded, tmp_path):
    """The checkpoint holds the layer, its final norm and its draft vocabulary: the embedding and LM head are
    the target's."""
    data = _data_dir(tmp_path / "data")
    out = tmp_path / "draft"
    summary = train_glide(loaded, data, out, TrainRecipe(epochs=1, batch=4), vocab=256, intermediate=32)
    assert summary["steps"] == 2 and summary["layers"] == 1 and summary["draft_vocab"] == 256
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["intermediate_size"] == 32 and config["shared_vocab"]
    with safe_open(out / "model.safetensors", "pt") as stored:
        assert stored.get_tensor("draft_vocab").shape == (256,)
        assert not any("embed_tokens" in name or "lm_head" in name for name in stored.keys())
    assert (out / "curves.png").stat().st_size > 0

    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    prompt = list(range(30, 60))
    ar = [t for e in engine.generate(prompt, sampling=SamplingConfig(), max_new_tokens=24) for t in e.tokens]
    drafter = build(engine.target, out)
    engine.set_drafter(drafter, 8)
    assert [t for e in engine.generate(prompt, sampling=SamplingConfig(), max_new_tokens=24) for t in e.tokens] == ar


def test_train_glide_rejects_bad_options_in_one_line(tmp_path, monkeypatch, capfd):
    command = ("train", "glide", "--data", str(tmp_path), "--out", str(tmp_path / "o"))
    # in this process (`specchat_in_process`): each is refused before the target loads
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command), "holds no training data")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, "--batch", "0"), "--batch")
