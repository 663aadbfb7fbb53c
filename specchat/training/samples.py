"""Training samples: a data record's conversation and the target's answer as one token sequence.

A drafter learns to predict the target's answer, so the loss counts only the rows whose next token is an
answer token; the prompt is context (what the target's cache holds at inference). Samples are capped at
LongSpec's 1200 tokens: a longer one keeps its end (the answer and the prompt's last part).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

MAX_SAMPLE_TOKENS = 1200  # LongSpec trains on samples up to this long, placed at large positions by anchor offsets


@dataclass(frozen=True)
class Sample:
    ids: tuple[int, ...]
    answer_start: int  # ids[answer_start:] are the target's own tokens
    greedy: bool  # the answer is the target's greedy output (what a greedy drafter must match exactly)

    def __len__(self) -> int:
        return len(self.ids)


def sample_of(record: dict, max_tokens: int = MAX_SAMPLE_TOKENS) -> Sample:
    ids = list(record["prompt_ids"]) + list(record["answer_ids"])
    answer_start = len(record["prompt_ids"])
    cut = max(0, len(ids) - max_tokens)
    return Sample(tuple(ids[cut:]), max(1, answer_start - cut), record["sampling"] == "greedy")


def samples_of(records: Iterable[dict], max_tokens: int = MAX_SAMPLE_TOKENS) -> list[Sample]:
    """One sample a record with an answer, in record order."""
    return [sample_of(record, max_tokens) for record in records if record["answer_ids"]]


def fingerprint(samples: Iterable[Sample]) -> str:
    """A digest of the samples' tokens: features computed for other samples are never reused."""
    digest = hashlib.sha1()
    for sample in samples:
        digest.update(len(sample.ids).to_bytes(4, "little"))
        digest.update(b"".join(token.to_bytes(4, "little") for token in sample.ids))
    return digest.hexdigest()
