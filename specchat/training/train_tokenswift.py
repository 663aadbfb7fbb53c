"""`specchat train tokenswift`: TokenSwift's multi-token heads for a target, from `specchat train data`'s records.

Trained through `pipeline.py` on the target's last hidden states (`features.target_hidden`, computed once and
kept next to the data) with `tokenswift.py`'s objective. Only the heads train; the LM head they feed is the
target's. TokenSwift's recipe: AdamW with the reference trainer's betas (0.9, 0.999), weight decay 0.1, peak
LR 5e-3, 50 warm-up steps, cosine. `<out>` is a checkpoint (`save_heads`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.engine.generate import eos_ids
from specchat.models.tokenswift import TokenSwiftConfig, TokenSwiftHeads, save_heads
from specchat.training.pipeline import Trainee, train_drafter
from specchat.training.tokenswift import TokenSwiftObjective
from specchat.training.trainer import TrainRecipe
from specchat.training.training_set import TrainingSet, target_head
from specchat.training.vocab import frequent_tokens

BETAS = (0.9, 0.999)  # the reference trains with the Hugging Face Trainer's AdamW defaults


def train_tokenswift(loaded, data: Path, out: Path, recipe: TrainRecipe, *, vocab: int = 0, root_input: bool = False,
                     **pipeline) -> dict:  # fmt: skip
    """Train, write the heads and their summary to `out`; returns the summary. `vocab`: the most frequent
    answer tokens the loss is taken over and the heads draft from (0: all). `root_input`: the heads also read
    the root token. `pipeline`: `train_drafter`'s options."""
    model = loaded.model

    def trainee(data_set: TrainingSet) -> Trainee:
        always = sorted(eos_ids(model, loaded.tokenizer))
        loss_vocab = frequent_tokens(data_set.answers, vocab, model.config.vocab_size, always=always)
        torch.manual_seed(recipe.seed)
        reduced = loss_vocab if len(loss_vocab) < model.config.vocab_size else None  # the heads draft inside it
        config = TokenSwiftConfig.for_target(model.config, root_input=root_input)
        heads = TokenSwiftHeads(config, parts(model).norm.weight.detach().float(), draft_vocab=reduced)
        heads = heads.to(model.device)
        return Trainee(
            objective=TokenSwiftObjective(heads, target_head(model), loss_vocab, embed=parts(model).embed),
            save=lambda: save_heads(out, heads, dtype=torch.bfloat16),
            title=f"TokenSwift heads for {loaded.source.name}",
            summary={"loss_vocab": len(loss_vocab), "gamma": config.gamma, "root_input": root_input},
            tau_label=f"held-out greedy chain tau (depth {heads.config.gamma})",
        )

    return train_drafter(loaded, data, out, recipe, trainee, hidden=True, **pipeline)
