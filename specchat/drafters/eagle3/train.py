"""`specchat train eagle3`: an EAGLE-3 draft for a target, from `specchat train data`'s records.

Trained through `pipeline.py` on the target's states entering its low, middle and high layers (EAGLE-3's
2, L/2, L - 3: `features.target_layer_states`, computed once and kept next to the data) with training-time test
(`objective.py`). The draft's LM head covers the most frequent answer tokens (`vocab`, EOS always in) and starts
as those rows of the target's head, its final norm as the target's: the draft's output then needs only to
approach the target's last state. fc starts by passing the high layer's state through, the rest at random
(N(0, 0.02), o and down zero: the layer starts as that pass-through). `<out>` is a checkpoint in the released
layout (`--drafter eagle3:<out>`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specchat.architectures import parts
from specchat.drafters.eagle3.model import Eagle3Config, Eagle3Draft, save_eagle3
from specchat.drafters.eagle3.objective import STEPS, Eagle3Objective
from specchat.engine.generate import eos_ids
from specchat.training.pipeline import Trainee, train_drafter
from specchat.training.trainer import TrainRecipe
from specchat.training.training_set import TrainingSet, target_head


def train_eagle3(loaded, data: Path | list[Path], out: Path, recipe: TrainRecipe, *, vocab: int = 8192,
                 intermediate: int = 2048, steps: int = STEPS, **pipeline) -> dict:  # fmt: skip
    """Train, write the checkpoint and its summary to `out`; returns the summary. `vocab`: the draft vocabulary
    (0: all); `intermediate`: the MLP's width; `steps`: training-time test's unrolled steps. `pipeline`:
    `train_drafter`'s options."""
    model = loaded.model
    config = model.config

    def trainee(data_set: TrainingSet) -> Trainee:
        always = sorted(eos_ids(model, loaded.tokenizer))
        draft_vocab = data_set.draft_vocab(vocab, config.vocab_size, always=always)
        torch.manual_seed(recipe.seed)
        draft = initial_draft(Eagle3Config.for_target(config, intermediate=intermediate,
                                                      draft_vocab_size=len(draft_vocab)),
                              model, draft_vocab)  # fmt: skip
        return Trainee(
            objective=Eagle3Objective(draft, parts(model).embed, steps),
            save=lambda: save_eagle3(out, draft, dtype=torch.bfloat16),
            title=f"EAGLE-3 drafter for {loaded.source.name}",
            summary={"draft_vocab": len(draft_vocab), "intermediate_size": intermediate, "ttt_steps": steps,
                     "feature_layers": list(draft.config.feature_layers)},  # fmt: skip
            tau_label=f"held-out greedy chain tau (depth {steps})",
        )

    layers = Eagle3Config.for_target(config, intermediate=1, draft_vocab_size=1).feature_layers
    return train_drafter(loaded, data, out, recipe, trainee, layers=layers, **pipeline)


def initial_draft(config: Eagle3Config, model, draft_vocab: torch.Tensor) -> Eagle3Draft:
    """The draft before training, in fp32 on the target's device (see the module's docstring)."""
    draft = Eagle3Draft(config)
    for module in draft.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
    layer, width = draft.midlayer, config.hidden_size
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.weight[:, 2 * width :] = torch.eye(width)
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        draft.lm_head.weight.copy_(target_head(model)[draft_vocab])
        draft.norm.weight.copy_(parts(model).norm.weight.float())
        draft.set_vocab(draft_vocab)
    return draft.to(model.device)
