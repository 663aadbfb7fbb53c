"""`specchat train longspec`: a LongSpec draft layer for a target, from `specchat train data`'s records.

The stages, each resumable: the target's features of every sample (`features.py`), the training loop
(`trainer.py` with `longspec.py`'s objective), then the draft vocabulary chosen by measured decoding speed
(`vocab_choice.py`). `<out>` is a checkpoint from the first state checkpoint on (`--drafter longspec:<out>`),
with `training.json` (recipe, data, times, the evaluation log and the vocabulary measurements) and
`curves.png` beside it.
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
from specchat.models.longspec import LongSpecConfig, LongSpecLayer, save_longspec
from specchat.training.curves import plot_training
from specchat.training.longspec import LongSpecObjective
from specchat.training.trainer import TrainProgress, TrainRecipe, train
from specchat.training.training_set import TrainingSet, target_embeddings, target_head
from specchat.training.vocab import frequent_tokens
from specchat.training.vocab_choice import VOCAB_SIZES, best_vocab, measure_vocabs

SUMMARY = "training.json"
CURVES = "curves.png"


def train_longspec(loaded, data: Path, out: Path, recipe: TrainRecipe, *, vocab: int = 0, resume: bool = False,
                   checkpoint_minutes: float = 5.0, eval_prompts: int = 16, eval_tokens: int = 128,
                   stage: Callable[[str, int], Callable[[int], None]] = lambda _name, _total: lambda _n: None,
                   progress: Callable[[TrainProgress], None] = lambda _p: None) -> dict:  # fmt: skip
    """Train, choose the draft vocabulary, write the checkpoint and its summary to `out`; returns the summary.

    `vocab` is the vocabulary trained over (0: the target's whole one; the shipped one is chosen among the
    sizes up to it). `stage(name, total)` announces a stage and returns its progress callback.
    """
    model = loaded.model
    data_set = TrainingSet.load(loaded, data, stage)

    vocab_size = model.config.vocab_size
    answers = data_set.answers
    eos = sorted(eos_ids(model, loaded.tokenizer))
    trained_vocab = frequent_tokens(answers, vocab, vocab_size, always=eos)
    torch.manual_seed(recipe.seed)
    layer = LongSpecLayer(LongSpecConfig.for_target(model.config)).to(model.device)
    objective = LongSpecObjective(layer, target_embeddings(model), target_head(model), trained_vocab,
                                  parts(model).rotary, model.config.max_position_embeddings)  # fmt: skip
    reduced = None if len(trained_vocab) == vocab_size else trained_vocab

    def save(draft_vocab=reduced):
        save_longspec(out, layer, draft_vocab, dtype=torch.bfloat16)

    start = time.perf_counter()
    done = train(objective, data_set.samples, data_set.features, data_set.heldout, data_set.heldout_features, recipe, out,
                 resume=resume,
                 checkpoint_minutes=checkpoint_minutes, save=save, progress=progress)  # fmt: skip
    train_seconds = time.perf_counter() - start

    sizes = [size for size in VOCAB_SIZES if 0 < size < len(trained_vocab)] + [len(trained_vocab)]
    vocabs = {size: frequent_tokens(answers, size, vocab_size, always=eos) for size in sizes}
    prompts = [r["prompt_ids"] for r in data_set.heldout_records if r["turn"] == 0 and r["sampling"] == "greedy"][:eval_prompts]
    layer.eval()
    rows = measure_vocabs(loaded, layer.to(model.dtype), vocabs, prompts, max_new_tokens=eval_tokens,
                          progress=lambda what: stage(f"decoding with {what}", 0))  # fmt: skip
    chosen = best_vocab(rows)
    save(None if chosen >= vocab_size else vocabs[chosen])
    summary = {
        "target": loaded.source.name, "weights": loaded.weights, "dtype": loaded.dtype, "recipe": asdict(recipe),
        "trained_vocab": len(trained_vocab), "draft_vocab": chosen,
        "data": data_set.summary(data),
        "seconds": {"features": round(data_set.feature_seconds, 1), "training_this_run": round(train_seconds, 1)},
        "steps": done.step, "log": done.log, "vocab_measurements": rows, "eval_prompts": len(prompts),
        "eval_tokens": eval_tokens,
    }  # fmt: skip
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    plot_training(done.log, out / CURVES, title=f"LongSpec drafter for {loaded.source.name}")
    return summary

