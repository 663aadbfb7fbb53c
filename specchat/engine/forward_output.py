"""What a target forward returns, whichever runs it (the compiled CPU decoder, the torch decoder)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [rows, vocab], or [1, vocab] for the last row only
    hidden: torch.Tensor  # [rows, hidden_size]: the last decoder layer's output, before the final norm
    # [rows, heads, head_dim]: the rotated queries of the model's `query_layer` (the last layer but in sliding-window
    # models: the last that attends to every position); [layers, ...]: every layer's
    queries: torch.Tensor
    # [rows, len(feature_layers) * hidden_size]: the residual stream entering each layer asked for, side by side
    # (the layer count: the last layer's output); empty when none was asked for
    features: torch.Tensor | None = None
