"""Greedy tree speculative decoding emits exactly the target's greedy tokens, whatever the drafter proposes.

Proven here, on tiny random models of every family (and once on the real default model):
- equality with `transformers`' greedy `generate` for an oracle drafter (always right, surrounded by wrong
  siblings and decoys), an always-wrong drafter, random trees of every budget from 1 to 64, and the n-gram
  drafter at budgets 1, 4, 16 and 64 (its copies of a long passage included);
- the oracle's whole chain is accepted at every step, its tokens carry the drafter's origin and the bonus
  "target"; the always-wrong drafter gets nothing accepted and every token is "target";
- an EOS inside an accepted path (or as the bonus) ends generation exactly there with "eos",
  `max_new_tokens` reached mid-path gives exactly that many tokens with "length", and a stop string
  completed mid-path ends it with "stop" after the same tokens and text — all as autoregressive decoding;
- after any sequence of speculative steps (cut paths and a second turn included) the static cache holds
  exactly the KV of a fresh forward over the committed tokens;
- `min_tokens` holds the end of text back at each verified row by its position, as in autoregressive decoding,
  though the drafter offers it beside every node;
- with the repetition penalty, spec decoding equals autoregressive decoding under the same penalty (each
  tree node is penalised with its own history), and the penalty really changes the output; the same under
  OpenAI's frequency and presence penalties, and under a logit bias, greedy and sampled.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time

import pytest
import torch
from conftest import TINY_FAMILIES, fresh_kv, tiny_model
from drafters_for_tests import EndBesideDrafter, OracleDrafter, RandomTreeDrafter, ScoredChainDrafter, WrongDrafter

from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.engine.events import COPY, TARGET
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling import SamplingConfig
from specchat.engine.verify_cost import PLAIN_STEP_EVERY

GREEDY = SamplingConfig()
VOCAB = 1024  # small enough to be cheap, large enough that random models rarely repeat or emit EOS (2)


def run(engine: Engine, prompt: list[int], n: int, sampling: SamplingConfig = GREEDY):
    events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=n))
    return [t for e in events for t in e.tokens], events


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=n, pad_token_id=model.config.pad_token_id
        )
    return out[0, len(prompt) :].tolist()


def random_prompt(n: int, seed: int, vocab: int = VOCAB) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@functools.cache
def model_and_greedy(family: str, seed: int, vocab: int = VOCAB, n: int = 160, prompt: tuple[int, ...] = ()):
    """A tiny model, a prompt and the model's greedy continuation by `transformers` (shared, read only)."""
    model = tiny_model(family, vocab_size=vocab, seed=seed)
    prompt = list(prompt) or random_prompt(12, seed, vocab)
    return model, prompt, hf_greedy(model, prompt, n)


def assert_cache_is_fresh_prefill(engine: Engine, committed: list[int]) -> None:
    """The session holds `committed` and its cache the KV of a fresh forward over all but the last (root)."""
    assert engine.length == len(committed)
    assert engine.ids == committed
    assert engine.cache.length == len(committed) - 1
    # tolerance: fp32 noise between differently batched forwards; a wrong KV row differs by O(1)
    for layer, (keys, values) in zip(engine.cache.layers, fresh_kv(engine.model, committed[:-1])):
        assert layer.length == len(committed) - 1
        torch.testing.assert_close(layer.keys[:, :, : layer.length], keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(layer.values[:, :, : layer.length], values, atol=1e-4, rtol=1e-4)


# --- oracle, always-wrong and random drafters -----------------------------------------------------------


@pytest.mark.parametrize(
    "family, depth, budget, tree_size",
    [
        ("llama", 1, 1, 1),  # the chain alone: no room for siblings
        ("qwen2", 3, 4, 4),  # one wrong sibling
        ("qwen3", 4, 16, 11),  # chain + a wrong sibling and a decoy per level
        ("mistral", 6, 10, 10),  # budget cuts the siblings
        ("llama", 8, 64, 23),
    ],
)
def test_oracle_chain_is_always_accepted(family, depth, budget, tree_size, tokenizer):
    model, prompt, greedy = model_and_greedy(family, seed=1)
    steps = 6
    n = 1 + steps * (depth + 1)
    drafter = OracleDrafter(prompt + greedy, depth=depth, vocab_size=VOCAB)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
    out, events = run(engine, prompt, n)
    assert out == greedy[:n]
    assert events[0].origins == [TARGET]  # the prefill's token
    for event in events[1:]:
        assert event.origins == ["oracle"] * depth + [TARGET]
    assert [len(tree) for tree in drafter.proposals] == [tree_size] * steps
    stats = events[-1].stats
    assert (stats.steps, stats.accepted, stats.acceptance_rate) == (steps, steps * depth, 1.0)
    assert events[-1].finish_reason == "length"
    assert_cache_is_fresh_prefill(engine, prompt + out)


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("budget", [1, 8, 64])
def test_always_wrong_drafter_changes_nothing(family, budget, tokenizer):
    model, prompt, greedy = model_and_greedy(family, seed=2)
    drafter = WrongDrafter(prompt + greedy, vocab_size=VOCAB, width=3, depth=6)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
    out, events = run(engine, prompt, 40)
    assert out == greedy[:40]
    assert all(origin == TARGET for event in events for origin in event.origins)
    assert len(events) == 40 and events[-1].stats.accepted == 0
    assert all(len(tree) == min(budget, 18) for tree in drafter.proposals)


@pytest.mark.parametrize("seed, budget", list(enumerate([1, 2, 3, 5, 8, 16, 33, 64])))
def test_random_trees_change_nothing(seed, budget, tokenizer):
    family = TINY_FAMILIES[seed % 4]
    model, prompt, greedy = model_and_greedy(family, seed=3)
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=seed, reference=prompt + greedy, p_correct=0.7)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
    out, events = run(engine, prompt, 60)
    assert out == greedy[:60]
    assert events[-1].stats.accepted > 0  # some paths were right, so the tree path really ran
    if budget >= 3:  # and the trees really branched
        assert any(len(set(tree.parents)) < len(tree) for tree in drafter.proposals)
    assert_cache_is_fresh_prefill(engine, prompt + out)


# --- the n-gram drafter ---------------------------------------------------------------------------------

REPETITIVE = (5, 9, 12, 7, 5, 9, 12, 7, 5, 9, 12, 7, 5, 9)
# vocab 64: small enough that greedy output falls into loops the n-gram drafter can predict; seeds chosen
# so that the 96 greedy tokens contain no EOS
NGRAM_MODELS = {"llama": 0, "qwen2": 3, "qwen3": 1, "mistral": 2}


class CountsCopies(NgramDrafter):
    """The n-gram drafter, counting the trees it proposed as copies of a long passage."""

    copies = 0

    def propose(self, budget, sampling=None, least_chance=0.0, noise=None):
        tree = super().propose(budget, sampling, least_chance, noise)
        self.copies += COPY in tree.origins
        return tree


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("budget", [1, 4, 16, 64])
def test_ngram_drafter_equals_greedy(family, budget, tokenizer):
    model, prompt, greedy = model_and_greedy(family, seed=NGRAM_MODELS[family], vocab=64, n=96, prompt=REPETITIVE)
    assert len(greedy) == 96
    drafter = CountsCopies()
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
    out, events = run(engine, prompt, 96)
    assert out == greedy
    assert events[-1].stats.accepted > 0
    assert any({"ngram", COPY} & set(event.origins) for event in events)
    if family == "qwen3":  # its greedy output repeats stretches longer than COPY_MATCH: copies are verified too
        assert drafter.copies > 0
    assert_cache_is_fresh_prefill(engine, prompt + out)


# --- EOS and max_new_tokens inside an accepted path -----------------------------------------------------

DEPTH = 4  # oracle chain: step 1 commits tokens 1..5 (5 = bonus), step 2 commits 6..10, ...


@pytest.mark.parametrize("k", [1, 3, 5, 6, 8])  # index of the EOS in the output: chain nodes and a bonus
def test_eos_inside_accepted_path_stops_there(k, tokenizer):
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=4)
    prompt = random_prompt(10, seed=4)
    greedy = hf_greedy(model, prompt, 40)
    eos = greedy[k]
    assert eos not in greedy[:k]  # the output's first EOS is at k
    model.generation_config.eos_token_id = eos
    ar_out, ar_events = run(Engine(model, tokenizer, max_len=128), prompt, 40)
    assert ar_out == greedy[: k + 1] and ar_events[-1].finish_reason == "eos"

    drafter = OracleDrafter(prompt + greedy, depth=DEPTH, vocab_size=VOCAB)  # its chains run past the EOS
    engine = Engine(model, tokenizer, max_len=128, drafter=drafter, draft_budget=12)
    out, events = run(engine, prompt, 40)
    assert out == ar_out
    assert events[-1].finish_reason == "eos" and events[-1].tokens[-1] == eos
    assert all(event.finish_reason is None for event in events[:-1])
    assert_cache_is_fresh_prefill(engine, prompt + out)

    # the session goes on from there: a second turn equals a fresh autoregressive session
    second = prompt + out + [7, 8, 9]
    expected2, _ = run(Engine(model, tokenizer, max_len=128), second, 20)
    drafter.reference = second + expected2
    out2, events2 = run(engine, second, 20)
    assert out2 == expected2 and events2[-1].stats.accepted > 0
    assert_cache_is_fresh_prefill(engine, second + out2)


def test_min_tokens_hold_the_end_back_at_every_verified_row(tokenizer):
    """vLLM's `min_tokens`: no end of text before that many tokens, in autoregressive decoding and at each tree row
    by its own position, though the drafter offers the end beside every node; past them the end may come."""
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=4)
    prompt = random_prompt(10, seed=4)
    greedy = hf_greedy(model, prompt, 40)
    model.generation_config.eos_token_id = end = greedy[2]  # the free output ends at its third token

    def held(engine, n, sampling=GREEDY):
        events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=40, min_tokens=n))
        return [t for e in events for t in e.tokens], events[-1].finish_reason

    plain = Engine(model, tokenizer, max_len=128)
    ar, finish = held(plain, 9)
    assert not set(ar[:9]) & plain.eos_ids and len(ar) > 9 and (finish == "length" or ar[-1] in plain.eos_ids)
    drafter = EndBesideDrafter(prompt + ar, depth=DEPTH, end=end)
    engine = Engine(model, tokenizer, max_len=128, drafter=drafter, draft_budget=12)
    assert held(engine, 9) == (ar, finish) and held(plain, 0) == (greedy[:3], "eos")
    sampled = SamplingConfig(temperature=1.0, seed=5)  # keyed draws: the text is the same however it was drafted
    text = held(plain, 9, sampled)
    drafter.reference = prompt + text[0]
    assert held(engine, 9, sampled) == text and not set(text[0][:9]) & plain.eos_ids


@pytest.mark.parametrize("n, mid_path", [(1, False), (2, True), (3, True), (6, False), (8, True), (11, False)])
def test_max_new_tokens_inside_accepted_path(n, mid_path, tokenizer):
    model, prompt, greedy = model_and_greedy("llama", seed=5)
    drafter = OracleDrafter(prompt + greedy, depth=DEPTH, vocab_size=VOCAB)
    engine = Engine(model, tokenizer, max_len=128, drafter=drafter, draft_budget=12)
    out, events = run(engine, prompt, n)
    assert out == greedy[:n]
    assert events[-1].finish_reason == "length"
    if mid_path:  # the cut dropped the bonus and part of the chain
        assert events[-1].origins == ["oracle"] * len(events[-1].tokens)
    assert_cache_is_fresh_prefill(engine, prompt + out)
    # and nothing of the dropped part leaks into the next request
    out2, _ = run(engine, prompt + out, 9)
    assert out2 == greedy[n : n + 9]
    assert_cache_is_fresh_prefill(engine, prompt + out + out2)


@pytest.mark.parametrize("k", [3, 5, 7])  # the stop string ends at token k: a chain node, a bonus, a chain node
def test_stop_string_inside_accepted_path_stops_like_autoregressive(k, tokenizer):
    model = tiny_model("llama", seed=2)  # full vocabulary: its greedy tokens decode to plain words
    prompt = random_prompt(10, seed=2, vocab=49152)
    greedy = hf_greedy(model, prompt, 30)
    stop = tokenizer.decode([greedy[k]]).strip()
    assert stop.isalpha() and stop not in tokenizer.decode(greedy[:k])
    ar_events = list(Engine(model, tokenizer, max_len=128).generate(prompt, max_new_tokens=30, stop=(stop,)))
    ar_out = [t for e in ar_events for t in e.tokens]
    assert ar_out == greedy[: k + 1] and ar_events[-1].finish_reason == "stop"

    drafter = OracleDrafter(prompt + greedy, depth=DEPTH, vocab_size=49152)
    engine = Engine(model, tokenizer, max_len=128, drafter=drafter, draft_budget=12)
    events = list(engine.generate(prompt, max_new_tokens=30, stop=(stop,)))
    assert events[-1].finish_reason == "stop"
    assert "".join(e.text for e in events) == "".join(e.text for e in ar_events)
    assert [t for e in events for t in e.tokens] == ar_out  # no token past the stop string is committed
    assert_cache_is_fresh_prefill(engine, prompt + ar_out)


def test_trees_fill_the_context_exactly_like_autoregressive(tokenizer):
    """Near the end of the context every step still has room for a full tree; the output stops where
    autoregressive decoding with the same max_len stops."""
    model, prompt, greedy = model_and_greedy("qwen3", seed=7)
    ar_out, ar_events = run(Engine(model, tokenizer, max_len=len(prompt) + 20), prompt, 100)
    assert ar_out == greedy[:21] and ar_events[-1].finish_reason == "context"  # the cache is full, not -n
    for budget in (8, 16, 64):
        drafter = OracleDrafter(prompt + greedy, depth=8, vocab_size=VOCAB)
        engine = Engine(model, tokenizer, max_len=len(prompt) + 20, drafter=drafter, draft_budget=budget)
        out, events = run(engine, prompt, 100)
        assert out == ar_out and events[-1].finish_reason == "context"
        assert_cache_is_fresh_prefill(engine, prompt + out)


def test_adaptive_budget_changes_nothing(tokenizer, tmp_path, monkeypatch):
    """Without a fixed budget the engine calibrates (forwards it never commits) and varies the tree size.
    Whether trees pay depends on the timings measured, so acceptance is checked under a calibration written
    here (verification as cheap as a decode step), not under the timings of a loaded test machine."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))  # the calibration file goes here
    model, prompt, greedy = model_and_greedy("qwen3", seed=NGRAM_MODELS["qwen3"], vocab=64, n=96, prompt=REPETITIVE)
    engine = Engine(model, tokenizer, max_len=256, drafter=NgramDrafter())
    out, _ = run(engine, prompt, 96)
    calibration = tmp_path / "verify_cost.json"
    assert calibration.is_file() and out == greedy
    assert_cache_is_fresh_prefill(engine, prompt + out)
    out2, _ = run(engine, prompt, 96)  # the session again, budget policy warmed up
    assert out2 == greedy

    entries = json.loads(calibration.read_text())
    calibration.write_text(json.dumps({key: {**entry, "seconds": [entry["seconds"][0]] * len(entry["seconds"])}
                                       for key, entry in entries.items()}))  # fmt: skip
    out3, events = run(Engine(model, tokenizer, max_len=256, drafter=NgramDrafter()), prompt, 96)
    assert out3 == greedy and events[-1].stats.accepted > 0


def test_trees_are_priced_at_the_context_class_of_each_text(tokenizer, tmp_path, monkeypatch):
    """A calibration stands for a context class (a power of two, at least 1024 tokens): a text that starts in a
    class not timed yet is timed at its own context; one in a class already timed reuses that timing."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    model = tiny_model("llama", vocab_size=VOCAB)
    model.config.max_position_embeddings = 4096  # default RoPE: the window only bounds the engine's cache
    engine = Engine(model, tokenizer, max_len=1400, drafter=NgramDrafter())
    calibration = tmp_path / "verify_cost.json"

    def classes() -> list[int]:
        return sorted(int(key.rsplit("|context=", 1)[1]) for key in json.loads(calibration.read_text()))

    def text(n: int, seed: int) -> list[int]:
        return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()

    run(engine, text(40, 0), 4)
    assert classes() == [1024]
    run(engine, text(1100, 1), 4)
    assert classes() == [1024, 2048]
    run(engine, text(1300, 2), 4)
    assert classes() == [1024, 2048]


# --- the cache after speculative steps, over two turns --------------------------------------------------


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_cache_equals_fresh_prefill_over_two_turns(family, tokenizer):
    model, prompt, greedy = model_and_greedy(family, seed=6)
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=6, reference=prompt + greedy, p_correct=0.8)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=16)
    out, events = run(engine, prompt, 33)
    assert out == greedy[:33] and events[-1].stats.accepted > 0
    assert_cache_is_fresh_prefill(engine, prompt + out)

    second = prompt + out + [300, 301, 302, 303]
    expected = hf_greedy(model, second, 40)
    drafter.reference = second + expected
    out2, events2 = run(engine, second, 40)
    assert out2 == expected
    assert events2[-1].stats.reused_tokens == len(prompt) + len(out) - 1
    assert events2[-1].stats.accepted > 0
    assert_cache_is_fresh_prefill(engine, second + out2)


# --- the repetition penalty: every node has its own history ---------------------------------------------

PENALTY = SamplingConfig(penalty=1.3, penalty_window=16)
ADDITIVE = SamplingConfig(frequency_penalty=0.5, presence_penalty=0.5, penalty_window=16)  # OpenAI's penalties


@pytest.mark.parametrize(("family", "penalty"), [("qwen3", PENALTY), ("llama", PENALTY), ("llama", ADDITIVE)])
def test_penalty_spec_equals_penalty_autoregressive(family, penalty, tokenizer):
    model, prompt, plain = model_and_greedy(family, seed=NGRAM_MODELS[family], vocab=64, n=96, prompt=REPETITIVE)
    expected, _ = run(Engine(model, tokenizer, max_len=256), prompt, 96, penalty)
    assert len(expected) == 96
    assert expected != plain  # the penalty changes the output, so the histories matter

    oracle = OracleDrafter(prompt + expected, depth=6, vocab_size=64)
    drafters = [
        (oracle, 24),
        (NgramDrafter(), 16),
        (RandomTreeDrafter(vocab_size=64, seed=1, reference=prompt + expected, p_correct=0.7), 32),
    ]
    for drafter, budget in drafters:
        engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
        out, events = run(engine, prompt, 96, penalty)
        assert out == expected, type(drafter).__name__
        assert events[-1].stats.accepted > 0, type(drafter).__name__
        if drafter is oracle:  # every chain node, at every depth, chose the penalised greedy token
            assert events[-1].stats.acceptance_rate == 1.0


# --- the default model ----------------------------------------------------------------------------------

COPY_PROMPT = (
    "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, "
    "mango, nectarine, orange, papaya, quince, raspberry, strawberry, tangerine, watermelon, apricot, "
    "blueberry, coconut, cranberry, guava, lime, lychee, peach, pear, plum, pomegranate, blackberry, cantaloupe."
)


@pytest.mark.slow
def test_default_model_ngram_equals_greedy(default_model):
    model, tokenizer = default_model.model, default_model.tokenizer
    prompt = encode_prompt(tokenizer, COPY_PROMPT)
    expected, _ = run(Engine(model, tokenizer, max_len=len(prompt) + 96), prompt, 96)
    assert len(expected) >= 64
    engine = Engine(model, tokenizer, max_len=len(prompt) + 96, drafter=NgramDrafter(), draft_budget=8)
    out, events = run(engine, prompt, 96)
    assert out == expected
    assert events[-1].stats.accepted > 0
    assert any({"ngram", COPY} & set(event.origins) for event in events)


def test_a_drafting_engine_times_its_forwards_and_now_and_then_a_plain_step(tokenizer, tmp_path, monkeypatch):
    """Every verification is timed into the prices of its size class, and while drafting a plain step re-times
    the decode step after `PLAIN_STEP_EVERY` forwards with a tree; the prices outlive a text (one table per
    calibration), so the next text starts from what was learnt."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    model, prompt, greedy = model_and_greedy("llama", seed=5, n=150)
    drafter = OracleDrafter(prompt + greedy, depth=1, vocab_size=VOCAB, siblings=False)  # trees of one node
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter)
    out, events = run(engine, prompt, 150)
    assert out == greedy[: len(out)] and len(out) == 150
    steps = [len(event.tokens) for event in events[1:]]  # after the prefill's token; a chain of one is accepted
    # the 65th step is plain (earlier, only if this machine's timings made drafting not pay)
    assert 1 in steps[: PLAIN_STEP_EVERY + 1]
    cost = engine.policy.cost
    assert set(cost.factors) == {0, 1} and cost.since_decode < PLAIN_STEP_EVERY
    assert cost.sizes[:5] == (0, 1, 2, 3, 4)  # each size a scored tree's cut mostly keeps is priced by its own class
    run(engine, random_prompt(12, seed=6), 8)  # a new text: a new policy, the same prices
    assert engine.policy.cost is cost and list(engine._verify_costs.values()) == [cost]


def test_scored_drafting_that_does_not_pay_is_probed_at_its_share_of_the_time(tokenizer, tmp_path, monkeypatch):
    """Wrong guesses that take 20 ms to draft, dozens of a tiny model's decode steps: the second tree stops drafting
    (the first's drafting is not priced), and a step without a tree drafts nothing, so no probe comes before the
    steps since make its drafting PROBE_SHARE of their time."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    model, prompt, greedy = model_and_greedy("llama", seed=5, n=60)
    drafter = ScoredChainDrafter(prompt + greedy, vocab_size=VOCAB, chance=0.0, sleep=0.02)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter)
    out, _ = run(engine, prompt, 60)
    assert out == greedy and len(drafter.proposals) == 2


@pytest.mark.parametrize("scored", [False, True], ids=["chain", "scored"])
def test_a_drafters_first_proposal_at_a_budget_is_not_priced(scored, tokenizer, tmp_path, monkeypatch):
    """A drafter whose first proposal at a budget and sampling setting takes 50 ms (dozens of a tiny model's decode
    steps: kernels compiled, a graph captured) and whose others are quick and right: priced, that one proposal
    would make drafting look too dear to try again for the rest of the text; unpriced, the drafter drafts on, and
    again under a new sampling setting (top-k, still greedy)."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    model, prompt, greedy = model_and_greedy("llama", seed=5, n=60)
    if scored:
        drafter = ScoredChainDrafter(prompt + greedy, vocab_size=VOCAB)
    else:
        drafter = OracleDrafter(prompt + greedy, depth=8, vocab_size=VOCAB, siblings=False)
    propose, first = drafter.propose, {}

    def slow_at_first(budget, sampling, *args):
        if (budget, sampling) not in first:
            first[budget, sampling] = time.sleep(0.05)
        return propose(budget, sampling, *args)

    drafter.propose = slow_at_first
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter)
    for sampling in (GREEDY, SamplingConfig(top_k=5)):
        out, events = run(engine, prompt, 60, sampling)
        stats = events[-1].stats
        assert out == greedy and stats.steps - stats.undrafted_steps >= 0.6 * stats.steps, stats


# --- logit bias: part of the target distribution, so every row gets it -----------------------------------


@pytest.mark.parametrize("sampled", [False, True])
def test_logit_bias_spec_equals_biased_autoregressive(sampled, tokenizer):
    """OpenAI's `logit_bias` changes what the target picks (a banned token never comes, a favoured one comes
    more), and trees verified under it give biased autoregressive decoding's tokens, greedy and sampled."""
    model, prompt, plain = model_and_greedy("llama", seed=3)
    banned, favoured = plain[0], plain[5]
    sampling = SamplingConfig(temperature=1.0 if sampled else 0.0, seed=7)
    biased = dataclasses.replace(sampling, logit_bias=((banned, -100.0), (favoured, 4.0)))

    def alone(config: SamplingConfig) -> list[int]:
        events = Engine(model, tokenizer, max_len=256).generate(prompt, sampling=config, max_new_tokens=60)
        return [t for e in events for t in e.tokens]

    expected, unbiased = alone(biased), alone(sampling)
    assert banned not in expected and expected.count(favoured) > unbiased.count(favoured)
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=5, reference=prompt + expected, p_correct=0.7)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=16)
    drafted = engine.generate(prompt, sampling=biased, max_new_tokens=60)
    assert [t for e in drafted for t in e.tokens] == expected
