"""The frozen target's features of the training samples, computed once and kept next to the data.

A drafter that reads the target's cache (LongSpec, GLIDE) trains on the target's last-layer keys and values,
and learns the target's own next token at every row: its greedy choice (`labels`), which is what a greedy
target accepts, is known for prompt rows too and is free of the noise of sampled answers. They cost a
target prefill per sample (about 700 tokens/s for the default model on 2 cores) and do not change between
epochs, so they are computed once, through the engine as it runs at inference (same weights, same kernels),
in chunks of CHUNK samples: `<data>/features/<split>-NNNNN.safetensors` holds `keys` and `values`
[kv_heads, tokens, head_dim] (bf16) and `labels` [tokens] of the chunk's samples end to end, and `starts`
[samples + 1]. A chunk whose samples changed is computed again; a stopped run resumes at the first
missing chunk.

Keys are post-RoPE at the sample's own positions 0..L-1. LongSpec's anchor offsets move a sample to other
positions by rotating them (`drafters/longspec/objective.py`); RoPE is relative, so that equals the keys the target
would compute there, except for the target's own attention to the sinks.

Heads that read the target's last hidden state (TokenSwift) train on that state instead: `target_hidden`
keeps it, with the same labels, in a file set of its own, `<data>/features/hidden-<split>-NNNNN.safetensors`
(`hidden` [tokens, hidden_size] bf16, `labels`, `starts`). One prefill gives both: a chunk computed for either
kind writes both files, so training LongSpec and TokenSwift on the same data costs one pass over it (for the
1.5B, ~30 minutes per 400K tokens here) and disk for both (the hidden states are 3 KB a token, its keys and
values 1 KB). EAGLE-3 reads three layers' input states (`target_layer_states`): 9 KB a token for the 1.5B, so
they are computed only for it, in files of their own (`layers-<split>-NNNNN.safetensors`). Caching pays for the same
reason: the target's prefill with its labels (about 720 tokens/s for the default model on 2 cores) is as slow as a
heads' training step over the full vocabulary (about 800) and ten times slower than one over 8K tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, NamedTuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specchat.architectures import parts
from specchat.training.samples import Sample, fingerprint

CHUNK = 16  # samples per features file: a few minutes of the 1.5B's prefill here, what a stop can lose


class SampleFeatures(NamedTuple):
    keys: torch.Tensor  # [kv_heads, length, head_dim]
    values: torch.Tensor
    labels: torch.Tensor  # [length]: the target's greedy token after each row


@dataclass(frozen=True)
class Features:
    """The features of samples, end to end: sample i is [:, starts[i]:starts[i + 1]] (labels [starts[i]:...])."""

    keys: torch.Tensor
    values: torch.Tensor
    labels: torch.Tensor
    starts: torch.Tensor
    TOKEN_DIMS: ClassVar[dict[str, int]] = {"keys": 1, "values": 1, "labels": 0}  # the dim chunks join along

    def of(self, index: int) -> SampleFeatures:
        start, end = int(self.starts[index]), int(self.starts[index + 1])
        return SampleFeatures(self.keys[:, start:end], self.values[:, start:end], self.labels[start:end])

    @classmethod
    def empty(cls) -> Features:
        return cls(torch.empty(0, 0, 0), torch.empty(0, 0, 0), torch.empty(0, dtype=torch.int32), _starts([]))


class SampleHidden(NamedTuple):
    hidden: torch.Tensor  # [length, hidden_size]: the target's last decoder layer output, before its final norm
    labels: torch.Tensor  # [length]: the target's greedy token after each row


@dataclass(frozen=True)
class HiddenFeatures:
    """The target's last hidden states of samples, end to end: sample i is rows starts[i]:starts[i + 1]."""

    hidden: torch.Tensor  # [tokens, hidden_size]
    labels: torch.Tensor  # [tokens]
    starts: torch.Tensor  # [samples + 1]
    TOKEN_DIMS: ClassVar[dict[str, int]] = {"hidden": 0, "labels": 0}

    def of(self, index: int) -> SampleHidden:
        start, end = int(self.starts[index]), int(self.starts[index + 1])
        return SampleHidden(self.hidden[start:end], self.labels[start:end])

    @classmethod
    def empty(cls) -> HiddenFeatures:
        return cls(torch.empty(0, 0), torch.empty(0, dtype=torch.int32), _starts([]))


class SampleLayers(NamedTuple):
    layers: torch.Tensor  # [length, layers * hidden_size]: the residual stream entering each layer, side by side
    labels: torch.Tensor  # [length]: the target's greedy token after each row


@dataclass(frozen=True)
class LayerFeatures:
    """The target's states entering some of its layers, of samples end to end (EAGLE-3's features)."""

    layers: torch.Tensor  # [tokens, layers * hidden_size]
    labels: torch.Tensor  # [tokens]
    starts: torch.Tensor  # [samples + 1]
    TOKEN_DIMS: ClassVar[dict[str, int]] = {"layers": 0, "labels": 0}

    def of(self, index: int) -> SampleLayers:
        start, end = int(self.starts[index]), int(self.starts[index + 1])
        return SampleLayers(self.layers[start:end], self.labels[start:end])

    @classmethod
    def empty(cls) -> LayerFeatures:
        return cls(torch.empty(0, 0), torch.empty(0, dtype=torch.int32), _starts([]))


def target_features(engine, data: Path, split: str, samples: list[Sample],
                    progress: Callable[[int], None] = lambda _tokens: None) -> Features:  # fmt: skip
    """The features of `samples` (one split of `data`, in order), computed where not on disk yet.

    `engine` runs the target (`Engine.target_states`); `progress` hears the tokens of each sample computed.
    """
    return _cached(Features, engine, data, split, samples, progress)


def target_hidden(engine, data: Path, split: str, samples: list[Sample],
                  progress: Callable[[int], None] = lambda _tokens: None) -> HiddenFeatures:  # fmt: skip
    """The target's last hidden states and greedy labels of `samples`, as `target_features` computes and
    keeps its features (files `hidden-<split>-NNNNN.safetensors`)."""
    return _cached(HiddenFeatures, engine, data, split, samples, progress)


def target_layer_states(engine, data: Path, split: str, samples: list[Sample],
                        progress: Callable[[int], None] = lambda _tokens: None, *,
                        layers: tuple[int, ...]) -> LayerFeatures:  # fmt: skip
    """The residual stream entering each of the target's `layers` and the greedy labels of `samples`, kept as
    `target_features` keeps its features (files `layers-<split>-NNNNN.safetensors`, for these layers)."""
    return _cached(LayerFeatures, engine, data, split, samples, progress, layers)


# each kind's file stem and the tensors its files hold
FILES = {Features: ("", ("keys", "values", "labels", "starts")),
         HiddenFeatures: ("hidden-", ("hidden", "labels", "starts")),
         LayerFeatures: ("layers-", ("layers", "labels", "starts"))}  # fmt: skip


def _cached(kind, engine, data: Path, split: str, samples: list[Sample], progress: Callable[[int], None],
            layers: tuple[int, ...] = ()):  # fmt: skip
    """`kind` of `samples`: each chunk read from its file when that holds these samples, else computed (Features
    and HiddenFeatures together, from one prefill) and written."""
    folder = data / "features"
    folder.mkdir(exist_ok=True)

    def path(of, index: int) -> Path:
        return folder / f"{FILES[of][0]}{split}-{index:05d}.safetensors"

    chunks = []
    for index, first in enumerate(range(0, len(samples), CHUNK)):
        part = samples[first : first + CHUNK]
        wanted = fingerprint(part) + (f"|layers={','.join(map(str, layers))}" if layers else "")
        chunk = _read(kind, path(kind, index), wanted)
        if chunk is None:
            computed = _compute_layers(engine, part, layers, progress) if layers else _compute(engine, part, progress)
            for made_kind, made in computed.items():
                names = FILES[made_kind][1]
                save_file({name: getattr(made, name) for name in names}, path(made_kind, index),
                          metadata={"fingerprint": wanted})  # fmt: skip
            chunk = computed[kind]
        else:
            progress(sum(len(sample) for sample in part))
        chunks.append(chunk)
    return concat(chunks) if chunks else kind.empty()


def _compute(engine, samples: list[Sample], progress: Callable[[int], None]) -> dict[type, Features | HiddenFeatures]:
    """Both kinds of features of `samples`, from one target prefill per sample."""
    keys, values, states, labels = [], [], [], []
    for sample in samples:
        hidden = engine.target_states(list(sample.ids))
        layer = engine.cache.layers[-1]
        sample_keys, sample_values = layer.read(slice(0, len(sample)))
        keys.append(sample_keys.to(torch.bfloat16).cpu())
        values.append(sample_values.to(torch.bfloat16).cpu())
        states.append(hidden.to(torch.bfloat16).cpu())
        labels.append(greedy_tokens(engine.model, hidden).cpu())
        progress(len(sample))
    labels, starts = torch.cat(labels), _starts(samples)
    return {Features: Features(torch.cat(keys, dim=1), torch.cat(values, dim=1), labels, starts),
            HiddenFeatures: HiddenFeatures(torch.cat(states), labels, starts)}  # fmt: skip


def _compute_layers(engine, samples: list[Sample], layers: tuple[int, ...],
                    progress: Callable[[int], None]) -> dict[type, LayerFeatures]:  # fmt: skip
    """LayerFeatures of `samples`, one target prefill each (the last layer's output too, for the labels)."""
    states, labels = [], []
    last = engine.model.config.num_hidden_layers
    for sample in samples:
        both = engine.target_states(list(sample.ids), feature_layers=(*layers, last))
        width = both.shape[1] // (len(layers) + 1)
        states.append(both[:, : len(layers) * width].to(torch.bfloat16).cpu())
        labels.append(greedy_tokens(engine.model, both[:, len(layers) * width :]).cpu())
        progress(len(sample))
    return {LayerFeatures: LayerFeatures(torch.cat(states), torch.cat(labels), _starts(samples))}


def _starts(samples: list[Sample]) -> torch.Tensor:
    return torch.tensor([0] + [len(sample) for sample in samples]).cumsum(0)


@torch.inference_mode()
def greedy_tokens(model, hidden: torch.Tensor, rows: int = 256) -> torch.Tensor:
    """The target's greedy next token after each row of its last-layer states `hidden` [length, hidden_size]
    (final norm, LM head, argmax; `rows` at a time, so the logits stay small)."""
    decoder = parts(model)
    head, norm = decoder.head, decoder.norm
    return torch.cat([head(norm(part)).argmax(dim=-1) for part in hidden.split(rows)]).to(torch.int32)


def _read(kind, path: Path, wanted: str):
    names = FILES[kind][1]
    if not path.is_file():
        return None
    try:
        with safe_open(path, "pt") as handle:
            if handle.metadata().get("fingerprint") != wanted or set(handle.keys()) != set(names):
                return None  # other samples, or written before the file held all it holds now
            return kind(**{name: handle.get_tensor(name) for name in names})
    except (OSError, ValueError, RuntimeError):  # cut by a stop while written: computed again
        return None


def concat(chunks: list):
    """Features (or HiddenFeatures) end to end, their samples' starts offset (at least one; empty ones skipped)."""
    kind = type(chunks[0])
    chunks = [chunk for chunk in chunks if len(chunk.starts) > 1] or chunks[:1]
    offsets = [0]
    for chunk in chunks[:-1]:
        offsets.append(offsets[-1] + int(chunk.starts[-1]))
    starts = torch.cat([chunks[0].starts[:1]] + [chunk.starts[1:] + offset for chunk, offset in zip(chunks, offsets)])
    joined = {name: torch.cat([getattr(c, name) for c in chunks], dim=dim) for name, dim in kind.TOKEN_DIMS.items()}
    return kind(**joined, starts=starts)
