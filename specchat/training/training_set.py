"""What every drafter trains on: a data directory's records for one target, as samples, with the target's
features of each (computed where not on disk yet), and the frozen target tensors a draft borrows."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.engine.generate import Engine
from specchat.errors import SpecchatError
from specchat.quant.quantized_linear import dense_weight
from specchat.training.data import read_records
from specchat.training.features import Features, HiddenFeatures, target_features, target_hidden
from specchat.training.samples import MAX_SAMPLE_TOKENS, Sample, samples_of


@dataclass
class TrainingSet:
    train_records: list[dict]
    samples: list[Sample]
    features: Features | HiddenFeatures
    heldout_records: list[dict]
    heldout: list[Sample]
    heldout_features: Features | HiddenFeatures
    feature_seconds: float  # computing the features that were not on disk

    @classmethod
    def load(cls, loaded, data: Path, stage: Callable[[str, int], Callable[[int], None]], *,
             hidden: bool = False) -> TrainingSet:  # fmt: skip
        """The records of `data`, checked to be answers of `loaded`'s model, and their features (`hidden`: the
        target's last hidden states instead); `stage(name, total)` announces the features stages and returns
        their progress callbacks."""
        train_records, heldout_records = read_split_records(data, loaded.source.name)
        samples, heldout = samples_of(train_records), samples_of(heldout_records)
        engine = Engine(loaded.model, loaded.tokenizer, max_len=MAX_SAMPLE_TOKENS)
        compute, what = (target_hidden, "hidden states") if hidden else (target_features, "features")
        start = time.perf_counter()
        features = compute(engine, data, "train", samples, stage(f"target {what}", sample_tokens(samples)))
        heldout_features = compute(engine, data, "heldout", heldout, stage(f"held-out {what}", sample_tokens(heldout)))
        return cls(train_records, samples, features, heldout_records, heldout, heldout_features,
                   time.perf_counter() - start)  # fmt: skip

    @property
    def answers(self) -> list[list[int]]:
        return [record["answer_ids"] for record in self.train_records]

    def summary(self, data: Path) -> dict:
        return {"dir": str(data), "train_samples": len(self.samples), "train_tokens": sample_tokens(self.samples),
                "answer_tokens": sum(map(len, self.answers)), "heldout_samples": len(self.heldout)}  # fmt: skip


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
    embed = parts(model).embed
    return embed(torch.arange(model.config.vocab_size, device=model.device)).float()


def target_head(model) -> torch.Tensor:
    """The target's LM head [vocab, hidden] in fp32 (frozen; quantized heads dequantized)."""
    return dense_weight(parts(model).head).float()
