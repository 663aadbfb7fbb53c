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
  at every row: prompt rows too, since the target's choice is known there as well. Training on prompt rows
  as well as answer rows was measured against answer rows alone (docs/training.md).

Held-out evaluation is on answer rows: the loss at lag 1, and greedy chain acceptance teacher-forced on the
greedy answers. While a chain is right its inputs are the text's own tokens, so the accepted length from
root t is the run of rows t, t + 1, ... whose argmax (under lags 1, 2, ...) equals the target's — the chain
tau a greedy target would see, by position.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from specchat.models.longspec import LongSpecLayer, rotate
from specchat.training.features import Features, SampleFeatures
from specchat.training.indices import anchor_offset_positions, lag_pad, lag_visibility, loss_rows
from specchat.training.samples import Sample
from specchat.training.vocab import IGNORE_INDEX, draft_vocab_targets

CHAIN_DEPTH = 5  # the depth of held-out chain acceptance (LongSpec's trees are 5 deep)


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

    @torch.no_grad()
    def evaluate(self, samples: list[Sample], features: Features) -> dict[str, float]:
        """Held-out loss (lag 1, positions as the text has them) and greedy chain tau (1 + accepted per root)."""
        loss_sum, rows, accepted, roots = 0.0, 0, 0, 0
        for index, sample in enumerate(samples):
            positions = torch.arange(len(sample), device=self.device)
            right = []  # right[d][t]: row t, seeing the target up to t - d - 1, predicts the target's token
            target_tokens = self._labels(features.of(index))
            labels = draft_vocab_targets(target_tokens, self.draft_vocab)
            scored = self._answer_rows(sample)
            for depth in range(CHAIN_DEPTH):
                logits = self._forward(sample, features.of(index), positions, depth + 1) @ self.head.T
                right.append(self.draft_vocab[logits.argmax(dim=-1)] == target_tokens)
                if depth == 0:
                    keep = scored & (labels != IGNORE_INDEX)
                    loss_sum += float(F.cross_entropy(logits[keep].float(), labels[keep], reduction="sum"))
                    rows += int(keep.sum())
            if sample.greedy:
                runs = chain_accepted(torch.stack(right), scored.nonzero().flatten().tolist())
                accepted += sum(runs)
                roots += len(runs)
        return {"loss": loss_sum / max(rows, 1), "chain_tau": 1 + accepted / max(roots, 1)}

    def _forward(self, sample: Sample, features: SampleFeatures, positions: torch.Tensor, pad: int) -> torch.Tensor:
        """The draft's outputs [length, hidden] at `positions`, the target's cache lagging `pad` rows."""
        length = len(sample)
        x = self.embeddings[self._ids(sample)]
        cos, sin = self._rotary(positions)
        shift_cos, shift_sin = self._rotary(positions - torch.arange(length, device=self.device))
        keys, values = (part.to(self.device, torch.float32) for part in (features.keys, features.values))
        keys = rotate(keys, shift_cos, shift_sin)
        own_keys, own_values = self.module.own_kv(x, cos, sin)
        own_mask = (positions[None, :] <= positions[:, None]) & (positions[None, :] > positions[:, None] - self.module.config.window)
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

    def _answer_rows(self, sample: Sample) -> torch.Tensor:
        """bool [length]: rows whose next token is an answer token."""
        t = torch.arange(len(sample), device=self.device)
        return (t + 1 >= sample.answer_start) & (t + 1 < len(sample))

    def _labels(self, features: SampleFeatures) -> torch.Tensor:
        return features.labels.to(self.device, torch.long)


def chain_accepted(right: torch.Tensor, roots: list[int]) -> list[int]:
    """Accepted draft tokens of a greedy chain from each root: right [depth, length] bool says whether row t,
    drafting at depth d + 1 (the target's cache lagging d + 1 rows), predicts the text's next token; a chain
    from root t goes on through rows t, t + 1, ... while they are right."""
    depth, length = right.shape
    runs = []
    for root in roots:
        run = 0
        while run < depth and root + run < length and right[run, root + run]:
            run += 1
        runs.append(run)
    return runs
