"""What the decode loop yields per step: committed tokens, where each came from, text and running stats.

Kept apart from the loop so a UI can name origins and read events without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.engine.stats import GenerationStats

TARGET = "target"  # origin of a token produced by the target model itself
COPY = "copy"  # origin of n-gram lookup's copies of a long passage (specchat/drafters/ngram/drafter.py)
ANSWERS = "answers"  # origin of its guesses from the target's own answers (specchat/drafters/ngram/answer_store.py)
KNOWN = "known"  # origin of a token the text was known to go on with (`Engine.generate(known=...)`)
FORCED = "forced"  # origin of a token a constraint left no choice about (`Constraint.forced`)


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability under the distribution it was chosen from (the processed logits of
    its row: penalty, temperature and filters applied), and the most likely ids there with theirs."""

    logprob: float
    top: list[tuple[int, float]]  # (id, logprob), most likely first


@dataclass(frozen=True)
class StepEvent:
    tokens: list[int]  # token ids committed by this step
    origins: list[str]  # per token: TARGET, or the kind of drafter that proposed it
    text: str  # printable text delta (may lag the tokens by an incomplete character or a stop-string prefix)
    finish_reason: str | None  # None while running, then "eos" | "stop" | "length" | "context" (the cache is full)
    stats: GenerationStats  # the running totals of this generation
    logprobs: list[TokenLogprob] | None = None  # per token, when `generate(logprobs=...)` asks
