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

from specchat.engine.generate import Engine, eos_ids
from specchat.errors import SpecchatError
from specchat.models.longspec import LongSpecConfig, LongSpecLayer, save_longspec
from specchat.training.curves import plot_training
from specchat.training.data import read_records
from specchat.training.features import target_features
from specchat.training.longspec import LongSpecObjective
from specchat.training.samples import MAX_SAMPLE_TOKENS, samples_of
from specchat.training.trainer import TrainProgress, TrainRecipe, train
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
    train_records, heldout_records = read_split_records(data, loaded.source.name)
    samples, heldout = samples_of(train_records), samples_of(heldout_records)
    engine = Engine(model, loaded.tokenizer, max_len=MAX_SAMPLE_TOKENS)
    start = time.perf_counter()
    features = target_features(engine, data, "train", samples, stage("target features", sample_tokens(samples)))
    heldout_features = target_features(engine, data, "heldout", heldout, stage("held-out features", sample_tokens(heldout)))
    feature_seconds = time.perf_counter() - start
    del engine

    vocab_size = model.config.vocab_size
    answers = [record["answer_ids"] for record in train_records]
    eos = sorted(eos_ids(model, loaded.tokenizer))
    trained_vocab = frequent_tokens(answers, vocab, vocab_size, always=eos)
    torch.manual_seed(recipe.seed)
    layer = LongSpecLayer(LongSpecConfig.for_target(model.config)).to(model.device)
    objective = LongSpecObjective(layer, target_embeddings(model), target_head(model), trained_vocab,
                                  model.model.rotary_emb, model.config.max_position_embeddings)  # fmt: skip
    reduced = None if len(trained_vocab) == vocab_size else trained_vocab

    def save(draft_vocab=reduced):
        save_longspec(out, layer, draft_vocab, dtype=torch.bfloat16)

    start = time.perf_counter()
    done = train(objective, samples, features, heldout, heldout_features, recipe, out, resume=resume,
                 checkpoint_minutes=checkpoint_minutes, save=save, progress=progress)  # fmt: skip
    train_seconds = time.perf_counter() - start

    sizes = [size for size in VOCAB_SIZES if 0 < size < len(trained_vocab)] + [len(trained_vocab)]
    vocabs = {size: frequent_tokens(answers, size, vocab_size, always=eos) for size in sizes}
    prompts = [r["prompt_ids"] for r in heldout_records if r["turn"] == 0 and r["sampling"] == "greedy"][:eval_prompts]
    layer.eval()
    rows = measure_vocabs(loaded, layer.to(model.dtype), vocabs, prompts, max_new_tokens=eval_tokens,
                          progress=lambda what: stage(f"decoding with {what}", 0))  # fmt: skip
    chosen = best_vocab(rows)
    save(None if chosen >= vocab_size else vocabs[chosen])
    summary = {
        "target": loaded.source.name, "weights": loaded.weights, "dtype": loaded.dtype, "recipe": asdict(recipe),
        "trained_vocab": len(trained_vocab), "draft_vocab": chosen,
        "data": {"dir": str(data), "train_samples": len(samples), "train_tokens": sample_tokens(samples),
                 "answer_tokens": sum(map(len, answers)), "heldout_samples": len(heldout)},
        "seconds": {"features": round(feature_seconds, 1), "training_this_run": round(train_seconds, 1)},
        "steps": done.step, "log": done.log, "vocab_measurements": rows, "eval_prompts": len(prompts),
        "eval_tokens": eval_tokens,
    }  # fmt: skip
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    plot_training(done.log, out / CURVES, title=f"LongSpec drafter for {loaded.source.name}")
    return summary


def read_split_records(data: Path, model_name: str) -> tuple[list[dict], list[dict]]:
    """The train and held-out records of `data`, checked to be answers of `model_name`."""
    recipe = data / "recipe.json"
    if not recipe.is_file():
        raise SpecchatError(f"{data} holds no training data; make it with `specchat train data --out {data}`")
    made_by = json.loads(recipe.read_text())["model"]
    if made_by != model_name:
        raise SpecchatError(f"{data} holds answers of {made_by}, not of {model_name}: a drafter learns its own target")
    train_records, heldout_records = list(read_records(data, "train")), list(read_records(data, "heldout"))
    if not train_records or not heldout_records:
        raise SpecchatError(f"{data} has no {'train' if not train_records else 'held-out'} records yet")
    return train_records, heldout_records


def sample_tokens(samples) -> int:
    """All tokens of `samples`, prompts included."""
    return sum(len(sample) for sample in samples)


def target_embeddings(model) -> torch.Tensor:
    """The target's input embeddings [vocab, hidden] in fp32 (frozen)."""
    embed = model.model.embed_tokens
    return embed(torch.arange(model.config.vocab_size, device=model.device)).float()


def target_head(model) -> torch.Tensor:
    """The target's LM head [vocab, hidden] in fp32 (frozen; quantized heads dequantized)."""
    head = model.lm_head
    return (head.dequantize() if hasattr(head, "dequantize") else head.weight).float()
