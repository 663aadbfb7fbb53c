"""Generation metrics as data; bench, CLI and TUI format them.

Definitions (docs/design.md, "Events, metrics and the UI"): tau = committed tokens per target decode
step, bonus included (AR = 1.0); acceptance rate = accepted draft tokens / speculated depth; tokens/s excludes
prefill, whose time (prompt processing up to the first new token) is reported separately.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose KV was already cached (multi-turn)
    prefill_seconds: float = 0.0  # prompt forward + first token
    decode_seconds: float = 0.0  # every later step, excluding time the consumer held the generator
    new_tokens: int = 0  # all generated tokens, the first (from prefill) included
    decode_tokens: int = 0  # tokens committed by decode steps
    steps: int = 0  # decode steps = target forwards after prefill
    drafted_depth: int = 0  # sum over steps of the proposed tree's depth
    accepted: int = 0  # draft tokens accepted
    proposed_at_depth: list[int] = field(default_factory=list)  # [d - 1]: steps whose tree reached depth d
    accepted_at_depth: list[int] = field(default_factory=list)  # [d - 1]: steps that accepted depth d

    budget_total: int = 0  # sum over steps of the tree budget in force
    drafted_nodes: int = 0  # sum over steps of the draft tokens verified (the trees' nodes)
    undrafted_steps: int = 0  # steps that verified no draft: no drafter, or the adaptive budget switched it off
    draft_seconds: float = 0.0  # the drafter's proposals, part of decode_seconds

    def record_step(self, tree_depth: int, accepted: int, budget: int, draft_seconds: float = 0.0, *,
                    nodes: int = 0) -> None:
        self.steps += 1
        self.budget_total += budget
        self.drafted_nodes += nodes
        self.undrafted_steps += nodes == 0
        self.draft_seconds += draft_seconds
        self.drafted_depth += tree_depth
        self.accepted += accepted
        for counts, depth in ((self.proposed_at_depth, tree_depth), (self.accepted_at_depth, accepted)):
            counts.extend([0] * (depth - len(counts)))
            for d in range(depth):
                counts[d] += 1

    @property
    def mean_budget(self) -> float:
        return self.budget_total / self.steps if self.steps else 0.0

    @property
    def per_depth_acceptance(self) -> list[float]:
        """Fraction of the steps that proposed depth d in which depth d was accepted."""
        accepted = self.accepted_at_depth + [0] * (len(self.proposed_at_depth) - len(self.accepted_at_depth))
        return [a / p for a, p in zip(accepted, self.proposed_at_depth)]

    @property
    def mean_accepted_length(self) -> float:
        return self.decode_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted_depth if self.drafted_depth else None

    @property
    def draft_ms_per_step(self) -> float:
        return 1e3 * self.draft_seconds / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def as_json(self) -> dict:
        """The figures as `specchat run --json` and the server's `specchat` object report them."""
        decoded = self.steps > 0
        return {
            "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "prefill_seconds": round(self.prefill_seconds, 4),
            "decode_seconds": round(self.decode_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3) if decoded else None,
            "steps": self.steps,
            "undrafted_steps": self.undrafted_steps,
            "mean_accepted_length": round(self.mean_accepted_length, 4) if decoded else None,
            "acceptance_rate": None if self.acceptance_rate is None else round(self.acceptance_rate, 4),
            "per_depth_acceptance": [round(a, 4) for a in self.per_depth_acceptance],
            "draft_budget": round(self.mean_budget, 2) if self.budget_total else None,
            "draft_ms_per_step": round(self.draft_ms_per_step, 3) if decoded else None,
        }
