"""`specchat train tokenswift`: TokenSwift's multi-token heads for a target, from `specchat train data`'s records.

The stages of the other drafters' pipelines, with the target's last hidden states as the features
(`features.target_hidden`, computed once and kept next to the data) and `tokenswift.py`'s objective on the
shared loop. Only the heads train; the LM head they feed is the target's. TokenSwift's recipe: AdamW with
the reference trainer's betas (0.9, 0.999), weight decay 0.1, peak LR 5e-3, 50 warm-up steps, cosine.
`<out>` is a checkpoint (`save_heads`) from the first state checkpoint on, with `training.json` and
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
from specchat.engine.generate import Engine, eos_ids
from specchat.models.tokenswift import TokenSwiftConfig, TokenSwiftHeads, save_heads
from specchat.training.curves import plot_training
from specchat.training.features import target_hidden
from specchat.training.samples import MAX_SAMPLE_TOKENS, samples_of
from specchat.training.tokenswift import TokenSwiftObjective
from specchat.training.train_longspec import CURVES, SUMMARY
from specchat.training.trainer import TrainProgress, TrainRecipe, train
from specchat.training.training_set import read_split_records, sample_tokens, target_head
from specchat.training.vocab import frequent_tokens

BETAS = (0.9, 0.999)  # the reference trains with the Hugging Face Trainer's AdamW defaults


def train_tokenswift(loaded, data: Path, out: Path, recipe: TrainRecipe, *, vocab: int = 0, resume: bool = False,
                     checkpoint_minutes: float = 5.0,
                     stage: Callable[[str, int], Callable[[int], None]] = lambda _name, _total: lambda _n: None,
                     progress: Callable[[TrainProgress], None] = lambda _p: None) -> dict:  # fmt: skip
    """Train, write the heads and their summary to `out`; returns the summary. `vocab`: the most frequent
    answer tokens the loss is taken over (0: all). `stage` and `progress` as `train_longspec`'s."""
    model = loaded.model
    train_records, heldout_records = read_split_records(data, loaded.source.name)
    samples, heldout = samples_of(train_records), samples_of(heldout_records)
    engine = Engine(model, loaded.tokenizer, max_len=MAX_SAMPLE_TOKENS)
    start = time.perf_counter()
    features = target_hidden(engine, data, "train", samples, stage("target hidden states", sample_tokens(samples)))
    heldout_features = target_hidden(engine, data, "heldout", heldout,
                                     stage("held-out hidden states", sample_tokens(heldout)))  # fmt: skip
    feature_seconds = time.perf_counter() - start
    answers = [record["answer_ids"] for record in train_records]
    eos = sorted(eos_ids(model, loaded.tokenizer))
    loss_vocab = frequent_tokens(answers, vocab, model.config.vocab_size, always=eos)
    torch.manual_seed(recipe.seed)
    heads = TokenSwiftHeads(TokenSwiftConfig.for_target(model.config), parts(model).norm.weight.detach().float())
    heads = heads.to(model.device)
    objective = TokenSwiftObjective(heads, target_head(model), loss_vocab)

    def save():
        save_heads(out, heads, dtype=torch.bfloat16)

    start = time.perf_counter()
    done = train(objective, samples, features, heldout, heldout_features, recipe, out, resume=resume,
                 checkpoint_minutes=checkpoint_minutes, save=save, progress=progress)  # fmt: skip
    summary = {
        "target": loaded.source.name, "weights": loaded.weights, "dtype": loaded.dtype, "recipe": asdict(recipe),
        "loss_vocab": len(loss_vocab), "gamma": heads.config.gamma,
        "data": {"dir": str(data), "train_samples": len(samples), "train_tokens": sample_tokens(samples),
                 "answer_tokens": sum(map(len, answers)), "heldout_samples": len(heldout)},
        "seconds": {"features": round(feature_seconds, 1), "training_this_run": round(time.perf_counter() - start, 1)},
        "steps": done.step, "log": done.log,
    }  # fmt: skip
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    plot_training(done.log, out / CURVES, title=f"TokenSwift heads for {loaded.source.name}",
                  tau_label=f"held-out greedy chain tau (depth {heads.config.gamma})")  # fmt: skip
    return summary
