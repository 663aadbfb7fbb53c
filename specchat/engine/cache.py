"""A static, preallocated KV cache that speculative verification can append to and compact.

Slots `[0, length)` of every layer hold the committed prefix. A forward writes its tokens' keys and
values right after them (the "pending" block) and attends over `[0, length + pending)` — a view, never a
copy of the past. `commit(kept)` then keeps a subset of the pending block, in order, moving it down to
`length ...` in every layer; dropping the rest is a pointer move. Memory is allocated once per session.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import psutil
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from specchat.errors import SpecchatError


@runtime_checkable
class Rollback(Protocol):
    """The contract every KV cache here keeps, the target's and each drafter's own: positions [0, length) hold
    the keys and values of the committed ids, and `truncate(length)` forgets those from `length` on (a request
    that shares only part of the last one, a draft that went past what was accepted). Writing is each cache's
    own business (a verified tree's kept rows, a ring's window, a selection rotated at compact positions)."""

    @property
    def length(self) -> int: ...

    def truncate(self, length: int) -> None: ...


class TreeKVLayer(CacheLayerMixin):
    """One layer's keys/values, `[batch, kv_heads, max_len, head_dim]`, allocated on first use."""

    is_compileable = False
    is_sliding = False

    def __init__(self, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.length = 0  # committed slots
        self.pending = 0  # slots written by the last forward, not yet committed

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, head_dim = key_states.shape
        shape = (batch, heads, self.max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros(
            shape[:-1] + value_states.shape[-1:], dtype=value_states.dtype, device=value_states.device
        )
        self.is_initialized = True

    def reserve(self, rows: int, heads: int, head_dim: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole cache [heads, max_len, D] (batch 1) for a forward that writes `rows` slots after the prefix
        itself (the compiled CPU decoder): `update` without the copy."""
        if not self.is_initialized:
            empty = torch.empty(1, heads, 0, head_dim, dtype=dtype, device=device)
            self.lazy_initialization(empty, empty)
        self._claim(rows)
        return self.keys[0], self.values[0]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self._claim(key_states.shape[-2])
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _claim(self, rows: int) -> int:
        """Mark the `rows` slots after the prefix pending; returns where they end."""
        end = self.length + rows
        if end > self.max_len:
            raise RuntimeError(f"KV cache full: {end} > {self.max_len} slots")
        self.pending = rows
        return end

    def commit(self, kept: torch.Tensor | None, count: int) -> None:
        """Keep `count` pending slots: the first `count` when `kept` is None, else those at offsets `kept`."""
        if kept is not None:
            start = self.length
            self.keys[:, :, start : start + count] = self.keys[:, :, start + kept]
            self.values[:, :, start : start + count] = self.values[:, :, start + kept]
        self.length += count
        self.pending = 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_len


class TreeCache(Cache):
    """The target's KV cache for one session: a `TreeKVLayer` per decoder layer."""

    def __init__(self, num_layers: int, max_len: int):
        super().__init__(layers=[TreeKVLayer(max_len) for _ in range(num_layers)])
        self.max_len = max_len

    @property
    def length(self) -> int:
        return self.layers[0].length

    def commit(self, kept: Sequence[int] | None = None) -> None:
        """Make pending slots part of the prefix: all of them (None), or the offsets `kept`, in order."""
        pending = self.layers[0].pending
        if kept is None or list(kept) == list(range(len(kept))):
            index, count = None, pending if kept is None else len(kept)
        else:
            index, count = torch.as_tensor(kept, device=self.layers[0].keys.device), len(kept)
        for layer in self.layers:
            layer.commit(index, count)

    def reserve(self, rows: int, heads: int, head_dim: int, dtype: torch.dtype, device) -> tuple[list, list]:
        """Every layer's keys and values [heads, max_len, D], `rows` slots after the prefix set pending."""
        reserved = [layer.reserve(rows, heads, head_dim, dtype, device) for layer in self.layers]
        return [keys for keys, _ in reserved], [values for _, values in reserved]

    def truncate(self, length: int) -> None:
        """Forget everything after the first `length` committed slots (a pointer move)."""
        for layer in self.layers:
            layer.length = min(layer.length, length)
            layer.pending = 0


def check_cache_fits(model, max_len: int) -> None:
    """Refuse, in one line, a cache that cannot be allocated: it is allocated once, for the whole session,
    so this is known before the first token (not 90K tokens into a book)."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    need = 2 * config.num_hidden_layers * config.num_key_value_heads * max_len * head_dim * model.dtype.itemsize
    if model.device.type == "cuda":
        free = torch.cuda.mem_get_info(model.device)[0]
    elif model.device.type == "cpu":
        free = psutil.virtual_memory().available
    else:
        return
    if need > free:
        raise SpecchatError(
            f"the KV cache for {max_len} tokens needs {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB is free; "
            "ask for fewer tokens of context"
        )
