"""A draft model's LM head: the target's, shared, or the target's rows for a reduced draft vocabulary.

A draft that feeds the target's LM head (LongSpec, a student distilled here) predicts over the whole
vocabulary or over the tokens its training saw most (a draft vocabulary): on a CPU the full head is most of a
draft step, so the reduced head is a copy of those rows, quantized as the draft runs.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from specchat.engine.drafter import TargetView
from specchat.engine.sampling import SamplingConfig, process_logits, process_rows
from specchat.quant.gguf_linear import GGUFLinear
from specchat.quant.quantize import quantizable, quantize_linear
from specchat.quant.quantized_linear import QuantizedLinear, dense_rows


class DraftHead:
    """The target's LM head over the whole vocabulary (shared), or over a reduced draft vocabulary (those rows
    of the head, copied once, quantized as the draft runs: the full head is most of a draft step on a CPU)."""

    def __init__(self, target: TargetView, draft_vocab: torch.Tensor | None, weights: str | None = None,
                 lm_head: torch.nn.Module | None = None, config=None):  # fmt: skip
        """`lm_head`: a draft model's own head over the target's vocabulary, instead of the target's; `config`: that
        model's, whose logits are divided (Granite's `logits_scaling`) and soft-capped (Gemma 2's
        `final_logit_softcapping`) as its forward does (None: the target's)."""
        config = config if config is not None else target.config
        self.logit_scale = getattr(config, "logits_scaling", 1.0)
        self.logit_cap = getattr(config, "final_logit_softcapping", None) or 0.0
        self.vocab_size = target.config.vocab_size
        self.draft_vocab = None if draft_vocab is None else draft_vocab.to(target.device)
        self.columns = None  # [vocab]: each target id's column in the draft vocabulary, -1 where it has none
        self.column_of: dict[int, int] = {}  # the same on the host, for the sampling settings' ids
        if draft_vocab is not None:
            self.columns = torch.full((self.vocab_size,), -1, dtype=torch.long, device=target.device)
            self.columns[self.draft_vocab] = torch.arange(len(self.draft_vocab), device=target.device)
            self.column_of = {token: column for column, token in enumerate(draft_vocab.tolist())}
        head = lm_head if lm_head is not None else target.lm_head
        if draft_vocab is None:
            self.lm_head = head
        else:
            rows = dense_rows(head, self.draft_vocab).to(device=target.device, dtype=target.dtype)
            self.lm_head = nn.Linear(rows.shape[1], len(draft_vocab), bias=False, device="meta")  # no random start
            self.lm_head.weight = nn.Parameter(rows, requires_grad=False)
            if weights and quantizable(self.lm_head):  # a vocabulary of odd size stays dense
                self.lm_head = quantize_linear(self.lm_head, weights, dtype=target.dtype)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(h)
        logits = logits if self.logit_scale == 1.0 else logits / self.logit_scale
        return logits if not self.logit_cap else torch.tanh(logits / self.logit_cap) * self.logit_cap

    def probs(self, logits: torch.Tensor, sampling: SamplingConfig,
              history: torch.Tensor | None = None) -> torch.Tensor:
        """Drafting probabilities of the head's `logits` [n, columns] under the target's sampling settings, in the
        draft vocabulary's own columns: a token outside it has probability zero, as it would at -inf over the whole
        vocabulary, so the suppressed and biased ids and the `history` [n, W] (target ids, -1 padding) are mapped, not
        the logits widened."""
        return process_logits(logits, *self._in_columns(sampling, history), drafting=True).softmax(dim=-1)

    def top(self, logits: torch.Tensor, sampling: SamplingConfig, width: int,
            history: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The `width` likeliest drafting probabilities of each row of `logits` [n, columns] and their target ids
        [n, width], as `probs` ranks them; from the survivors alone where the sampling pipeline kept them (top-k's, a
        nucleus), not from whole rows of the vocabulary written, normalised and ranked for a few dozen tokens."""
        processed = process_rows(logits, *self._in_columns(sampling, history), drafting=True)
        if processed.tokens is None or processed.tokens.shape[-1] < width:
            top = processed.logits.softmax(dim=-1).topk(width, dim=-1)
            return top.values, self.target_ids(top.indices)
        top = processed.values.softmax(dim=-1).topk(width, dim=-1)
        return top.values, self.target_ids(processed.tokens.gather(1, top.indices))

    def _in_columns(self, sampling: SamplingConfig,
                    history: torch.Tensor | None) -> tuple[SamplingConfig, torch.Tensor | None]:  # fmt: skip
        """The sampling settings and history with target ids mapped to the draft vocabulary's columns."""
        if self.columns is None:
            return sampling, history
        columns = self.column_of
        suppress = tuple(columns[token] for token in sampling.suppress if token in columns)
        bias = tuple((columns[token], value) for token, value in sampling.logit_bias if token in columns)
        if history is not None:
            history = self.columns[history.clamp(min=0)].masked_fill(history < 0, -1)
        return replace(sampling, suppress=suppress, logit_bias=bias), history

    def target_ids(self, columns: torch.Tensor) -> torch.Tensor:
        return columns if self.draft_vocab is None else self.draft_vocab[columns]


def draft_weights(target: TargetView, weights: str | None = "auto") -> str | None:
    """How the draft's weights run: as asked, or for "auto" on a CPU whose target runs quantized weights in 4
    bits (a draft there is mostly reading weights, and 4 bits cost a few thousandths of tau): GGUF's Q4_K (Q4_1 for
    rows that are not whole Q4_K blocks) beside a GGUF target, through the kernels its matrices run on
    (`quant/q4_k.py`), else int4; dense in the target's dtype elsewhere."""
    if weights != "auto":
        return weights
    if target.device.type != "cpu" or not isinstance(target.lm_head, QuantizedLinear):
        return None
    return "q4_k" if isinstance(target.lm_head, GGUFLinear) else "int4"
