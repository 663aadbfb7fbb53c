"""`specchat train glide`: a one-layer GLIDE draft for a target, from `specchat train data`'s records.

The draft shares the target's embedding and LM head; with `vocab` it predicts over the most frequent answer
tokens only (its draft vocabulary: those rows of the head, as LongSpec's), which is most of a draft step's
cost on a CPU otherwise. Trained through `pipeline.py` with `glide.py`'s objective; `<out>` is a checkpoint
(`--drafter glide:<out>`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.drafters.glide.model import GlideConfig, GlideModel, save_glide
from specchat.drafters.glide.objective import GlideObjective
from specchat.engine.generate import eos_ids
from specchat.training.pipeline import Trainee, train_drafter
from specchat.training.trainer import TrainRecipe
from specchat.training.training_set import TrainingSet, target_embeddings, target_head


def train_glide(loaded, data: Path | list[Path], out: Path, recipe: TrainRecipe, *, vocab: int = 0,
                intermediate: int = 0, **pipeline) -> dict:  # fmt: skip
    """Train, write the checkpoint and its summary to `out`; returns the summary. `vocab`: the draft
    vocabulary, the most frequent answer tokens (0: all); `intermediate`: the draft MLP's width (0: the
    target's). `pipeline`: `train_drafter`'s options."""
    model = loaded.model
    vocab_size = model.config.vocab_size

    def trainee(data_set: TrainingSet) -> Trainee:
        always = sorted(eos_ids(model, loaded.tokenizer))
        draft_vocab = data_set.draft_vocab(vocab, vocab_size, always=always)
        torch.manual_seed(recipe.seed)
        width = {"intermediate_size": intermediate} if intermediate else {}
        config = GlideConfig.for_target(model.config, num_hidden_layers=1, shared_vocab=True, **width)
        draft = GlideModel(config).to(model.device)
        reduced = None if len(draft_vocab) == vocab_size else draft_vocab
        return Trainee(
            objective=GlideObjective(draft, target_embeddings(model), target_head(model), draft_vocab,
                                     parts(model).last_rotary),  # fmt: skip
            save=lambda: save_glide(out, draft, dtype=torch.bfloat16, draft_vocab=reduced),
            title=f"GLIDE drafter for {loaded.source.name}",
            summary={"draft_vocab": len(draft_vocab), "layers": 1, "intermediate_size": config.intermediate_size},
        )

    return train_drafter(loaded, data, out, recipe, trainee, **pipeline)
