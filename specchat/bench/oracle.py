"""`specchat bench oracle`: end-to-end speed at a known acceptance, on any target, random weights included.

The oracle drafter knows the text the target writes (a plain run's output, read beforehand) and proposes a chain
of `budget` tokens (a fixed one, or what the engine's adaptive budget asks for), each the target's own with
probability `acceptance`, else one it does not pick (nodes below a wrong one are never accepted). So tau is set by
the benchmark instead of by a trained draft: a model with random weights, for which no draft can be trained, shows
what speculation at a given tau gives on its shapes, and acceptance 0 what verifying trees that are all rejected
costs (at a fixed budget; the adaptive one learns to stop drafting). A benchmark's tool, not a user drafter: it
reads the answer. Every run's output is checked against plain decoding's.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from specchat.bench.progress import NO_PROGRESS
from specchat.bench.runs import Run, engine_run
from specchat.bench.synthetic import check_range, significant
from specchat.engine.budget import MAX_BUDGET
from specchat.engine.drafter import DraftsAlone, TracksCommittedIds
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.tree import DraftTree
from specchat.errors import SpecchatError


class OracleDrafter(DraftsAlone, TracksCommittedIds):
    kind = "oracle"

    def __init__(self, text: list[int], acceptance: float, *, vocab_size: int, seed: int = 0):
        """`text`: the ids the target's plain decoding commits, prompt first."""
        check_acceptance(acceptance)
        self.text, self.acceptance, self.vocab_size = text, acceptance, vocab_size
        self.rng = random.Random(seed)
        self.ids: list[int] = []

    def prefill(self, ids: list[int], hidden, reused: int) -> None:
        self.new_request(ids, reused)

    def propose(self, budget: int, sampling, least_chance: float = 0.0, noise=None) -> DraftTree:
        start = len(self.ids)
        chain = [token if self.rng.random() < self.acceptance else (token + 1) % self.vocab_size
                 for token in self.text[start : start + budget]]  # fmt: skip
        return DraftTree.from_chains([chain], self.kind, budget) if chain else DraftTree.empty()


def check_acceptance(acceptance: float) -> None:
    if not 0 <= acceptance <= 1:
        raise SpecchatError(f"an acceptance is a chance between 0 and 1, not {acceptance}")


def check_oracle_run(acceptances: list[float], budget: int | None, tokens: int, repeats: int = 1) -> None:
    """One line for what `oracle_runs` refuses, before a model is built."""
    for acceptance in acceptances:
        check_acceptance(acceptance)
    if budget is not None:
        check_range("--budget", budget, 1, MAX_BUDGET)
    check_range("--tokens", tokens, 2)
    check_range("--repeats", repeats, 1)


def expected_tau(acceptance: float, budget: int) -> float:
    """Tokens a step commits on average: the bonus, plus each depth's node while all above it were right."""
    return 1 + sum(acceptance**depth for depth in range(1, budget + 1))


@dataclass
class OracleRow:
    acceptance: float | None  # None: plain decoding
    budget: float  # nodes a step asked for: the fixed budget, or the adaptive budget's mean
    expected_tau: float | None  # None at the adaptive budget
    tau: float  # tokens committed per step, measured
    tokens_per_s: float  # decoded tokens per second (prefill excluded)
    vs_plain: float  # tokens_per_s / plain decoding's
    exact: bool  # the output is plain decoding's, token for token


def oracle_runs(engine, prompt: list[int], *, acceptances: list[float], budget: int | None, tokens: int,
                repeats: int = 1, seed: int = 0, step: Callable[[str], None] = NO_PROGRESS,
                ) -> list[OracleRow]:  # fmt: skip
    """Plain decoding of `tokens` tokens after `prompt`, then the same with the oracle at each acceptance (greedy,
    EOS never chosen: every run decodes all its tokens); a short warm-up run first (on a GPU it captures the CUDA
    graphs). `budget` None: the engine's adaptive budget, calibrated on this target as a user's run is. `repeats`
    rounds of every run, interleaved, their times summed: a machine whose memory speeds up or slows down during the
    benchmark moves every run alike instead of whichever ran first."""
    check_oracle_run(acceptances, budget, tokens, repeats)
    greedy = SamplingConfig(suppress=tuple(sorted(engine.eos_ids)))
    engine.set_drafter(None)
    step("warm-up")
    engine_run(engine, prompt, 3, greedy)
    step("plain decoding")
    plain = [engine_run(engine, prompt, tokens, greedy)]
    text, vocab = prompt + plain[0].tokens, engine.model.config.vocab_size
    runs: list[list[Run]] = [[] for _ in acceptances]
    for repeat in range(repeats):
        if repeat:
            step(f"plain decoding, repeat {repeat + 1}/{repeats}")
            engine.set_drafter(None)
            plain.append(engine_run(engine, prompt, tokens, greedy))
        for acceptance, done in zip(acceptances, runs):
            step(f"acceptance {acceptance}" + (f", repeat {repeat + 1}/{repeats}" if repeats > 1 else ""))
            engine.set_drafter(OracleDrafter(text, acceptance, vocab_size=vocab, seed=seed), budget)
            done.append(engine_run(engine, prompt, tokens, greedy))
    engine.set_drafter(None)
    plain_rate = _rate(plain)
    rows = [OracleRow(None, 0, 1.0, 1.0, significant(plain_rate), 1.0, _writes(plain, plain[0].tokens))]
    for acceptance, done in zip(acceptances, runs):
        steps = max(sum(run.steps for run in done), 1)
        asked = budget if budget is not None else significant(sum(run.budget_total for run in done) / steps)
        expected = None if budget is None else significant(expected_tau(acceptance, budget))
        tau = significant(sum(run.decode_tokens for run in done) / steps)
        rate = _rate(done)
        rows.append(OracleRow(acceptance, asked, expected, tau, significant(rate), significant(rate / plain_rate),
                              _writes(done, plain[0].tokens)))  # fmt: skip
    return rows


def _writes(runs: list[Run], text: list[int]) -> bool:
    return all(run.tokens == text for run in runs)


def _rate(runs: list[Run]) -> float:
    """Decoded tokens per second over `runs` together."""
    return sum(run.decode_tokens for run in runs) / sum(run.decode_seconds for run in runs)


def word_tokenizer(vocab_size: int, eos: int | None = None):
    """A word-level tokenizer whose token i is `<i>`: what a random-weight model's text is written with (it has
    no tokenizer of its own)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab_size)}, unk_token="<0>"))
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token=None if eos is None else f"<{eos}>")
