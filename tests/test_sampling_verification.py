"""Sampled tree speculative decoding is lossless: its output is distributed exactly as target-only sampling.

Proven here, on a tiny model with an 8-token vocabulary whose exact distribution over the first three
generated tokens is enumerated from the model's own forwards, p(x1) p(x2 | x1) p(x3 | x1, x2):
- `Engine.generate` (a thousand fresh seeds, one reused engine) with an adversarial drafter that always
  proposes the target's most likely tokens (a chain), a wide tree (three distinct children per node, two
  levels) and random trees passes a chi-square goodness-of-fit test at p = 0.001 — at temperature 1, and
  with top-k, top-p and the repetition penalty together (each tree node drawn from its own processed row,
  drafted tokens outside the top-k/top-p support included); EOS (token 2) ends an output wherever it is
  drawn, inside an accepted path too, and the enumeration accounts for it (every draw keyed by its place in the
  text, `PositionNoise`, as the engine always draws);
- the test has power: a per-path verifier (TokenSwift-style: each root-to-leaf path draws its own sample at
  every node and the longest self-consistent path wins) fed the very same trees and distributions is
  rejected by the same test at the same number of samples, while the per-node rule of
  `specchat.engine.verify.accept` fed them passes.
The second and third tokens come from the first tree step (the first token is the prefill's), so the test
covers acceptance at depth 1 and 2 and the bonus after an accepted node.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
import torch
from chi_square import assert_fits, assert_rejected
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter, TopTokensDrafter

from specchat.engine.generate import Engine
from specchat.engine.sampling import SamplingConfig, process_logits
from specchat.engine.tree import DraftTree
from specchat.engine.verify import accept

VOCAB = 8
EOS = {2}  # the tiny model's EOS and the real tokenizer's: outputs that reach it are shorter
PROMPT = [3, 6, 1, 4, 7, 5]
TOKENS = 3  # the joint distribution of the first three generated tokens is tested
# Samples per test, engine and simulated alike, so the power shown by `test_per_path_sampling_is_caught...` is the
# engine tests' own. At 1000 the per-path verifier's chi2 is 167-330 over the three trees (5 seeds each) against
# critical values of 48-60 at p = 0.001: caught with a wide margin (380-730 at 2000, which took twice as long).
SAMPLES = 1000
BUDGET = 16


CONFIGS = {
    "t1": SamplingConfig(temperature=1.0),
    # every history-free and history-dependent step at once: top-k and top-p cut the support (a drafted
    # token may have probability 0), the penalty makes each node's distribution depend on its ancestors
    "processed": SamplingConfig(temperature=1.0, top_k=5, top_p=0.9, penalty=2.0, penalty_window=4),
}


class Target:
    """The target's next-token distributions by plain forwards over whole contexts (cached): `probs` is the
    sampling distribution under `sampling` (penalty history = the context's last window), `raw` the plain
    softmax, for drafters."""

    def __init__(self, model, sampling: SamplingConfig):
        self.model = model
        self.sampling = sampling
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}
        self._probs: dict[tuple[int, ...], list[float]] = {}

    def logits(self, context: tuple[int, ...]) -> torch.Tensor:
        if context not in self._logits:
            with torch.inference_mode():
                self._logits[context] = self.model(input_ids=torch.tensor([context])).logits[0, -1:].float()
        return self._logits[context]

    def probs(self, context: tuple[int, ...]) -> list[float]:
        if context not in self._probs:
            history = torch.tensor([context[-self.sampling.penalty_window :]])
            processed = process_logits(self.logits(context), self.sampling, history)
            self._probs[context] = processed.double().softmax(dim=-1)[0].tolist()
        return self._probs[context]

    def raw(self, context: tuple[int, ...]) -> list[float]:
        return self.logits(context).softmax(dim=-1)[0].tolist()


def exact_joint(target: Target, prompt: list[int], n: int) -> dict[tuple[int, ...], float]:
    """P(output) under target-only sampling of at most n tokens, by enumeration; EOS ends an output."""
    joint, done = {(): 1.0}, {}
    for _ in range(n):
        grown = {}
        for seq, p in joint.items():
            for t, q in enumerate(target.probs(tuple(prompt) + seq)):
                if q > 0:
                    (done if t in EOS else grown)[seq + (t,)] = p * q
        joint = grown
    return {**done, **joint}


# --- the model and the drafters -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2", vocab_size=VOCAB, seed=1)  # spread distributions: p(x1) has 5 tokens > 5%


def make_drafter(name: str, target: Target, seed: int = 0):
    if name == "greedy_chain":  # always proposes the target's most likely token, 4 deep
        return TopTokensDrafter(target.raw, width=1, depth=4)
    if name == "wide":  # 3 distinct children per node, 2 levels: 12 nodes
        return TopTokensDrafter(target.raw, width=3, depth=2)
    if name == "binary":  # 2 distinct children per node, 3 levels: 14 nodes
        return TopTokensDrafter(target.raw, width=2, depth=3)
    if name == "random":
        return RandomTreeDrafter(vocab_size=VOCAB, seed=seed)
    raise ValueError(name)


def engine_eos(model, tokenizer) -> set[int]:
    return set(Engine(model, tokenizer, max_len=64).eos_ids)


def engine_counts(model, tokenizer, drafter, sampling: SamplingConfig) -> tuple[Counter, int]:
    """Outputs of SAMPLES generations with seeds 0, 1, ... on one engine, and how many drafted tokens
    they contain."""
    engine = Engine(model, tokenizer, max_len=64, drafter=drafter, draft_budget=BUDGET)
    counts, drafted = Counter(), 0
    for seed in range(SAMPLES):
        events = list(engine.generate(PROMPT, sampling=replace(sampling, seed=seed), max_new_tokens=TOKENS))
        counts[tuple(t for event in events for t in event.tokens)] += 1
        drafted += sum(origin == drafter.kind for event in events for origin in event.origins)
    return counts, drafted


# --- the engine is lossless -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, drafter", [("t1", "greedy_chain"), ("t1", "wide"), ("t1", "random"), ("processed", "wide")]
)
def test_engine_output_is_distributed_as_target_sampling(config, drafter, model, tokenizer):
    sampling = CONFIGS[config]
    target = Target(model, sampling)
    exact = exact_joint(target, PROMPT, TOKENS)
    assert abs(sum(exact.values()) - 1) < 1e-9
    tree_drafter = make_drafter(drafter, target, seed=7)
    counts, drafted = engine_counts(model, tokenizer, tree_drafter, sampling)
    assert engine_eos(model, tokenizer) == EOS
    assert sum(counts.values()) == SAMPLES
    assert all(len(seq) == TOKENS or seq[-1] in EOS for seq in counts)
    # the drafter really proposed trees and they were really accepted: many outputs hold drafted tokens
    assert sum(len(tree) for tree in tree_drafter.proposals) > SAMPLES
    assert drafted > SAMPLES // 4, drafted
    assert_fits(counts, exact, f"engine with the {drafter} drafter under {config}")


# --- per-node vs per-path verification on the same trees and distributions ------------------------------


def draw(probs: list[float], rng: random.Random) -> int:
    return rng.choices(range(len(probs)), weights=probs)[0]


def per_node(tree: DraftTree, rows: list[list[float]], rng: random.Random) -> list[int]:
    """Ours: one draw per node, then `accept` — the rule the engine implements."""
    verdict = accept(tree, [draw(row, rng) for row in rows])
    return [tree.tokens[node] for node in verdict.path] + [verdict.bonus]


def per_path(tree: DraftTree, rows: list[list[float]], rng: random.Random) -> list[int]:
    """Biased: every root-to-leaf path draws its own sample at each of its nodes; the longest path whose
    tokens match its own draws wins (the first on ties), with its own draw after it as the bonus."""
    if not len(tree):
        return [draw(rows[0], rng)]
    leaves = [i for i in range(len(tree)) if i not in set(tree.parents)]
    best: list[int] | None = None
    for leaf in leaves:
        tokens, row = [], 0  # row 0 = the root
        for node in tree.path_to(leaf):
            choice = draw(rows[row], rng)
            if choice != tree.tokens[node]:
                break
            tokens.append(choice)
            row = node + 1
        else:
            choice = draw(rows[row], rng)
        if best is None or len(tokens) + 1 > len(best):
            best = tokens + [choice]
    return best


def simulated_counts(verifier, drafter, target: Target, seed: int) -> Counter:
    """The engine's loop with exact distributions in place of the tree forward: prefill draw, then
    draft -> verify -> commit until TOKENS tokens."""
    rng, counts = random.Random(seed), Counter()
    for _ in range(SAMPLES):
        out = [draw(target.probs(tuple(PROMPT)), rng)]
        drafter.prefill(PROMPT)
        drafter.commit(out)
        while len(out) < TOKENS and out[-1] not in EOS:
            tree = drafter.propose(BUDGET)
            context = tuple(PROMPT + out)
            rows = [target.probs(context)] + [
                target.probs(context + tuple(tree.tokens[j] for j in tree.path_to(i))) for i in range(len(tree))
            ]
            tokens = verifier(tree, rows, rng)[: TOKENS - len(out)]
            tokens = next((tokens[: i + 1] for i, t in enumerate(tokens) if t in EOS), tokens)
            out += tokens
            drafter.commit(tokens)
        counts[tuple(out)] += 1
    return counts


@pytest.mark.parametrize("config, drafter", [("t1", "wide"), ("t1", "binary"), ("processed", "wide")])
def test_per_path_sampling_is_caught_and_per_node_is_not(config, drafter, model):
    sampling = CONFIGS[config]
    target = Target(model, sampling)
    exact = exact_joint(target, PROMPT, TOKENS)
    ours = simulated_counts(per_node, make_drafter(drafter, target, seed=11), target, seed=1)
    assert_fits(ours, exact, f"per-node verification of the {drafter} drafter's trees")
    biased = simulated_counts(per_path, make_drafter(drafter, target, seed=11), target, seed=1)
    assert_rejected(biased, exact, f"per-path verification of the {drafter} drafter's trees")


def test_per_path_equals_per_node_on_a_chain(model):
    """A chain has a single path, so both rules coincide there: the power above comes from branching."""
    target = Target(model, CONFIGS["t1"])
    exact = exact_joint(target, PROMPT, TOKENS)
    biased = simulated_counts(per_path, make_drafter("greedy_chain", target), target, seed=2)
    assert_fits(biased, exact, "per-path verification of chains")
