"""`specchat train model-drafter`: a standalone draft model for a target, from `specchat train data`'s records.

The student (`models/draft_model.student_from_target`) starts as the target's first `layers` decoder layers
and its final norm over the target's own embedding and LM head: the same tokenizer by construction, a start
that already guesses like a shallow target, and nothing large to store (the default model's embedding is
57 MB in bf16, four times two of its layers). The embedding and head are shared and frozen; the layers and
the norm train, in fp32 under the recipe's autocast. Trained through `pipeline.py` on the target's features
(only their greedy labels are read) with `model_drafter.py`'s objective. `<out>` is a checkpoint
(`save_student`, bf16; `load_draft_model` reads it).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from specchat.architectures import parts
from specchat.drafters.checkpoint import WEIGHTS
from specchat.drafters.model.model import save_student, student_from_target
from specchat.drafters.model.objective import ModelDrafterObjective
from specchat.engine.generate import eos_ids
from specchat.errors import SpecchatError
from specchat.training.pipeline import Trainee, train_drafter
from specchat.training.trainer import TrainRecipe
from specchat.training.training_set import TrainingSet

DENSE = ("float32", "bfloat16", "float16")  # weight formats a student can start from


def train_model_drafter(loaded, data: Path, out: Path, recipe: TrainRecipe, *, layers: int = 2, vocab: int = 0,
                        **pipeline) -> dict:  # fmt: skip
    """Train, write the student and its summary to `out`; returns the summary. `layers`: the target's first
    layers the student starts as; `vocab`: the draft vocabulary, the most frequent answer tokens (0: all).
    `pipeline`: `train_drafter`'s options."""
    model = loaded.model
    if loaded.weights not in DENSE:
        raise SpecchatError(
            f"a student starts as the target's dense weights, not {loaded.weights}: load it with --dtype float32"
        )
    student = trainable_student(model, layers)  # refused here, before any feature is computed

    def trainee(data_set: TrainingSet) -> Trainee:
        vocab_size = model.config.vocab_size
        always = sorted(eos_ids(model, loaded.tokenizer))
        draft_vocab = data_set.draft_vocab(vocab, vocab_size, always=always)
        reduced = None if len(draft_vocab) == vocab_size else draft_vocab
        return Trainee(
            objective=ModelDrafterObjective(student, draft_vocab),
            save=lambda: save_student(out, student, target=loaded.source.name, draft_vocab=reduced),
            title=f"{layers}-layer draft model for {loaded.source.name}",
            summary={"layers": layers, "draft_vocab": len(draft_vocab)},
            finish=lambda: {"checkpoint_bytes": (out / WEIGHTS).stat().st_size},
        )

    return train_drafter(loaded, data, out, recipe, trainee, **pipeline)


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
