"""Held-out metrics of a drafter that reads the target's cache, on answer rows: the loss with the target's
cache one row behind (as at a tree's first level), and greedy chain acceptance teacher-forced.

While a greedy chain is right its inputs are the text's own tokens, so on a greedy answer the accepted length
from root t is the run of rows t, t + 1, ... whose argmax, with the cache lagging 1, 2, ... rows, equals
the target's greedy token: the chain tau a greedy target would see, by position.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specchat.training.features import Features
from specchat.training.samples import Sample
from specchat.training.vocab import IGNORE_INDEX, draft_vocab_targets

CHAIN_DEPTH = 5  # the depth of held-out chain acceptance (LongSpec's trees are 5 deep)


@torch.no_grad()
def lag_evaluation(logits_at_lag: Callable[[int, int], torch.Tensor], samples: list[Sample], features: Features,
                   draft_vocab: torch.Tensor) -> dict[str, float]:  # fmt: skip
    """`logits_at_lag(index, lag)`: the draft's logits [length, draft vocab] of sample `index`, the target's
    cache ending `lag` rows before each row. Returns the held-out loss (lag 1) and greedy chain tau."""
    loss_sum, rows, accepted, roots = 0.0, 0, 0, 0
    for index, sample in enumerate(samples):
        target_tokens = features.of(index).labels.to(draft_vocab.device, torch.long)
        labels = draft_vocab_targets(target_tokens, draft_vocab)
        scored = answer_rows(sample, draft_vocab.device)
        right = []  # right[d][t]: row t, seeing the target up to t - d - 1, predicts the target's token
        for depth in range(CHAIN_DEPTH):
            logits = logits_at_lag(index, depth + 1)
            right.append(draft_vocab[logits.argmax(dim=-1)] == target_tokens)
            if depth == 0:
                keep = scored & (labels != IGNORE_INDEX)
                loss_sum += float(F.cross_entropy(logits[keep].float(), labels[keep], reduction="sum"))
                rows += int(keep.sum())
        if sample.greedy:
            runs = chain_accepted(torch.stack(right), scored.nonzero().flatten().tolist())
            accepted += sum(runs)
            roots += len(runs)
    return {"loss": loss_sum / max(rows, 1), "chain_tau": 1 + accepted / max(roots, 1)}


def answer_rows(sample: Sample, device: torch.device | None = None) -> torch.Tensor:
    """bool [length]: rows whose next token is an answer token."""
    t = torch.arange(len(sample), device=device)
    return (t + 1 >= sample.answer_start) & (t + 1 < len(sample))


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
