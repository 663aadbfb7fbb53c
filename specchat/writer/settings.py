"""What a book's text is a function of: the model as it runs, the prompt, the target distribution and the
window policy. A resumed book must keep all of them; drafter, draft budget and token count may change
(they change the speed, or where the book ends, never the text). No torch: the CLI checks these first."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields

from specchat.engine.sampling_config import SamplingConfig
from specchat.errors import SpecchatError

# TokenSwift's writing settings (its paper, section 4.1 and appendix B): sampled, min-p 0.1 keeping 20
# tokens, contextual penalty 1.2 over the last 1024 tokens.
TEMPERATURE, MIN_P, MIN_P_KEEP, PENALTY, PENALTY_WINDOW = 1.0, 0.1, 20, 1.2, 1024
SAMPLING = {"temperature": TEMPERATURE, "top_k": 0, "top_p": 1.0, "min_p": MIN_P, "min_p_keep": MIN_P_KEEP,
            "penalty": PENALTY, "penalty_window": PENALTY_WINDOW}  # a book's settings, its seed aside
STORY = (
    "Write a very long novel. Begin with the title, then tell the story chapter by chapter, with named "
    "characters, places, dialogue and vivid detail. Never summarise and never stop: keep the story going."
)


@dataclass(frozen=True)
class BookSettings:
    model: str  # the profile or model name
    weights: str  # how the weights run (e.g. Q4_1): part of the arithmetic
    dtype: str  # activations
    kv_cache: str  # auto (the activations' dtype) | int8: part of the arithmetic too
    yarn: float | None  # the window's YaRN stretch (`--yarn`), None: the model's own RoPE
    prompt_sha256: str  # of the prompt's token ids
    prompt_tokens: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    min_p_keep: int
    penalty: float
    penalty_window: int
    seed: int
    stop_at_eos: bool  # else EOS is never chosen: the book runs to its length
    context: int  # tokens the cache holds, prompt included; a full cache drops the oldest `refill_chunk`
    refill_chunk: int  # generated tokens dropped when the cache is full

    def sampling(self, eos_ids: frozenset[int]) -> SamplingConfig:
        return SamplingConfig(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            min_p_keep=self.min_p_keep, penalty=self.penalty, penalty_window=self.penalty_window, seed=self.seed,
            suppress=() if self.stop_at_eos else tuple(sorted(eos_ids)),
        )  # fmt: skip

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> BookSettings:
        """Exactly a book's fields; a book saved before `--kv-cache` or `--yarn` existed has no `kv_cache` (it was
        auto) or `yarn` (None)."""
        names = {f.name for f in fields(cls)}
        if isinstance(data, dict):
            data = {"kv_cache": "auto", "yarn": None, **data}
        if not isinstance(data, dict) or set(data) != names:
            raise ValueError("its settings are not a book's")
        return cls(**data)

    def differences(self, other: BookSettings) -> list[str]:
        """'name: was A, now B' for each field that differs."""
        return [
            f"{f.name}: was {getattr(self, f.name)!r}, now {getattr(other, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


def prompt_digest(prompt_ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, prompt_ids)).encode()).hexdigest()


def check_same(stored: BookSettings, given: BookSettings) -> None:
    """Refuse to resume a book under settings that would write other text, naming what differs."""
    differences = stored.differences(given)
    if differences:
        raise SpecchatError(
            f"--resume would change the book's text ({'; '.join(differences)}); "
            "resume with the settings it was written with, or write a new book"
        )
