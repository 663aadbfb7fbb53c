"""N-gram lookup in the target's own answers: the table backs off from the longest k-gram it knows, guesses only
answer tokens, and a drafter that proposes from it stays lossless on the real default model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_cli import assert_one_line_error, specchat_in_process
from test_train_longspec import _data_dir

from specchat.drafters.ngram.answer_store import CONTEXT, ORDERS, AnswerStore, Guess
from specchat.drafters.ngram.drafter import NgramDrafter, build, match_rate
from specchat.engine.events import ANSWERS
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling_config import SamplingConfig


def test_the_longest_known_k_gram_decides_and_counts_are_the_answers():
    store = AnswerStore.from_records([([1], [5, 6, 7, 8]), ([2], [9, 6, 7, 3]), ([3], [4, 6, 7, 3])])
    assert store.guess([6, 7]) == Guess(3, 2, 2, 3)  # "6 7" went on with 3 twice, 8 once
    assert store.guess([5, 6, 7]) == Guess(8, 3, 1, 1)  # "5 6 7": only 8
    assert store.guess([99, 7]) == Guess(3, 1, 2, 3)  # "99 7" unknown: backs off to "7"
    assert store.guess([99]) is None
    assert [guess.token for guess in store.chain([5, 6], 5)] == [7, 8]  # nothing ever followed "8"


def test_only_answer_tokens_are_guessed_and_records_do_not_run_together():
    store = AnswerStore.from_records([(list(range(100, 120)), [1, 2]), ([50], [3])])
    assert store.guess([118]) is None  # prompt tokens: context, never a guess
    assert store.guess([119]) == Guess(1, 1, 1, 1)  # the answer's first token follows the prompt's end
    assert store.guess(list(range(120 - CONTEXT, 120))).order == max(ORDERS)
    assert store.guess([2]) is None  # the next record's prompt does not follow this answer


def test_the_drafter_keeps_the_most_likely_nodes_of_the_contexts_chains_and_the_answers(tmp_path):
    store = AnswerStore.from_records([([1], [10, 11, 12, 13, 14, 15])])
    store.save(tmp_path)
    drafter = build(None, tmp_path)
    assert np.array_equal(drafter.store.tokens, store.tokens)
    drafter.prefill([7, 12, 40, 41, 10, 11, 12])  # "12" occurred in the context; "10 11 12" in the answers
    assert drafter.next_kinds() == {"ngram", ANSWERS}
    tree = drafter.propose(4)  # the answers' 13, 14, 15 at 1/2, 1/4, 1/8; the context's 40 after one token: 0.21
    assert tree.tokens == [13, 14, 40, 15] and tree.origins == [ANSWERS, ANSWERS, "ngram", ANSWERS]  # best first
    assert tree.scores == [0.5, 0.25, match_rate(1), 0.125]
    drafter.prefill([5, 10, 11, 12, 40, 5, 10, 11, 12])  # now the context matches four tokens: 0.72, then 0.52 ...
    tree = drafter.propose(7)
    assert tree.tokens == [40, 5, 13, 10, 11, 14, 12] and tree.origins.count(ANSWERS) == 2


@pytest.mark.parametrize("budget", [4, None])  # None: the adaptive budget, which cuts scored trees to size
def test_lookup_in_the_targets_answers_is_lossless_and_accepted(default_model, tokenizer, budget):
    engine = Engine(default_model.model, tokenizer, max_len=512)
    prompts = [encode_prompt(tokenizer, text) for text in ("Name three primary colours.", "What is a noun?")]

    def decode(ids):
        events = list(engine.generate(ids, sampling=SamplingConfig(), max_new_tokens=40))
        return [t for event in events for t in event.tokens], events[-1].stats

    answers = [decode(ids)[0] for ids in prompts]
    engine.set_drafter(NgramDrafter(store=AnswerStore.from_records([(prompts[0], answers[0])])), budget)
    tokens, stats = decode(prompts[0])  # its own answer is in the store: drafted from it
    assert tokens == answers[0] and stats.accepted >= len(answers[0]) // 2
    assert decode(prompts[1])[0] == answers[1]  # guesses from another answer, checked and mostly rejected


def test_train_ngram_writes_the_training_answers_and_refuses_in_one_line(tmp_path, monkeypatch, capfd):
    data = _data_dir(tmp_path / "data")
    out = tmp_path / "answers"
    result = specchat_in_process(monkeypatch, capfd, "train", "ngram", "--data", str(data), "--out", str(out))
    assert result.returncode == 0 and f"--drafter ngram:{out}" in result.stdout
    config = json.loads((out / "config.json").read_text())
    assert (config["model"], config["records"], config["answer_tokens"]) == ("tiny-llama", 8, 64)  # held-out left out
    assert len(AnswerStore.load(out).tokens) == 8 * (12 + 8)
    missing = specchat_in_process(monkeypatch, capfd, "train", "ngram", "--data", str(tmp_path), "--out", str(out))
    assert_one_line_error(missing, "holds no training data")
    result = specchat_in_process(monkeypatch, capfd, "run", "hi", "--drafter", f"ngram:{data}")
    assert_one_line_error(result, "holds no answers for n-gram lookup")
