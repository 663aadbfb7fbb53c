"""What the acceptance overlay shows, as data: one snapshot per step, taken in the engine's thread.

Definitions are those of docs/design.md, "Events, metrics and the UI" (see `EXPLANATIONS`); the speedup
divides by an autoregressive step the engine timed itself at the current context, never an estimate from tau.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

import torch

EXPLANATIONS = {
    "acceptance": "accepted draft tokens / speculated depth (the sum over steps of the draft tree's depth); "
    "for a chain this is accepted / drafted.",
    "tau": "mean accepted length: tokens committed per target verification step, the target's own bonus "
    "token included. Autoregressive decoding is 1.00.",
    "tokens/s": "this answer's decode speed; prefill (the prompt, up to the first token) is excluded and "
    "shown separately under each answer.",
    "speedup": "tokens/s here / tokens/s of autoregressive decoding of the same model, engine and machine, "
    "both measured here: a few autoregressive steps are timed between the steps of an answer (again when the "
    "context has changed by a quarter); 'AR' shows that speed and the context it was measured at.",
    "per-depth": "for each tree depth d, the fraction of the steps that proposed depth d in which depth d "
    "was accepted.",
    "tau sparkline": "tokens committed by each of the last steps, oldest on the left.",
    "context": "tokens the conversation holds now / the most it may hold (--context).",
    "drafter, budget": "who proposes draft trees, and the most nodes a tree may have: fixed (/budget N) or "
    "auto, chosen each step from the measured verification cost and the acceptance seen and shown as this "
    "answer's mean (0 when drafting did not pay; small trees still probe now and then).",
    "memory": "resident memory of this process (CPU), or memory torch has allocated on the GPU.",
}


@dataclass(frozen=True)
class Figures:
    tokens: int  # this answer's tokens so far
    tau: float
    acceptance_rate: float | None  # None before anything was drafted
    tokens_per_second: float
    ar_tokens_per_second: float | None  # measured autoregressive speed; None without a drafter
    ar_context: int | None  # the context length it was measured at
    per_depth: tuple[float, ...]
    recent_tau: tuple[int, ...]  # tokens committed by each recent step, oldest first
    context_used: int
    context_max: int
    drafter: str
    budget: int | None  # the tree budget now in force; None without a drafter
    adaptive: bool
    mean_budget: float
    memory_bytes: int
    memory_kind: str  # "RSS" | "CUDA"
    prompt_tokens: int
    reused_tokens: int  # prompt tokens whose KV was already cached
    prefill_seconds: float

    @property
    def budget_text(self) -> str:
        """The tree budget as the overlay and /stats show it: fixed, or the adaptive one's mean."""
        if self.budget is None:
            return "-"
        return f"auto, mean {self.mean_budget:.1f}" if self.adaptive else f"{self.budget}"

    @property
    def speedup(self) -> float | None:
        if self.ar_tokens_per_second is None:
            return None
        return self.tokens_per_second / self.ar_tokens_per_second

    def describe(self) -> str:
        """One line for /stats."""
        parts = [f"{self.tokens} tokens", f"{self.tokens_per_second:.1f} tok/s", f"tau {self.tau:.2f}"]
        if self.acceptance_rate is not None:
            parts.append(f"acceptance {self.acceptance_rate:.0%}")
        if self.speedup is not None:
            parts.append(f"{self.speedup:.2f}x autoregressive ({self.ar_tokens_per_second:.1f} tok/s)")
        if self.budget is not None:
            parts.append(f"budget {self.budget_text}")
        parts.append(
            f"prompt {self.prompt_tokens} tokens ({self.reused_tokens} reused from the cache), "
            f"prefill {self.prefill_seconds:.2f} s"
        )
        return "last answer: " + " · ".join(parts)

    def summary(self) -> dict[str, float]:
        """The figures an answer keeps (shown under it and saved with it)."""
        summary = {
            "tokens": self.tokens,
            "tokens_per_second": round(self.tokens_per_second, 2),
            "tau": round(self.tau, 3),
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "prefill_seconds": round(self.prefill_seconds, 3),
        }
        if self.acceptance_rate is not None:
            summary["acceptance_rate"] = round(self.acceptance_rate, 3)
        if self.speedup is not None:
            summary["speedup"] = round(self.speedup, 2)
        return summary


def memory_in_use(device: torch.device) -> tuple[int, str]:
    """Bytes in use now: torch's CUDA allocations on a GPU, else this process's resident memory."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device), "CUDA"
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"), "RSS"
    except OSError:  # not Linux: the peak is what getrusage knows
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak RSS"
