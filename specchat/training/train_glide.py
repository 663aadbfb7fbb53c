"""`specchat train glide`: a one-layer GLIDE draft for a target, from `specchat train data`'s records.

The stages of `train_longspec` (the target's features, then the shared loop, here with `glide.py`'s
objective). The draft keeps the target's whole vocabulary, its LM head being the target's, so no vocabulary
is chosen afterwards. `<out>` is a checkpoint (`--drafter glide:<out>`) from the first state checkpoint on,
with `training.json` and `curves.png` beside it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.engine.generate import eos_ids
from specchat.models.glide import GlideConfig, GlideModel, save_glide
from specchat.training.curves import plot_training
from specchat.training.glide import GlideObjective
from specchat.training.train_longspec import CURVES, SUMMARY
from specchat.training.trainer import TrainProgress, TrainRecipe, train
from specchat.training.training_set import TrainingSet, target_embeddings, target_head
from specchat.training.vocab import frequent_tokens


def train_glide(loaded, data: Path, out: Path, recipe: TrainRecipe, *, vocab: int = 0, resume: bool = False,
                checkpoint_minutes: float = 5.0,
                stage: Callable[[str, int], Callable[[int], None]] = lambda _name, _total: lambda _n: None,
                progress: Callable[[TrainProgress], None] = lambda _p: None) -> dict:  # fmt: skip
    """Train, write the checkpoint and its summary to `out`; returns the summary. `vocab`: the most frequent
    answer tokens the loss is taken over (0: all). `stage` and `progress` as `train_longspec`'s."""
    model = loaded.model
    data_set = TrainingSet.load(loaded, data, stage)
    loss_vocab = frequent_tokens(data_set.answers, vocab, model.config.vocab_size, always=sorted(eos_ids(model, loaded.tokenizer)))
    torch.manual_seed(recipe.seed)
    draft = GlideModel(GlideConfig.for_target(model.config, num_hidden_layers=1)).to(model.device)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    head = target_head(model)
    with torch.no_grad():  # a tied target's head is its embedding: one matrix for both (dequantized once)
        draft.lm_head.weight.copy_(head)
        draft.model.embed_tokens.weight.copy_(head if tied else target_embeddings(model))
    objective = GlideObjective(draft, loss_vocab, parts(model).rotary)

    def save():
        save_glide(out, draft, dtype=torch.bfloat16, tied=tied)

    start = time.perf_counter()
    done = train(objective, data_set.samples, data_set.features, data_set.heldout, data_set.heldout_features, recipe, out,
                 resume=resume,
                 checkpoint_minutes=checkpoint_minutes, save=save, progress=progress)  # fmt: skip
    summary = {
        "target": loaded.source.name, "weights": loaded.weights, "dtype": loaded.dtype, "recipe": asdict(recipe),
        "loss_vocab": len(loss_vocab), "layers": 1,
        "data": data_set.summary(data),
        "seconds": {"features": round(data_set.feature_seconds, 1), "training_this_run": round(time.perf_counter() - start, 1)},
        "steps": done.step, "log": done.log,
    }  # fmt: skip
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    plot_training(done.log, out / CURVES, title=f"GLIDE drafter for {loaded.source.name}")
    return summary
