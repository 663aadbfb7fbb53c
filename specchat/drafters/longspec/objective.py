"""LongSpec's training objective: a sample through the draft layer as inference would run it, at long positions
and with the target's cache lagging behind, scored through the target's frozen LM head.

- Anchor-offset positions (`indices.anchor_offset_positions`): a short sample is placed at large positions,
  its first 0-4 tokens kept at 0.. as attention sinks, so the draft meets the long contexts it serves. The
  cached target keys are rotated to the same positions.
- Lag (`indices.lag_visibility`): the query at t sees the target's keys / values up to t - pad, pad drawn
  from 1-4, as a tree node at depth d sees a target cache that ends d positions before it; rows t < pad see
  none and are not scored.
- The draft's own self-attention is causal over its window of positions, as `RingKV` serves it.
- The loss is cross-entropy, over the draft vocabulary, of the target's greedy next token (`features.labels`)
  at every row: prompt rows too, since the target's choice is known there as well (about twice the rows
  of the answers alone, on the same features).

Held-out evaluation: `lag_evaluation`.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from specchat.drafters.draft_layers import rotate
from specchat.drafters.longspec.model import LongSpecLayer
from specchat.training.features import Features, SampleFeatures
from specchat.training.indices import anchor_offset_positions, lag_pad, lag_visibility, loss_rows
from specchat.training.lag_evaluation import lag_evaluation
from specchat.training.samples import Sample
from specchat.training.vocab import IGNORE_INDEX, draft_vocab_targets


class LongSpecObjective:
    """Loss and held-out metrics of a LongSpec layer over a target's frozen embedding, rotary and LM head."""

    def __init__(self, layer: LongSpecLayer, embeddings: torch.Tensor, head: torch.Tensor, draft_vocab: torch.Tensor,
                 rotary: torch.nn.Module, window: int):  # fmt: skip
        """`embeddings` [vocab, hidden] and `head` [vocab, hidden] are the target's, `draft_vocab` the ids the
        loss is taken over (sorted; all of them for the full vocabulary), `window` the target's positions."""
        self.module = layer
        self.embeddings = embeddings
        self.draft_vocab = draft_vocab.to(embeddings.device)
        self.head = head[draft_vocab]
        self.rotary = rotary
        self.window = window

    def loss(self, sample: Sample, features: SampleFeatures, rng: random.Random):
        """Summed cross-entropy over the sample's scored rows, and how many rows were scored."""
        length = len(sample)
        positions = anchor_offset_positions(length, self.window, rng).to(self.device)
        pad = lag_pad(rng)
        out = self._forward(sample, features, positions, pad)
        rows = loss_rows(length, pad).to(self.device)
        labels = draft_vocab_targets(self._labels(features), self.draft_vocab)
        logits = out[rows] @ self.head.T
        loss = F.cross_entropy(logits.float(), labels[rows], ignore_index=IGNORE_INDEX, reduction="sum")
        return loss, int((labels[rows] != IGNORE_INDEX).sum())

    def evaluate(self, samples: list[Sample], features: Features) -> dict[str, float]:
        """Held-out loss and greedy chain tau (`lag_evaluation`), at the positions the text has."""

        def logits_at_lag(index: int, lag: int) -> torch.Tensor:
            positions = torch.arange(len(samples[index]), device=self.device)
            return self._forward(samples[index], features.of(index), positions, lag) @ self.head.T

        return lag_evaluation(logits_at_lag, samples, features, self.draft_vocab)

    def _forward(self, sample: Sample, features: SampleFeatures, positions: torch.Tensor, pad: int) -> torch.Tensor:
        """The draft's outputs [length, hidden] at `positions`, the target's cache lagging `pad` rows."""
        length = len(sample)
        x = self.embeddings[self._ids(sample)]
        cos, sin = self._rotary(positions)
        shift_cos, shift_sin = self._rotary(positions - torch.arange(length, device=self.device))
        keys, values = (part.to(self.device, torch.float32) for part in (features.keys, features.values))
        keys = rotate(keys, shift_cos, shift_sin)
        own_keys, own_values = self.module.own_kv(x, cos, sin)
        own_mask = ((positions[None, :] <= positions[:, None])
                    & (positions[None, :] > positions[:, None] - self.module.config.window))
        target_mask = lag_visibility(length, pad).to(self.device)
        target_mask[:pad, 0] = True  # rows that see no target KV yet: never scored, kept finite
        return self.module(x, cos, sin, own_keys, own_values, own_mask, keys, values, target_mask)

    def _rotary(self, positions: torch.Tensor):
        cos, sin = self.rotary(self.embeddings[:1], positions[None])
        return cos[0].float(), sin[0].float()

    @property
    def device(self) -> torch.device:
        return self.embeddings.device

    def _ids(self, sample: Sample) -> torch.Tensor:
        return torch.tensor(sample.ids, device=self.device)

    def _labels(self, features: SampleFeatures) -> torch.Tensor:
        return features.labels.to(self.device, torch.long)

