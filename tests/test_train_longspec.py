"""Training a LongSpec drafter: samples, the target's cached features, the objective's positions and lag, the
shared loop's schedule and exact resume, and a trained checkpoint that decodes losslessly."""

from __future__ import annotations

import json
import random

import pytest
import torch
from test_cli import assert_one_line_error, specchat_in_process
from tui_harness import tiny_loaded

from specchat.drafters.draft_layers import rotate
from specchat.drafters.longspec.drafter import build
from specchat.drafters.longspec.model import LongSpecConfig, LongSpecLayer
from specchat.drafters.longspec.objective import LongSpecObjective
from specchat.drafters.longspec.train import train_longspec
from specchat.engine.generate import Engine
from specchat.engine.sampling_config import SamplingConfig
from specchat.errors import SpecchatError
from specchat.training.data import read_records
from specchat.training.features import SampleFeatures, target_features
from specchat.training.lag_evaluation import chain_accepted
from specchat.training.pipeline import quiet_stage
from specchat.training.samples import Sample, fingerprint, sample_of, samples_of
from specchat.training.trainer import STATE, TrainRecipe, learning_rate, train
from specchat.training.training_set import TrainingSet
from specchat.training.vocab import frequent_tokens


def _record(prompt, answer, sampling="greedy", turn=0):
    return {"prompt_ids": prompt, "answer_ids": answer, "sampling": sampling, "turn": turn}


def test_a_sample_is_prompt_then_answer_and_a_long_one_keeps_its_end():
    sample = sample_of(_record([1, 2, 3], [4, 5]))
    assert sample == Sample((1, 2, 3, 4, 5), 3, True)
    cut = sample_of(_record(list(range(10)), [20, 21], sampling={"temperature": 1.0}), max_tokens=5)
    assert cut == Sample((7, 8, 9, 20, 21), 3, False)
    assert samples_of([_record([1], []), _record([1], [2])]) == [Sample((1, 2), 1, True)]
    assert fingerprint([sample]) != fingerprint([cut]) and fingerprint([sample]) == fingerprint([sample])


@pytest.fixture(scope="module")
def loaded(tokenizer):
    return tiny_loaded(tokenizer)


def _samples(count, length=24, seed=0):
    rng = random.Random(seed)
    return [Sample(tuple(rng.randrange(1000) for _ in range(length)), length // 2, True) for _ in range(count)]


def test_features_are_the_targets_last_layer_kv_and_greedy_tokens_computed_once(loaded, tmp_path):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    samples = _samples(3)
    features = target_features(engine, tmp_path, "train", samples)
    assert features.starts.tolist() == [0, 24, 48, 72]
    for index, sample in enumerate(samples):
        engine.target_states(list(sample.ids))
        layer = engine.cache.layers[-1]
        keys, values, labels = features.of(index)
        torch.testing.assert_close(keys, layer.keys[0, :, :24].to(torch.bfloat16))
        torch.testing.assert_close(values, layer.values[0, :, :24].to(torch.bfloat16))
        with torch.no_grad():  # transformers' own forward: the greedy token after each row
            logits = loaded.model(input_ids=torch.tensor([sample.ids])).logits[0]
        assert labels.tolist() == logits.argmax(dim=-1).tolist()
    path = next((tmp_path / "features").glob("train-*.safetensors"))
    written = path.stat().st_mtime_ns
    again = target_features(engine, tmp_path, "train", samples)  # read back, not computed
    assert path.stat().st_mtime_ns == written and torch.equal(again.keys, features.keys)
    other = target_features(engine, tmp_path, "train", _samples(3, seed=1))  # other samples: computed again
    assert not torch.equal(other.keys, features.keys)


def _objective(loaded):
    model = loaded.model
    torch.manual_seed(0)
    layer = LongSpecLayer(LongSpecConfig.for_target(model.config))
    embeddings = model.model.embed_tokens.weight.detach().float()
    return LongSpecObjective(layer, embeddings, model.lm_head.weight.detach().float(),
                             torch.arange(model.config.vocab_size), model.model.rotary_emb,
                             model.config.max_position_embeddings)  # fmt: skip


def test_rotated_cached_keys_equal_the_targets_keys_at_the_offset_positions(loaded):
    """RoPE is relative: the target run at positions shifted by d caches its keys rotated by d."""
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    ids = list(range(5, 25))
    engine.target_states(ids)
    keys = engine.cache.layers[-1].keys[0, :, :20].clone()
    offset = 1000
    engine.target_states(ids, positions=torch.arange(offset, offset + 20))
    shifted = engine.cache.layers[-1].keys[0, :, :20]
    objective = _objective(loaded)
    cos, sin = objective._rotary(torch.full((20,), offset))
    torch.testing.assert_close(rotate(keys, cos, sin), shifted, atol=2e-4, rtol=1e-4)


def test_a_row_never_sees_target_kv_inside_its_lag(loaded):
    objective = _objective(loaded)
    sample = _samples(1, length=16)[0]
    keys, values = torch.randn(2, 2, 16, 16).unbind(0)  # the tiny model's kv heads x head_dim
    labels = torch.zeros(16, dtype=torch.int32)
    positions = torch.arange(16)
    for pad in (1, 3):
        out = objective._forward(sample, SampleFeatures(keys, values, labels), positions, pad)
        later = values.clone()
        later[:, 16 - pad :] += 5.0  # the last `pad` positions: seen by no row under this lag
        torch.testing.assert_close(objective._forward(sample, SampleFeatures(keys, later, labels), positions, pad), out)
        seen = values.clone()
        seen[:, 15 - pad] += 5.0  # seen by the last row only
        changed = ((objective._forward(sample, SampleFeatures(keys, seen, labels), positions, pad) - out)
                   .abs().sum(-1) > 0)
        assert changed.nonzero().flatten().tolist() == [15]


def test_chain_acceptance_runs_down_the_diagonal():
    right = torch.tensor([[1, 1, 0, 1, 1],  # depth 1 at rows 0..4
                          [1, 1, 0, 0, 1],  # depth 2
                          [0, 1, 1, 1, 1]], dtype=torch.bool)  # fmt: skip
    assert chain_accepted(right, [0, 1, 2, 3, 4]) == [3, 1, 0, 2, 1]


def test_learning_rate_warms_up_then_follows_a_cosine_to_zero():
    recipe = TrainRecipe(lr=1e-3, warmup=0.1)
    rates = [learning_rate(step, 100, recipe) for step in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert rates[10] == pytest.approx(1e-3) and rates[55] == pytest.approx(5e-4, rel=0.05)
    assert rates[-1] < 1e-5 and all(a >= b for a, b in zip(rates[10:], rates[11:]))


def test_a_resumed_run_ends_with_the_same_weights_as_an_unbroken_one(loaded, tmp_path):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    samples, heldout = _samples(6), _samples(2, seed=9)
    features = target_features(engine, tmp_path, "train", samples)
    heldout_features = target_features(engine, tmp_path, "heldout", heldout)
    recipe = TrainRecipe(epochs=2, batch=3, evaluations=2)  # 4 steps

    def run(out, stop_after=None, resume=False):
        objective = _objective(loaded)
        stop = stop_after

        def progress(now):
            if stop is not None and now.step == stop:
                raise KeyboardInterrupt  # a run stopped right after a checkpoint
        try:
            done = train(objective, samples, features, heldout, heldout_features, recipe, out, resume=resume,
                         checkpoint_minutes=0.0, progress=progress)  # fmt: skip
        except KeyboardInterrupt:
            return None, objective
        return done, objective

    done, whole = run(tmp_path / "whole")
    assert done.step == 4 and [entry["step"] for entry in done.log] == [2, 4]
    assert all(entry["heldout_chain_tau"] >= 1 for entry in done.log)
    run(tmp_path / "broken", stop_after=3)
    with pytest.raises(SpecchatError, match="--resume"):
        run(tmp_path / "broken")
    resumed, objective = run(tmp_path / "broken", resume=True)
    assert resumed.step == 4 and resumed.log == done.log
    for (name, a), b in zip(whole.module.named_parameters(), objective.module.parameters()):
        assert torch.equal(a, b), name
    with pytest.raises(SpecchatError, match="another recipe"):
        train(_objective(loaded), samples, features, heldout, heldout_features, TrainRecipe(epochs=1, batch=3),
              tmp_path / "broken", resume=True)  # fmt: skip
    with pytest.raises(SpecchatError, match="other samples"):
        train(_objective(loaded), samples[:5], features, heldout, heldout_features, recipe, tmp_path / "broken",
              resume=True)  # fmt: skip
    assert (tmp_path / "whole" / STATE).is_file()


def _data_dir(folder, counts=(("train", 8), ("heldout", 2)), sampling="greedy", seed=0):
    """A data directory of random records of the tiny target."""
    folder.mkdir()
    (folder / "recipe.json").write_text(json.dumps({"model": "tiny-llama"}))
    rng = random.Random(seed)
    for split, count in counts:
        records = [_record([rng.randrange(1, 1000) for _ in range(12)], [rng.randrange(1, 1000) for _ in range(8)],
                           sampling) for _ in range(count)]  # fmt: skip
        (folder / f"{split}-00000.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return folder


def test_a_training_set_joins_data_dirs_each_keeping_its_own_features(loaded, tmp_path):
    answers = _data_dir(tmp_path / "answers")
    text = _data_dir(tmp_path / "text", counts=(("train", 3),), sampling="text", seed=1)  # no held-out records
    alone = TrainingSet.load(loaded, answers, quiet_stage)
    both = TrainingSet.load(loaded, [answers, text], quiet_stage)
    assert both.samples == alone.samples + samples_of(read_records(text, "train")) and both.heldout == alone.heldout
    assert sorted(path.name for path in (text / "features").iterdir()) == ["hidden-train-00000.safetensors",
                                                                         "train-00000.safetensors"]  # fmt: skip
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    text_features = target_features(engine, text, "train", samples_of(read_records(text, "train")))  # read back
    first = len(alone.samples)
    for index in range(len(both.samples)):  # each sample's features, wherever they were computed
        own = alone.features.of(index) if index < first else text_features.of(index - first)
        assert all(torch.equal(a, b) for a, b in zip(both.features.of(index), own, strict=True))
    assert both.summary()["text_tokens"] == 24 and both.summary()["answer_tokens"] == 64
    with pytest.raises(SpecchatError, match="no heldout records"):
        TrainingSet.load(loaded, [text], quiet_stage)


def test_limits_read_each_directorys_first_samples_whose_features_a_whole_run_reuses(loaded, tmp_path):
    answers = _data_dir(tmp_path / "answers", counts=(("train", 40), ("heldout", 4)))
    records = list(read_records(answers, "train"))
    records[1] = {**records[1], "answer_ids": []}  # a record with no answer makes no sample
    (answers / "train-00000.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    first = TrainingSet.load(loaded, answers, quiet_stage, limits={"train": 17, "heldout": 3})
    assert first.samples == samples_of(records)[:17] and first.train_records == records[:18]
    assert first.heldout == samples_of(read_records(answers, "heldout"))[:3]
    chunks = sorted((answers / "features").glob("train-*"))
    assert len(chunks) == 2  # 16 samples, then 1
    whole = TrainingSet.load(loaded, answers, quiet_stage)
    assert len(whole.samples) == 39 and whole.feature_seconds > 0
    assert chunks[0].stat().st_mtime_ns == (answers / "features" / "train-00000.safetensors").stat().st_mtime_ns
    for index in range(17):
        assert all(torch.equal(a, b) for a, b in zip(first.features.of(index), whole.features.of(index), strict=True))
    assert TrainingSet.load(loaded, answers, quiet_stage, limits={"train": 100}).samples == whole.samples
    vocab_size = loaded.model.config.vocab_size  # the draft vocabulary counts every answer, whatever the limits
    assert torch.equal(first.draft_vocab(32, vocab_size), whole.draft_vocab(32, vocab_size))
    assert torch.equal(first.draft_vocab(32, vocab_size), frequent_tokens([r["answer_ids"] for r in records], 32,
                                                                           vocab_size))  # fmt: skip
    assert not torch.equal(first.draft_vocab(32, vocab_size), frequent_tokens(first.answers, 32, vocab_size))
    other = _data_dir(tmp_path / "other", seed=1)  # 8 training samples, 2 held out
    each = TrainingSet.load(loaded, [answers, other], quiet_stage, limits={"train": [0, 3], "heldout": 1})
    assert each.samples == whole.samples + samples_of(read_records(other, "train"))[:3]  # all, then the first 3
    assert each.heldout == whole.heldout[:1] + samples_of(read_records(other, "heldout"))[:1]


def test_train_longspec_writes_a_checkpoint_that_decodes_losslessly(loaded, tmp_path):
    data = _data_dir(tmp_path / "data")
    out = tmp_path / "draft"
    summary = train_longspec(loaded, data, out, TrainRecipe(epochs=1, batch=4), vocab=16384, eval_tokens=8)
    assert summary["steps"] == 2 and summary["trained_vocab"] == 16384
    assert [row["vocab"] for row in summary["vocab_measurements"]] == ["AR", 8192, 16384]
    assert summary["draft_vocab"] in (8192, 16384)
    assert json.loads((out / "training.json").read_text())["draft_vocab"] == summary["draft_vocab"]
    assert (out / "curves.png").stat().st_size > 0

    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    prompt = list(range(30, 60))
    ar = [t for e in engine.generate(prompt, sampling=SamplingConfig(), max_new_tokens=24) for t in e.tokens]
    drafter = build(engine.target, out)
    assert len(drafter.head.draft_vocab) == summary["draft_vocab"]
    engine.set_drafter(drafter, 8)
    assert [t for e in engine.generate(prompt, sampling=SamplingConfig(), max_new_tokens=24) for t in e.tokens] == ar
    with pytest.raises(SpecchatError, match="answers of tiny-llama, not of other"):
        train_longspec(tiny_loaded_named(loaded, "other"), data, tmp_path / "x", TrainRecipe())


def tiny_loaded_named(loaded, name):
    from dataclasses import replace

    return replace(loaded, source=replace(loaded.source, name=name))


def test_train_longspec_rejects_bad_options_in_one_line(tmp_path, monkeypatch, capfd):
    command = ("train", "longspec", "--data", str(tmp_path), "--out", str(tmp_path / "o"))
    # in this process (`specchat_in_process`): each is refused before the target loads
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command), "holds no training data")
    data = _data_dir(tmp_path / "data")
    two = ("train", "longspec", "--data", str(data), "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o"))
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *two), f"{tmp_path / 'none'} holds no training data")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, "--epochs", "0"), "--epochs")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, "--precision", "fp8"), "--precision")
    for flag in ("--max-train-samples", "--max-heldout-samples"):
        assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, flag, "-1"), "must be at least 0")
        twice = (*two, flag, "1", flag, "2", flag, "3")  # once, or once for each of the two directories
        assert_one_line_error(specchat_in_process(monkeypatch, capfd, *twice), f"{flag} is given 3 times")
