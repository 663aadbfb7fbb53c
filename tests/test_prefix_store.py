"""Earlier texts' cached prefixes (`engine/prefix_store.py`) on the default model's CPU decoder: a conversation that
comes back after another took the cache reuses its own prefix, and answers exactly as a prompt prefilled whole,
with a bf16 cache and an int8 one (kept in whole tiles), within the byte budget, most recently used kept."""

from __future__ import annotations

import pytest

from specchat.engine.generate import Engine
from specchat.engine.prefix_store import MIN_TOKENS
from specchat.engine.prompt import encode_chat
from specchat.engine.sampling import SamplingConfig

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def default_model():
    """The embedded model as run, serve and chat load it: its own 4-bit weights on the CPU decoder."""
    from specchat.loading import load_model

    return load_model(None)
TOPICS = ["the history of the printing press", "how bees make honey", "the rules of chess"]


def prompt(tokenizer, topic: str, turn: int) -> list[int]:
    """A long first message on `topic`, then `turn` follow-ups: each turn's prompt extends the last."""
    messages = [{"role": "user", "content": f"Write at length about {topic}. " * 12}]
    for k in range(turn):
        messages += [{"role": "assistant", "content": f"Here is part {k + 1}."},
                     {"role": "user", "content": f"Go on with part {k + 2}."}]  # fmt: skip
    return encode_chat(tokenizer, messages)


def answer(engine: Engine, ids: list[int], *, fresh: bool = False) -> tuple[list[int], int]:
    tokens, stats = [], None
    for event in engine.generate(ids, sampling=GREEDY, max_new_tokens=12, fresh=fresh):
        tokens += event.tokens
        stats = event.stats
    return tokens, stats.reused_tokens


@pytest.mark.parametrize(("kv_cache", "drafter"), [("auto", "none"), ("int8", "none"), ("auto", "longspec"),
                                                 ("auto", "tokenswift+ngram")])  # fmt: skip
def test_conversations_taking_turns_reuse_their_own_prefixes_exactly(default_model, kv_cache, drafter):
    """A drafter that tracked another text rebuilds its state from the restored prefix (the Drafter contract)."""
    from specchat.drafters import attach_drafter

    engine = Engine(default_model.model, default_model.tokenizer, max_len=1024, kv_cache=kv_cache,
                    prefix_bytes=2**30)  # fmt: skip
    attach_drafter(engine, default_model.source, drafter)
    assert engine.exact_reuse
    first = {topic: prompt(default_model.tokenizer, topic, 0) for topic in TOPICS}
    assert min(len(ids) for ids in first.values()) >= MIN_TOKENS
    for topic in TOPICS:  # each takes the cache in turn
        answer(engine, first[topic])
    for topic in TOPICS:  # and comes back after the others
        ids = prompt(default_model.tokenizer, topic, 1)
        reused_answer, reused = answer(engine, ids)
        assert reused >= len(first[topic]) - 1, topic  # its whole first prompt, from the store
        assert reused_answer == answer(engine, ids, fresh=True)[0], topic
    kept = engine.prefixes.kept
    assert len(kept) >= len(TOPICS) and sum(prefix.bytes for prefix in kept) <= 2**30


def test_the_budget_keeps_the_most_recent(default_model):
    tokenizer = default_model.tokenizer
    engine = Engine(default_model.model, tokenizer, max_len=1024, prefix_bytes=1)
    for topic in TOPICS:
        answer(engine, prompt(tokenizer, topic, 0))
    assert engine.prefixes.kept == []  # nothing fits one byte
    engine = Engine(default_model.model, tokenizer, max_len=1024, prefix_bytes=2**30)
    for topic in TOPICS:
        answer(engine, prompt(tokenizer, topic, 0))
    engine.prefixes.budget = int(1.5 * engine.prefixes.kept[-1].bytes)  # room for one text
    _, reused = answer(engine, prompt(tokenizer, TOPICS[0], 1))  # the first text comes back
    assert reused >= len(prompt(tokenizer, TOPICS[0], 0)) - 1  # restored, though the last one was kept since
    [kept] = engine.prefixes.kept  # the one just used: its first prompt and answer
    first = prompt(tokenizer, TOPICS[0], 0)
    assert kept.ids[: len(first)] == first
