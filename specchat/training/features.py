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
positions by rotating them (`training/longspec.py`); RoPE is relative, so that equals the keys the target
would compute there, except for the target's own attention to the sinks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specchat.training.samples import Sample, fingerprint

CHUNK = 200  # samples per features file
NAMES = ("keys", "values", "labels", "starts")


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

    def of(self, index: int) -> SampleFeatures:
        start, end = int(self.starts[index]), int(self.starts[index + 1])
        return SampleFeatures(self.keys[:, start:end], self.values[:, start:end], self.labels[start:end])


def target_features(engine, data: Path, split: str, samples: list[Sample],
                    progress: Callable[[int], None] = lambda _tokens: None) -> Features:  # fmt: skip
    """The features of `samples` (one split of `data`, in order), computed where not on disk yet.

    `engine` runs the target (`Engine.target_states`); `progress` hears the tokens of each sample computed.
    """
    folder = data / "features"
    folder.mkdir(exist_ok=True)
    chunks = []
    for index, first in enumerate(range(0, len(samples), CHUNK)):
        part = samples[first : first + CHUNK]
        path = folder / f"{split}-{index:05d}.safetensors"
        chunk = _read(path, fingerprint(part))
        if chunk is None:
            chunk = _compute(engine, part, progress)
            save_file({name: getattr(chunk, name) for name in NAMES}, path, metadata={"fingerprint": fingerprint(part)})
        else:
            progress(sum(len(sample) for sample in part))
        chunks.append(chunk)
    return _concat(chunks)


def _compute(engine, samples: list[Sample], progress: Callable[[int], None]) -> Features:
    keys, values, labels = [], [], []
    for sample in samples:
        hidden = engine.target_states(list(sample.ids))
        layer = engine.cache.layers[-1]
        keys.append(layer.keys[0, :, : len(sample)].to(torch.bfloat16).cpu())
        values.append(layer.values[0, :, : len(sample)].to(torch.bfloat16).cpu())
        labels.append(greedy_tokens(engine.model, hidden).cpu())
        progress(len(sample))
    starts = torch.tensor([0] + [len(sample) for sample in samples]).cumsum(0)
    return Features(torch.cat(keys, dim=1), torch.cat(values, dim=1), torch.cat(labels), starts)


@torch.inference_mode()
def greedy_tokens(model, hidden: torch.Tensor, rows: int = 256) -> torch.Tensor:
    """The target's greedy next token after each row of its last-layer states `hidden` [length, hidden_size]
    (final norm, LM head, argmax; `rows` at a time, so the logits stay small)."""
    head, norm = model.lm_head, model.model.norm
    return torch.cat([head(norm(part)).argmax(dim=-1) for part in hidden.split(rows)]).to(torch.int32)


def _read(path: Path, wanted: str) -> Features | None:
    if not path.is_file():
        return None
    try:
        with safe_open(path, "pt") as handle:
            if handle.metadata().get("fingerprint") != wanted or set(handle.keys()) != set(NAMES):
                return None  # other samples, or written before the file held all it holds now
            return Features(*(handle.get_tensor(name) for name in NAMES))
    except (OSError, ValueError, RuntimeError):  # cut by a stop while written: computed again
        return None


def _concat(chunks: list[Features]) -> Features:
    if not chunks:
        return Features(torch.empty(0, 0, 0), torch.empty(0, 0, 0), torch.empty(0, dtype=torch.int32),
                        torch.zeros(1, dtype=torch.long))  # fmt: skip
    offsets = [0]
    for chunk in chunks[:-1]:
        offsets.append(offsets[-1] + int(chunk.starts[-1]))
    starts = torch.cat([chunks[0].starts[:1]] + [chunk.starts[1:] + offset for chunk, offset in zip(chunks, offsets)])
    return Features(torch.cat([c.keys for c in chunks], dim=1), torch.cat([c.values for c in chunks], dim=1),
                    torch.cat([c.labels for c in chunks]), starts)  # fmt: skip
