"""A draft head over a reduced draft vocabulary scores its own columns under the target's sampling settings.

Its drafting probabilities must be those of the same logits placed in the whole vocabulary (every other token
at -inf) and run through the target's pipeline: suppressed ids and the penalty's history are target ids, and
only those inside the draft vocabulary touch its columns. Over the whole vocabulary its logits are the target's own,
divided and capped as the target's forward does.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from specchat.drafters.draft_head import DraftHead
from specchat.engine.generate import Engine
from specchat.engine.sampling import process_logits
from specchat.engine.sampling_config import SamplingConfig

VOCAB = 96


@pytest.fixture(scope="module")
def target(tokenizer):
    return Engine(tiny_model("llama", vocab_size=VOCAB, seed=2), tokenizer, max_len=64).target


def widened(logits: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    return logits.new_full((len(logits), VOCAB), float("-inf")).index_copy_(1, vocab, logits)


@pytest.mark.parametrize("sampling", [
    SamplingConfig(),
    SamplingConfig(temperature=0.7, suppress=(5, 40)),
    SamplingConfig(temperature=1.0, min_p=0.1, min_p_keep=4, penalty=1.3, penalty_window=8),
    SamplingConfig(temperature=0.9, top_k=30, top_p=0.8, penalty=0.8, suppress=(0, 41, 95)),
])  # fmt: skip
def test_draft_columns_score_as_the_whole_vocabulary_would(target, sampling):
    generator = torch.Generator().manual_seed(3)
    vocab = torch.randperm(VOCAB, generator=generator)[:40].sort().values
    head = DraftHead(target, vocab)
    logits = torch.randn(3, len(vocab), generator=generator) * 3
    history = torch.randint(0, VOCAB, (3, 8), generator=generator)
    history[0, :5] = -1  # a row with a shorter history
    history[1, :] = vocab[:8]  # a row whose every token is in the draft vocabulary
    probs = head.probs(logits, sampling, history)
    reference = process_logits(widened(logits, vocab), sampling, history).softmax(dim=-1)[:, vocab]
    torch.testing.assert_close(probs, reference)
    for token in sampling.suppress:
        if token in vocab:
            assert (probs[:, int((vocab == token).nonzero())] == 0).all()


def test_the_whole_vocabulary_is_scored_as_the_target_scores_it(target):
    sampling = SamplingConfig(temperature=0.8, penalty=1.2, suppress=(7,))
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4))
    history = torch.tensor([[1, 2, 3], [-1, 9, 9]])
    expected = process_logits(logits, sampling, history).softmax(dim=-1)
    assert torch.equal(DraftHead(target, None).probs(logits, sampling, history), expected)


@pytest.mark.parametrize("sampling", [
    SamplingConfig(),
    SamplingConfig(temperature=0.7, top_k=20, top_p=0.8, penalty=1.1),
    SamplingConfig(temperature=0.6, top_p=0.9),
    SamplingConfig(temperature=1.0, min_p=0.1, min_p_keep=20, penalty=1.2, suppress=(3,)),
], ids=["greedy", "top-k", "top-p", "min-p"])  # fmt: skip
@pytest.mark.parametrize("columns", [None, 700], ids=["whole-vocabulary", "draft-vocabulary"])
def test_the_likeliest_drafts_are_those_of_the_whole_rows(tokenizer, sampling, columns):
    """`top` ranks the survivors the pipeline kept (top-k's, a nucleus, min-p's among the largest 256 of 1000
    tokens) where `probs` writes and ranks whole rows: the same tokens, probabilities within a softmax's rounding."""
    wide = Engine(tiny_model("llama", vocab_size=1000, seed=3), tokenizer, max_len=64).target
    generator = torch.Generator().manual_seed(5)
    vocab = None if columns is None else torch.randperm(1000, generator=generator)[:columns].sort().values
    head = DraftHead(wide, vocab)
    logits = torch.randn(3, columns or 1000, generator=generator) * 3
    logits[:, :4] += 8.0  # peaked rows, as a head's are: the survivors are few
    history = torch.randint(0, 1000, (3, 16), generator=generator)
    values, ids = head.top(logits, sampling, 3, history)
    expected = head.probs(logits, sampling, history).topk(3, dim=-1)
    torch.testing.assert_close(values, expected.values)
    likely = expected.values > 0  # past a row's survivors, tokens of probability 0 in any order
    assert torch.equal(ids[likely], head.target_ids(expected.indices)[likely])


@pytest.mark.parametrize("architecture", ["granite", "gemma2"])
def test_the_targets_head_gives_the_targets_logits(architecture, tmp_path):
    """A draft scoring the target's last hidden state through the target's head gets the target's logits: divided by
    Granite's logit scale, soft-capped as Gemma 2's (drafting probabilities at the target's temperature)."""

    from gguf_files import write_tiny_model

    from specchat.engine.cache import TreeCache
    from specchat.engine.target_forward import target_forward
    from specchat.loading import embedded_gguf_path, load_model

    path = write_tiny_model(tmp_path / f"{architecture}.gguf", embedded_gguf_path(), architecture=architecture,
                            unquantized=True)  # fmt: skip
    loaded = load_model(str(path), dtype="float32")
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    cache = TreeCache(2, 64)
    out = target_forward(loaded.model, cache)(torch.arange(3, 23), torch.arange(20), None, cache)
    logits = DraftHead(engine.target, None)(engine.target.norm(out.hidden))
    torch.testing.assert_close(logits, out.logits, atol=1e-4, rtol=1e-4)
