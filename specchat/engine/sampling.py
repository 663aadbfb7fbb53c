"""The logits pipeline that defines the target distribution: logit bias, penalties, temperature, top-k, top-p, min-p.

Speculative verification draws from exactly this distribution at every tree node (`keyed_draws.py`), so spec decoding
and autoregressive decoding share one definition. History-dependent steps
(the penalty window) take each row's own history, which for a tree node is the committed text plus the node's
ancestors.
"""

from __future__ import annotations

import functools

import torch

from specchat.engine.events import TokenLogprob
from specchat.engine.host_data import to_device, to_host
from specchat.engine.sampling_config import SamplingConfig

NUCLEUS_ROOM = 256  # the largest logits top-p alone looks among on a CPU before sorting the vocabulary


def token_logprobs(processed: torch.Tensor, rows: list[int], tokens: list[int], top: int) -> list[TokenLogprob]:
    """Each token's log-probability at its row of `processed` logits, with the `top` most likely ids there."""
    logprobs = processed[rows].float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, to_device(tokens, logprobs.device)[:, None])[:, 0]
    values, ids = logprobs.topk(top, dim=-1) if top else (logprobs[:, :0], logprobs[:, :0].long())
    return [TokenLogprob(lp, list(zip(i, v))) for lp, i, v in zip(*to_host(chosen, ids, values))]


def apply_penalty_(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive (multiply negative) logits of tokens seen in each row's history by `penalty`, in place.

    Only the seen tokens' logits are read and written (a tree of 40 rows over a 49K vocabulary would
    otherwise spend milliseconds on full-width masks).

    Args:
        logits: [n, vocab]
        history: [n, W] token ids, -1 = padding (rows may have shorter histories)
    """
    history = history.to(logits.device)
    fill = history.max(dim=1, keepdim=True).values  # a token the row has seen; -1: it has seen none
    index = torch.where(history >= 0, history, fill).clamp(min=0)  # padding repeats a seen token
    seen = logits.gather(1, index)
    penalised = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter_(1, index, torch.where(fill >= 0, penalised, seen))


def apply_occurrence_penalties(logits: torch.Tensor, history: torch.Tensor, frequency: float,
                               presence: float) -> torch.Tensor:  # fmt: skip
    """OpenAI's additive penalties: subtract `frequency` times the count of each token in the row's history and
    `presence` once from each token in it (history [n, W], -1 padding), as llama.cpp counts them over its window."""
    seen = history >= 0
    counts = torch.zeros_like(logits).scatter_add_(1, history.clamp(min=0), seen.to(logits.dtype))
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # [n, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches p (a token is kept while the mass
    strictly above it is still < p). Tied tokens have the same mass above them, so they are kept or dropped
    together, whatever order a sort leaves them in."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    drop_sorted = _outside_nucleus(sorted_logits, sorted_logits.softmax(dim=-1), p)
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _outside_nucleus(sorted_logits: torch.Tensor, probs: torch.Tensor, p: float) -> torch.Tensor:
    """Which of the logits sorted descending [n, m], of probabilities `probs`, top-p drops: those whose tie group
    has a mass of at least p above it."""
    positions = torch.arange(sorted_logits.shape[-1], device=sorted_logits.device).expand_as(sorted_logits)
    starts = torch.ones_like(sorted_logits, dtype=torch.bool)
    starts[:, 1:] = sorted_logits[:, 1:] != sorted_logits[:, :-1]
    first_of_tie = torch.where(starts, positions, 0).cummax(dim=-1).values
    mass_above = (probs.cumsum(dim=-1) - probs).gather(1, first_of_tie)
    return mass_above >= p


def apply_min_p(logits: torch.Tensor, min_p: float, keep: int = 1) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's, keeping at least the
    `keep` most likely (TokenSwift writes with min-p 0.1 and keeps 20; ties with the keep-th are kept too)."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    if keep > 1:
        threshold = torch.minimum(threshold, torch.topk(probs, min(keep, probs.shape[-1]), dim=-1).values[:, -1:])
    return logits.masked_fill(probs < threshold, float("-inf"))


class Processed:
    """Processed rows of target logits: their softmax (or argmax, when greedy) is the target distribution.

    Where the pipeline found every row's support among a few of its largest logits (top-k's survivors, the nucleus),
    it keeps those alone, `values` [n, m] (-inf where dropped) at token ids `tokens` [n, m], and writes the whole
    rows (`logits`, -inf past the survivors) only when asked: a draw reads the survivors, where writing rows of 152K
    logits and scanning them again for the few dozen it may take cost a CPU milliseconds a step."""

    def __init__(self, logits: torch.Tensor | None = None, *,
                 survivors: tuple[torch.Tensor, torch.Tensor] | None = None, vocab: int = 0):  # fmt: skip
        self._logits = logits
        self.values, self.tokens = survivors if survivors is not None else (None, None)
        self.vocab = logits.shape[-1] if logits is not None else vocab

    @property
    def logits(self) -> torch.Tensor:
        """The whole processed rows [n, vocab]."""
        if self._logits is None:
            rows = torch.full((self.values.shape[0], self.vocab), float("-inf"), device=self.values.device)
            self._logits = rows.scatter_(1, self.tokens, self.values)
        return self._logits


@functools.lru_cache(maxsize=64)
def setting_on(values: tuple, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A sampling setting's ids or values on `device`, copied there once (a request's steps read the same tensor,
    and so can a CUDA graph captured after its warm-up). Read only."""
    return to_device(values, device, dtype)


def process_logits(logits: torch.Tensor, config: SamplingConfig, history: torch.Tensor | None = None, *,
                   drafting: bool = False) -> torch.Tensor:  # fmt: skip
    """Raw logits [n, vocab] -> the processed logits whose softmax (or argmax, when greedy) is the target.

    `drafting`: a draft's distribution, which need only be the one drafted from (verification weighs each token by
    the target's own): top-k keeps its 2k largest without looking further for ties with the k-th, a look that
    would make the host wait for the device."""
    return process_rows(logits, config, history, drafting=drafting).logits


def process_rows(logits: torch.Tensor, config: SamplingConfig, history: torch.Tensor | None = None, *,
                 drafting: bool = False) -> Processed:  # fmt: skip
    """`process_logits`, with the survivors the draw may take where the pipeline found them (`Processed`)."""
    penalised = config.uses_history and history is not None
    edited = bool(config.logit_bias or config.suppress or penalised)
    logits = logits.to(torch.float32, copy=edited)  # the edits write in place, on one copy of the rows
    if config.logit_bias:
        ids, biases = zip(*config.logit_bias)
        bias = setting_on(biases, logits.device, logits.dtype).expand(logits.shape[0], -1)
        logits.index_add_(1, setting_on(ids, logits.device, torch.long), bias)
    if config.suppress:
        logits.index_fill_(1, setting_on(config.suppress, logits.device, torch.long), float("-inf"))
    if penalised:
        if config.penalty != 1.0:
            apply_penalty_(logits, history, config.penalty)
        if config.frequency_penalty or config.presence_penalty:
            logits = apply_occurrence_penalties(logits, history, config.frequency_penalty, config.presence_penalty)
    if config.greedy:
        return Processed(logits)
    if 0 < config.top_k < logits.shape[-1]:
        survivors = _top_k_survivors(logits, config.top_k, config.temperature, checked=not drafting)
        if survivors is not None:
            values, indices = survivors
            return Processed(survivors=(_top_p_then_min_p(values, config), indices), vocab=logits.shape[-1])
        return Processed(_top_p_then_min_p(apply_top_k(logits / config.temperature, config.top_k), config))
    if config.temperature != 1.0:  # a division by 1 changes no bit: the rows are not copied for it
        logits = logits / config.temperature
    if logits.device.type == "cpu" and NUCLEUS_ROOM < logits.shape[-1]:
        survivors = None
        if config.top_p < 1.0:
            survivors = _nucleus_survivors(logits, config.top_p)
            if survivors is not None:
                values, indices = survivors
                survivors = apply_min_p(values, config.min_p, config.min_p_keep), indices
        elif config.min_p > 0:
            survivors = _min_p_survivors(logits, config.min_p, config.min_p_keep)
        if survivors is not None:
            return Processed(survivors=survivors, vocab=logits.shape[-1])
    return Processed(_top_p_then_min_p(logits, config))


def _top_p_then_min_p(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    return apply_min_p(apply_top_p(logits, config.top_p), config.min_p, config.min_p_keep)


def _top_k_survivors(logits: torch.Tensor, k: int, temperature: float,
                     checked: bool = True) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """The logits / `temperature` top-k keeps, -inf among them where a larger set was searched, and their token ids;
    None when ties with the k-th reach past the 2k largest (unless not `checked`: then those past it are dropped).

    Top-p and min-p then run over these alone: the tokens top-k drops have probability 0 in every later step,
    so the survivors are the whole distribution, and sorting them instead of the vocabulary saves ~10 ms a row
    at 128K tokens. Top-k keeps every token tied with the k-th, and bf16 logits tie often, hence the 2k. The
    temperature divides the 2k largest alone: a division keeps the logits' order, and a tie it makes with the k-th
    past them shows as one at the last."""
    room = min(2 * k, logits.shape[-1])
    values, indices = torch.topk(logits, room, dim=-1)  # sorted, most likely first
    values = values / temperature
    kth = values[:, k - 1 : k]
    if checked and room < logits.shape[-1] and bool((values[:, -1:] == kth).any()):
        return None
    return values.masked_fill(values < kth, float("-inf")), indices


def _nucleus_survivors(logits: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Top-p without a top-k, from the NUCLEUS_ROOM largest logits: those it keeps, -inf among them where it drops,
    and their token ids; None where some row's nucleus may reach past them. Two CPU cores sort a row of 128K logits in
    ~10 ms, a top-256 in 0.2; a nucleus is rarely more than a few dozen tokens. Their probabilities are taken over
    the whole vocabulary, by a softmax: `logsumexp`'s exp runs ~5x slower on a CPU, and ~50x where a low temperature
    sends the tail's exponentials below float32's normal range (T 0.2: 3 ms a row of 152K).

    A token past the room has above it every token of the room whose value is above the room's last: where their
    mass reaches p, top-p drops it, and the last value's ties."""
    values, indices, probs = _room(logits)
    above_last = torch.where(values > values[:, -1:], probs, 0).sum(dim=-1)
    if bool((above_last < p).any()):  # a read: on a CPU, free
        return None
    return values.masked_fill(_outside_nucleus(values, probs, p), float("-inf")), indices


def _room(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The NUCLEUS_ROOM largest logits of each row, most likely first, their token ids and their probabilities over
    the whole row."""
    values, indices = torch.topk(logits, NUCLEUS_ROOM, dim=-1)
    return values, indices, logits.softmax(dim=-1).gather(1, indices)


def _min_p_survivors(logits: torch.Tensor, min_p: float, keep: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Min-p alone (TokenSwift's writing), from the NUCLEUS_ROOM largest logits: those it keeps, -inf among them where
    it drops, and their token ids; None where some row's survivors may reach past them. Their probabilities are the
    whole row's softmax, as `apply_min_p` takes them, so the same tokens survive; a token past the room is no likelier
    than the room's last, which it drops."""
    values, indices, probs = _room(logits)
    threshold = min_p * probs[:, :1]
    if keep > 1:
        threshold = torch.minimum(threshold, probs[:, min(keep, NUCLEUS_ROOM) - 1 :][:, :1])
    dropped = probs < threshold
    if not bool(dropped[:, -1].all()):  # a read: on a CPU, free
        return None
    return values.masked_fill(dropped, float("-inf")), indices
