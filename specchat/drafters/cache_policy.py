"""What a draft reads of a long context (`--draft-cache full|streaming|retrieval`): a standalone draft model
of its own cache, LongSpec's cross-attention of the target's.

- **full**: every position, at its true position (the baseline).
- **streaming**: attention sinks and the most recent tokens (StreamingLLM).
- **retrieval** (SpecExtend's Cross-model Retrieval): the context in chunks of 32, ranked by the target's own
  attention: when a text starts and every 4 steps, the target's last-layer attention row of the newest
  position in its cache (one q.K row of the last forward, averaged over heads), each chunk scored by its
  mean; the top 32 chunks and the newest one make the working cache. Without a row, the most recent chunks.

Streaming and retrieval read the same number of positions (33 chunks of 32), so they cost the same.
A policy says when the working cache is laid out again and which stored positions it then holds; between
layouts, new positions are appended (`working_cache.py`).
"""

from __future__ import annotations

import torch

from specchat.architectures import parts
from specchat.drafters import DRAFT_CACHES

CHUNK = 32
TOP_CHUNKS = 32
RETRIEVE_EVERY = 4  # steps
SINKS = 4
READ = (TOP_CHUNKS + 1) * CHUNK  # positions a streaming or retrieval draft reads, new ones aside
BLOCK = 512  # committed rows one draft forward takes at most: a long prompt goes in blocks
SLOTS = READ + BLOCK + 64  # working slots: a layout, then at most a block or a few steps' tokens appended


class FullCache:
    name = "full"

    def working_slots(self, capacity: int) -> int:
        return capacity

    def select(self, length: int, *, force: bool = False) -> torch.Tensor | None:
        return torch.arange(length) if force else None


class StreamingCache:
    """The first SINKS positions and the most recent ones, laid out again each time CHUNK have been appended."""

    name = "streaming"

    def __init__(self, sinks: int = SINKS, read: int = READ):
        self.sinks, self.recent = sinks, read - sinks
        self.laid_out_at = 0  # the length at the last layout

    def working_slots(self, capacity: int) -> int:
        return min(capacity, SLOTS)

    def select(self, length: int, *, force: bool = False) -> torch.Tensor | None:
        if not force and length - self.laid_out_at < CHUNK:
            return None
        self.laid_out_at = length
        if length <= self.sinks + self.recent:
            return torch.arange(length)
        return torch.cat([torch.arange(self.sinks), torch.arange(length - self.recent, length)])


class RetrievalCache:
    """The top chunks by the target's attention, and the newest chunk, chosen every RETRIEVE_EVERY steps and
    whenever a text starts (the prefill's last row has a query too).

    `attention()` is the target's attention row of the newest position in its cache, averaged over heads
    [positions], or None where the target has none to give."""

    name = "retrieval"

    def __init__(self, attention, *, chunk: int = CHUNK, top: int = TOP_CHUNKS, every: int = RETRIEVE_EVERY):
        self.attention, self.chunk, self.top, self.every = attention, chunk, top, every
        self.steps = 0

    def working_slots(self, capacity: int) -> int:
        return min(capacity, SLOTS)

    def select(self, length: int, *, force: bool = False) -> torch.Tensor | None:
        """`force`: a new text, or a long prompt between blocks."""
        self.steps = 0 if force else self.steps + 1
        if self.steps % self.every:
            return None
        scores = self.attention()
        return (recent_chunks(length, self.chunk, self.top) if scores is None
                else rank_chunks(scores, length, self.chunk, self.top))


def recent_chunks(length: int, chunk: int, top: int) -> torch.Tensor:
    """The newest chunk (partial or whole) and the `top` before it."""
    newest = (length - 1) // chunk if length else 0
    return torch.arange(max(0, newest - top) * chunk, length)


def rank_chunks(scores: torch.Tensor, length: int, chunk: int = CHUNK, top: int = TOP_CHUNKS) -> torch.Tensor:
    """Positions of the `top` chunks of [0, length) with the highest mean score, in order, then the newest chunk
    (the one holding position length - 1, and anything after it).

    `scores` [n] covers positions [0, n); positions without one score 0."""
    newest = (length - 1) // chunk
    if newest <= top:  # everything fits
        return torch.arange(length)
    scores = torch.nn.functional.pad(scores.float()[: newest * chunk], (0, max(0, newest * chunk - len(scores))))
    best = scores.view(newest, chunk).mean(dim=1).topk(top).indices.sort().values.cpu()
    return torch.cat([(best[:, None] * chunk + torch.arange(chunk)).flatten(), torch.arange(newest * chunk, length)])


def target_attention(target) -> torch.Tensor | None:
    """The target's attention row of the newest position in its cache, averaged over heads [cache length] (fp32):
    one q.K row of its last layer that attends to every position (`TargetView.query_layer`) over the keys it cached.
    None for a view without an engine, or where that layer's cache keeps only a window (every layer has one)."""
    layer = target.cache.layers[target.query_layer]
    if target.last_query is None or layer.first:
        return None
    query = target.last_query()  # [heads, D]
    keys = layer.read(slice(0, target.cache.length))[0].float()  # [kv_heads, L, D]
    grouped = query.reshape(keys.shape[0], -1, query.shape[-1])  # [kv_heads, group, D]
    scale = parts(target.model).layers[target.query_layer].scaling
    logits = torch.einsum("kgd,kld->kgl", grouped, keys) * scale
    return logits.softmax(dim=-1).mean(dim=(0, 1))


CachePolicy = FullCache | StreamingCache | RetrievalCache


def make_policy(name: str, target) -> CachePolicy:
    if name == "full":
        return FullCache()
    if name == "streaming":
        return StreamingCache()
    if name == "retrieval":
        return RetrievalCache(lambda: target_attention(target))
    raise ValueError(f"unknown draft cache policy '{name}'; use {', '.join(DRAFT_CACHES)}")
