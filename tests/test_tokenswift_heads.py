"""TokenSwift heads: the chained blocks as written by hand, head i aligned to token t + 2 + i, the published
checkpoints read tensor by tensor, our own checkpoints round-tripped, a short run on real text lowering the
held-out loss, and one-line errors."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from test_cli import assert_one_line_error, specchat_in_process
from test_train_glide import real_text_samples
from test_train_longspec import _data_dir
from tui_harness import tiny_loaded

import specchat.drafters.tokenswift.model as tokenswift
from specchat.drafters.tokenswift.model import (
    TokenSwiftConfig,
    TokenSwiftHeads,
    download_heads,
    load_heads,
    read_published_heads,
    save_heads,
)
from specchat.drafters.tokenswift.objective import TokenSwiftObjective, head_labels
from specchat.drafters.tokenswift.train import BETAS, train_tokenswift
from specchat.engine.generate import Engine
from specchat.engine.sampling_config import SamplingConfig
from specchat.errors import SpecchatError
from specchat.training.features import HiddenFeatures, target_features, target_hidden
from specchat.training.samples import Sample
from specchat.training.trainer import STATE, TrainRecipe, learning_rate, train


@pytest.fixture(scope="module")
def loaded(tokenizer):
    return tiny_loaded(tokenizer)


def random_heads(hidden: int = 16, eps: float = 1e-5, seed: int = 0, root_input: bool = False) -> TokenSwiftHeads:
    torch.manual_seed(seed)
    heads = TokenSwiftHeads(TokenSwiftConfig(hidden, eps, root_input=root_input))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_()
    return heads


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def test_the_heads_chain_residual_blocks_as_written_by_hand():
    heads = random_heads()
    x = torch.randn(5, 16)
    h, expected = x, []
    for i in range(3):
        block = heads.medusa_layers[i]
        h = h + rms_norm(h, block.input_layernorm.weight, 1e-5) @ block.linear.weight.T
        expected.append(rms_norm(h, block.post_layernorm.weight, 1e-5))
    with torch.no_grad():
        torch.testing.assert_close(heads(x), torch.stack(expected))


def test_the_root_input_adds_a_silu_block_of_the_state_and_the_token_as_written_by_hand():
    heads = random_heads(root_input=True)
    x, root = torch.randn(5, 16), torch.randn(5, 16)
    mix = heads.root_input
    both = torch.cat([rms_norm(x, mix.state_norm.weight, 1e-5), rms_norm(root, mix.token_norm.weight, 1e-5)], -1)
    start = x + F.silu(both @ mix.up.weight.T) @ mix.down.weight.T
    plain = random_heads()
    plain.medusa_layers = heads.medusa_layers
    with torch.no_grad():
        torch.testing.assert_close(heads(x, root), plain(start))
        assert not torch.allclose(heads(x, root), heads(x, root.flip(0)))  # it reads the token
    with pytest.raises(ValueError, match="root token"):
        heads(x)


def test_chained_heads_read_the_token_the_head_before_guessed_as_written_by_hand():
    torch.manual_seed(0)
    heads = TokenSwiftHeads(TokenSwiftConfig(16, 1e-5, root_input=True, chain_input=True))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_()
    x, root, chain = torch.randn(5, 16), torch.randn(5, 16), torch.randn(2, 5, 16)

    def mixed(block, state, token):
        both = torch.cat([rms_norm(state, block.state_norm.weight, 1e-5),
                          rms_norm(token, block.token_norm.weight, 1e-5)], -1)
        return state + F.silu(both @ block.up.weight.T) @ block.down.weight.T

    h, expected = mixed(heads.root_input, x, root), []
    for i in range(3):
        if i:
            h = mixed(heads.chain_inputs[i - 1], h, chain[i - 1])
        block = heads.medusa_layers[i]
        h = h + rms_norm(h, block.input_layernorm.weight, 1e-5) @ block.linear.weight.T
        expected.append(rms_norm(h, block.post_layernorm.weight, 1e-5))
    with torch.no_grad():
        out = heads(x, root, chain=chain)
        torch.testing.assert_close(out, torch.stack(expected))
        other = heads(x, root, chain=chain.flip(1))
        assert torch.equal(other[0], out[0]) and not torch.allclose(other[1], out[1])  # head 1 reads no chain token
        state, stepped = heads.start(x, root), []
        for i in range(3):  # a depth at a time, as the drafter runs them
            state, step_out = heads.step(i, state, chain[i - 1] if i else None)
            stepped.append(step_out)
        torch.testing.assert_close(torch.stack(stepped), out)
    with pytest.raises(ValueError, match="the head before"):
        heads(x, root)
    with pytest.raises(SpecchatError, match="root token too"):
        TokenSwiftConfig(16, 1e-5, chain_input=True)


@pytest.mark.parametrize("root_input", [False, True], ids=["tokenswift", "root-input"])
def test_fresh_heads_start_as_the_targets_own_final_state(loaded, root_input):
    model = loaded.model
    heads = TokenSwiftHeads(TokenSwiftConfig.for_target(model.config, root_input=root_input), model.model.norm.weight)
    hidden = torch.randn(7, model.config.hidden_size)
    with torch.no_grad():
        out = heads(hidden, torch.randn(7, model.config.hidden_size) if root_input else None)
        for i in range(3):
            torch.testing.assert_close(out[i], model.model.norm(hidden))
    assert heads.config.rms_norm_eps == model.config.rms_norm_eps and heads.config.gamma == 3


class Oracle(torch.nn.Module):
    """Heads that point straight at the token `shift` rows after head i's label row: `shift` 0 is the
    alignment the objective must reward (head i at row t -> labels[t + 1 + i], i.e. token t + 2 + i)."""

    def __init__(self, labels: torch.Tensor, vocab: int, shift: int):
        super().__init__()
        self.config = TokenSwiftConfig(vocab, 1e-6)
        self.labels, self.vocab, self.shift = labels, vocab, shift
        self.weight = torch.nn.Parameter(torch.zeros(1))  # the trainer's device probe

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        length = hidden.shape[0]
        out = torch.zeros(3, length, self.vocab)
        for i in range(3):
            for t in range(length):
                row = t + 1 + i + self.shift
                if 0 <= row < length:
                    out[i, t, self.labels[row]] = 30.0
        return out


def test_head_i_is_scored_against_the_targets_token_t_plus_2_plus_i():
    """Constructed logits: an identity LM head, heads that point at labels[t + 1 + i] (exact), or one row
    early (the t + 1 + i guess a next-token head would make)."""
    vocab, length = 32, 12
    labels = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0)).to(torch.int32)
    sample = Sample(tuple(range(length)), 4, True)
    features = HiddenFeatures(torch.zeros(length, vocab), labels, torch.tensor([0, length]))
    results = {}
    for shift in (0, -1):
        heads = TokenSwiftHeads(TokenSwiftConfig(vocab, 1e-6))
        objective = TokenSwiftObjective(heads, torch.eye(vocab), torch.arange(vocab))
        objective.module = Oracle(labels, vocab, shift)
        loss, rows = objective.loss(sample, features.of(0), random.Random(0))
        results[shift] = (float(loss) / rows, objective.evaluate([sample], features))
    assert rows == (length - 1) + (length - 2) + (length - 3)  # head i has a label for rows 0 .. length - 2 - i
    exact, early = results[0][1], results[-1][1]
    assert results[0][0] < 1e-6 < 1.0 < results[-1][0]
    assert [exact[f"head{i}_top1"] for i in (1, 2, 3)] == [1.0, 1.0, 1.0]
    # roots: rows 3..10 (their next token is the answer's); a chain stops at the sample's end: runs 3 x5, 2, 1, 0
    assert exact["chain_tau"] == pytest.approx(1 + (5 * 3 + 2 + 1 + 0) / 8)
    assert max(early[f"head{i}_top1"] for i in (1, 2, 3)) < 0.5 and early["chain_tau"] < 2.0
    assert head_labels(labels, 2).tolist() == labels[3:].tolist()


def test_on_a_greedy_answer_head_i_at_row_t_is_labelled_with_the_texts_token_t_plus_2_plus_i(loaded, tmp_path):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=128)
    prompt = list(range(40, 60))
    answer = [t for e in engine.generate(prompt, sampling=SamplingConfig(), max_new_tokens=20) for t in e.tokens]
    sample = Sample(tuple(prompt + answer), len(prompt), True)
    features = target_hidden(engine, tmp_path, "train", [sample])
    labels, length = features.labels, len(sample)
    for i in range(3):
        for t in range(len(prompt) - 1, length - 2 - i):  # rows whose guessed token is the answer's
            assert int(head_labels(labels, i)[t]) == sample.ids[t + 2 + i]
    torch.testing.assert_close(features.hidden, engine.target_states(list(sample.ids)).to(torch.bfloat16))
    # the same prefill wrote the keys and values too: read back, not computed again
    written = tmp_path / "features" / "train-00000.safetensors"
    assert sorted(p.name for p in written.parent.iterdir()) == ["hidden-train-00000.safetensors", written.name]
    before = written.stat().st_mtime_ns
    kv = target_features(engine, tmp_path, "train", [sample])
    assert written.stat().st_mtime_ns == before and torch.equal(kv.labels, features.labels)
    layer = engine.cache.layers[-1]
    assert torch.equal(kv.keys, layer.keys[0, :, :length].to(torch.bfloat16))


def published_checkpoint(directory, heads: TokenSwiftHeads, *, sharded: bool = True) -> dict[str, torch.Tensor]:
    """A full-model checkpoint as TokenSwift publishes one: the heads under `model.`, among a target's
    tensors, over two shards with an index (and a third shard without heads), or in one file."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "rms_norm_eps": 1e-5, "hidden_size": 16}))
    medusa = {f"model.{name}": tensor.to(torch.bfloat16) for name, tensor in heads.state_dict().items()}
    other = {"model.embed_tokens.weight": torch.randn(64, 16), "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16),
             "lm_head.weight": torch.randn(64, 16), "model.norm.weight": torch.ones(16)}  # fmt: skip
    if not sharded:
        save_file({**medusa, **other}, directory / "model.safetensors")
        return medusa
    first = {k: v for k, v in medusa.items() if ".0." in k} | {k: other[k] for k in ["model.embed_tokens.weight"]}
    second = {k: v for k, v in medusa.items() if ".0." not in k} | {k: other[k] for k in ["lm_head.weight"]}
    third = {k: other[k] for k in ("model.layers.0.mlp.up_proj.weight", "model.norm.weight")}
    shards = {"model-00001-of-00003.safetensors": first, "model-00002-of-00003.safetensors": second,
              "model-00003-of-00003.safetensors": third}  # fmt: skip
    for name, tensors in shards.items():
        save_file(tensors, directory / name)
    weight_map = {key: name for name, tensors in shards.items() for key in tensors}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return medusa


@pytest.mark.parametrize("sharded", [True, False])
def test_published_heads_are_read_alone_from_a_full_model_checkpoint(sharded, tmp_path, monkeypatch):
    written = published_checkpoint(tmp_path / "TokenSwift-tiny", random_heads(), sharded=sharded)
    opened, read = [], []
    real_open = tokenswift.safe_open

    class Recording:
        def __init__(self, path, framework):
            opened.append(path.name)
            self.handle = real_open(path, framework)

        def __enter__(self):
            self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def keys(self):
            return self.handle.keys()

        def get_tensor(self, name):
            read.append(name)
            return self.handle.get_tensor(name)

    monkeypatch.setattr(tokenswift, "safe_open", Recording)
    heads = read_published_heads(tmp_path / "TokenSwift-tiny")
    assert sorted(read) == sorted(written)  # nothing of the target's is ever copied out
    if sharded:
        assert sorted(opened) == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"]
    assert heads.config == TokenSwiftConfig(16, 1e-5, 3)
    for name, tensor in heads.state_dict().items():
        torch.testing.assert_close(tensor, written[f"model.{name}"].float())


def test_our_checkpoint_round_trips_in_bf16(tmp_path, loaded):
    heads = random_heads(hidden=loaded.model.config.hidden_size)
    save_heads(tmp_path / "heads", heads)
    assert json.loads((tmp_path / "heads" / "config.json").read_text()) == {
        "model_type": "tokenswift", "hidden_size": 64, "rms_norm_eps": 1e-5, "gamma": 3, "root_input": False,
            "chain_input": False}  # fmt: skip
    back = load_heads(tmp_path / "heads", "cpu", torch.float32, target_config=loaded.model.config)
    assert back.config == heads.config and next(back.parameters()).dtype == torch.float32
    for (name, a), b in zip(heads.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a.to(torch.bfloat16).float(), b), name
    assert load_heads(tmp_path / "heads", dtype=torch.bfloat16).medusa_layers[2].linear.weight.dtype == torch.bfloat16
    assert back.draft_vocab is None
    heads.draft_vocab = torch.tensor([0, 5, 9, 40])
    save_heads(tmp_path / "reduced", heads)
    assert torch.equal(load_heads(tmp_path / "reduced", dtype=torch.bfloat16).draft_vocab, heads.draft_vocab)
    published_checkpoint(tmp_path / "published", random_heads())
    assert load_heads(tmp_path / "published").config.rms_norm_eps == 1e-5  # a published model loads the same way
    rooted = random_heads(hidden=64, root_input=True)
    save_heads(tmp_path / "rooted", rooted)
    back = load_heads(tmp_path / "rooted", dtype=torch.float32)
    assert back.config.root_input and torch.equal(back.root_input.up.weight,
                                                  rooted.root_input.up.weight.bfloat16().float())


def test_checkpoint_errors_are_one_line(tmp_path, loaded):
    for name in ("plain", "pickled", "empty"):
        (tmp_path / name).mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, tmp_path / "plain" / "model.safetensors")
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"\x80")
    published_checkpoint(tmp_path / "lost", random_heads())
    (tmp_path / "lost" / "model-00002-of-00003.safetensors").unlink()
    expected = {"nowhere": "no such checkpoint directory", "plain": "holds no TokenSwift heads",
                "pickled": "never unpickles", "empty": "neither TokenSwift heads", "lost": "model-00002-of-00003"}
    for name, needle in expected.items():
        with pytest.raises(SpecchatError, match=needle) as error:
            load_heads(tmp_path / name)
        assert "\n" not in str(error.value)
    save_heads(tmp_path / "small", random_heads(hidden=16))
    with pytest.raises(SpecchatError, match="hidden size 16; the target has 64"):
        load_heads(tmp_path / "small", target_config=loaded.model.config)


def test_warm_up_in_steps_then_cosine_to_zero():
    recipe = TrainRecipe(lr=5e-3, warmup_steps=50)
    rates = [learning_rate(step, 200, recipe) for step in range(200)]
    assert rates[0] == pytest.approx(1e-4) and rates[49] == pytest.approx(5e-3) and rates[50] == pytest.approx(5e-3)
    assert rates[-1] < 1e-5 and all(a >= b for a, b in zip(rates[50:], rates[51:]))


def test_a_state_saved_without_warmup_steps_resumes(loaded, tmp_path):
    """A run checkpointed before TrainRecipe had `warmup_steps` resumes under the default recipe."""
    from safetensors import safe_open

    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    samples = real_text_samples(loaded.tokenizer, 4, length=24)
    features = target_hidden(engine, tmp_path, "train", samples)
    recipe = TrainRecipe(epochs=1, batch=4, evaluations=1, autocast=False)
    train(objective_for(loaded), samples, features, samples, features, recipe, tmp_path / "run")
    path = tmp_path / "run" / STATE
    with safe_open(path, "pt") as handle:
        info, tensors = json.loads(handle.metadata()["state"]), {k: handle.get_tensor(k) for k in handle.keys()}
    del info["recipe"]["warmup_steps"]
    save_file(tensors, path, metadata={"state": json.dumps(info)})
    resumed = train(objective_for(loaded), samples, features, samples, features, recipe, tmp_path / "run", resume=True)
    assert resumed.step == 1


def objective_for(loaded, vocab: torch.Tensor | None = None) -> TokenSwiftObjective:
    model = loaded.model
    torch.manual_seed(0)
    heads = TokenSwiftHeads(TokenSwiftConfig.for_target(model.config), model.model.norm.weight)
    full = torch.arange(model.config.vocab_size)
    return TokenSwiftObjective(heads, model.lm_head.weight.detach().float(), full if vocab is None else vocab)


def noise_state_samples(text, hidden: int) -> tuple[list, list]:
    """32 training and 4 held-out (sample, features) pairs: greedy answers of `text(generator)`'s ids over
    target states of noise, so only the tokens tell what comes next."""

    def sample(seed: int) -> tuple[Sample, HiddenFeatures]:
        g = torch.Generator().manual_seed(seed)
        ids = text(g)
        labels = torch.tensor(ids[1:] + [0], dtype=torch.int32)  # a greedy answer: the text's next token
        return Sample(tuple(ids), 1, True), HiddenFeatures(torch.randn(len(ids), hidden, generator=g), labels,
                                                           torch.tensor([0, len(ids)]))  # fmt: skip

    return [sample(s) for s in range(32)], [sample(100 + s) for s in range(4)]


def heldout_top1_by_config(text, hidden: int, vocab: int, configs: dict, epochs: int, metric: str) -> dict:
    """`metric` on the held-out noise-state samples of `text` for heads fitted under each of `configs`, all from
    the same data, embeddings, LM head and start."""
    train_set, heldout = noise_state_samples(text, hidden)
    embed = torch.nn.Embedding(vocab, hidden)
    head = torch.randn(vocab, hidden)
    accuracy = {}
    for key, config in configs.items():
        torch.manual_seed(1)
        accuracy[key] = fitted(TokenSwiftHeads(config), head, embed, train_set, heldout, epochs=epochs)[metric]
    return accuracy


def fitted(heads, head, embed, train_set, heldout, *, epochs: int) -> dict[str, float]:
    """Held-out metrics of `heads` after `epochs` of AdamW over `train_set` ((sample, features) pairs)."""
    from specchat.training.features import concat

    objective = TokenSwiftObjective(heads, head, torch.arange(head.shape[0]), embed=embed)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=1e-2)
    for _ in range(epochs):
        for s, f in train_set:
            total, rows = objective.loss(s, f.of(0), random.Random(0))
            optimizer.zero_grad()
            (total / rows).backward()
            optimizer.step()
    samples, features = zip(*heldout)
    return objective.evaluate(list(samples), concat(list(features)))


def test_heads_with_root_input_learn_what_only_the_root_tells():
    """Token t + 2 is a fixed function of token t + 1 and the states are noise: heads that read the root learn
    it, TokenSwift's cannot guess better than the token frequencies."""
    hidden, vocab, length = 32, 40, 48
    torch.manual_seed(0)
    follow = torch.randperm(vocab)  # token t + 1 -> token t + 2

    def text(g: torch.Generator) -> list[int]:
        ids = [int(torch.randint(vocab, (1,), generator=g))]
        while len(ids) < length:
            ids.append(int(follow[ids[-1]]) if torch.rand(1, generator=g) < 0.9
                       else int(torch.randint(vocab, (1,), generator=g)))
        return ids

    configs = {root_input: TokenSwiftConfig(hidden, 1e-5, root_input=root_input) for root_input in (False, True)}
    accuracy = heldout_top1_by_config(text, hidden, vocab, configs, epochs=3, metric="head1_top1")
    assert accuracy[True] > 0.75 and accuracy[False] < 0.3, accuracy


def test_chained_heads_learn_what_only_the_token_before_tells():
    """Tokens come in pairs, a random one then a fixed function of it, and the states are noise: head 2 (token
    t + 3) can know it only from token t + 2, which chained heads read (teacher-forced, as a run of right guesses
    drafts it) and root-input heads do not."""
    hidden, vocab, length = 32, 40, 48
    torch.manual_seed(0)
    follow = torch.randperm(vocab)

    def text(g: torch.Generator) -> list[int]:
        ids = []
        while len(ids) < length:
            first = int(torch.randint(vocab, (1,), generator=g))
            ids += [first, int(follow[first])]
        return ids

    configs = {chain: TokenSwiftConfig(hidden, 1e-5, root_input=True, chain_input=chain) for chain in (False, True)}
    accuracy = heldout_top1_by_config(text, hidden, vocab, configs, epochs=6, metric="head2_top1")
    # half of head 2's tokens follow the one before (the other half are a pair's random first)
    assert accuracy[True] > 0.4 and accuracy[False] < 0.2, accuracy


def test_a_short_run_on_real_text_lowers_the_heldout_loss(loaded, tokenizer, tmp_path):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    samples = real_text_samples(tokenizer, 20)
    train_samples, heldout = [s for i, s in enumerate(samples) if i % 10], samples[::10]  # pieces of the same files
    features = target_hidden(engine, tmp_path, "train", train_samples)
    heldout_features = target_hidden(engine, tmp_path, "heldout", heldout)
    objective = objective_for(loaded)
    before = objective.evaluate(heldout, heldout_features)["loss"]
    recipe = TrainRecipe(epochs=3, batch=4, lr=3e-2, betas=BETAS, warmup_steps=5, evaluations=1, autocast=False)
    done = train(objective, train_samples, features, heldout, heldout_features, recipe, tmp_path / "heads")
    # nats per head and row (13.4 -> 12.2: a random target's tokens 2-4 ahead are barely predictable, but the
    # confident next-token guess the heads start from is unlearned and the spread of its tokens learned)
    assert done.log[-1]["heldout_loss"] < before - 0.8


@pytest.mark.parametrize("root_input", [False, True], ids=["tokenswift", "root-input"])
def test_train_tokenswift_writes_heads_that_load(loaded, tmp_path, root_input):
    data = _data_dir(tmp_path / "data")
    out = tmp_path / "heads"
    summary = train_tokenswift(loaded, data, out, TrainRecipe(epochs=1, batch=4, warmup_steps=1), vocab=8192,
                               root_input=root_input)  # fmt: skip
    assert summary["steps"] == 2 and summary["gamma"] == 3 and summary["loss_vocab"] == 8192
    assert summary["root_input"] == root_input
    assert {"heldout_head1_top1", "heldout_head3_top3", "heldout_chain_tau"} <= set(summary["log"][-1])
    assert (out / "curves.png").stat().st_size > 0
    assert sorted(p.name for p in (data / "features").iterdir()) == [
        "heldout-00000.safetensors", "hidden-heldout-00000.safetensors", "hidden-train-00000.safetensors",
        "train-00000.safetensors"]  # fmt: skip
    heads = load_heads(out, target_config=loaded.model.config)
    assert heads.medusa_layers[0].linear.weight.abs().sum() > 0  # trained, not the zero start
    assert heads.config.root_input == root_input
    if root_input:
        assert heads.root_input.down.weight.abs().sum() > 0
    assert len(heads.draft_vocab) == 8192 and bool((heads.draft_vocab.diff() > 0).all())  # it drafts inside it


def test_heads_trained_from_a_checkpoint_keep_its_vocabulary_and_start_as_it_was(loaded, tmp_path):
    """`--init` with `--chain-input`: the root-input heads of a first run, given chain blocks that start as no-ops
    (the same outputs before any step), train on with the first run's draft vocabulary; given `--vocab`, with one
    picked afresh from the data."""
    data = _data_dir(tmp_path / "data")
    recipe = TrainRecipe(epochs=1, batch=4, warmup_steps=1)
    train_tokenswift(loaded, data, tmp_path / "first", recipe, vocab=8192, root_input=True)
    first = load_heads(tmp_path / "first")
    summary = train_tokenswift(loaded, data, tmp_path / "chained", recipe, chain_input=True,
                               init=tmp_path / "first", limits={"train": 4})  # fmt: skip
    assert summary["chain_input"] and summary["loss_vocab"] == 8192  # the first run's vocabulary
    repicked = train_tokenswift(loaded, data, tmp_path / "repicked", recipe, vocab=64, init=tmp_path / "first",
                                limits={"train": 4})  # fmt: skip
    narrow = load_heads(tmp_path / "repicked").draft_vocab
    assert repicked["loss_vocab"] == 64 and len(narrow) == 64  # the 64 most frequent: among the first's 8192
    assert set(narrow.tolist()) < set(first.draft_vocab.tolist())
    assert summary["steps"] == 1 and summary["data"]["train_samples"] == 4 and summary["data"]["limits"] == {"train": 4}
    chained = load_heads(tmp_path / "chained")
    assert (chained.config.chain_input and chained.config.root_input
            and torch.equal(chained.draft_vocab, first.draft_vocab))
    assert all(block.down.weight.abs().sum() > 0 for block in chained.chain_inputs)
    fresh = TokenSwiftHeads(chained.config, draft_vocab=first.draft_vocab)
    fresh.load_state_dict(first.state_dict(), strict=False)
    x, root, chain = torch.randn(3, 64), torch.randn(3, 64), torch.randn(2, 3, 64)
    with torch.no_grad():
        torch.testing.assert_close(fresh.float()(x, root, chain=chain), first.float()(x, root))


def test_train_tokenswift_rejects_bad_options_in_one_line(tmp_path, monkeypatch, capfd):
    out = str(tmp_path / "o")
    command = ("train", "tokenswift", "--data", str(tmp_path), "--out", out)
    # in this process (`specchat_in_process`): each is refused before the target loads
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command), "holds no training data")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, "--root-input"), "holds no training data")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, "--warmup-steps", "-1"), "--warmup-steps")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, "--lr", "0"), "--lr")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, "--init", out), "--init")


def test_a_published_model_is_fetched_only_as_far_as_it_holds_heads(tmp_path):
    """From a published TokenSwift repo only config.json, the shard index and the shards with heads come down,
    never the target's other shards; offline and uncached is one line."""
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    written = published_checkpoint(tmp_path / "hub", random_heads())
    local, fetched = tmp_path / "snapshot", []
    local.mkdir()

    def download(repo, filename):
        if not (tmp_path / "hub" / filename).is_file():
            raise EntryNotFoundError(f"{repo}/{filename}")  # what the hub answers for a missing file
        fetched.append(filename)
        (local / filename).write_bytes((tmp_path / "hub" / filename).read_bytes())
        return str(local / filename)

    directory = download_heads("TokenSwift/TokenSwift-tiny", download)
    assert sorted(fetched) == ["config.json", "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                               "model.safetensors.index.json"]  # fmt: skip
    heads = load_heads(directory)
    for name, tensor in heads.state_dict().items():
        assert torch.equal(tensor, written[f"model.{name}"])

    def offline(repo, filename):
        raise LocalEntryNotFoundError(filename)

    with pytest.raises(SpecchatError,
                       match="^the TokenSwift heads of TokenSwift/x are not cached and this machine is offline$"):
        download_heads("TokenSwift/x", offline)
