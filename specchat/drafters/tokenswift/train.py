"""`specchat train tokenswift`: TokenSwift's multi-token heads for a target, from `specchat train data`'s records.

Trained through `pipeline.py` on the target's last hidden states (`features.target_hidden`, computed once and
kept next to the data) with `tokenswift.py`'s objective. Only the heads train; the LM head they feed is the
target's. TokenSwift's recipe: AdamW with the reference trainer's betas (0.9, 0.999), weight decay 0.1, peak
LR 5e-3, 50 warm-up steps, cosine. `<out>` is a checkpoint (`save_heads`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.drafters.tokenswift.model import TokenSwiftConfig, TokenSwiftHeads, load_heads, save_heads
from specchat.drafters.tokenswift.objective import TokenSwiftObjective
from specchat.engine.generate import eos_ids
from specchat.errors import SpecchatError
from specchat.training.pipeline import Trainee, train_drafter
from specchat.training.trainer import TrainRecipe
from specchat.training.training_set import TrainingSet, target_head

BETAS = (0.9, 0.999)  # the reference trains with the Hugging Face Trainer's AdamW defaults


def train_tokenswift(loaded, data: Path, out: Path, recipe: TrainRecipe, *, vocab: int = 0, root_input: bool = False,
                     chain_input: bool = False, init: Path | None = None, **pipeline) -> dict:  # fmt: skip
    """Train, write the heads and their summary to `out`; returns the summary. `vocab`: the most frequent
    answer tokens the loss is taken over and the heads draft from (0: all). `root_input`: the heads also read
    the root token; `chain_input`: each later head the token the one before it guessed. `init`: start from
    these trained heads (their root input kept, and their draft vocabulary unless `vocab` picks one afresh from
    this data: the heads output hidden states for the target's LM head, so any of its rows can be drafted; blocks
    they lack start as no-ops).
    `pipeline`: `train_drafter`'s options."""
    model = loaded.model
    start = load_heads(init, device=model.device, dtype=torch.float32, target_config=model.config) if init else None

    def trainee(data_set: TrainingSet) -> Trainee:
        torch.manual_seed(recipe.seed)
        config = TokenSwiftConfig.for_target(model.config, root_input=root_input or chain_input,
                                             chain_input=chain_input)
        if start is None or vocab:
            always = sorted(eos_ids(model, loaded.tokenizer))
            loss_vocab = data_set.draft_vocab(vocab, model.config.vocab_size, always=always)
        else:
            loss_vocab = start.draft_vocab if start.draft_vocab is not None else torch.arange(model.config.vocab_size)
        reduced = loss_vocab if len(loss_vocab) < model.config.vocab_size else None  # the heads draft inside it
        if start is None:
            heads = TokenSwiftHeads(config, parts(model).norm.weight.detach().float(), draft_vocab=reduced)
        else:
            config = replace(config, root_input=config.root_input or start.config.root_input)
            heads = TokenSwiftHeads(config, draft_vocab=reduced)
            missing, unexpected = heads.load_state_dict(start.state_dict(), strict=False)
            if unexpected or any(not name.startswith(("chain_inputs.", "root_input.")) for name in missing):
                raise SpecchatError(f"{init}: these heads are not the trained part of the heads asked for")
        heads = heads.to(model.device)
        return Trainee(
            objective=TokenSwiftObjective(heads, target_head(model), loss_vocab, embed=parts(model).embed),
            save=lambda: save_heads(out, heads, dtype=torch.bfloat16),
            title=f"TokenSwift heads for {loaded.source.name}",
            summary={"loss_vocab": len(loss_vocab), "gamma": config.gamma, "root_input": config.root_input,
                     "chain_input": chain_input, "init": str(init) if init else None},  # fmt: skip
            tau_label=f"held-out greedy chain tau (depth {heads.config.gamma})",
        )

    return train_drafter(loaded, data, out, recipe, trainee, hidden=True, **pipeline)
