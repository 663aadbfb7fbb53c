"""The target's choice at a verified row: its argmax when greedy, else a draw keyed by the row's place in the text.

Every sampled draw is the exponential race argmax p / E with E keyed by (seed, text index, token) (`PositionNoise`): a
token then depends on its own distribution and its place alone, so every drafter's trees, however sized, and plain
decoding draw the same text for one seed, and a drafter can guess the draws by racing its own distribution under the
same noise (`guess`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specchat.engine.host_data import to_device
from specchat.engine.sampling import Processed

GUESS_POOL = 32  # the likeliest tokens of a draft distribution its guesses at keyed draws are chosen among


def choose(processed: Processed, noise: PositionNoise | None,
           indices: list[int] | torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """The target's choice at each processed row [n]: its argmax when greedy (no `noise`; `indices` unread), else its
    keyed draw as the token at text index `indices[i]` (`PositionNoise.choose`)."""
    if noise is None:
        return processed.logits.argmax(dim=-1)
    return noise.choose(processed, indices)


class PositionNoise:
    """The exponential race with noise that depends on (seed, index of the token in the text, token) alone.

    A sampled token then depends on nothing but its own distribution and where it stands: autoregressive
    decoding and every drafter's trees choose the same tokens (a node's draw is the draw autoregressive
    decoding makes at that index, whatever the tree around it), and a text can be continued in another
    process, after its KV cache was rebuilt, as if it had never stopped. The noise is a counter-based hash
    (splitmix64), independent across indices and tokens, so the output is distributed exactly as the
    target's sampling; a CPU computes it only where a row's distribution is not zero (min-p or top-p leave a
    few dozen tokens of 49K). A drafter that knows the noise guesses the draws by racing its own distribution
    under it (`guess`).
    """

    def __init__(self, seed: int, offset: int = 0):
        self.seed = _signed(_splitmix(seed))
        self.offset = offset

    def choose(self, processed: Processed, indices: list[int] | torch.Tensor, *,
               dense: bool | None = None) -> torch.Tensor:  # fmt: skip
        """One token per processed row [n, vocab], row i being the token at text index `indices[i]` (+ offset): the
        race argmax p / E, E ~ Exp(1) keyed by (seed, index, token), run in logs (argmax logit - log E: a row's
        normaliser changes no winner); [n] on the logits' device.

        Where the pipeline kept a few survivors, they alone race. Else a CPU scans for the tokens any row may take
        and computes their noise alone, and a GPU (`dense`) races every token at once without reading anything back,
        so the step's one wait stays its acceptance. A token's score is the same whichever way (its logit in float64
        less its noise's log), and a token at -inf never wins."""
        if processed.tokens is not None:
            rows = indices[:, None] if isinstance(indices, torch.Tensor) else indices
            scores = processed.values.double() - self.exponential(rows, processed.tokens).log()
            return processed.tokens.gather(1, scores.argmax(dim=-1, keepdim=True))[:, 0]
        logits = processed.logits
        if dense is None:
            dense = logits.device.type != "cpu"
        if dense:
            indices = indices if isinstance(indices, torch.Tensor) else to_device(indices, logits.device, torch.long)
            vocab = torch.arange(logits.shape[-1], device=logits.device)
            return (logits.double() - self.exponential(indices[:, None], vocab[None]).log()).argmax(dim=-1)
        indices = indices.tolist() if isinstance(indices, torch.Tensor) else indices
        support = (logits.amax(dim=0) > float("-inf")).nonzero()[:, 0]  # tokens some row may take: one scan
        candidates = logits[:, support].double()  # a token no row at an index may take is at -inf there
        rows_at: dict[int, list[int]] = {}  # the rows at each index (a tree's nodes of one depth share theirs)
        for row, index in enumerate(indices):
            rows_at.setdefault(index, []).append(row)
        choices = [0] * len(indices)
        for index, rows in rows_at.items():
            noise = self.exponential(index, support)
            for row, token in zip(rows, support[(candidates[rows] - noise.log()).argmax(dim=1)].tolist()):
                choices[row] = token
        return torch.tensor(choices)

    def guess(self, probs: torch.Tensor, indices: list[int], width: int,
              target_ids: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A drafter's best guesses at the keyed draws: the `width` tokens of each row of drafting probabilities
        `probs` [n, m] that win the race p / E at row i's text index `indices[i]` (among its GUESS_POOL likeliest),
        each with its chance of winning if the target's log-probabilities were the draft's plus Gumbel noise (its
        race value over the pool's sum), as `topk` gives them: (chances, columns) [n, width]. `target_ids` maps
        columns of a draft vocabulary to the target's ids, by which the noise is keyed.

        Where the target samples a broad distribution, its choice is the draft's likeliest token only as often as
        that token's probability; the token that wins the race under the same noise is its choice wherever the two
        distributions agree."""
        return guess_keyed(probs, self.keys(indices, probs.device), width, target_ids)

    def key(self, index: int) -> int:
        """The key of text index `index` (+ offset): the draws there race under `keyed_exponential(key, tokens)`."""
        return _signed(_splitmix(self.seed ^ (index + self.offset)))

    def keys(self, indices: list[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
        """The keys of `indices` as a column [n, 1] on `device` (a tensor of indices: on its own device)."""
        if not isinstance(indices, torch.Tensor):  # copied without a wait: a drafter's guesses queue behind its work
            indices = to_device(indices, device, torch.long)[:, None]
        return _mix_tensor((self.seed ^ (indices + self.offset)) + _GOLDEN)  # splitmix64 of seed ^ index

    def exponential(self, index: int | list[int] | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Exp(1) noise of `tokens` at text `index` (+ offset): one index, one a row of `tokens` [n, m] (a list), or
        any indices broadcast against `tokens` (a tensor, on its device)."""
        if isinstance(index, int):  # one key: the host hashes it faster than a tensor's operations would
            keys = torch.tensor(self.key(index), device=tokens.device)
        else:
            keys = self.keys(index, tokens.device)
        return keyed_exponential(keys, tokens)


def keyed_exponential(keys: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise of `tokens` under `keys` (`PositionNoise.key`, broadcast against `tokens`): float64 uniforms in
    (0, 1), then -log."""
    bits = _mix_tensor(keys + tokens.long() * _GOLDEN)
    uniform = ((bits >> 11) & ((1 << 53) - 1)).double() * 2.0**-53 + 2.0**-54
    return -torch.log(uniform)


def guess_keyed(probs: torch.Tensor, keys: torch.Tensor, width: int,
                target_ids: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`PositionNoise.guess` with row i's draws keyed by `keys[i]` [n, 1]: keys a device buffer holds, so that a CUDA
    graph replays the guess for any text index and seed."""
    pool = probs.topk(min(GUESS_POOL, probs.shape[-1]), dim=-1)
    ids = pool.indices if target_ids is None else target_ids(pool.indices)
    races = pool.values.double() / keyed_exponential(keys, ids)
    best = races.topk(min(width, races.shape[-1]), dim=-1)
    chances = best.values / races.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(races.dtype).tiny)
    return chances.to(probs.dtype), pool.indices.gather(1, best.indices)


_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15 as a signed 64-bit integer


def _splitmix(x: int) -> int:
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def _mix_tensor(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps; shifts made logical)."""
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _signed(0x94D049BB133111EB)
    return z ^ ((z >> 31) & ((1 << 33) - 1))
