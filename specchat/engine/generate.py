"""The decode loop: prefill, then one target step at a time, yielding a `StepEvent` per step.

The engine owns the session's static KV cache and the committed token ids. Prompts that extend what is
already committed (a chat's next turn) only prefill their new suffix.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from specchat.engine.cache import TreeCache
from specchat.engine.sampling import SamplingConfig, make_generator, process_logits, sample
from specchat.engine.stats import GenerationStats
from specchat.engine.text import TextStream
from specchat.errors import SpecchatError

TARGET = "target"  # origin of a token produced by the target model itself


@dataclass(frozen=True)
class StepEvent:
    tokens: list[int]  # token ids committed by this step
    origins: list[str]  # per token: TARGET, or the kind of drafter that proposed it
    text: str  # printable text delta (may lag the tokens by an incomplete character or a stop-string prefix)
    finish_reason: str | None  # None while running, then "eos" | "stop" | "length"
    stats: GenerationStats  # the running totals of this generation


class Engine:
    """Generates with one target model over a cache of `max_len` slots, allocated once."""

    def __init__(self, model, tokenizer, *, max_len: int | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.context_window = model.config.max_position_embeddings
        self.max_len = min(max_len or self.context_window, self.context_window)
        self.device = model.get_input_embeddings().weight.device
        self.eos_ids = _eos_ids(model, tokenizer)
        self.cache = TreeCache(model.config.num_hidden_layers, self.max_len)
        self.ids = torch.zeros(self.max_len + 1, dtype=torch.long, device=self.device)  # committed ids
        self.length = 0  # committed ids; the cache holds all but the last (the root)

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingConfig = SamplingConfig(),
        max_new_tokens: int = 512,
        stop: tuple[str, ...] = (),
    ) -> Iterator[StepEvent]:
        if not prompt_ids:
            raise SpecchatError("the prompt is empty")
        if max_new_tokens < 1:
            raise SpecchatError("max_new_tokens must be at least 1")
        if len(prompt_ids) >= self.max_len:
            raise SpecchatError(
                f"the prompt has {len(prompt_ids)} tokens; the context holds {self.max_len}"
            )
        budget = min(max_new_tokens, self.max_len + 1 - len(prompt_ids))
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        generator = make_generator(sampling, self.device)
        stream = TextStream(self.tokenizer, stop)

        start = time.perf_counter()
        logits = self._prefill(prompt_ids, stats)
        token = self._choose(logits, sampling, generator)
        stats.prefill_seconds = time.perf_counter() - start
        event = self._commit([token], [TARGET], stats, stream, budget)
        yield event
        while event.finish_reason is None:
            start = time.perf_counter()
            logits = self._forward(self.ids[self.length - 1 : self.length])
            self.cache.commit()
            token = self._choose(logits, sampling, generator)
            stats.steps += 1
            stats.decode_seconds += time.perf_counter() - start
            event = self._commit([token], [TARGET], stats, stream, budget)
            stats.decode_tokens += len(event.tokens)
            yield event

    def _prefill(self, prompt_ids: list[int], stats: GenerationStats) -> torch.Tensor:
        """Feed the prompt, reusing the cached KV of the longest prefix it shares with the session."""
        prompt = torch.tensor(prompt_ids, dtype=torch.long, device=self.device)
        shared = 0
        if self.cache.length:
            limit = min(self.cache.length, len(prompt_ids) - 1)
            same = (self.ids[:limit] == prompt[:limit]).int()
            shared = int(same.cumprod(0).sum()) if limit else 0
        self.cache.truncate(shared)
        stats.reused_tokens = shared
        self.ids[: len(prompt_ids)] = prompt
        self.length = len(prompt_ids)
        logits = self._forward(prompt[shared:], last_only=True)
        self.cache.commit()
        return logits

    def _forward(self, tokens: torch.Tensor, *, last_only: bool = False) -> torch.Tensor:
        """Run the target over `tokens` [q] placed right after the cached prefix -> logits [q or 1, vocab]."""
        start = self.cache.length
        positions = torch.arange(start, start + tokens.shape[0], device=self.device)
        out = self.model(
            input_ids=tokens[None],
            position_ids=positions[None],
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        return out.logits[0]

    def _choose(self, logits: torch.Tensor, sampling: SamplingConfig, generator) -> int:
        history = None
        if sampling.uses_history:
            history = self.ids[max(0, self.length - sampling.penalty_window) : self.length][None]
        processed = process_logits(logits[-1:], sampling, history)
        return int(sample(processed, sampling, generator)[0])

    def _commit(self, tokens, origins, stats, stream, budget) -> StepEvent:
        """Append tokens to the committed ids (cutting at EOS or the budget) and build the step's event."""
        finish = None
        for i, token in enumerate(tokens):
            if token in self.eos_ids:
                finish, tokens, origins = "eos", tokens[: i + 1], origins[: i + 1]
                break
        if stats.new_tokens + len(tokens) >= budget:
            keep = budget - stats.new_tokens
            finish, tokens, origins = finish or "length", tokens[:keep], origins[:keep]
        self.ids[self.length : self.length + len(tokens)] = torch.tensor(tokens, device=self.device)
        self.length += len(tokens)
        stats.new_tokens += len(tokens)
        text = stream.add(tokens)
        if stream.stopped:
            finish = "stop"
        if finish:
            text += stream.flush()
        return StepEvent(tokens, origins, text, finish, stats)


def _eos_ids(model, tokenizer) -> frozenset[int]:
    """Every id that ends generation: the generation config's EOS ids plus the tokenizer's."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return frozenset(ids)
