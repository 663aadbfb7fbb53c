"""The target's last-layer query of the newest position in its cache: how the target itself attends to the
context, for drafters that rank the context by it (SpecExtend's cross-model retrieval).

Every forward computes it anyway. The lean forward returns the last layer's rotated queries; under
transformers' forward a hook keeps the last layer's q_proj output, rotated only when a drafter asks. The
engine keeps the row of the last position it committed (the last accepted node, or the root).
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.architectures import parts
from specchat.models.layers import rotate


class LastQuery:
    def __init__(self, model: nn.Module, *, lean: bool):
        decoder = parts(model)
        last = decoder.layers[-1]
        self.rotary = decoder.rotary
        self.head_dim = last.head_dim
        self.q_norm = last.q_norm  # Qwen3 normalises each head's query before RoPE
        self.output = None if lean else _Output.of(last.q)
        self._rows: tuple[torch.Tensor, torch.Tensor, bool] | None = None  # queries, positions, rotated
        self._kept: tuple[torch.Tensor, torch.Tensor, bool] | None = None

    def ran(self, positions: torch.Tensor, queries: torch.Tensor | None = None) -> None:
        """A target forward ran over `positions` [q]; the lean one hands its rotated `queries` [q, heads, D]."""
        if queries is None:
            self._rows = self.output.take()[0], positions, False  # [q, heads * D], before RoPE
        else:
            self._rows = queries, positions, True

    def keep(self, row: int) -> None:
        """The forward's row `row` is now the newest position in the cache."""
        queries, positions, rotated = self._rows
        self._kept = queries[row], positions[row], rotated

    def __call__(self) -> torch.Tensor:
        """[heads, D] fp32, rotated at its position."""
        query, position, rotated = self._kept
        query = query.reshape(-1, self.head_dim)
        if not rotated:
            if self.q_norm is not None:
                query = self.q_norm(query)
            cos, sin = self.rotary(query, position.reshape(1, 1))
            query = rotate(query, cos[0], sin[0])
        return query.float()


class _Output:
    """Catches a module's output during transformers' forward; one per module, however many engines run it."""

    def __init__(self, module: nn.Module):
        self.value: torch.Tensor | None = None
        module.register_forward_hook(self._catch)

    @classmethod
    def of(cls, module: nn.Module) -> _Output:
        if not isinstance(getattr(module, "_specchat_output", None), cls):
            module._specchat_output = cls(module)
        return module._specchat_output

    def _catch(self, module, args, output) -> None:
        self.value = output

    def take(self) -> torch.Tensor:
        value, self.value = self.value, None
        return value
