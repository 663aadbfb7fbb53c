"""What every drafter trains on: the records of one or more data directories for one target (its answers,
text it labels), as samples, with the target's features of each (computed where not on disk yet), and the
frozen target tensors a draft borrows."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.engine.generate import Engine
from specchat.errors import SpecchatError
from specchat.quant.quantized_linear import dense_weight
from specchat.training.data import SPLITS, read_records
from specchat.training.features import (
    Features,
    HiddenFeatures,
    LayerFeatures,
    concat,
    target_features,
    target_hidden,
    target_layer_states,
)  # fmt: skip
from specchat.training.samples import MAX_SAMPLE_TOKENS, Sample, samples_of
from specchat.training.vocab import frequent_tokens


@dataclass
class TrainingSet:
    train_records: list[dict]
    samples: list[Sample]
    features: Features | HiddenFeatures | LayerFeatures
    heldout_records: list[dict]
    heldout: list[Sample]
    heldout_features: Features | HiddenFeatures | LayerFeatures
    feature_seconds: float  # computing the features that were not on disk
    dirs: list[Path]  # the data directories, in the order their samples are
    every_answer: list[list[int]]  # of every training record of `dirs`, whatever `limits` read

    def draft_vocab(self, size: int, vocab_size: int, always: Sequence[int] = ()) -> torch.Tensor:
        """The `size` most frequent tokens (`always` among them) of every training answer of the directories, not
        only of the samples `limits` let train: counting is cheap, the estimate better, and a quick run drafts in
        the vocabulary of the longer run on the same data. 0: the whole vocabulary."""
        return frequent_tokens(self.every_answer, size, vocab_size, always=always)

    @classmethod
    def load(cls, loaded, data: Path | Sequence[Path], stage: Callable[[str, int], Callable[[int], None]], *,
             hidden: bool = False, layers: tuple[int, ...] = (),
             limits: dict[str, int | Sequence[int]] | None = None) -> TrainingSet:  # fmt: skip
        """The records of the data directories `data`, each checked to hold answers or labels of `loaded`'s
        model, and their features (`hidden`: the target's last hidden states instead; `layers`: the states entering
        those target layers), each directory's kept in it; `limits`: at most this many samples of a split from each
        directory, or from each in turn (a sequence), its first (a quicker run, whose features a longer one
        reuses); `stage(name, total)` announces the features stages and returns their progress callbacks."""
        dirs = [data] if isinstance(data, Path) else list(data)
        every = {folder: read_split_records(folder, loaded.source.name) for folder in dirs}
        records = {folder: {split: _first_samples(held, _limit(limits, split, index))
                            for split, held in zip(SPLITS, every[folder], strict=True)}
                   for index, folder in enumerate(dirs)}  # fmt: skip
        for split in SPLITS:
            if not any(samples_of(held[split]) for held in records.values()):
                raise SpecchatError(f"{', '.join(map(str, dirs))}: no {split} records yet")
        engine = Engine(loaded.model, loaded.tokenizer, max_len=MAX_SAMPLE_TOKENS)
        compute, what = (target_hidden, "hidden states") if hidden else (target_features, "features")
        if layers:
            compute, what = partial(target_layer_states, layers=layers), f"states of layers {list(layers)}"
        start = time.perf_counter()
        parts = {split: ([], [], []) for split in SPLITS}  # records, samples, features
        for folder, split in itertools.product(dirs, SPLITS):
            samples = samples_of(records[folder][split])
            name = ("held-out " if split == "heldout" else "") + what + (f" ({folder})" if len(dirs) > 1 else "")
            features = compute(engine, folder, split, samples, stage(f"target {name}", sample_tokens(samples)))
            for held, part in zip(parts[split], (records[folder][split], samples, [features]), strict=True):
                held.extend(part)
        (train_records, samples, train_features), (heldout_records, heldout, heldout_features) = parts.values()
        return cls(train_records, samples, concat(train_features), heldout_records, heldout, concat(heldout_features),
                   time.perf_counter() - start, dirs, [r["answer_ids"] for train, _ in every.values() for r in train])

    @property
    def answers(self) -> list[list[int]]:
        """Every training record's answer: the target's own, or text it labelled."""
        return [record["answer_ids"] for record in self.train_records]

    def summary(self) -> dict:
        text = sum(len(r["answer_ids"]) for r in self.train_records if r["sampling"] == "text")
        return {"dirs": [str(folder) for folder in self.dirs], "train_samples": len(self.samples),
                "train_tokens": sample_tokens(self.samples), "answer_tokens": sum(map(len, self.answers)) - text,
                "text_tokens": text, "heldout_samples": len(self.heldout)}  # fmt: skip


def _limit(limits: dict[str, int | Sequence[int]] | None, split: str, index: int) -> int:
    """The most samples of `split` to read from the `index`-th directory (0: all)."""
    count = (limits or {}).get(split, 0)
    return count if isinstance(count, int) else count[index]


def _first_samples(records: list[dict], count: int) -> list[dict]:
    """`records` up to the one that makes `count` samples (0: all of them)."""
    if count <= 0:
        return records
    with_answers = [i for i, record in enumerate(records) if record["answer_ids"]]
    return records if len(with_answers) <= count else records[: with_answers[count - 1] + 1]


def read_split_records(data: Path, model_name: str) -> tuple[list[dict], list[dict]]:
    """The train and held-out records of `data`, checked to be answers (or labels) of `model_name`."""
    recipe = data / "recipe.json"
    if not recipe.is_file():
        raise SpecchatError(f"{data} holds no training data; make it with `specchat train data --out {data}`")
    made_by = json.loads(recipe.read_text())["model"]
    if made_by != model_name:
        raise SpecchatError(f"{data} holds answers of {made_by}, not of {model_name}: a drafter learns its own target")
    return list(read_records(data, "train")), list(read_records(data, "heldout"))


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
