"""Training a standalone draft model (`specchat train model-drafter`): the student starts as the target's first
layers over its shared, frozen embedding and head; one of all its layers guesses every target token (the
labels' alignment); a short run on real-format data lowers the held-out loss; a stopped run resumes to the
same student; a saved student loads back with the same logits."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file
from test_cli import assert_one_line_error, specchat_in_process
from test_train_glide import real_text_samples
from test_train_longspec import _record
from tui_harness import tiny_loaded

from specchat.drafters.model.model import load_draft_model, save_student
from specchat.drafters.model.objective import ModelDrafterObjective
from specchat.drafters.model.train import train_model_drafter, trainable_student
from specchat.engine.generate import Engine
from specchat.errors import SpecchatError
from specchat.quant.quantize import quantize_model
from specchat.training.features import target_features
from specchat.training.lag_evaluation import CHAIN_DEPTH, answer_rows
from specchat.training.samples import Sample
from specchat.training.trainer import TrainRecipe
from specchat.training.training_set import TrainingSet


@pytest.fixture(scope="module")
def loaded(tokenizer):
    return tiny_loaded(tokenizer)


def _data(tmp_path: Path, tokenizer, count: int) -> Path:
    """A data directory in `specchat train data`'s format whose records are real text, pieces of this Python's
    json and textwrap sources (half prompt, half answer) 12 tokens apart, every tenth held out. The pieces
    overlap: a student of a random target generalises to no text it has not seen (its start, the target's own
    first layer, is already the best guess there), so a held-out piece shares most of its text with training
    pieces."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "recipe.json").write_text(json.dumps({"model": "tiny-llama"}))
    ids = tokenizer.encode(open(json.__file__).read() + open(textwrap.__file__).read())
    samples = [Sample(tuple(ids[i * 12 : i * 12 + 48]), 24, True) for i in range(count)]
    for split, part in (("train", [s for i, s in enumerate(samples) if i % 10]), ("heldout", samples[::10])):
        records = [_record(list(s.ids[: s.answer_start]), list(s.ids[s.answer_start :])) for s in part]
        (data / f"{split}-00000.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return data


def test_the_student_starts_as_the_targets_first_layers_over_its_frozen_embedding_and_head(loaded):
    model = loaded.model
    student = trainable_student(model, 1)
    own, target = student.state_dict(), model.state_dict()
    first = {name for name in target if name.startswith("model.layers.0.")} | {"model.norm.weight"}
    for name in first:
        assert torch.equal(own[name], target[name]), name
    assert not any(name.startswith("model.layers.1.") for name in own)
    assert student.model.embed_tokens is model.model.embed_tokens and student.lm_head is model.lm_head
    assert {name for name, p in student.named_parameters() if p.requires_grad} == first
    with pytest.raises(SpecchatError, match="--layers must be between 1 and the target's 2 layers, not 3"):
        trainable_student(model, 3)


def test_a_student_of_all_the_targets_layers_guesses_its_every_token(loaded, tokenizer, tmp_path):
    """Row t's label is the target's greedy token after t: a student that is the whole target accepts every
    chain to full depth."""
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    samples = real_text_samples(tokenizer, 3)
    features = target_features(engine, tmp_path, "heldout", samples)
    objective = ModelDrafterObjective(trainable_student(loaded.model, 2), torch.arange(loaded.model.config.vocab_size))
    runs = [min(CHAIN_DEPTH, len(s) - t) for s in samples for t in answer_rows(s).nonzero().flatten().tolist()]
    assert objective.evaluate(samples, features)["chain_tau"] == pytest.approx(1 + sum(runs) / len(runs))


def test_a_short_run_lowers_the_heldout_loss_and_its_checkpoint_is_the_trained_student(loaded, tokenizer, tmp_path):
    data = _data(tmp_path, tokenizer, 40)
    out = tmp_path / "student"
    recipe = TrainRecipe(epochs=4, batch=4, lr=1e-3, evaluations=1, autocast=False)
    summary = train_model_drafter(loaded, data, out, recipe, layers=1, vocab=2048)
    assert summary["steps"] == 36 and summary["layers"] == 1 and summary["draft_vocab"] == 2048
    assert summary["checkpoint_bytes"] == (out / "model.safetensors").stat().st_size
    assert json.loads((out / "training.json").read_text())["log"] == summary["log"]
    assert (out / "curves.png").stat().st_size > 0

    draft = load_draft_model(out, loaded.model)
    assert draft.student and draft.config.num_hidden_layers == 1 and len(draft.draft_vocab) == 2048
    data_set = TrainingSet.load(loaded, data, lambda _name, _total: lambda _n: None)  # features cached by the run
    start = ModelDrafterObjective(trainable_student(loaded.model, 1), draft.draft_vocab)
    before = start.evaluate(data_set.heldout, data_set.heldout_features)["loss"]
    after = summary["log"][-1]["heldout_loss"]
    assert after < before - 0.8  # nats per row (3.4 -> 2.3)
    trained = ModelDrafterObjective(draft.model, draft.draft_vocab)  # the trained student, its weights in bf16
    assert trained.evaluate(data_set.heldout, data_set.heldout_features)["loss"] == pytest.approx(after, abs=0.02)


def test_a_stopped_run_resumes_to_the_same_student(loaded, tokenizer, tmp_path):
    data = _data(tmp_path, tokenizer, 10)  # 9 training samples: 3 steps an epoch
    # fp32 (`--precision auto` on a CPU without bf16 dot products; bf16 autocast runs ~15x slower there): a
    # resume under autocast is checked by test_train_longspec's, on the trainer all objectives share
    recipe = TrainRecipe(epochs=2, batch=4, evaluations=2, autocast=False)

    def run(out, **options):
        return train_model_drafter(loaded, data, tmp_path / out, recipe, layers=1, checkpoint_minutes=0.0, **options)

    def stop(now):
        if now.step == 4:
            raise KeyboardInterrupt  # a run stopped right after a checkpoint

    whole = run("whole")
    with pytest.raises(KeyboardInterrupt):
        run("broken", progress=stop)
    with pytest.raises(SpecchatError, match="--resume"):
        run("broken")
    resumed = run("broken", resume=True)
    assert resumed["steps"] == whole["steps"] == 6 and resumed["log"] == whole["log"]
    expected, got = (load_file(tmp_path / out / "model.safetensors") for out in ("whole", "broken"))
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


def test_a_saved_student_loads_back_with_the_same_logits(loaded, tmp_path):
    student = trainable_student(loaded.model, 1)
    with torch.no_grad():  # no longer the target's own layer
        for p in student.model.layers.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    vocab = torch.arange(0, loaded.model.config.vocab_size, 7)
    sample = Sample(tuple(range(100, 140)), 20, True)
    save_student(tmp_path / "fp32", student, target="tiny-llama", draft_vocab=vocab, dtype=torch.float32)
    save_student(tmp_path / "bf16", student, target="tiny-llama", draft_vocab=vocab)
    with torch.no_grad():
        expected = ModelDrafterObjective(student, vocab).logits(sample)
        draft = load_draft_model(tmp_path / "fp32", loaded.model)
        assert torch.equal(draft.draft_vocab, vocab)
        assert torch.equal(ModelDrafterObjective(draft.model, draft.draft_vocab).logits(sample), expected)

        stored = load_file(tmp_path / "bf16" / "model.safetensors")
        assert {t.dtype for name, t in stored.items() if name != "draft_vocab"} == {torch.bfloat16}
        for p in student.model.parameters():
            if p.requires_grad:
                p.copy_(p.bfloat16())  # what the bf16 checkpoint holds
        draft = load_draft_model(tmp_path / "bf16", loaded.model)
        rounded = ModelDrafterObjective(student, vocab).logits(sample)
        assert torch.equal(ModelDrafterObjective(draft.model, draft.draft_vocab).logits(sample), rounded)


def test_a_quantized_target_is_refused_in_one_line(loaded, tmp_path):
    quantized = tiny_model("llama")
    quantize_model(quantized, "int8", dtype=torch.float32)
    with pytest.raises(SpecchatError, match="dense weights, not int8.*--dtype float32"):
        train_model_drafter(replace(loaded, model=quantized), tmp_path, tmp_path / "o", TrainRecipe())


def test_train_model_drafter_rejects_bad_options_in_one_line(tmp_path, monkeypatch, capfd):
    command = ("train", "model-drafter", "--data", str(tmp_path), "--out", str(tmp_path / "o"))
    # in this process (`specchat_in_process`): each is refused before the target loads
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command), "holds no training data")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, "--vocab", "-1"), "--vocab")
