"""`specchat train model-drafter`: a standalone draft model for a target, from `specchat train data`'s records.

The student (`models/draft_model.student_from_target`) starts as the target's first `layers` decoder layers
and its final norm over the target's own embedding and LM head: the same tokenizer by construction, a start
that already guesses like a shallow target, and nothing large to store (the default model's embedding is
57 MB in bf16, four times two of its layers). The embedding and head are shared and frozen; the layers and
the norm train, in fp32 under the recipe's autocast. The stages of the other drafters' pipelines: the
target's features (only their greedy labels are read), then the shared loop with `model_drafter.py`'s
objective. `<out>` is a checkpoint (`save_student`, bf16; `load_draft_model` reads it) from the first state
checkpoint on, with `training.json` and `curves.png` beside it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from torch import nn

from specchat.architectures import parts
from specchat.engine.generate import eos_ids
from specchat.errors import SpecchatError
from specchat.models.checkpoint import WEIGHTS
from specchat.models.draft_model import save_student, student_from_target
from specchat.training.curves import plot_training
from specchat.training.model_drafter import ModelDrafterObjective
from specchat.training.train_longspec import CURVES, SUMMARY
from specchat.training.trainer import TrainProgress, TrainRecipe, train
from specchat.training.training_set import TrainingSet
from specchat.training.vocab import frequent_tokens

DENSE = ("float32", "bfloat16", "float16")  # weight formats a student can start from


def train_model_drafter(loaded, data: Path, out: Path, recipe: TrainRecipe, *, layers: int = 2, vocab: int = 0,
                        resume: bool = False, checkpoint_minutes: float = 5.0,
                        stage: Callable[[str, int], Callable[[int], None]] = lambda _name, _total: lambda _n: None,
                        progress: Callable[[TrainProgress], None] = lambda _p: None) -> dict:  # fmt: skip
    """Train, write the student and its summary to `out`; returns the summary. `layers`: the target's first
    layers the student starts as; `vocab`: the draft vocabulary, the most frequent answer tokens (0: all).
    `stage` and `progress` as `train_longspec`'s."""
    model = loaded.model
    if loaded.weights not in DENSE:
        raise SpecchatError(
            f"a student starts as the target's dense weights, not {loaded.weights}: load it with --dtype float32"
        )
    student = trainable_student(model, layers)
    data_set = TrainingSet.load(loaded, data, stage)
    vocab_size = model.config.vocab_size
    eos = sorted(eos_ids(model, loaded.tokenizer))
    draft_vocab = frequent_tokens(data_set.answers, vocab, vocab_size, always=eos)
    objective = ModelDrafterObjective(student, draft_vocab)
    reduced = None if len(draft_vocab) == vocab_size else draft_vocab

    def save():
        save_student(out, student, target=loaded.source.name, draft_vocab=reduced)

    start = time.perf_counter()
    done = train(objective, data_set.samples, data_set.features, data_set.heldout, data_set.heldout_features, recipe,
                 out, resume=resume, checkpoint_minutes=checkpoint_minutes, save=save, progress=progress)  # fmt: skip
    summary = {
        "target": loaded.source.name, "weights": loaded.weights, "dtype": loaded.dtype, "recipe": asdict(recipe),
        "layers": layers, "draft_vocab": len(draft_vocab), "checkpoint_bytes": (out / WEIGHTS).stat().st_size,
        "data": data_set.summary(data),
        "seconds": {"features": round(data_set.feature_seconds, 1),
                    "training_this_run": round(time.perf_counter() - start, 1)},
        "steps": done.step, "log": done.log,
    }  # fmt: skip
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    plot_training(done.log, out / CURVES, title=f"{layers}-layer draft model for {loaded.source.name}")
    return summary


def trainable_student(target: nn.Module, layers: int) -> nn.Module:
    """The student of the target's first `layers` layers, its own modules trainable in fp32 (AdamW's master
    weights, whatever the target's dtype) and the shared embedding and head frozen."""
    depth = target.config.num_hidden_layers
    if not 1 <= layers <= depth:
        raise SpecchatError(f"--layers must be between 1 and the target's {depth} layers, not {layers}")
    student = student_from_target(target, layers)
    decoder = parts(student)
    decoder.embed.requires_grad_(False)
    decoder.head.requires_grad_(False)
    for own in (decoder.layer_modules, decoder.norm):
        own.float().requires_grad_(True)
    return student
