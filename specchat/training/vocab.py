"""A reduced draft vocabulary (FR-Spec): the drafter's head scores only the most frequent target tokens.

The LM head is most of a small drafter's cost at a large vocabulary; the tokens it drops are rare enough that
the acceptance lost is small. The draft vocabulary is a sorted LongTensor of target token ids; the draft's
logits are indexed by position in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

IGNORE_INDEX = -100  # the cross-entropy ignore index: a target the draft vocabulary cannot produce


def frequent_tokens(token_lists: Iterable[Sequence[int]], size: int, vocab_size: int,
                    always: Iterable[int] = ()) -> torch.Tensor:  # fmt: skip
    """The draft vocabulary: `size` token ids, sorted ascending, as LongTensor.

    The ids in `always` (EOS, so the draft can stop) come first, then the most frequent ids over
    `token_lists`, ties going to the lower id. Size 0, or one >= `vocab_size`, is the full vocabulary.
    """
    if size <= 0 or size >= vocab_size:
        return torch.arange(vocab_size)
    always_ids = torch.tensor(sorted(set(always)), dtype=torch.long)
    if len(always_ids) > size:
        raise ValueError(f"{len(always_ids)} ids must always be in a draft vocabulary of {size}")
    tokens = torch.tensor([token for tokens in token_lists for token in tokens], dtype=torch.long)
    for name, ids in (("token", tokens), ("always", always_ids)):
        if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"{name} ids must lie in 0..{vocab_size - 1}")
    counts = torch.bincount(tokens, minlength=vocab_size)
    counts[always_ids] = -1  # already taken; never picked twice
    by_frequency = torch.sort(counts, descending=True, stable=True).indices  # stable: ties keep the lower id first
    chosen = torch.cat([always_ids, by_frequency[: size - len(always_ids)]])
    return torch.sort(chosen).values


def draft_vocab_targets(targets: torch.Tensor, draft_vocab: torch.Tensor) -> torch.Tensor:
    """Target token ids to their index in the (sorted) `draft_vocab`, IGNORE_INDEX for ids not in it."""
    index = torch.searchsorted(draft_vocab, targets).clamp(max=len(draft_vocab) - 1)
    return torch.where(draft_vocab[index] == targets, index, IGNORE_INDEX)
