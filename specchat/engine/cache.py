"""A static, preallocated KV cache that speculative verification can append to and compact.

Positions `[0, length)` of every layer hold the committed prefix. A forward writes its tokens' keys and
values right after them (the "pending" block) and attends over `[0, length + pending)` — a view, never a
copy of the past. `commit(kept)` then keeps a subset of the pending block, in order, moving it down to
`length ...` in every layer; dropping the rest is a pointer move. Memory is allocated once per session (on a CPU,
committed page by page as slots are written).

A sliding-window layer (Gemma 3's five in six, Phi-3-mini's) holds only the positions its rows still see: its
window and a forward's rows (`WindowKVLayer`), so a long context costs its full-attention layers' keys alone.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import psutil
import torch

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


class TreeKVLayer:
    """One layer's keys/values, `[1, kv_heads, max_len, head_dim]`: views of the cache's, once it allocates them,
    held in the activations' dtype or narrower (bf16 beside fp32 activations), read in the activations'."""

    def __init__(self, max_len: int):
        self.max_len = max_len  # positions it can hold
        self.slots = max_len  # slots it allocates: one per position
        self.first = 0  # the position slot 0 holds
        self.length = 0  # committed positions
        self.pending = 0  # positions written by the last forward, not yet committed
        self.is_initialized = False

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, dtype: torch.dtype) -> None:
        """Hold `keys` and `values` [1, kv_heads, slots, D] (the cache's for this layer), read in `dtype`."""
        self.keys, self.values, self.dtype, self.is_initialized = keys, values, dtype, True

    def reserve(self, rows: int) -> tuple[torch.Tensor, ...]:
        """The whole cache (batch 1) for a forward that writes `rows` slots after the prefix itself (the compiled
        CPU decoder): `update` without the copy."""
        self._claim(rows)
        return self._held()

    def _held(self) -> tuple[torch.Tensor, ...]:
        """What the CPU decoder's forward takes of this layer: keys and values [heads, slots, D]."""
        return self.keys[0], self.values[0]

    def _stored(self, length: int) -> tuple[torch.Tensor, ...]:
        """Views of what holds the first `length` slots (`copy` / `restore` move these)."""
        return self.keys[:, :, :length], self.values[:, :, :length]

    def copy(self, length: int) -> tuple[torch.Tensor, ...]:
        """A copy of the first `length` committed slots, for `restore` later."""
        return tuple(part.clone() for part in self._stored(length))

    def restore(self, parts: tuple[torch.Tensor, ...], length: int) -> None:
        """Slots [0, length) back as `copy(length)` took them; what followed is forgotten."""
        for held, saved in zip(self._stored(length), parts):
            held.copy_(saved[tuple(slice(0, n) for n in held.shape)])
        self.length, self.pending = length, 0

    def holds(self, length: int) -> bool:
        """Whether it still holds what a row at position `length` sees (all committed positions: yes)."""
        return True

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on (`holds(length)` first)."""
        self.length = min(self.length, length)
        self.pending = 0

    @property
    def rows_per_forward(self) -> int:
        """The most rows one forward may write (the slots left past the prefix bound them too)."""
        return self.slots

    def restorable(self, parts: tuple[torch.Tensor, ...], length: int) -> bool:
        """Whether `restore(parts, length)` can be done: `parts` hold what a row at `length` sees."""
        return True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write keys and values [1, kv_heads, n, D] after the prefix, pending (a benchmark's random context)."""
        end = self._claim(key_states.shape[-2]) - self.first  # claimed first: a window's slots may move down
        start = self.length - self.first
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)

    def _claim(self, rows: int) -> int:
        """Mark the `rows` slots after the prefix pending; returns where they end."""
        end = self.length + rows
        if end > self.max_len:
            raise RuntimeError(f"KV cache full: {end} > {self.max_len} slots")
        self.pending = rows
        return end

    def read(self, slots: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values [heads, n, D] of `slots` (a slice or index tensor of written slots), as the
        target's attention reads them, in the activations' dtype: what a drafter that reads the target's cache
        takes."""
        return self.keys[0, :, slots].to(self.dtype), self.values[0, :, slots].to(self.dtype)

    def commit(self, kept: torch.Tensor | None, count: int) -> None:
        """Keep `count` pending slots: the first `count` when `kept` is None, else those at offsets `kept`."""
        if kept is not None:
            start = self.length - self.first
            self.keys[:, :, start : start + count] = self.keys[:, :, start + kept]
            self.values[:, :, start : start + count] = self.values[:, :, start + kept]
        self.length += count
        self.pending = 0

    @property
    def device(self) -> torch.device:
        return self.keys.device


WINDOW_HEADROOM = 512  # slots a sliding-window layer keeps past its window: the most rows one forward writes there


class WindowKVLayer(TreeKVLayer):
    """A sliding-window layer's keys and values: a row at position p sees only p - window + 1 .. p, so the layer
    holds `window + WINDOW_HEADROOM` slots, slot 0 holding position `first`. When a forward's rows would pass the
    last slot, what its first row sees moves down to slot 0 (a window's copy every few hundred positions) and
    `first` moves up. Positions before `first` are gone: `read` refuses them, and the cache cannot go back before
    `first + window - 1` (`holds`); a forward writes at most WINDOW_HEADROOM + 1 rows."""

    def __init__(self, max_len: int, window: int):
        super().__init__(max_len)
        self.window = window
        self.slots = window + WINDOW_HEADROOM

    def seen_from(self, position: int) -> int:
        """The first position a row at `position` sees."""
        return max(0, position - self.window + 1)

    def holds(self, length: int) -> bool:
        return length == 0 or self.first <= self.seen_from(length)

    def truncate(self, length: int) -> None:
        if length == 0:
            self.first = 0
        super().truncate(length)

    @property
    def rows_per_forward(self) -> int:
        return self.slots - self.window + 1

    def restorable(self, parts: tuple[torch.Tensor, ...], length: int) -> bool:
        return _held_from(parts) <= self.seen_from(length)

    def _claim(self, rows: int) -> int:
        end = super()._claim(rows)
        if end - self.first > self.slots:
            self._move_down(end)
        return end

    def _move_down(self, end: int) -> None:
        """Move what the next rows see (from `seen_from(length)`) down to slot 0, so positions up to `end` fit."""
        first = self.seen_from(self.length)
        if end - first > self.slots:
            raise RuntimeError(f"a forward of {end - self.length} rows does not fit a window's {self.slots} slots")
        kept = slice(first - self.first, self.length - self.first)
        for part in (self.keys, self.values):
            part[:, :, : self.length - first] = part[:, :, kept].clone()
        self.first = first

    def _stored(self, length: int) -> tuple[torch.Tensor, ...]:
        return self.keys[:, :, : length - self.first], self.values[:, :, : length - self.first]

    def copy(self, length: int) -> tuple[torch.Tensor, ...]:
        """What it holds of the first `length` positions, and the position that starts at: for `restore` later."""
        return (*super().copy(length), torch.tensor([self.first]))

    def restore(self, parts: tuple[torch.Tensor, ...], length: int) -> None:
        """Hold what a row at `length` sees, from `parts` (this layer's `copy`, or a whole layer's)."""
        if not self.restorable(parts, length):
            raise RuntimeError(f"the copy no longer holds what position {length} sees")
        keys, values, *_ = parts
        start, first = _held_from(parts), self.seen_from(length)
        for held, saved in zip((self.keys, self.values), (keys, values)):
            held[:, :, : length - first] = saved[:, :, first - start : length - start]
        self.first, self.length, self.pending = first, length, 0

    def read(self, slots: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values [heads, n, D] at positions `slots`: the held ones only."""
        if isinstance(slots, slice):
            start, stop, _ = slots.indices(self.length + self.pending)
            gone = start < min(stop, self.first)
            slots = slice(max(0, start - self.first), max(0, stop - self.first))
        else:
            gone = slots.numel() > 0 and int(slots.min()) < self.first
            slots = slots - self.first
        if gone:
            raise SpecchatError(
                f"the target's sliding-window layers keep only their last {self.window} keys: a drafter that reads "
                "the target's whole cache cannot draft for it"
            )
        return super().read(slots)


def _held_from(parts: tuple[torch.Tensor, ...]) -> int:
    """The position a layer's `copy` starts at: a window layer's names it last, a whole layer's starts at 0."""
    return int(parts[2]) if len(parts) == 3 else 0


TILE = 16  # slots in an int8 cache's tile
BLOCK = 32  # a key's dims under one scale in an int8 cache


class Int8KVLayer(TreeKVLayer):
    """One layer's keys and values in int8, as the compiled CPU decoder writes and reads them: each slot's key (by
    blocks of 32 dims) and value of each head quantized when written, with scales of its own, so a slot's codes
    never change and a verified tree row reads what a decode step at its position reads. 0.54x a bf16 cache's
    bytes at head_dim 128.

    `key_codes` [heads, slots, D] uint8 holds the keys and `value_codes` [heads, slots, D] int8 the values, both in
    tiles of 16 slots (`kernels/cpu/int8_dots.h`), `scales` [heads, slots / 16, D / 32 + 1, 16] fp32 each tile's key
    block scales, then its value scales; slots are `max_len` rounded up to 16. `read` dequantizes slots for what reads
    the target's cache (a LongSpec or GLIDE draft, retrieval): the keys and values the target attends to."""

    def allocate(self, heads: int, head_dim: int, dtype: torch.dtype, device) -> None:
        """Codes and scales for `max_len` slots; `dtype` is what `read` dequantizes to."""
        slots = -(-self.max_len // TILE) * TILE
        self.key_codes = cache_zeros((heads, slots, head_dim), torch.uint8, device)
        self.value_codes = cache_zeros((heads, slots, head_dim), torch.int8, device)
        self.scales = cache_zeros((heads, slots // TILE, head_dim // BLOCK + 1, TILE), torch.float32, device)
        self.dtype = dtype
        self.is_initialized = True

    def _held(self) -> tuple[torch.Tensor, ...]:
        """What the CPU decoder's forward takes of this layer: key codes, value codes and scales."""
        return self.key_codes, self.value_codes, self.scales

    def _stored(self, length: int) -> tuple[torch.Tensor, ...]:
        tiles = -(-length // TILE)  # whole tiles: a slot's codes and scales are its own, so the rest is rewritten
        return self.key_codes[:, : tiles * TILE], self.value_codes[:, : tiles * TILE], self.scales[:, :tiles]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Quantize and write [1, heads, n, D] keys and values after the prefix, pending (as the CPU decoder
        does)."""
        start, end = self.length, self._claim(key_states.shape[-2])
        heads, n, head_dim = key_states.shape[1:]
        slots = torch.arange(start, end, device=key_states.device)
        key_codes, key_scales = _quantized(key_states[0].reshape(heads, n, head_dim // BLOCK, BLOCK))
        biased = (key_codes.reshape(heads, n, head_dim).to(torch.int16) + 128).to(torch.uint8)
        self._key_tiles()[:, slots // TILE, :, slots % TILE] = biased.view(torch.int32).transpose(0, 1)
        value_codes, value_scales = _quantized(value_states[0])
        self._value_groups()[_value_columns(slots)] = value_codes.transpose(0, 1)
        scales = torch.cat([key_scales, value_scales[..., None]], dim=-1)  # [heads, n, D / 32 + 1]
        self.scales[:, slots // TILE, :, slots % TILE] = scales.transpose(0, 1)

    def commit(self, kept: torch.Tensor | None, count: int) -> None:
        if kept is not None:
            start = self.length
            source, target = start + kept, torch.arange(start, start + count, device=kept.device)
            for tiles in (self._key_tiles(), self.scales):  # a slot is a column of its tile in both
                tiles[:, target // TILE, :, target % TILE] = tiles[:, source // TILE, :, source % TILE]
            groups = self._value_groups()
            groups[_value_columns(target)] = groups[_value_columns(source)]
        self.length += count
        self.pending = 0

    def read(self, slots: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values [heads, n, D] of `slots`, dequantized."""
        index = torch.arange(self.length + self.pending, device=self.key_codes.device)[slots]
        heads, _, head_dim = self.key_codes.shape
        codes = self._key_tiles()[:, index // TILE, :, index % TILE].transpose(0, 1).contiguous()  # [heads, n, D / 4]
        scales = self.scales[:, index // TILE, :, index % TILE].transpose(0, 1)  # [heads, n, D / 32 + 1]
        keys = ((codes.view(torch.uint8).view(heads, -1, head_dim // BLOCK, BLOCK).float() - 128)
                * scales[..., :-1, None])
        values = self._value_groups()[_value_columns(index)].transpose(0, 1).float() * scales[..., -1:]
        return keys.reshape(heads, -1, head_dim).to(self.dtype), values.to(self.dtype)

    @property
    def device(self) -> torch.device:
        return self.key_codes.device

    def _key_tiles(self) -> torch.Tensor:
        """The keys as [heads, tiles, D / 4, 16] int32: a slot's key is a dword in each of D / 4 rows of its tile."""
        heads, slots, head_dim = self.key_codes.shape
        return self.key_codes.view(heads, slots // TILE, head_dim // 4, TILE, 4).view(torch.int32)[..., 0]

    def _value_groups(self) -> torch.Tensor:
        """The values as [heads, tiles, 4, D, 4]: a tile is four groups of 4 slots, a slot's value a column of its
        group."""
        heads, slots, head_dim = self.value_codes.shape
        return self.value_codes.view(heads, slots // TILE, TILE // 4, head_dim, 4)


def _value_columns(slots: torch.Tensor) -> tuple:
    """Where slots' values lie in `_value_groups()`: indexed there, [n, heads, D]."""
    return slice(None), slots // TILE, slots % TILE // 4, slice(None), slots % 4


def _quantized(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., n] -> (int8 codes, scales [...]) as the CPU decoder quantizes: round(x * 127 / max|x|) over the last
    dim, the scale max|x| / 127."""
    rows = rows.float()
    top = rows.abs().amax(-1, keepdim=True)
    inverse = torch.where(top > 0, 127 / top, torch.zeros_like(top))
    return (rows * inverse).round().to(torch.int8), (top / 127)[..., 0]


class TreeCache:
    """The target's KV cache for one session: a `TreeKVLayer` per decoder layer (an `Int8KVLayer` with
    `kv_cache="int8"`, a `WindowKVLayer` where `windows` gives the layer a sliding window shorter than the cache),
    its keys and values in the activations' dtype (`kv_cache="auto"`) or in bf16 (`"bf16"`).

    `allocate` lays the layers' keys and values out in a pair of tensors `[layers, 1, kv_heads, slots, D]` per
    size of layer (`stacks`; each layer's are views of them). Where every layer holds every position, `keys` and
    `values` are that pair, and `length_tensor` holds the committed length on the device: what the torch
    decoder's kernels read, so a CUDA graph of its forward replays at any length."""

    def __init__(self, num_layers: int, max_len: int, kv_cache: str = "auto", windows: Sequence[int] = ()):
        layer = Int8KVLayer if kv_cache == "int8" else TreeKVLayer
        windows = list(windows) or [0] * num_layers
        self.layers = [WindowKVLayer(max_len, window) if layer is TreeKVLayer and 0 < window < max_len - WINDOW_HEADROOM
                       else layer(max_len) for window in windows]  # fmt: skip
        self.max_len = max_len
        self.kv_cache = kv_cache
        self.stacks: list[tuple[list[TreeKVLayer], torch.Tensor, torch.Tensor]] = []  # once allocated (not int8)
        self.keys: torch.Tensor | None = None  # [layers, 1, kv_heads, max_len, D] where every layer holds all
        self.values: torch.Tensor | None = None
        self.length_tensor: torch.Tensor | None = None  # [1] int32 on the cache's device

    def allocate(self, heads: int, head_dim: int, dtype: torch.dtype, device) -> None:
        """Allocate every layer (once) on `device`: keys and values in `dtype` (the activations') or bf16, or int8
        codes and scales."""
        if self.layers[0].is_initialized:
            return
        if self.kv_cache == "int8":
            for layer in self.layers:
                layer.allocate(heads, head_dim, dtype, device)
        else:
            for slots in sorted({layer.slots for layer in self.layers}, reverse=True):
                members = [layer for layer in self.layers if layer.slots == slots]
                shape = (len(members), 1, heads, slots, head_dim)
                held = torch.bfloat16 if self.kv_cache == "bf16" else dtype
                keys, values = (cache_zeros(shape, held, device) for _ in range(2))
                for layer, layer_keys, layer_values in zip(members, keys, values):
                    layer.adopt(layer_keys, layer_values, dtype)
                self.stacks.append((members, keys, values))
            if len(self.stacks) == 1:
                _, self.keys, self.values = self.stacks[0]
        self.length_tensor = torch.zeros(1, dtype=torch.int32, device=device)

    def allocate_like(self, other: TreeCache) -> None:
        """Allocate with `other`'s heads, head size, dtype and device (a drafter's copy of the target's cache)."""
        keys, _ = other.layers[0].read(slice(0, 0))
        self.allocate(keys.shape[0], keys.shape[-1], keys.dtype, keys.device)

    @property
    def length(self) -> int:
        return self.layers[0].length

    @property
    def dtype(self) -> torch.dtype:
        """The dtype its keys and values are read in: the activations'."""
        return self.layers[0].read(slice(0, 0))[0].dtype

    def claim(self, rows: int) -> None:
        """Set the `rows` slots after the prefix pending (a forward writes them) and the device length to the
        committed one; raises when they do not fit."""
        for layer in self.layers:
            layer._claim(rows)
        self.length_tensor.fill_(self.length)

    def commit(self, kept: Sequence[int] | torch.Tensor | None = None) -> None:
        """Make pending slots part of the prefix: all of them (None), or the offsets `kept`, in order."""
        pending = self.layers[0].pending
        if kept is None or (not isinstance(kept, torch.Tensor) and list(kept) == list(range(len(kept)))):
            index, count = None, pending if kept is None else len(kept)
        else:
            index, count = torch.as_tensor(kept, device=self.layers[0].device), len(kept)
        if index is not None and self.stacks:  # one move for each stack of layers
            for members, keys, values in self.stacks:
                start = members[0].length - members[0].first  # a stack's layers move down together
                keys[:, :, :, start : start + count] = keys[:, :, :, start + index]
                values[:, :, :, start : start + count] = values[:, :, :, start + index]
            index = None
        for layer in self.layers:
            layer.commit(index, count)

    def reserve(self, rows: int, heads: int, head_dim: int, dtype: torch.dtype,
                device) -> tuple[list, list, list | None, list[int]]:  # fmt: skip
        """Every layer's keys and values [heads, slots, D] and, in int8, their scales (else None), `rows` positions
        after the prefix set pending, and the position each layer's slot 0 holds: what the compiled CPU decoder's
        forward takes."""
        self.allocate(heads, head_dim, dtype, device)
        reserved = [layer.reserve(rows) for layer in self.layers]
        keys, values, *scales = zip(*reserved)
        return list(keys), list(values), list(scales[0]) if scales else None, [layer.first for layer in self.layers]

    @property
    def rows_per_forward(self) -> int:
        """The most rows one forward may write: a longer prompt is fed in pieces (sliding-window layers hold only
        their window and this many more)."""
        return min(layer.rows_per_forward for layer in self.layers)

    def reach(self, length: int) -> int:
        """How far back the cache can go towards `length` committed positions: `length` where every layer still
        holds what a row at `length` sees, else 0 (a sliding window moved past it; as llama.cpp, start again)."""
        length = min(length, self.length)
        return length if all(layer.holds(length) for layer in self.layers) else 0

    def truncate(self, length: int) -> None:
        """Forget everything after the first `length` committed positions (a pointer move); `reach` says how far
        back it can go."""
        if not all(layer.holds(min(length, layer.length)) for layer in self.layers):
            raise RuntimeError(f"the cache no longer holds what position {length} sees (ask `reach` first)")
        for layer in self.layers:
            layer.truncate(length)

    def copy(self, length: int) -> list[tuple[torch.Tensor, ...]]:
        """Every layer's first `length` committed slots, copied (`PrefixStore` keeps them)."""
        return [layer.copy(length) for layer in self.layers]

    def restore(self, layers: list[tuple[torch.Tensor, ...]], length: int) -> None:
        """The first `length` positions of every layer back as `copy(length)` (of `length` or more) took them."""
        for layer, parts in zip(self.layers, layers):
            layer.restore(parts, length)

    def restorable(self, layers: list[tuple[torch.Tensor, ...]], length: int) -> bool:
        """Whether `restore(layers, length)` can be done (a sliding window's copy holds its last positions only)."""
        return all(layer.restorable(parts, length) for layer, parts in zip(self.layers, layers))


def cache_zeros(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """Zeros for a cache's slots. On a CPU they are anonymous memory that the kernel zero-fills a page at a time as
    slots are first written, so a cache sized for long texts (`--context 32768`) costs what its text uses. In 4 KB
    pages: a 2 MB page would be committed for every layer's every head at the first token (1 GB at Llama 3.1 8B's
    shapes)."""
    count = math.prod(shape)
    if torch.device(device).type != "cpu" or count == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    memory = mmap.mmap(-1, count * dtype.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(memory, dtype=dtype, count=count).view(shape)  # the tensor keeps `memory` mapped


def token_bytes(model, kv_cache: str = "auto") -> int:
    """Bytes one token takes in the cache, over every layer and KV head."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if kv_cache == "int8":  # a key's and a value's codes, and their scales
        slot_bytes = 2 * head_dim + 4 * (head_dim // BLOCK + 1)
    else:
        slot_bytes = 2 * head_dim * (torch.bfloat16 if kv_cache == "bf16" else model.dtype).itemsize
    return config.num_hidden_layers * config.num_key_value_heads * slot_bytes


def check_cache_fits(model, cache: TreeCache) -> None:
    """Refuse, in one line, a cache (not yet allocated) that cannot be: it is allocated once, for the whole session,
    so this is known before the first token (not 90K tokens into a book)."""
    slots = sum(layer.slots for layer in cache.layers)  # sliding windows' layers hold fewer
    need = token_bytes(model, cache.kv_cache) * slots // len(cache.layers)
    if model.device.type == "cuda":
        free = torch.cuda.mem_get_info(model.device)[0]
    elif model.device.type == "cpu":
        free = psutil.virtual_memory().available
    else:
        return
    if need > free:
        raise SpecchatError(
            f"the KV cache for {cache.max_len} tokens needs {need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB is free; "
            "ask for fewer tokens of context"
        )
