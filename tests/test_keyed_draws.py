"""A verified row's choice (`engine/keyed_draws.py`): the argmax when greedy, else a keyed draw distributed as
softmax(processed logits).

Proven here: `choose` is the argmax when greedy; a keyed draw never takes a masked token and passes a chi-square
goodness-of-fit test that a biased sampler fails, drawn among the survivors, over the tokens not at -inf (a CPU) or
over every token (a GPU); `PositionNoise`'s draws depend on (seed, index, token) alone, and a drafter racing the
target's own distribution guesses every one.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_sampling import NEG_INF, kept, random_logits

from specchat.engine.keyed_draws import PositionNoise, choose
from specchat.engine.sampling import Processed, SamplingConfig, process_logits, process_rows

# --- choose ---------------------------------------------------------------------------------------------


def test_the_greedy_choice_is_the_argmax():
    logits = torch.full((3, 10), -1.0)
    logits[0, 7] = 10.0
    logits[1, 2] = 10.0
    logits[2, 9] = 10.0
    out = choose(Processed(logits), None, [0, 1, 2])
    assert out.dtype == torch.long and out.tolist() == [7, 2, 9]
    random = random_logits()
    assert torch.equal(choose(Processed(random), None, list(range(8))), random.argmax(dim=1))


@pytest.mark.parametrize("dense", [False, True], ids=["cpu", "gpu"])
def test_a_keyed_draw_never_takes_a_masked_token(dense):
    logits = torch.full((5000, 20), NEG_INF)
    logits[:, [4, 11, 17]] = 0.0
    draws = PositionNoise(5).choose(Processed(logits), list(range(5000)), dense=dense)
    assert set(draws.tolist()) == {4, 11, 17}


# chi-square critical values at p = 0.001 (upper tail), from the standard table
CHI2_CRITICAL_P001 = {5: 20.515}


def chi_square(draws: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the tokens with positive probability, and its degrees of freedom."""
    counts = torch.bincount(draws, minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "drew a token of probability 0"
    expected = probs[support].double() * draws.numel()
    assert expected.min() >= 5  # the chi-square approximation holds
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


DRAWS = 20_000
RAW = torch.tensor([[1.5, 1.0, 0.6, 0.2, -0.3, -0.8, 2.5]])
CONFIG = SamplingConfig(temperature=0.9, top_k=6, seed=2024)  # top-k masks token 5: 6 tokens remain


def keyed_draws(processed: Processed, **kwargs) -> torch.Tensor:
    """One keyed draw per row, row i at text index i: DRAWS independent draws."""
    return PositionNoise(CONFIG.seed).choose(processed, torch.arange(DRAWS), **kwargs)


@pytest.mark.parametrize("where", ["survivors", "rows", "every-token"])
def test_keyed_draws_match_softmax_of_processed_logits(where):
    """Drawn among the survivors the pipeline kept, over the whole processed rows (a CPU's scan for their support), or
    over every token at once (a GPU's race, no read of which are nonzero): the processed distribution each way."""
    processed = process_logits(RAW, CONFIG)
    probs = processed.softmax(dim=-1)[0]
    assert kept(processed) == [[0, 1, 2, 3, 4, 6]]
    rows = process_rows(RAW.expand(DRAWS, -1), CONFIG)
    assert rows.tokens is not None and torch.equal(rows.logits, processed.expand(DRAWS, -1))
    draws = keyed_draws(rows) if where == "survivors" else keyed_draws(Processed(rows.logits),
                                                                      dense=where == "every-token")  # fmt: skip
    statistic, df = chi_square(draws, probs)
    assert df == 5
    assert statistic < CHI2_CRITICAL_P001[df], f"chi2 = {statistic:.1f} with {df} dof"


def test_chi_square_rejects_a_biased_sampler():
    """The same test has power: sampling from softmax(1.3 * logits) is caught (raced over every token at once, the
    quickest way here)."""
    processed = process_logits(RAW, CONFIG)
    probs = processed.softmax(dim=-1)[0]
    biased = keyed_draws(Processed(processed.expand(DRAWS, -1) * 1.3), dense=True)
    statistic, df = chi_square(biased, probs)
    assert statistic > CHI2_CRITICAL_P001[df], f"chi2 = {statistic:.1f} with {df} dof"


# --- keyed noise: the draw at each index of the text ---------------------------------------------------


def test_position_noise_draws_are_distributed_as_p():
    from chi_square import assert_fits, assert_rejected


    p = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02, 0.0])
    noise = PositionNoise(seed=12345)
    logits = Processed(p.log()[None])  # processed logits whose softmax is p
    draws = [int(noise.choose(logits, [index])[0]) for index in range(6000)]
    counts = Counter(draws)
    assert counts[7] == 0  # a token of probability 0 is never drawn
    exact = {token: float(prob) for token, prob in enumerate(p) if prob > 0}
    assert_fits(counts, exact, "keyed draws")
    assert_rejected(counts, {t: q for t, q in zip(exact, [0.34, 0.28, 0.17, 0.11, 0.05, 0.03, 0.02])}, "a near p")
    # the same (seed, index) draws the same token, in any company; another seed draws others
    again = PositionNoise(seed=12345)
    both = Processed(torch.stack([p, p.flip(0)]).log())
    assert [int(again.choose(both, [i, i])[0]) for i in range(200)] == draws[:200]
    other = [int(PositionNoise(seed=1).choose(logits, [i])[0]) for i in range(200)]
    assert other != draws[:200]
    shifted = PositionNoise(seed=12345, offset=100)
    assert [int(shifted.choose(logits, [i])[0]) for i in range(100)] == draws[100:200]


def test_position_noise_draws_each_index_over_its_own_support_or_all_rows_alike():
    """Keyed draws among the survivors the pipeline kept, over the tokens any row may take (a CPU's scan), and over
    every token of every row at once (a GPU's) equal those over each index's own support, token for token: a token
    no row at an index may take is at -inf there. What was written keyed stays the text when resumed."""

    def per_index(noise, logits, indices):  # each index's own support, scanned apart
        choices = [0] * len(indices)
        for index in sorted(set(indices)):
            rows = [i for i, each in enumerate(indices) if each == index]
            support = (logits[rows].amax(dim=0) > NEG_INF).nonzero()[:, 0]
            scores = logits[rows][:, support].double() - noise.exponential(index, support).log()
            for row, token in zip(rows, support[scores.argmax(dim=1)].tolist()):
                choices[row] = token
        return choices

    noise = PositionNoise(seed=7, offset=30)
    for seed in range(20):
        logits = random_logits(rows=9, vocab=2000, seed=seed)
        config = SamplingConfig(temperature=0.8, top_k=[5, 40, 0][seed % 3], top_p=0.9, min_p=0.02)
        processed = process_rows(logits, config)
        assert processed.tokens is not None  # top-k's survivors or the nucleus
        indices = [0, 1, 1, 2, 3, 3, 3, 4, 5][: 9 - seed % 4] + [9] * (seed % 4)
        expected = per_index(noise, processed.logits, indices)
        assert noise.choose(processed, indices).tolist() == expected
        assert noise.choose(Processed(processed.logits), indices).tolist() == expected
        assert noise.choose(Processed(processed.logits), indices, dense=True).tolist() == expected  # a GPU's


SURVIVOR_PATHS = {  # Qwen's defaults, Llama 3.1's, a book's
    "top-k": SamplingConfig(temperature=0.7, top_p=0.8, top_k=20),
    "top-p": SamplingConfig(temperature=0.6, top_p=0.9),
    "min-p": SamplingConfig(temperature=1.0, min_p=0.1, min_p_keep=20),
}


@pytest.mark.parametrize("config", SURVIVOR_PATHS.values(), ids=SURVIVOR_PATHS.keys())
def test_a_row_s_keyed_draw_is_the_same_alone_and_beside_rows_that_need_the_whole_vocabulary(config):
    """A row of a tree is processed with the others: where one of them (a flat row) has survivors past the largest
    logits, every row takes the whole-vocabulary path, while decoding processes the row alone among its survivors.
    Its keyed draw is the same either way, bit for bit the scores (logit less the noise's log) being the same."""

    noise = PositionNoise(seed=4)
    peaked = random_logits(rows=5, vocab=50_000, seed=13)
    peaked[:, :4] += 25.0
    flat = random_logits(rows=1, vocab=50_000, seed=14, scale=0.3)
    if config.top_k:  # top-k's ties with the k-th past its 2k largest: a row of equal logits
        flat = torch.zeros(1, 50_000)
    together = process_rows(torch.cat([peaked, flat]), config)
    assert together.tokens is None  # the flat row sent every row down the whole-vocabulary path
    for index in range(40):
        alone = [process_rows(row[None], config) for row in peaked]
        assert all(each.tokens is not None for each in alone)
        drawn = [int(noise.choose(each, [index + row])[0]) for row, each in enumerate(alone)]
        assert noise.choose(together, [index + row for row in range(6)]).tolist()[:5] == drawn


def test_a_drafter_racing_the_target_s_own_distribution_guesses_every_keyed_draw():
    """`guess` runs the race `choose` runs: given the target's distributions, its first guess at each row is the
    target's draw there (rows at their own indices, a draft vocabulary's columns mapped to the target's ids), where
    the row's support is within the GUESS_POOL likeliest; the others follow by race, and a token of probability 0
    comes after every other."""
    from specchat.engine.keyed_draws import GUESS_POOL

    noise = PositionNoise(seed=11, offset=40)
    columns = torch.randperm(2000, generator=torch.Generator().manual_seed(0))[:600]  # a draft vocabulary's ids
    for seed in range(20):
        config = SamplingConfig(temperature=1.0, top_k=[GUESS_POOL, 20, 2][seed % 3], top_p=0.95, min_p=0.01)
        probs = process_logits(random_logits(rows=6, vocab=600, seed=seed), config).softmax(dim=-1)
        assert int((probs > 0).sum(dim=1).max()) <= GUESS_POOL
        indices = [seed, seed + 1, seed + 1, seed + 2, seed + 5, seed + 9]
        full = torch.zeros(6, 2000).index_copy_(1, columns, probs)  # the same rows over the target's vocabulary
        chances, guessed = noise.guess(probs, indices, 3, lambda c: columns[c])
        assert columns[guessed[:, 0]].tolist() == noise.choose(Processed(full.log()), indices).tolist()
        assert bool((chances[:, :-1] >= chances[:, 1:]).all()) and bool((chances <= 1).all())
        assert bool((chances[:, 0] > 0).all())
        assert bool(((probs.gather(1, guessed) == 0) <= (chances == 0)).all())  # no chance at p = 0


def test_position_noise_keys_are_splitmix64_of_the_seed_and_index_as_written_before():
    """The noise's keys, computed on the device from a tensor of indices, are bit for bit splitmix64(seed ^ index) as
    the host computed them: books written before resume with the same draws."""
    from specchat.engine.keyed_draws import _GOLDEN, _mix_tensor, _signed, _splitmix

    def reference(noise: PositionNoise, index: int, tokens: torch.Tensor) -> torch.Tensor:
        key = torch.tensor(_signed(_splitmix(noise.seed ^ (noise.offset + index))), dtype=torch.long)
        bits = _mix_tensor(key + tokens.long() * _GOLDEN)
        return -torch.log(((bits >> 11) & ((1 << 53) - 1)).double() * 2.0**-53 + 2.0**-54)

    tokens = torch.arange(0, 152_000, 997)
    for seed, offset in [(0, 0), (12345, 100), (2**62 + 7, 3), (-5, 10**9)]:
        noise = PositionNoise(seed, offset)
        for index in [0, 1, 77, 2**31 + 5, 10**12]:
            expected = reference(noise, index, tokens)
            assert torch.equal(noise.exponential(index, tokens), expected)
            assert torch.equal(noise.exponential([index, index + 1], torch.stack([tokens, tokens]))[0], expected)
            assert torch.equal(noise.exponential(torch.tensor([[index]]), tokens[None])[0], expected)
