"""What the target samples from: the settings of the logits pipeline, checked (no torch: option checks
import this before anything slow)."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SEED = 2**63 - 1  # a seed is a signed 64-bit integer, as OpenAI's and llama.cpp's are


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    min_p_keep: int = 1  # min-p keeps at least this many of the most likely tokens
    penalty: float = 1.0  # repetition / contextual penalty theta; 1 = off
    penalty_window: int = 1024  # the last W tokens of a row's history are penalised
    frequency_penalty: float = 0.0  # subtracted once per time a token is in the window (OpenAI's, -2 to 2)
    presence_penalty: float = 0.0  # subtracted once from a token in the window (OpenAI's, -2 to 2)
    seed: int | None = None
    suppress: tuple[int, ...] = ()  # token ids never chosen (a book written past the model's end of text)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (id, bias) added to the raw logits (OpenAI's, -100 to 100)

    def __post_init__(self):
        checks = {
            "temperature must be a number >= 0": 0 <= self.temperature < math.inf,
            "top_k must be >= 0": self.top_k >= 0,
            "top_p must be in (0, 1]": 0 < self.top_p <= 1,
            "min_p must be in [0, 1)": 0 <= self.min_p < 1,
            "min_p_keep must be >= 1": self.min_p_keep >= 1,
            "penalty must be a number > 0": 0 < self.penalty < math.inf,
            "penalty_window must be >= 1": self.penalty_window >= 1,
            "frequency_penalty must be in [-2, 2]": -2 <= self.frequency_penalty <= 2,
            "presence_penalty must be in [-2, 2]": -2 <= self.presence_penalty <= 2,
            f"seed must be between 0 and {MAX_SEED}": self.seed is None or 0 <= self.seed <= MAX_SEED,
            "suppressed tokens must be ids >= 0": all(token >= 0 for token in self.suppress),
            "logit_bias takes token ids >= 0 and biases from -100 to 100": all(
                token >= 0 and -100 <= bias <= 100 for token, bias in self.logit_bias),
        }
        for message, ok in checks.items():
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_history(self) -> bool:
        return self.penalty != 1.0 or bool(self.frequency_penalty or self.presence_penalty)
