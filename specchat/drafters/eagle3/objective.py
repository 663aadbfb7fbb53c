"""EAGLE-3's training objective: training-time test, the draft unrolled over its own outputs as it drafts.

Rows are indexed by their anchor p, the last position whose target features they descend from:

- step 0, the row of position p: fc(the target's features of p) and the embedding of token p + 1; it guesses
  token p + 2 and attends causally to the step-0 rows of positions <= p (the committed rows at inference);
- step k > 0, the row of position p + k: the step-(k - 1) output of the same anchor (the draft's own state,
  where the target's would be) and the embedding of token p + k + 1; it guesses token p + k + 2, and attends to
  the step-0 rows <= p and to the anchor's own rows of steps 1..k: exactly the rows a depth-(k + 1) node sees in
  a draft tree (its ancestors), at the positions it has there.

Labels are the target's greedy choices (`labels[t]`, for token t + 1), so step k of anchor p is scored against
`labels[p + k + 1]`, over the draft vocabulary, every row with a label (prompt rows too); step k weighs 0.8^k, as
EAGLE-3 weighs its steps. Tokens are the text's: on a greedy answer they are what a chain of right guesses reads.

Held-out evaluation: per step, top-1 accuracy on rows whose guessed token is an answer token, the loss there,
and greedy chain tau teacher-forced: from each such anchor, 1 (the target's own token) plus the run of steps
0, 1, ... whose argmax is right, as a chain drafted by the layer would be accepted.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specchat.drafters.eagle3.model import Eagle3Draft
from specchat.training.features import LayerFeatures, SampleLayers
from specchat.training.samples import Sample
from specchat.training.vocab import IGNORE_INDEX, draft_vocab_targets

STEPS = 3  # unrolled steps: a chain of three drafted tokens, what a CPU's trees of 3-8 nodes reach
STEP_WEIGHT = 0.8


class Eagle3Objective:
    def __init__(self, draft: Eagle3Draft, embed: Callable[[torch.Tensor], torch.Tensor], steps: int = STEPS):
        """`embed`: the target's token embedding (frozen, not the draft's)."""
        self.module, self.embed, self.steps = draft, embed, steps

    def loss(self, sample: Sample, features: SampleLayers, rng: random.Random):
        """Weighted cross-entropy summed over steps and rows, and the rows of step 0."""
        total, rows = 0.0, 0
        for step, (logits, labels) in enumerate(self._unroll(sample, features)):
            total = total + STEP_WEIGHT**step * F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX,
                                                                reduction="sum")  # fmt: skip
            rows = rows or int((labels != IGNORE_INDEX).sum())
        return total, rows

    @torch.no_grad()
    def evaluate(self, samples: list[Sample], features: LayerFeatures) -> dict[str, float]:
        """Per-step top-1 accuracy and loss on answer rows, and greedy chain tau, over the draft vocabulary."""
        hits, counts = torch.zeros(self.steps), torch.zeros(self.steps)
        loss_sum, scored, accepted, roots = 0.0, 0, 0, 0
        for index, sample in enumerate(samples):
            steps = list(self._unroll(sample, features.of(index)))
            anchors = len(steps[0][1])
            right = torch.zeros(self.steps, anchors, dtype=torch.bool, device=self.device)
            for step, (logits, labels) in enumerate(steps):
                guessed = guessed_answer_rows(sample, step, anchors, self.device)
                right[step] = (logits.argmax(dim=-1) == labels) & guessed
                hits[step] += float(right[step].sum())
                counts[step] += float(guessed.sum())
                inside = guessed & (labels != IGNORE_INDEX)
                loss_sum += float(F.cross_entropy(logits[inside].float(), labels[inside], reduction="sum"))
                scored += int(inside.sum())
            if sample.greedy:
                root_rows = guessed_answer_rows(sample, 0, anchors, self.device)
                runs = right.int().cumprod(0).sum(0)
                accepted += int(runs[root_rows].sum())
                roots += int(root_rows.sum())
        metrics = {"loss": loss_sum / max(scored, 1), "chain_tau": 1 + accepted / max(roots, 1)}
        for step in range(self.steps):
            metrics[f"step{step + 1}_top1"] = float(hits[step] / max(float(counts[step]), 1))
        return metrics

    def _unroll(self, sample: Sample, features: SampleLayers):
        """Per step, (logits [anchors, draft vocab], labels [anchors]) for anchors 0 .. length - 2."""
        draft, device = self.module, self.device
        ids = torch.tensor(sample.ids, device=device)
        anchors = len(ids) - 1
        vocab = draft.draft_vocab
        labels = draft_vocab_targets(features.labels.to(device, torch.long), vocab)
        p = torch.arange(anchors, device=device)
        h = draft.fc(features.layers[:anchors].to(device, draft.fc.weight.dtype))
        keys, values = None, None  # step 0's, every later step attends to (causally)
        own_keys, own_values = [], []  # each later step's rows: an anchor sees only its own
        for step in range(self.steps):
            ahead = p + step + 1  # the token each row reads; its label is the target's choice after it
            valid = ahead < len(ids)
            with torch.no_grad():
                embeds = self.embed(ids[ahead.clamp(max=len(ids) - 1)]).to(h.dtype)
            cos, sin = draft.tables(p + step, h.dtype)
            q, k, v, residual = draft.project(h, embeds, cos, sin)
            if step == 0:
                keys, values = k, v
            else:
                own_keys.append(k)
                own_values.append(v)
            h = draft.finish(residual, unrolled_attention(q, keys, values, own_keys, own_values))
            wanted = torch.full_like(p, IGNORE_INDEX)
            wanted[valid] = labels[ahead[valid]]
            yield draft.logits(h), wanted

    @property
    def device(self) -> torch.device:
        return self.module.fc.weight.device


def unrolled_attention(q, keys, values, own_keys: list, own_values: list) -> torch.Tensor:
    """q [heads, n, D] of anchors 0..n-1 over step 0's keys / values [kv_heads, n, D] up to their own anchor and
    over their own rows of the later steps (lists of [kv_heads, n, D]) -> [heads, n, D]."""
    heads, n, dim = q.shape
    kv = keys.shape[0]
    grouped = q.view(kv, heads // kv, n, dim)
    scores = torch.einsum("kgnd,kmd->kgnm", grouped, keys).float() * dim**-0.5
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril_()
    scores = scores.masked_fill(~causal, float("-inf"))
    if own_keys:
        own = torch.stack(own_keys, dim=-2)  # [kv, n, steps, D]
        diagonal = torch.einsum("kgnd,knsd->kgns", grouped, own).float() * dim**-0.5
        scores = torch.cat([scores, diagonal], dim=-1)
    probs = scores.softmax(dim=-1).to(values.dtype)
    out = torch.einsum("kgnm,kmd->kgnd", probs[..., :n], values)
    if own_values:
        out = out + torch.einsum("kgns,knsd->kgnd", probs[..., n:], torch.stack(own_values, dim=-2))
    return out.reshape(heads, n, dim)


def guessed_answer_rows(sample: Sample, step: int, anchors: int, device=None) -> torch.Tensor:
    """bool [anchors]: anchors p whose step-`step` guess, token p + step + 2, is an answer token of the sample."""
    guessed = torch.arange(anchors, device=device) + step + 2
    return (guessed >= sample.answer_start) & (guessed < len(sample))
