"""`Engine.generate(logprobs=N)`: each committed token's log-probability and the N most likely ids at its row, the
same whether the token came from a verified tree or a decode step.

- random trees on tiny models (greedy, cut mid-path by the token budget) give AR's tokens and AR's log-probabilities
  (within fp32 rounding: the torch decoder rounds a tree's rows by their count), one entry a token;
- on the embedded model (the compiled CPU decoder, whose verified rows are bitwise decode steps) the n-gram
  drafter's log-probabilities are AR's bit for bit, and a sampled token's is that of the distribution it was drawn
  from (temperature and top-k applied: the ids top-k drops are -inf); `specchat run --json --logprobs N` reports
  them.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter
from test_cli import specchat

from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling import SamplingConfig

VOCAB = 1024


def _decode(engine: Engine, prompt: list[int], n: int, top: int, sampling=SamplingConfig()):
    events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=n, logprobs=top))
    assert all(len(event.logprobs) == len(event.tokens) for event in events)
    return [t for e in events for t in e.tokens], [entry for e in events for entry in e.logprobs]


@pytest.mark.parametrize(("family", "budget"), [("llama", 4), ("qwen2", 16)])
def test_tree_tokens_carry_the_log_probabilities_of_decode_steps(family, budget, tokenizer):
    model = tiny_model(family, vocab_size=VOCAB, seed=1)
    prompt = torch.randint(3, VOCAB, (10,), generator=torch.Generator().manual_seed(1)).tolist()
    alone, expected = _decode(Engine(model, tokenizer, max_len=256), prompt, 45, 3)
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=2, reference=prompt + alone, p_correct=0.8)
    tokens, scored = _decode(Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=budget), prompt, 45, 3)
    assert tokens == alone and len(scored) == 45
    for token, entry, reference in zip(tokens, scored, expected):
        assert entry.top[0][0] == token and entry.logprob == entry.top[0][1] <= 0
        assert math.isclose(entry.logprob, reference.logprob, abs_tol=1e-4)
        assert [i for i, _ in entry.top] == [i for i, _ in reference.top]


@pytest.mark.slow
def test_on_the_cpu_decoder_they_are_bitwise_and_a_sampled_tokens_is_its_distributions(default_model):
    from specchat.session import Session

    ids = encode_prompt(default_model.tokenizer, "Repeat exactly: one two three four five, one two three four five.")
    session = Session.open(None, max_len=256, drafter="ngram")
    engine = session.engine
    drafted = _decode(engine, ids, 40, 5)
    engine.set_drafter(None)
    assert drafted == _decode(engine, ids, 40, 5)
    sampling = SamplingConfig(temperature=0.8, top_k=3, seed=4)
    tokens, scored = _decode(engine, ids, 24, 5, sampling)
    kept = []
    for token, entry in zip(tokens, scored):
        finite = [lp for _, lp in entry.top if math.isfinite(lp)]
        assert math.isfinite(entry.logprob) and token in [i for i, _ in entry.top[: len(finite)]]
        kept.append(len(finite))
        if len(finite) < 5:  # top-k's 3, or more where bf16 logits tie with the 3rd: the whole distribution
            assert sum(map(math.exp, finite)) == pytest.approx(1.0, abs=1e-5)
    assert 3 in kept


@pytest.mark.slow
def test_run_reports_them():
    result = specchat("run", "Say hi.", "--json", "--logprobs", "2", "-n", "6", "--temperature", "0", warm=True)
    report = json.loads(result.stdout)
    entries = report["logprobs"]
    assert len(entries) == len(report["token_ids"]) == 6
    assert "".join(entry["token"] for entry in entries) == report["text"]
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] == e["logprob"] for e in entries)


def _scores_what_decoding_reported(engine: Engine, prompt: list[int], n: int, exact: bool) -> None:
    tokens, reported = _decode(engine, prompt, n, 4)
    scored = engine.prompt_logprobs(prompt + tokens, 4)
    assert len(scored) == len(prompt) + len(tokens) and scored[0] is None
    assert all(entry.logprob <= 0 and len(entry.top) == 4 for entry in scored[1:])
    for entry, reference in zip(scored[len(prompt) :], reported):
        if exact:
            assert entry == reference
        else:
            assert math.isclose(entry.logprob, reference.logprob, abs_tol=1e-4)
            assert [i for i, _ in entry.top] == [i for i, _ in reference.top]
    # the prompt stays cached: generating from it next prefills its last token only, and answers as before
    events = list(engine.generate(prompt + tokens, max_new_tokens=4))
    assert events[0].stats.reused_tokens == len(prompt) + len(tokens) - 1


def test_scoring_a_text_gives_the_log_probabilities_decoding_it_reported(tokenizer, monkeypatch):
    """`prompt_logprobs` (echo's): the rows of a prefill, in pieces, score each token as the decode step that chose
    it did (the torch decoder rounds a prefill by its rows: within fp32 rounding)."""
    import specchat.engine.generate as generate

    monkeypatch.setattr(generate, "PROMPT_CHUNK", 7)  # several pieces
    model = tiny_model("llama", vocab_size=VOCAB, seed=4)
    prompt = torch.randint(3, VOCAB, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    _scores_what_decoding_reported(Engine(model, tokenizer, max_len=256), prompt, 20, exact=False)


@pytest.mark.slow
def test_on_the_cpu_decoder_a_scored_text_is_bitwise_its_decode_steps(default_model):
    from specchat.session import Session

    ids = encode_prompt(default_model.tokenizer, "Name three colours.")
    _scores_what_decoding_reported(Session.open(None, max_len=256, drafter="none").engine, ids, 24, exact=True)
