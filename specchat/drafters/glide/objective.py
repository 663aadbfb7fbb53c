"""GLIDE's training objective: a one-layer GLIDE draft over the target's last-layer KV, the target's cache
hidden block-wise, scored through the draft's LM head.

- Block-wise lag (`indices.block_lag_visibility`, blocks of 5): a query in block b sees the target's keys
  and values of blocks < b, so rows lag the target's cache by 1 to 5 positions, as a draft chain of up to
  5 tokens does at inference; the first block sees none and is not scored.
- The draft shares the target's embedding and LM head (frozen, not part of the draft), its layer and final
  norm are trained. One layer reads the target's last layer: the features LongSpec trains on.
- The loss is cross-entropy, over the draft vocabulary, of the target's greedy next token at every row.

Held-out evaluation: `lag_evaluation`, with the target's cache lagging 1, 2, ... rows.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from specchat.drafters.glide.model import GlideKV, GlideModel
from specchat.training.features import Features, SampleFeatures
from specchat.training.indices import block_lag_visibility, lag_visibility
from specchat.training.lag_evaluation import lag_evaluation
from specchat.training.samples import Sample
from specchat.training.vocab import IGNORE_INDEX, draft_vocab_targets

BLOCK = 5  # GLIDE's lag block


class GlideObjective:
    def __init__(self, model: GlideModel, embeddings: torch.Tensor, head: torch.Tensor, draft_vocab: torch.Tensor,
                 rotary: torch.nn.Module):  # fmt: skip
        """`model` a shared-vocabulary draft; `embeddings` [vocab, hidden] and `head` [vocab, hidden] the target's,
        `draft_vocab` the ids the loss is taken over (sorted), `rotary` the target's rotary embedding (the
        cross-attention's queries meet its keys)."""
        self.module = model
        self.embeddings = embeddings
        self.draft_vocab = draft_vocab.to(embeddings.device)
        self.head = head[self.draft_vocab]
        self.rotary = rotary

    def loss(self, sample: Sample, features: SampleFeatures, rng: random.Random):
        """Summed cross-entropy over the rows past the first block, and how many rows were scored."""
        length = len(sample)
        out = self._forward(sample, features, block_lag_visibility(length, BLOCK))
        labels = draft_vocab_targets(features.labels.to(self.device, torch.long), self.draft_vocab)[BLOCK:]
        logits = out[BLOCK:] @ self.head.T
        loss = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
        return loss, int((labels != IGNORE_INDEX).sum())

    def evaluate(self, samples: list[Sample], features: Features) -> dict[str, float]:
        def logits_at_lag(index: int, lag: int) -> torch.Tensor:
            mask = lag_visibility(len(samples[index]), lag)
            return self._forward(samples[index], features.of(index), mask) @ self.head.T

        return lag_evaluation(logits_at_lag, samples, features, self.draft_vocab)

    def _forward(self, sample: Sample, features: SampleFeatures, target_mask: torch.Tensor) -> torch.Tensor:
        """The draft's final-normed states [length, hidden] at positions 0.., seeing the target's KV where
        `target_mask` [length, length] shows it (rows that see none get no cross-attention)."""
        length = len(sample)
        x = self.embeddings[torch.tensor(sample.ids, device=self.device)]
        kv = GlideKV(self.module.config, length, dtype=torch.float32, device=self.device)
        positions = torch.arange(length, device=self.device)
        cos, sin = self.rotary(self.embeddings[:1], positions[None])
        keys, values = (part.to(self.device, torch.float32) for part in (features.keys, features.values))
        target_kv = self.module.target_kv([(keys, values)])
        return self.module(x, 0, kv, target_kv, (cos[0], sin[0]), cross_mask=target_mask.to(self.device))

    @property
    def device(self) -> torch.device:
        return self.embeddings.device
