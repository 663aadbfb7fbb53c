"""Generation metrics as data; bench, CLI and TUI format them.

Definitions (DESIGN §2): tau = committed tokens per target decode step, bonus included (AR = 1.0);
acceptance rate = accepted draft tokens / speculated depth; tokens/s excludes prefill, whose time
(prompt processing up to the first new token) is reported separately.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV was already cached (multi-turn)
    prefill_seconds: float = 0.0  # prompt forward + first token
    decode_seconds: float = 0.0  # every later step, excluding time the consumer held the generator
    new_tokens: int = 0  # all generated tokens, the first (from prefill) included
    decode_tokens: int = 0  # tokens committed by decode steps
    steps: int = 0  # decode steps = target forwards after prefill
    drafted_depth: int = 0  # sum over steps of the proposed tree's depth
    accepted: int = 0  # draft tokens accepted

    @property
    def mean_accepted_length(self) -> float:
        return self.decode_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted_depth if self.drafted_depth else None

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0
