"""The logits pipeline is exactly its definition and exactly transformers' own processors.

Proven here: penalty, temperature, top-k, top-p and min-p mask the same tokens as transformers' processors
and leave the same finite values on random logits; constructed logits pin each rule to a literal table
(boundaries included); `process_logits` applies penalty -> temperature -> top-k -> top-p -> min-p, and only
the penalty when greedy, and runs top-p and min-p over top-k's survivors (or top-p alone over the largest logits)
with the same tokens and logits as over the vocabulary; `SamplingConfig` rejects every out-of-range field.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specchat.engine.keyed_draws import choose
from specchat.engine.sampling import (
    NUCLEUS_ROOM,
    Processed,
    SamplingConfig,
    _min_p_survivors,
    _nucleus_survivors,
    apply_min_p,
    apply_penalty_,
    apply_top_k,
    apply_top_p,
    process_logits,
    process_rows,
)

NEG_INF = float("-inf")


def random_logits(rows: int = 8, vocab: int = 1000, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=generator) * scale


def random_history(rows: int = 8, width: int = 64, vocab: int = 1000, seed: int = 1) -> torch.Tensor:
    """Ids drawn from a small range so rows repeat tokens, like real text does."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab // 4, (rows, width), generator=generator)


def kept(logits: torch.Tensor) -> list[list[int]]:
    """The token ids left finite in each row."""
    return [torch.isfinite(row).nonzero().flatten().tolist() for row in logits]


def assert_same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Exactly the same tokens masked to -inf, and the same finite values."""
    assert ours.shape == theirs.shape
    assert torch.equal(ours == NEG_INF, theirs == NEG_INF), "different tokens are masked"
    assert not torch.isnan(ours).any()
    finite = torch.isfinite(theirs)
    torch.testing.assert_close(ours[finite], theirs[finite])


def hf(processor, logits: torch.Tensor, input_ids: torch.Tensor | None = None) -> torch.Tensor:
    if input_ids is None:
        input_ids = torch.zeros(logits.shape[0], 1, dtype=torch.long)
    return processor(input_ids, logits.clone())


# --- agreement with transformers on random logits -------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 5, 50, 999, 1000, 5000])
def test_top_k_matches_transformers(k):
    logits = random_logits()
    ours = apply_top_k(logits, k)
    assert_same(ours, hf(TopKLogitsWarper(k), logits))
    # definition: the k largest survive unchanged (random floats have no ties)
    expected = min(k, logits.shape[1])
    assert (torch.isfinite(ours).sum(dim=1) == expected).all()
    top = torch.topk(logits, expected, dim=1).indices
    assert torch.equal(ours.gather(1, top), logits.gather(1, top))


@pytest.mark.parametrize("p", [0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99])
def test_top_p_matches_transformers(p):
    logits = random_logits()
    ours = apply_top_p(logits, p)
    assert_same(ours, hf(TopPLogitsWarper(p), logits))
    # definition: kept = the shortest most-likely prefix whose mass reaches p
    probs = logits.softmax(dim=1)
    for row, out in zip(probs, ours):
        order = row.argsort(descending=True)
        n_kept = int(torch.isfinite(out).sum())
        assert torch.equal(torch.isfinite(out[order]), torch.arange(len(row)) < n_kept), "not a prefix"
        mass = row[order].cumsum(0)
        assert n_kept == 1 or mass[n_kept - 2] < p  # without its last token the set falls short of p
        assert n_kept == len(row) or mass[n_kept - 1] >= p - 1e-6  # with it, the set reaches p


@pytest.mark.parametrize("min_p", [0.001, 0.01, 0.05, 0.2, 0.5, 0.9])
def test_min_p_matches_transformers(min_p):
    logits = random_logits(scale=1.0)  # flatter rows: min-p keeps many tokens
    ours = apply_min_p(logits, min_p)
    assert_same(ours, hf(MinPLogitsWarper(min_p), logits))
    probs = logits.softmax(dim=1)
    expected = probs >= min_p * probs.max(dim=1, keepdim=True).values
    assert torch.equal(torch.isfinite(ours), expected)


@pytest.mark.parametrize("temperature", [0.1, 0.3, 0.7, 1.0, 1.5, 4.0])
def test_temperature_matches_transformers(temperature):
    logits = random_logits()
    ours = process_logits(logits, SamplingConfig(temperature=temperature))
    assert_same(ours, hf(TemperatureLogitsWarper(temperature), logits))
    torch.testing.assert_close(ours, logits / temperature)


@pytest.mark.parametrize("penalty", [0.5, 0.8, 1.3, 2.0, 10.0])
def test_penalty_matches_transformers(penalty):
    logits = random_logits()
    history = random_history()
    ours = apply_penalty_(logits.clone(), history, penalty)
    assert_same(ours, hf(RepetitionPenaltyLogitsProcessor(penalty), logits, history))
    # tokens absent from a row's history are untouched
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, history, True)
    assert torch.equal(ours[~seen], logits[~seen])
    assert not torch.equal(ours[seen], logits[seen])


@pytest.mark.parametrize(
    "temperature, top_k, top_p, min_p, penalty",
    [
        (0.7, 50, 0.9, 0.05, 1.3),
        (1.0, 0, 0.8, 0.0, 1.0),
        (1.3, 10, 1.0, 0.1, 2.0),
        (0.5, 200, 0.95, 0.0, 0.8),
        (2.0, 0, 1.0, 0.02, 1.0),
    ],
)
def test_process_logits_matches_transformers_chain(temperature, top_k, top_p, min_p, penalty):
    config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, penalty=penalty)
    logits = random_logits(seed=3)
    history = random_history(seed=4)
    chain = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(penalty), TemperatureLogitsWarper(temperature)])
    if top_k:
        chain.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        chain.append(TopPLogitsWarper(top_p))
    if min_p:
        chain.append(MinPLogitsWarper(min_p))
    assert_same(process_logits(logits, config, history), chain(history, logits.clone()))


# --- literal tables on constructed logits ---------------------------------------------------------------


@pytest.mark.parametrize(
    "k, expected",
    [(1, [1]), (2, [1, 3]), (3, [1, 2, 3]), (4, [1, 2, 3, 4]), (5, [0, 1, 2, 3, 4]), (0, [0, 1, 2, 3, 4])],
)
def test_top_k_table(k, expected):
    logits = torch.tensor([[1.0, 9.0, 3.0, 5.0, 2.0]])
    out = apply_top_k(logits, k)
    assert kept(out) == [expected]
    assert torch.equal(out[torch.isfinite(out)], logits[torch.isfinite(out)])


def test_top_k_keeps_ties_with_the_kth_value():
    assert kept(apply_top_k(torch.tensor([[4.0, 1.0, 4.0, 4.0]]), 1)) == [[0, 2, 3]]


@pytest.mark.parametrize(
    "p, expected",
    # logits [3, 2, 1, 0]: probs .644 .237 .087 .032, mass strictly above each: 0 .6439 .8808 .9679
    [(0.01, [0]), (0.6, [0]), (0.643, [0]), (0.645, [0, 1]), (0.88, [0, 1]), (0.9, [0, 1, 2]),
     (0.96, [0, 1, 2]), (0.97, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])],
)  # fmt: skip
def test_top_p_table(p, expected):
    assert kept(apply_top_p(torch.tensor([[3.0, 2.0, 1.0, 0.0]]), p)) == [expected]


@pytest.mark.parametrize("p, expected", [(0.25, [0]), (0.5, [0]), (0.500001, [0, 1]), (0.75, [0, 1])])
def test_top_p_boundary_is_strict(p, expected):
    """probs [.5, .25, .125, .125] are exact in fp32: a token whose mass above equals p is dropped."""
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()
    assert logits.softmax(-1).tolist() == [[0.5, 0.25, 0.125, 0.125]]
    out = apply_top_p(logits, p)
    assert kept(out) == [expected]
    assert_same(out, hf(TopPLogitsWarper(p), logits))


@pytest.mark.parametrize(
    "min_p, expected",
    # probs .5 .2 .16 .1 .04: kept iff prob >= min_p * .5
    [(0.05, [0, 1, 2, 3, 4]), (0.1, [0, 1, 2, 3]), (0.3, [0, 1, 2]), (0.35, [0, 1]), (0.5, [0]), (0.99, [0])],
)
def test_min_p_table(min_p, expected):
    logits = torch.tensor([[0.5, 0.2, 0.16, 0.1, 0.04]]).log()
    assert kept(apply_min_p(logits, min_p)) == [expected]


def test_min_p_boundary_is_inclusive():
    """probs [.5, .25, .25] are exact in fp32: a token at exactly min_p times the top probability stays."""
    logits = torch.tensor([[0.5, 0.25, 0.25]]).log()
    assert logits.softmax(-1).tolist() == [[0.5, 0.25, 0.25]]
    assert kept(apply_min_p(logits, 0.5)) == [[0, 1, 2]]
    assert kept(apply_min_p(logits, 0.500001)) == [[0]]
    assert_same(apply_min_p(logits, 0.5), hf(MinPLogitsWarper(0.5), logits))


def test_off_values_are_identity():
    logits = random_logits(rows=3)
    for out in (apply_top_k(logits, 0), apply_top_p(logits, 1.0), apply_min_p(logits, 0.0)):
        assert torch.equal(out, logits)
    assert torch.equal(process_logits(logits, SamplingConfig(temperature=1.0)), logits)


def test_penalty_table():
    logits = torch.tensor([[2.0, -2.0, 0.0, 3.0, -1.0, 4.0]])
    history = torch.tensor([[0, 1, 2, 1, -1, -1]])  # repeats penalise once; -1 is padding
    out = apply_penalty_(logits.clone(), history, 2.0)
    assert out.tolist() == [[1.0, -4.0, 0.0, 3.0, -1.0, 4.0]]
    boosted = apply_penalty_(logits.clone(), history, 0.5)  # theta < 1 rewards repetition
    assert boosted.tolist() == [[4.0, -1.0, 0.0, 3.0, -1.0, 4.0]]


def test_penalty_padding_is_ignored():
    logits = torch.tensor([[2.0, 2.0, 2.0, 2.0]])
    all_padding = torch.full((1, 5), -1)
    assert torch.equal(apply_penalty_(logits.clone(), all_padding, 3.0), logits)
    # the last vocab id is not hit by padding's column shift
    out = apply_penalty_(logits.clone(), torch.tensor([[-1, 3, -1]]), 2.0)
    assert out.tolist() == [[2.0, 2.0, 2.0, 1.0]]


def test_penalty_uses_each_rows_own_history():
    logits = torch.tensor([[4.0, -4.0, 2.0, 0.0, 1.0, 6.0]] * 2)
    history = torch.tensor([[5, -1, -1], [0, 1, 1]])  # row 0 penalises token 5, row 1 does not
    out = apply_penalty_(logits.clone(), history, 2.0)
    assert out.tolist() == [[4.0, -4.0, 2.0, 0.0, 1.0, 3.0], [2.0, -8.0, 2.0, 0.0, 1.0, 6.0]]


# --- process_logits -------------------------------------------------------------------------------------


def test_greedy_returns_penalised_logits_only():
    logits = torch.tensor([[5.0, 4.0, -1.0, 3.0], [1.5, 2.4, 0.5, -3.0]])
    history = torch.tensor([[0, -1], [1, 3]])
    config = SamplingConfig(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9, penalty=2.0)
    out = process_logits(logits, config, history)
    torch.testing.assert_close(out, torch.tensor([[2.5, 4.0, -1.0, 3.0], [1.5, 1.2, 0.5, -6.0]]))  # no masking
    assert choose(Processed(logits), None, [0, 1]).tolist() == [0, 1]
    assert choose(Processed(out), None, [0, 1]).tolist() == [1, 0]  # the penalty moved both rows' greedy token
    assert process_logits(logits, SamplingConfig(), history).tolist() == logits.tolist()  # penalty 1 = off


@pytest.mark.parametrize("top_k, top_p, min_p", [(20, 0.8, 0.0), (40, 1.0, 0.1), (5, 0.95, 0.05), (1, 0.5, 0.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_p_and_min_p_over_the_top_k_alone_equal_them_over_the_vocabulary(top_k, top_p, min_p, dtype):
    """process_logits runs top-p and min-p over the k survivors of top-k only: the same tokens and logits as
    the three steps over the whole vocabulary, also where bf16 logits tie with the k-th."""
    logits = random_logits(rows=6, vocab=50_000, seed=7).to(dtype)
    config = SamplingConfig(temperature=0.7, top_k=top_k, top_p=top_p, min_p=min_p)
    full = apply_min_p(apply_top_p(apply_top_k(logits.float() / 0.7, top_k), top_p), min_p)
    assert torch.equal(process_logits(logits, config), full)


@pytest.mark.parametrize("temperature, top_p, min_p", [(0.6, 0.9, 0.0), (1.0, 0.8, 0.05), (0.3, 0.5, 0.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_p_alone_over_the_largest_logits_equals_it_over_the_vocabulary(temperature, top_p, min_p, dtype):
    """Without a top-k, a CPU looks for the nucleus among the NUCLEUS_ROOM largest logits (their probabilities over
    the whole vocabulary) and sorts the vocabulary only where a row's nucleus may reach past them: the same tokens
    and logits either way, bf16's ties included."""
    logits = random_logits(rows=6, vocab=50_000, seed=9).to(dtype)
    logits[:, :3] += 30.0  # peaked rows: the nucleus is a few tokens
    flat = random_logits(rows=2, vocab=50_000, seed=10, scale=0.5).to(dtype)  # a nucleus of thousands
    config = SamplingConfig(temperature=temperature, top_p=top_p, min_p=min_p)
    for rows, looked_among_the_largest in ((logits, True), (flat, False)):
        scaled = rows.float() / temperature
        assert (_nucleus_survivors(scaled, top_p) is not None) == looked_among_the_largest
        full = apply_min_p(apply_top_p(scaled, top_p), min_p)
        assert torch.equal(process_logits(rows, config), full)


@pytest.mark.parametrize("temperature, min_p, keep", [(1.0, 0.1, 20), (0.7, 0.05, 1), (1.3, 0.2, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_min_p_alone_over_the_largest_logits_equals_it_over_the_vocabulary(temperature, min_p, keep, dtype):
    """Min-p without top-k or top-p (a book's sampling) looks for its survivors among the NUCLEUS_ROOM largest
    logits, and over the whole rows where some row's may reach past them (a flat row; a `keep` past the room): the
    same tokens and logits either way."""
    logits = random_logits(rows=6, vocab=50_000, seed=11).to(dtype)
    logits[:, :3] += 30.0
    flat = random_logits(rows=2, vocab=50_000, seed=12, scale=0.5).to(dtype)
    config = SamplingConfig(temperature=temperature, min_p=min_p, min_p_keep=keep)
    for rows, looked_among_the_largest in ((logits, keep <= NUCLEUS_ROOM), (flat, False)):
        scaled = rows.float() / temperature
        assert (_min_p_survivors(scaled, min_p, keep) is not None) == looked_among_the_largest
        processed = process_rows(rows, config)
        assert (processed.tokens is not None) == looked_among_the_largest
        assert torch.equal(processed.logits, apply_min_p(scaled, min_p, keep))


def test_top_p_keeps_or_drops_tied_tokens_together():
    """Each of three tied tokens holds 0.3: the mass strictly above each is 0, so p = 0.5 keeps all three, not
    the two a sort happened to put first; the token below them has 0.9 above it and goes."""
    row = torch.tensor([[0.0, 0.0, 0.0, -1.0986]])  # probs 0.3, 0.3, 0.3, 0.1
    assert kept(apply_top_p(row, 0.5)) == [[0, 1, 2]]
    assert kept(apply_top_p(row[:, [3, 1, 0, 2]], 0.5)) == [[1, 2, 3]]


def test_process_logits_keeps_ties_with_the_kth_value():
    row = torch.tensor([[4.0, 1.0, 4.0, 4.0, 0.5, 0.0, -1.0, -2.0]])  # k = 1: the ties reach past the 2 largest
    assert kept(process_logits(row, SamplingConfig(temperature=1.0, top_k=1))) == [[0, 2, 3]]
    assert kept(process_logits(row, SamplingConfig(temperature=1.0, top_k=1, top_p=0.5))) == [[0, 2, 3]]  # ties: all
    assert kept(process_logits(row, SamplingConfig(temperature=1.0, top_k=2))) == [[0, 2, 3]]  # within the 4 largest
    drafted = process_logits(row, SamplingConfig(temperature=1.0, top_k=1), drafting=True)
    [tokens] = kept(drafted)  # a draft's distribution keeps the 2k largest: no read for the ties past them
    assert len(tokens) == 2 and set(tokens) < {0, 2, 3}


def test_sampling_chain_order():
    """penalty -> temperature -> top-k -> top-p -> min-p, each on the previous step's output."""
    logits = torch.tensor([[6.0, 5.0, 4.8, 3.0, 1.0, -2.0], [0.0, 3.0, 2.0, 2.5, -1.0, 1.0]])
    history = torch.tensor([[0, -1], [3, 5]])
    config = SamplingConfig(temperature=0.5, top_k=4, top_p=0.95, min_p=0.1, penalty=1.5)
    step = apply_penalty_(logits.clone(), history, 1.5)
    # row 0: token 0 6 -> 4; row 1: token 3 2.5 -> 1.667, token 5 1 -> .667
    torch.testing.assert_close(step, torch.tensor([[4, 5, 4.8, 3, 1, -2], [0, 3, 2, 5 / 3, -1, 2 / 3]]))
    step = step / 0.5
    step = apply_top_k(step, 4)
    assert kept(step) == [[0, 1, 2, 3], [1, 2, 3, 5]]
    step = apply_top_p(step, 0.95)  # row 0: mass above token 3 is .990; row 1: above token 5 is .992
    assert kept(step) == [[0, 1, 2], [1, 2, 3]]
    step = apply_min_p(step, 0.1)  # row 1: token 3 has p .058 < .1 * .830
    assert kept(step) == [[0, 1, 2], [1, 2]]
    assert_same(process_logits(logits, config, history), step)


@pytest.mark.parametrize(
    "row, config, expected, swapped",
    [
        # top-k renormalises before top-p: {3, 2} -> .73 .27, so p=.7 keeps token 0 only; top-p first keeps 2
        ([3.0, 2.0, 1.9, 1.8, 1.7, 1.6, 1.5], SamplingConfig(temperature=1.0, top_k=2, top_p=0.7), [0], [0, 1]),
        # top-p before min-p: p=.8 keeps .4 .3 .12; min-p first drops .1 .08, renormalises, and top-p drops .12
        (torch.tensor([0.4, 0.3, 0.12, 0.1, 0.08]).log().tolist(), SamplingConfig(temperature=1.0, top_p=0.8,
         min_p=0.28), [0, 1, 2], [0, 1]),
    ],
)  # fmt: skip
def test_processor_order_matters(row, config, expected, swapped):
    logits = torch.tensor([row])
    assert kept(process_logits(logits, config)) == [expected]
    if config.top_k:
        wrong = apply_top_k(apply_top_p(logits, config.top_p), config.top_k)
    else:
        wrong = apply_top_p(apply_min_p(logits, config.min_p), config.top_p)
    assert kept(wrong) == [swapped]


def test_history_is_ignored_without_penalty_and_penalty_needs_history():
    logits = random_logits(rows=2)
    history = random_history(rows=2)
    assert torch.equal(process_logits(logits, SamplingConfig(temperature=1.0), history), logits)
    assert torch.equal(process_logits(logits, SamplingConfig(temperature=1.0, penalty=2.0), None), logits)


def test_occurrence_penalties_table():
    logits = torch.zeros(2, 6)
    history = torch.tensor([[1, 1, 1, 4, -1], [2, -1, -1, -1, -1]])
    out = process_logits(logits, SamplingConfig(frequency_penalty=0.5, presence_penalty=0.25), history)
    assert out.tolist() == [[0, -1.75, 0, 0, -0.75, 0], [0, 0, -0.75, 0, 0, 0]]  # 3 * 0.5 + 0.25; 0.5 + 0.25
    assert torch.equal(process_logits(logits, SamplingConfig(frequency_penalty=-1.0), history)[0, 1], torch.tensor(3.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_pipeline_edits_a_copy_of_the_rows(dtype):
    """Bias, suppressed ids and the penalty are written in place, on one copy: the caller's logits stay as given."""
    logits = random_logits(rows=3).to(dtype)
    given = logits.clone()
    config = SamplingConfig(temperature=0.8, penalty=1.3, suppress=(2,), logit_bias=((4, 1.5),))
    out = process_logits(logits, config, torch.tensor([[1, 5], [0, -1], [7, 7]]))
    assert torch.equal(logits, given) and out.data_ptr() != logits.data_ptr()
    assert bool((out[:, 2] == NEG_INF).all())


def test_logit_bias_is_added_first_even_when_greedy():
    logits = random_logits(rows=2)
    config = SamplingConfig(penalty=2.0, logit_bias=((3, -100.0), (5, 2.5)))
    history = torch.tensor([[5], [-1]])
    out = process_logits(logits, config, history)
    expected = logits.clone()
    expected[:, 3] -= 100
    expected[:, 5] += 2.5
    assert torch.equal(out, apply_penalty_(expected, history, 2.0))  # the bias, then the penalty on the biased logit


def test_process_logits_returns_fp32_and_leaves_input_alone():
    logits = random_logits(rows=2)
    before = logits.clone()
    process_logits(logits, SamplingConfig(logit_bias=((0, 1.0),)))
    assert torch.equal(logits, before)
    logits = random_logits(rows=2).bfloat16()
    before = logits.clone()
    config = SamplingConfig(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, penalty=1.2)
    out = process_logits(logits, config, random_history(rows=2))
    assert out.dtype == torch.float32
    assert torch.equal(logits, before)


# --- SamplingConfig -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1), ("temperature", float("nan")),
        ("top_k", -1),
        ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.01), ("top_p", float("nan")),
        ("min_p", -0.01), ("min_p", 1.0), ("min_p", 1.5),
        ("penalty", 0.0), ("penalty", -1.0), ("penalty", float("nan")),
        ("penalty_window", 0), ("penalty_window", -5),
        ("logit_bias", ((1, 101.0),)), ("logit_bias", ((-1, 1.0),)),
        ("frequency_penalty", 2.5), ("frequency_penalty", float("nan")), ("presence_penalty", -2.1),
    ],
)  # fmt: skip
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value})


def test_config_accepts_edge_values():
    SamplingConfig(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, penalty=1.0, penalty_window=1)
    SamplingConfig(temperature=1e-6, top_k=1, top_p=1e-6, min_p=0.999, penalty=1e-3, seed=0)
    assert SamplingConfig().greedy and not SamplingConfig(temperature=0.1).greedy
    assert SamplingConfig(penalty=1.1).uses_history and not SamplingConfig().uses_history
