"""TokenSwift's training objective: the heads over the target's cached last hidden states, each scored through
the target's frozen LM head against the token it must guess.

- Alignment: `labels[t]` is the target's greedy choice at row t, i.e. for token t + 1. Head i (from 0) at row
  t guesses token t + 2 + i, so its label is `labels[t + 1 + i]`: the target's greedy choice once the text
  up to t + 1 + i is there. On a greedy answer that is the text's own next tokens; elsewhere it is still what
  a greedy target would accept after that text. Every row with such a label is scored, prompt rows too.
- The loss is cross-entropy over the draft vocabulary (`--vocab`; all of it by default), summed over heads
  and rows (the trainer divides by the rows), as the reference sums its heads' losses.

Held-out evaluation ranks what the drafter ranks, the draft vocabulary (a token outside it is a miss): per
head, top-1 and top-3 accuracy on the rows whose guessed token is an answer token; the loss on those of them
inside the draft vocabulary; and the greedy chain tau teacher-forced: from a root row t of a greedy answer, the target's
own token t + 1 (the bonus) plus the run of heads 0, 1, ... whose argmax at t is right, as a chain drafted by the heads
would be accepted.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specchat.drafters.tokenswift.model import TokenSwiftHeads
from specchat.training.features import HiddenFeatures, SampleHidden
from specchat.training.lag_evaluation import answer_rows
from specchat.training.samples import Sample
from specchat.training.vocab import IGNORE_INDEX, draft_vocab_targets

TOP_K = 3  # held-out top-k accuracy: a TokenSwift tree [1, 3, 3, 3] takes each head's top 3


class TokenSwiftObjective:
    """Loss and held-out metrics of TokenSwift heads over a target's frozen LM head."""

    def __init__(self, heads: TokenSwiftHeads, head: torch.Tensor, draft_vocab: torch.Tensor,
                 embed: Callable[[torch.Tensor], torch.Tensor] | None = None):  # fmt: skip
        """`head` [vocab, hidden] is the target's LM head, `draft_vocab` the ids the loss is taken over (sorted;
        all of them for the full vocabulary), `embed` the target's token embedding (heads with `root_input`)."""
        self.module, self.embed = heads, embed
        self.draft_vocab = draft_vocab.to(head.device)
        self.head = head if len(draft_vocab) == head.shape[0] else head[self.draft_vocab]

    def loss(self, sample: Sample, features: SampleHidden, rng: random.Random):
        """Summed cross-entropy of every head at every row it has a label for, and how many were scored."""
        out = self._forward(sample, features)
        labels = draft_vocab_targets(features.labels.to(self.device, torch.long), self.draft_vocab)
        total, rows = 0.0, 0
        for i, states in enumerate(out):
            wanted = head_labels(labels, i)
            logits = states[: len(wanted)] @ self.head.T
            total = total + F.cross_entropy(logits.float(), wanted, ignore_index=IGNORE_INDEX, reduction="sum")
            rows += int((wanted != IGNORE_INDEX).sum())
        return total, rows

    @torch.no_grad()
    def evaluate(self, samples: list[Sample], features: HiddenFeatures) -> dict[str, float]:
        """Per-head top-1 / top-3 accuracy and loss, and greedy chain tau, over the draft vocabulary."""
        gamma = self.module.config.gamma
        loss_sum, inside, accepted, roots = 0.0, 0, 0, 0
        hits = torch.zeros(gamma, TOP_K)  # [head, k]: rows whose label is in the head's top k
        counts = torch.zeros(gamma)
        for index, sample in enumerate(samples):
            sample_features = features.of(index)
            labels = draft_vocab_targets(sample_features.labels.to(self.device, torch.long), self.draft_vocab)
            length = len(sample)
            right = torch.zeros(gamma, length, dtype=torch.bool, device=self.device)  # [head, row]: argmax right
            for i, states in enumerate(self._forward(sample, sample_features)):
                wanted = head_labels(labels, i)
                scored = guessed_answer_rows(sample, i, self.device)[: len(wanted)]
                wanted = wanted[scored]  # only these rows are scored: the head's logits of the others go unused
                logits = (states[: len(scored)][scored] @ self.head.T).float()
                top = logits.topk(TOP_K, dim=-1).indices == wanted[:, None]  # [scored rows, k]; IGNORE_INDEX: a miss
                right[i, : len(scored)][scored] = top[:, 0]
                loss_sum += float(F.cross_entropy(logits, wanted, ignore_index=IGNORE_INDEX, reduction="sum"))
                inside += int((wanted != IGNORE_INDEX).sum())
                hits[i] += top.cumsum(-1).clamp(max=1).sum(0).cpu()
                counts[i] += len(wanted)
            if sample.greedy:
                root_rows = answer_rows(sample, self.device)
                runs = right.int().cumprod(0).sum(0)  # [length]: heads right in a row from head 0
                accepted += int(runs[root_rows].sum())
                roots += int(root_rows.sum())
        metrics = {"loss": loss_sum / max(inside, 1), "chain_tau": 1 + accepted / max(roots, 1)}
        for i in range(gamma):
            for k in (1, TOP_K):
                metrics[f"head{i + 1}_top{k}"] = float(hits[i, k - 1] / max(float(counts[i]), 1))
        return metrics

    def _forward(self, sample: Sample, features: SampleHidden) -> torch.Tensor:
        """[gamma, rows, hidden]: every row, or with `root_input` every row but the last (row t reads token
        t + 1, the text's own: the one the labels of rows t + 1 on follow). With `chain_input` head i + 1 at
        row t reads the text's token t + 2 + i, which head i guesses: a run of right guesses feeds each head what
        drafting would (rows whose token is past the text's end are never scored; they read token 0)."""
        hidden = features.hidden.to(self.device, torch.float32)
        config = self.module.config
        if not config.root_input:
            return self.module(hidden)
        ids = torch.tensor(sample.ids, device=self.device)
        with torch.no_grad():
            root = self.embed(ids[1:]).float()
            chain = None
            if config.chain_input:
                ahead = torch.cat([F.pad(ids[2 + i :], (0, 1 + i)) for i in range(config.gamma - 1)])
                chain = self.embed(ahead).float().view(config.gamma - 1, len(ids) - 1, -1)
        return self.module(hidden[:-1], root, chain=chain)

    @property
    def device(self) -> torch.device:
        return self.head.device


def head_labels(labels: torch.Tensor, i: int) -> torch.Tensor:
    """Head i's labels for rows 0 .. length - 2 - i: `labels[t + 1 + i]`, the target's choice for token t + 2 + i."""
    return labels[1 + i :]


def guessed_answer_rows(sample: Sample, i: int, device: torch.device | None = None) -> torch.Tensor:
    """bool [length]: rows t whose head-i guess, token t + 2 + i, is an answer token of the sample."""
    guessed = torch.arange(len(sample), device=device) + 2 + i
    return (guessed >= sample.answer_start) & (guessed < len(sample))
