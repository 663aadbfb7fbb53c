"""EAGLE-3 (`specchat.drafters.eagle3`): the released checkpoint layout, drafting through the engine (lossless,
greedy and sampled), training-time test against what drafting computes, and `specchat train eagle3`."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import random_eagle3 as random_draft
from drafters_for_tests import rerun
from safetensors.torch import save_file
from test_cli import assert_one_line_error, specchat_in_process
from test_train_longspec import _data_dir
from tui_harness import tiny_loaded

from specchat.drafters import build_drafter, parse_drafter
from specchat.drafters.composite import CompositeDrafter
from specchat.drafters.eagle3.drafter import DraftKV, Eagle3Drafter
from specchat.drafters.eagle3.model import Eagle3Config, Eagle3Draft, load_eagle3, save_eagle3
from specchat.drafters.eagle3.objective import Eagle3Objective
from specchat.drafters.eagle3.train import train_eagle3
from specchat.drafters.glide.drafter import GlideDrafter
from specchat.drafters.glide.model import GlideConfig, GlideModel
from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.drafters.tree_rows import TreeRows
from specchat.engine.generate import Engine
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.tree import ROOT, DraftTree
from specchat.errors import SpecchatError
from specchat.training.features import LayerFeatures, SampleLayers, target_layer_states
from specchat.training.samples import Sample
from specchat.training.trainer import TrainRecipe


@pytest.fixture(scope="module")
def loaded(tokenizer):
    return tiny_loaded(tokenizer)


def released_layout(draft: Eagle3Draft, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors as EAGLE-3's releases name them (with the target's embedding some of them carry)."""
    tensors = {prefix + name: tensor.clone() for name, tensor in draft.state_dict().items()}
    tensors[prefix + "embed_tokens.weight"] = torch.zeros(draft.config.vocab_size, draft.config.target_hidden_size)
    return tensors


# A release's config.json for the tiny target's draft (the 512-token draft vocabulary `random_draft` draws).
RELEASED_CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "intermediate_size": 96,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 49152,
                   "draft_vocab_size": 512, "rope_theta": 10000.0, "num_hidden_layers": 1}  # fmt: skip


def write_release(directory, config: dict, tensors: dict[str, torch.Tensor]):
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    save_file(tensors, directory / "model.safetensors")
    return directory


def test_a_released_checkpoint_loads_with_its_config_and_prefixes(loaded, tmp_path):
    model = loaded.model
    draft = random_draft(model)
    tensors = released_layout(draft, "model.")
    del tensors["model.t2d"]  # some releases carry only d2t
    back = load_eagle3(write_release(tmp_path / "release", RELEASED_CONFIG, tensors), model.config)
    assert back.config.feature_layers is None and back.config.head_dim == 16
    for name, tensor in draft.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    drafter = Eagle3Drafter(Engine(model, loaded.tokenizer, max_len=64).target, back)
    assert drafter.feature_layers == (2, 1, 0)  # EAGLE-3's (2, L/2, L - 3), clamped into 2 layers


def test_a_draft_over_the_whole_vocabulary_loads_without_a_mapping(loaded, tmp_path):
    """Released without d2t or t2d where its vocabulary is the target's: every draft id is its target id. The weights
    are the file's, built on no random start (the loader's meta device), the rotary table on the host."""
    config = {**RELEASED_CONFIG, "draft_vocab_size": 49152}
    torch.manual_seed(0)
    tensors = {name: tensor for name, tensor in Eagle3Draft(Eagle3Config.from_dict(config)).state_dict().items()
               if name not in ("d2t", "t2d")}  # fmt: skip
    back = load_eagle3(write_release(tmp_path / "release", config, tensors), loaded.model.config)
    assert torch.equal(back.draft_vocab, torch.arange(49152)) and bool(back.t2d.all())
    assert all(torch.equal(back.state_dict()[name], tensor) for name, tensor in tensors.items())
    assert back.inverse_frequencies.device.type == "cpu"


def test_released_checkpoints_for_another_target_and_pickles_are_one_line_errors(loaded, tmp_path):
    draft = random_draft(loaded.model)
    save_eagle3(tmp_path / "ours", draft)
    other = loaded.model.config.__class__(**{**loaded.model.config.to_dict(), "hidden_size": 128})
    with pytest.raises(SpecchatError, match="hidden size 64 and 49152 tokens; this one has 128"):
        load_eagle3(tmp_path / "ours", other)
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(SpecchatError, match="never unpickles"):
        load_eagle3(tmp_path / "pickled", loaded.model.config)


def test_our_checkpoint_is_the_released_layout_and_loads_back(loaded, tmp_path):
    draft = random_draft(loaded.model)
    save_eagle3(tmp_path / "ours", draft)
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 512
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 1, 0]
    back = load_eagle3(tmp_path / "ours", loaded.model.config)
    assert torch.equal(back.draft_vocab, torch.arange(3, 515))
    assert all(torch.equal(back.state_dict()[name], tensor) for name, tensor in draft.state_dict().items())


def _decode(engine, prompt, sampling, **options):
    return [t for event in engine.generate(prompt, sampling=sampling, max_new_tokens=40, **options)
            for t in event.tokens]


@pytest.mark.parametrize("prunes", [True, False], ids=["pruned", "as-on-a-gpu"])
@pytest.mark.parametrize("budget", [1, 4, 12, None])
def test_eagle3_decodes_token_for_token_as_the_target_alone(loaded, budget, prunes):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    prompts = [list(range(30, 60)), list(range(100, 180, 3))]
    alone = [_decode(engine, prompt, SamplingConfig()) for prompt in prompts]
    drafter = Eagle3Drafter(engine.target, random_draft(loaded.model))
    drafter.prunes = prunes  # a GPU expands each depth's best nodes without reading them
    engine.set_drafter(drafter, budget)
    assert [_decode(engine, prompt, SamplingConfig()) for prompt in prompts] == alone
    assert engine.drafter.kv.positions == list(range(len(engine.drafter.kv.positions)))  # a row per position


def test_eagle3_is_lossless_through_the_cpu_decoder_in_bf16(tokenizer):
    """bf16 activations: the compiled CPU decoder runs the target and hands over the layers' states."""
    model = tiny_model("llama", head_dim=64).to(torch.bfloat16)  # a head size the CPU decoder is built for
    engine = Engine(model, tokenizer, max_len=256)
    assert engine.canonical
    prompt = list(range(30, 60))
    alone = _decode(engine, prompt, SamplingConfig())
    engine.set_drafter(Eagle3Drafter(engine.target, random_draft(model)), 6)
    assert _decode(engine, prompt, SamplingConfig(), fresh=True) == alone


def test_the_tree_drafted_from_tensors_alone_is_the_one_grown_on_the_hosts_terms(loaded, monkeypatch):
    """A GPU's depths read the root's position and the draft cache's length on the device and attend over its whole
    buffer, masked: every node expanded, the tree is the one the host grows when nothing is pruned."""
    monkeypatch.setattr("specchat.drafters.eagle3.drafter.MIN_DEPTH_CHANCE", 0.0)  # every depth runs
    engine = Engine(loaded.model, loaded.tokenizer, max_len=128)
    ids = list(range(200, 240))
    drafter = Eagle3Drafter(engine.target, random_draft(loaded.model))
    drafter.prefill(ids, engine.target_states(ids, feature_layers=(2, 1, 0)), 0)
    for budget in (1, 3, 8, 40):
        drafter.prunes = True
        host = drafter.propose(budget, SamplingConfig()).paths()
        drafter.prunes = False
        device = drafter.propose(budget, SamplingConfig()).paths()
        assert device.keys() == host.keys() and len(host) == min(budget, 52)
        assert [device[path][0] for path in host] == pytest.approx([score for score, _ in host.values()], rel=1e-5)


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0, top_p=0.9, seed=3)],
                         ids=["greedy", "sampled"])  # fmt: skip
def test_a_graphed_proposal_drafts_as_called(loaded, monkeypatch, sampling):
    """What a GPU captures: the depths of a budget from buffers each proposal's newest row is copied into, captured
    anew when the draft's cache grows (a long prompt takes it past its first 256 slots). Capture's stand-in
    (`rerun`) fails where the call moved data between host and device or dispatched other ops or host values than
    at its capture. Every proposal equals the one drafted as called, and the output is the target's."""
    prompt = list(range(30, 270))
    captures = []
    monkeypatch.setattr("specchat.engine.cuda_graphs.graph_of",
                        lambda call, pool: captures.append(call) or rerun(call, pool))  # fmt: skip
    proposals, outputs = {}, {}
    for graphed in (False, True):
        engine = Engine(loaded.model, loaded.tokenizer, max_len=400)
        drafter = Eagle3Drafter(engine.target, random_draft(loaded.model))
        drafter.prunes, drafter.uses_graphs = False, graphed  # as on a GPU
        seen = proposals[graphed] = []
        propose = drafter.propose
        drafter.propose = lambda *args, propose=propose, seen=seen: seen.append(propose(*args)) or seen[-1]
        engine.set_drafter(drafter, 12)
        outputs[graphed] = _decode(engine, prompt, sampling)
    alone = _decode(Engine(loaded.model, loaded.tokenizer, max_len=400), prompt, sampling)
    assert outputs[True] == outputs[False] == alone and len(proposals[True]) > 10
    assert [(t.tokens, t.parents, t.scores) for t in proposals[True]] == [
        (t.tokens, t.parents, t.scores) for t in proposals[False]]  # fmt: skip
    assert list(drafter.graphs) == [12] and len(captures) == 2


def test_a_small_budget_expands_only_the_nodes_whose_children_it_can_keep(loaded, monkeypatch):
    """At budget B a depth-d forward runs the B - d best nodes (at most top_k): the tree is the one a full
    expansion cut to B nodes gives, for fewer rows."""
    monkeypatch.setattr("specchat.drafters.eagle3.drafter.MIN_DEPTH_CHANCE", 0.0)  # every depth runs
    engine = Engine(loaded.model, loaded.tokenizer, max_len=128)
    ids = list(range(200, 240))
    features = engine.target_states(ids, feature_layers=(2, 1, 0))
    drafter = Eagle3Drafter(engine.target, random_draft(loaded.model))
    drafter.prefill(ids, features, 0)
    full = drafter.propose(64, SamplingConfig()).paths()
    assert drafter.kv.tree_rows == 12  # depths 1-3, four rows each
    for budget, rows in ((2, 1), (3, 3), (4, 6), (6, 11), (8, 12)):
        tree = drafter.propose(budget, SamplingConfig())
        assert drafter.kv.tree_rows == rows
        assert tree.paths() == DraftTree.best(full, budget).paths()


def test_nodes_less_likely_than_the_least_chance_are_not_expanded(loaded, monkeypatch):
    """A child is no likelier than its parent, so below the least chance worth verifying a node's row is not run:
    the tree is the full one less the children of such nodes."""
    monkeypatch.setattr("specchat.drafters.eagle3.drafter.MIN_DEPTH_CHANCE", 0.0)  # every depth runs
    engine = Engine(loaded.model, loaded.tokenizer, max_len=128)
    ids = list(range(200, 240))
    drafter = Eagle3Drafter(engine.target, random_draft(loaded.model))
    drafter.prefill(ids, engine.target_states(ids, feature_layers=(2, 1, 0)), 0)
    full = drafter.propose(64, SamplingConfig()).paths()
    least = sorted((chance for path, (chance, _) in full.items() if len(path) == 1), reverse=True)[1]
    tree = drafter.propose(64, SamplingConfig(), least_chance=least)
    assert drafter.kv.tree_rows == 2  # the two likeliest of the root's children; their children are less likely
    kept = {path: node for path, node in full.items() if all(full[path[:d]][0] >= least for d in range(1, len(path)))}
    assert tree.paths().keys() == kept.keys() and {len(path) for path in kept} == {1, 2}
    assert [chance for chance, _ in tree.paths().values()] == pytest.approx(
        [kept[path][0] for path in tree.paths()], rel=1e-5
    )  # fp32 rounds rows batched in twos and in fours apart


def test_the_engine_tells_a_scored_drafter_the_least_chance_worth_a_node(loaded):
    """Each step passes the adaptive budget's price of a node as it stands; live timings move it (a noisy step
    can even make a node look free), so the test compares it with the budget's, not with a number."""
    asked, priced = [], []
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)

    class Recorded(Eagle3Drafter):
        def propose(self, budget, sampling, least_chance=0.0, noise=None):
            asked.append(least_chance)
            priced.append(engine.policy.least_chance())
            return super().propose(budget, sampling, least_chance, noise)

    engine.set_drafter(Recorded(engine.target, random_draft(loaded.model)), None)  # the adaptive budget
    _decode(engine, list(range(30, 60)), SamplingConfig())
    assert asked and asked == priced and any(chance > 0 for chance in asked)  # verifying a node costs something


@pytest.mark.parametrize("layer", ["torch", "compiled"])
def test_a_chat_turn_that_reuses_the_cache_keeps_one_draft_row_per_position(loaded, layer):
    model = loaded.model if layer == "torch" else tiny_model("llama", head_dim=64)  # the CPU decoder's head size
    engine = Engine(model, loaded.tokenizer, max_len=256)
    engine.set_drafter(Eagle3Drafter(engine.target, random_draft(model)), 6)
    assert (engine.drafter.native is not None) == (layer == "compiled")
    first = list(range(30, 60))
    second = first + _decode(engine, first, SamplingConfig()) + list(range(300, 310))
    alone = _decode(Engine(model, loaded.tokenizer, max_len=256), second, SamplingConfig())
    assert _decode(engine, second, SamplingConfig()) == alone  # the second turn prefilled only its new tokens
    drafter = engine.drafter
    positions = drafter.kv.positions + list(range(drafter.first_pending, drafter.first_pending + len(drafter.features)))
    assert positions == list(range(engine.length - 1))  # every committed position's row, run or pending, once


def test_eagle3_drafts_that_are_right_get_accepted(loaded):
    """A draft whose guesses are the target's own: the tree's first path is the greedy continuation, so the
    engine commits several tokens a step (a drafter wired wrong would commit one)."""
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    prompt = list(range(30, 60))
    alone = _decode(engine, prompt, SamplingConfig())
    drafter = Eagle3Drafter(engine.target, random_draft(loaded.model))
    real = drafter.propose

    def knowing(budget, sampling, least_chance=0.0, noise=None):  # the draft's tree, its best path the truth
        real(budget, sampling, least_chance, noise)
        return DraftTree.from_chains([alone[len(drafter.ids) - len(prompt) :][:3]], drafter.kind, budget)

    drafter.propose = knowing
    engine.set_drafter(drafter, 3)
    events = list(engine.generate(prompt, sampling=SamplingConfig(), max_new_tokens=40))
    assert [t for e in events for t in e.tokens] == alone and len(events) < 20


def test_eagle3_sampled_output_is_the_targets_draw_for_draw(loaded):
    """Sampling keys every draw by its token's position: the output is the target's own whatever
    the drafter proposes, so any difference would be a verification that is not exact."""
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    sampling = SamplingConfig(temperature=1.0, top_p=0.95, seed=7)
    prompt = list(range(30, 60))
    alone = _decode(engine, prompt, sampling)
    engine.set_drafter(Eagle3Drafter(engine.target, random_draft(loaded.model)), 6)
    assert _decode(engine, prompt, sampling) == alone


@torch.inference_mode()
def test_training_time_test_computes_what_drafting_computes(loaded):
    """The objective's step-k row of anchor p equals the drafter's depth-(k + 1) row below committed text that
    ends at p + 1, reading the text's tokens: training trains the computation drafting runs."""
    model = loaded.model
    draft = random_draft(model).eval()
    ids = list(range(200, 236))
    engine = Engine(model, loaded.tokenizer, max_len=128)
    layers = draft.config.layers_for(2)
    features = engine.target_states(ids, feature_layers=layers)
    labels = torch.zeros(len(ids), dtype=torch.int32)
    unrolled = [logits for logits, _ in Eagle3Objective(draft, engine.target.embed_tokens, steps=3)._unroll(
        Sample(tuple(ids), 1, True), SampleLayers(features, labels))]  # fmt: skip
    drafter = Eagle3Drafter(engine.target, draft, weights=None)
    anchor = 20  # committed: ids[: anchor + 2]; the root is ids[anchor + 1]
    drafter.prefill(ids[: anchor + 1], features[: anchor + 1], 0)
    drafter.commit([ids[anchor + 1]], features[:0])
    h, logits = drafter._catch_up()
    torch.testing.assert_close(logits[0], unrolled[0][anchor], atol=1e-4, rtol=1e-4)
    tree, rows, root = TreeRows(), [ROOT], anchor + 1
    for depth in (1, 2):
        rows = tree.add(rows)
        h, logits = drafter._rows(h, torch.tensor([ids[anchor + 1 + depth]]), root + depth - 1, tree.seen(rows))
        torch.testing.assert_close(logits[0], unrolled[depth][anchor], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_the_compiled_draft_layer_computes_what_the_torch_layer_computes(tokenizer, dtype):
    """The CPU decoder's EAGLE-3 layer (`native.py`) against the torch layer: the committed rows' keys and values,
    the newest row's logits and the trees drafted below it."""
    model = tiny_model("llama", head_dim=64).to(dtype)  # a head size the CPU decoder is built for
    engine = Engine(model, tokenizer, max_len=128)
    ids = list(range(200, 240))
    features = engine.target_states(ids, feature_layers=(2, 1, 0))
    draft = random_draft(model).to(dtype)
    drafters = [Eagle3Drafter(engine.target, draft, weights=None) for _ in range(2)]
    assert drafters[0].native is not None
    drafters[1].native = None
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.05}
    trees = []
    for drafter in drafters:
        drafter.prefill(ids[:30], features[:30], 0)
        drafter.commit(ids[30:33], features[30:33])
        trees.append([drafter.propose(12, SamplingConfig()).paths() for _ in range(2)])
        assert trees[-1][0] == trees[-1][1]  # drafting twice from the same text drafts the same tree
    compiled, plain = drafters
    assert compiled.kv.positions == plain.kv.positions == list(range(32))
    for a, b in zip(compiled.last, plain.last, strict=True):
        torch.testing.assert_close(a, b, **tolerance)
    torch.testing.assert_close(compiled.kv.keys[:, :32], plain.kv.keys[:, :32], **tolerance)
    torch.testing.assert_close(compiled.kv.values[:, :32], plain.kv.values[:, :32], **tolerance)
    if dtype == torch.float32:  # bf16's roundings may swap near-equal guesses
        (compiled_tree, _), (plain_tree, _) = trees
        assert list(compiled_tree) == list(plain_tree) and len(compiled_tree) == 12
        assert [p for p, _ in compiled_tree.values()] == pytest.approx([p for p, _ in plain_tree.values()], rel=1e-4)


def test_a_short_run_lowers_the_heldout_loss_and_the_checkpoint_decodes_losslessly(loaded, tmp_path):
    data = _data_dir(tmp_path / "data", counts=(("train", 8), ("heldout", 2)))
    out = tmp_path / "draft"
    summary = train_eagle3(loaded, data, out, TrainRecipe(epochs=3, batch=2, lr=3e-3, evaluations=2), vocab=0,
                           intermediate=32)  # fmt: skip
    log = summary["log"]
    assert summary["steps"] == 12 and summary["feature_layers"] == [2, 1, 0]
    assert log[-1]["heldout_loss"] < log[0]["heldout_loss"]
    assert sorted(p.name for p in (data / "features").iterdir()) == ["layers-heldout-00000.safetensors",
                                                                   "layers-train-00000.safetensors"]  # fmt: skip
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    prompt = list(range(30, 60))
    alone = _decode(engine, prompt, SamplingConfig())
    engine.set_drafter(build_drafter(parse_drafter(f"eagle3:{out}+ngram"), engine.target), 8)
    assert _decode(engine, prompt, SamplingConfig()) == alone


def test_layer_features_are_the_engine_forward_states(loaded, tmp_path):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    samples = [Sample(tuple(random.Random(i).randrange(3, 1000) for _ in range(20)), 10, True) for i in range(3)]
    features = target_layer_states(engine, tmp_path, "train", samples, layers=(2, 1, 0))
    assert isinstance(features, LayerFeatures) and features.layers.shape == (60, 192)
    expected = engine.target_states(list(samples[1].ids), feature_layers=(2, 1, 0)).to(torch.bfloat16)
    assert torch.equal(features.of(1).layers, expected)
    again = target_layer_states(engine, tmp_path, "train", samples, layers=(2, 1, 0))  # read back from disk
    assert torch.equal(again.layers, features.layers)


def test_drafters_that_read_different_target_states_do_not_combine(loaded):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    eagle3 = Eagle3Drafter(engine.target, random_draft(loaded.model))
    with pytest.raises(SpecchatError, match="eagle3 and glide read different target states"):
        CompositeDrafter(eagle3, GlideDrafter(engine.target, GlideModel(GlideConfig.for_target(
            loaded.model.config, num_hidden_layers=1, shared_vocab=True))))  # fmt: skip
    assert CompositeDrafter(eagle3, NgramDrafter()).feature_layers == eagle3.feature_layers


@torch.inference_mode()
def test_a_long_prompt_catches_up_in_blocks_as_in_one(loaded, monkeypatch):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=64)
    draft = random_draft(loaded.model)
    ids = list(range(200, 230))
    features = engine.target_states(ids, feature_layers=(2, 1, 0))
    runs = []
    for block in (512, 7):
        monkeypatch.setattr("specchat.drafters.eagle3.drafter.CATCH_UP", block)
        drafter = Eagle3Drafter(engine.target, draft, weights=None)
        drafter.prefill(ids[:-1], features[:-1], 0)
        drafter.commit(ids[-1:], features[:0])
        (last, logits), kv = drafter._catch_up(), drafter.kv
        runs.append((last, logits, kv.keys[:, : len(kv)], kv.values[:, : len(kv)]))
    for whole, blocks in zip(*runs, strict=True):
        torch.testing.assert_close(blocks, whole, atol=1e-5, rtol=1e-5)


def test_train_eagle3_rejects_bad_options_in_one_line(tmp_path, monkeypatch, capfd):
    command = ("train", "eagle3", "--data", str(tmp_path), "--out", str(tmp_path / "o"))
    # in this process (`specchat_in_process`): each is refused before the target loads
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command), "holds no training data")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, *command, "--steps", "0"), "--steps")
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, "run", "hi", "--drafter", "eagle3"),
                          "no published eagle3 drafter")  # fmt: skip


def test_the_draft_cache_grows_keeping_its_rows():
    kv = DraftKV(2, 4, dtype=torch.float32, device=torch.device("cpu"))
    rows = torch.arange(2 * 300 * 4, dtype=torch.float32).view(2, 300, 4)
    keys, _ = kv.write(rows[:, :200], -rows[:, :200])
    kv.added(200, list(range(200)))
    keys, values = kv.write(rows[:, 200:], -rows[:, 200:])  # past the 256 slots it starts with
    assert kv.keys.shape[1] >= 300 and torch.equal(keys, rows) and torch.equal(values, -rows)
