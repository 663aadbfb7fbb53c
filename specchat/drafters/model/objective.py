"""A standalone draft model's training objective: the student (the target's first layers, retrained) run
causally over a sample, its final states scored through the target's frozen LM head.

- Plain causal training at the sample's own positions 0..n-1: a standalone draft reads no target cache, so
  there is no lag or anchor offset to simulate; row t sees the tokens up to t and guesses token t + 1.
- The label at row t is the target's greedy next token (`features.labels`), at every row, prompt rows too,
  as the LongSpec and GLIDE objectives take it: what a greedy target accepts, free of sampled answers' noise.
- The loss is cross-entropy over the draft vocabulary: only its rows of the LM head are multiplied.

Held-out evaluation: `lag_evaluation`. A standalone draft sees no target cache, so its logits are the same at
every lag; the greedy chain from root t is accepted while rows t, t + 1, ... guess the target's token.
"""

from __future__ import annotations

import random
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from specchat.architectures import parts
from specchat.training.features import Features, SampleFeatures
from specchat.training.lag_evaluation import lag_evaluation
from specchat.training.samples import Sample
from specchat.training.vocab import IGNORE_INDEX, draft_vocab_targets


class ModelDrafterObjective:
    """Loss and held-out metrics of a student whose embedding and LM head are the target's."""

    def __init__(self, student: nn.Module, draft_vocab: torch.Tensor):
        """`student` a transformers `*ForCausalLM`, `draft_vocab` the ids the loss is taken over (sorted; all of
        them for the full vocabulary)."""
        self.student, decoder = student, parts(student)
        # what trains and what a training state holds: the student's own modules, not the shared embedding and head
        self.module = nn.ModuleDict({"layers": decoder.layer_modules, "norm": decoder.norm})
        self.draft_vocab = draft_vocab.to(self.device)
        self.head = decoder.head.weight.detach()[self.draft_vocab]

    def loss(self, sample: Sample, features: SampleFeatures, _rng: random.Random):
        """Summed cross-entropy over the sample's rows, and how many rows were scored (those whose target token
        the draft vocabulary holds)."""
        labels = draft_vocab_targets(features.labels.to(self.device, torch.long), self.draft_vocab)
        loss = F.cross_entropy(self.logits(sample).float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
        return loss, int((labels != IGNORE_INDEX).sum())

    @torch.no_grad()
    def evaluate(self, samples: list[Sample], features: Features) -> dict[str, float]:
        """Held-out loss and greedy chain tau (`lag_evaluation`), each sample's logits computed once."""
        logits = lru_cache(maxsize=1)(lambda index: self.logits(samples[index]))
        return lag_evaluation(lambda index, _lag: logits(index), samples, features, self.draft_vocab)

    def logits(self, sample: Sample) -> torch.Tensor:
        """The student's logits [length, draft vocab]: row t guesses token t + 1."""
        ids = torch.tensor([sample.ids], device=self.device)
        return self.student.model(input_ids=ids, use_cache=False).last_hidden_state[0] @ self.head.T

    @property
    def device(self) -> torch.device:
        return parts(self.student).head.weight.device
