"""`specchat train glide`: a one-layer GLIDE draft for a target, from `specchat train data`'s records.

The draft keeps the target's whole vocabulary, its LM head being the target's, so no vocabulary is chosen
afterwards; the loss may still be taken over the most frequent answer tokens. Trained through `pipeline.py`
with `glide.py`'s objective; `<out>` is a checkpoint (`--drafter glide:<out>`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.engine.generate import eos_ids
from specchat.models.glide import GlideConfig, GlideModel, save_glide
from specchat.training.glide import GlideObjective
from specchat.training.pipeline import Trainee, train_drafter
from specchat.training.trainer import TrainRecipe
from specchat.training.training_set import TrainingSet, target_embeddings, target_head
from specchat.training.vocab import frequent_tokens


def train_glide(loaded, data: Path, out: Path, recipe: TrainRecipe, *, vocab: int = 0, **pipeline) -> dict:
    """Train, write the checkpoint and its summary to `out`; returns the summary. `vocab`: the most frequent
    answer tokens the loss is taken over (0: all). `pipeline`: `train_drafter`'s options."""
    model = loaded.model

    def trainee(data_set: TrainingSet) -> Trainee:
        always = sorted(eos_ids(model, loaded.tokenizer))
        loss_vocab = frequent_tokens(data_set.answers, vocab, model.config.vocab_size, always=always)
        torch.manual_seed(recipe.seed)
        draft = GlideModel(GlideConfig.for_target(model.config, num_hidden_layers=1)).to(model.device)
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        head = target_head(model)
        with torch.no_grad():  # a tied target's head is its embedding: one matrix for both (dequantized once)
            draft.lm_head.weight.copy_(head)
            draft.model.embed_tokens.weight.copy_(head if tied else target_embeddings(model))
        return Trainee(
            objective=GlideObjective(draft, loss_vocab, parts(model).rotary),
            save=lambda: save_glide(out, draft, dtype=torch.bfloat16, tied=tied),
            title=f"GLIDE drafter for {loaded.source.name}",
            summary={"loss_vocab": len(loss_vocab), "layers": 1},
        )

    return train_drafter(loaded, data, out, recipe, trainee, **pipeline)
