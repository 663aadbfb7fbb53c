"""`specchat train longspec`: a LongSpec draft layer for a target, from `specchat train data`'s records.

Trained through `pipeline.py` with `longspec.py`'s objective; then the draft vocabulary is chosen by measured
decoding speed (`vocab_choice.py`) and the checkpoint rewritten with it. `<out>` is a checkpoint
(`--drafter longspec:<out>`); `training.json` also holds the vocabulary measurements.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.drafters.longspec.model import LongSpecConfig, LongSpecLayer, save_longspec
from specchat.drafters.longspec.objective import LongSpecObjective
from specchat.engine.generate import eos_ids
from specchat.training.pipeline import Trainee, quiet_stage, train_drafter
from specchat.training.trainer import TrainRecipe
from specchat.training.training_set import TrainingSet, target_embeddings, target_head
from specchat.training.vocab_choice import VOCAB_SIZES, best_vocab, measure_vocabs


def train_longspec(loaded, data: Path | list[Path], out: Path, recipe: TrainRecipe, *, vocab: int = 0,
                   intermediate: int = 0, eval_prompts: int = 16, eval_tokens: int = 128, stage=quiet_stage,
                   **pipeline) -> dict:  # fmt: skip
    """Train, choose the draft vocabulary, write the checkpoint and its summary to `out`; returns the summary.

    `vocab` is the vocabulary trained over (0: the target's whole one; the shipped one is chosen among the
    sizes up to it, decoding `eval_prompts` held-out prompts for `eval_tokens` tokens with each).
    `intermediate` is the draft MLP's width (0: the target's, as LongSpec's layer has): a narrower one trains
    and drafts faster on a CPU, and keeps a 1.5B target's draft under 40 MB in bf16.
    `stage` and `pipeline`: `train_drafter`'s options.
    """
    model = loaded.model
    vocab_size = model.config.vocab_size
    eos = sorted(eos_ids(model, loaded.tokenizer))

    def trainee(data_set: TrainingSet) -> Trainee:
        trained_vocab = data_set.draft_vocab(vocab, vocab_size, always=eos)
        torch.manual_seed(recipe.seed)
        layer = LongSpecLayer(LongSpecConfig.for_target(model.config, intermediate=intermediate)).to(model.device)
        reduced = None if len(trained_vocab) == vocab_size else trained_vocab
        objective = LongSpecObjective(layer, target_embeddings(model), target_head(model), trained_vocab,
                                      parts(model).last_rotary, model.config.max_position_embeddings)  # fmt: skip

        def choose_vocab() -> dict:
            sizes = [size for size in VOCAB_SIZES if 0 < size < len(trained_vocab)] + [len(trained_vocab)]
            vocabs = {size: data_set.draft_vocab(size, vocab_size, always=eos) for size in sizes}
            prompts = [r["prompt_ids"] for r in data_set.heldout_records
                       if r["turn"] == 0 and r["sampling"] == "greedy"][:eval_prompts]  # fmt: skip
            layer.eval()
            rows = measure_vocabs(loaded, layer.to(model.dtype), vocabs, prompts, max_new_tokens=eval_tokens,
                                  progress=lambda what: stage(f"decoding with {what}", 0))  # fmt: skip
            chosen = best_vocab(rows)
            save_longspec(out, layer, None if chosen >= vocab_size else vocabs[chosen], dtype=torch.bfloat16)
            return {"draft_vocab": chosen, "vocab_measurements": rows, "eval_prompts": len(prompts),
                    "eval_tokens": eval_tokens}  # fmt: skip

        return Trainee(
            objective=objective,
            save=lambda: save_longspec(out, layer, reduced, dtype=torch.bfloat16),  # the vocabulary trained over
            title=f"LongSpec drafter for {loaded.source.name}",
            summary={"trained_vocab": len(trained_vocab), "intermediate_size": layer.config.intermediate_size},
            finish=choose_vocab,
        )

    return train_drafter(loaded, data, out, recipe, trainee, stage=stage, **pipeline)
