"""GLIDE + CAPE: a draft model over the target's KV cache, proposing a chain and its runners-up.

Proven here:
- greedy speculative decoding with a random GLIDE draft emits exactly the target's own greedy tokens (tiny
  llama and qwen2 targets at budgets 8, 20 and adaptive, a second turn that reuses the cache included, and
  the real default model); a draft that copies a tiny llama target (its self-attention is the target's, its
  cross-attention silent) gets whole chains accepted;
- CAPE's tree: a chain of `chain` top-1 tokens, each step with as many next-ranked siblings as its top-1
  probability's bin asks, chain first and siblings step by step while the budget lasts, then each step's other
  ranked tokens; laid out on the device, node for node the tree built on the host;
- the draft's own cache caught up step by step (and across turns) equals a fresh drafter's over the same ids;
- the loader: save -> load gives the same outputs, the remap variant (with a training prefix and unused
  cross-attention k / v projections) loads, a wrong head count or vocabulary is one line naming both, and
  pickles are refused.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import rerun
from safetensors import safe_open
from torch import nn

from specchat.drafters.checkpoint import write_checkpoint
from specchat.drafters.glide.drafter import CAPE_BINS, GlideDrafter, build
from specchat.drafters.glide.model import GlideConfig, GlideKV, GlideModel, load_glide, save_glide
from specchat.engine.generate import Engine
from specchat.engine.sampling import SamplingConfig
from specchat.engine.tree import ROOT
from specchat.errors import SpecchatError

GREEDY = SamplingConfig()
VOCAB = 1024
PROMPT = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(0)).tolist()


def run(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], list]:
    events = list(engine.generate(prompt, sampling=GREEDY, max_new_tokens=n))
    return [t for e in events for t in e.tokens], events


def random_draft(target_config, layers: int = 1, seed: int = 0, std: float = 0.3, **changes) -> GlideModel:
    """Random weights, peaked at the tiny targets' width so that its choices are not ties (at the default
    model's, 0.02 keeps its probabilities clear of subnormal floats, which CPUs compute 100x slower)."""
    torch.manual_seed(seed)
    draft = GlideModel(GlideConfig.for_target(target_config, num_hidden_layers=layers, **changes))
    for parameter in draft.parameters():
        if parameter.dim() > 1:
            nn.init.normal_(parameter, std=std)
    return draft.eval().requires_grad_(False)


def copy_of(target, **changes) -> GlideModel:
    """A draft that is the (bias-free llama) target: self-attention over its own cache is the target's own
    attention, the cross-attention adds nothing."""
    draft = GlideModel(GlideConfig.for_target(target.config, **changes))
    state = {k: v for k, v in target.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    for name, tensor in draft.state_dict().items():
        tensor.copy_(state[name] if name in state else torch.zeros_like(tensor))
    return draft.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def targets():
    return {family: tiny_model(family, vocab_size=VOCAB) for family in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def greedy(targets, tokenizer):
    """Each tiny target's own greedy continuation of PROMPT, by the engine without a drafter."""
    return {family: run(Engine(model, tokenizer, max_len=256), PROMPT, 48)[0] for family, model in targets.items()}


# --- greedy equality --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("budget", [8, 20, None])
def test_random_glide_changes_nothing(family, budget, targets, greedy, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))  # the adaptive budget's calibration goes here
    engine = Engine(targets[family], tokenizer, max_len=256)
    drafter = GlideDrafter(engine.target, random_draft(targets[family].config, layers=2 if budget == 20 else 1))
    engine.set_drafter(drafter, budget)
    out, events = run(engine, PROMPT, 48)
    assert out == greedy[family]
    assert all(origin in ("glide", "target") for event in events for origin in event.origins)

    second = PROMPT + out[:20] + [5, 6, 7]  # a second turn: the shared prefix's draft cache is kept
    expected, _ = run(Engine(targets[family], tokenizer, max_len=256), second, 24)
    assert run(engine, second, 24)[0] == expected


def test_a_graphed_chain_reads_the_caches_to_their_lengths_and_drafts_as_called(targets, greedy, tokenizer,
                                                                                monkeypatch):  # fmt: skip
    """What a GPU captures: the chain's steps at positions held on the device, writing and reading the draft's own
    cache and reading the target's whole layers to the root's length (the prefix-attention op: its CPU body here,
    its kernel held to the reference in test_decoder_kernels.py); every proposal of a generation equals the one
    drafted as called, one graph per chain length."""
    engine = Engine(targets["llama"], tokenizer, max_len=64)
    proposals = {}
    for graphed in (False, True):
        drafter = GlideDrafter(engine.target, random_draft(targets["llama"].config, layers=2))
        monkeypatch.setattr(drafter, "_graphed", lambda graphed=graphed: graphed)
        monkeypatch.setattr("specchat.engine.cuda_graphs.graph_of", rerun)
        seen = proposals[graphed] = []
        propose = drafter.propose
        drafter.propose = lambda *args, propose=propose, seen=seen: seen.append(propose(*args)) or seen[-1]
        engine.set_drafter(drafter, 20)
        assert run(engine, PROMPT, 10)[0] == greedy["llama"][:10]
    assert [(t.tokens, t.parents) for t in proposals[True]] == [(t.tokens, t.parents) for t in proposals[False]]
    assert len(proposals[True]) > 3 and list(drafter.graphs) == [4]


def test_a_copy_of_the_target_gets_its_chains_accepted(targets, greedy, tokenizer):
    engine = Engine(targets["llama"], tokenizer, max_len=256)
    engine.set_drafter(GlideDrafter(engine.target, copy_of(targets["llama"])), 20)
    out, events = run(engine, PROMPT, 48)
    assert out == greedy["llama"]
    steps = events[1:]
    assert sum(event.origins == ["glide"] * 4 + ["target"] for event in steps) >= len(steps) - 2


@pytest.mark.slow
def test_default_model(default_model, tokenizer):
    prompt = tokenizer.encode("The three primary colours are", add_special_tokens=False)
    model = default_model.model
    expected, _ = run(Engine(model, tokenizer, max_len=128), prompt, 32)
    engine = Engine(model, tokenizer, max_len=128)
    engine.set_drafter(GlideDrafter(engine.target, random_draft(model.config, std=0.02)), 20)
    assert run(engine, prompt, 32)[0] == expected


# --- drafts that share the target's embedding and LM head (trained here) ------------------------------------


@pytest.mark.parametrize("weights", [None, "int8", "int4"])
def test_a_shared_vocabulary_draft_changes_nothing(weights, targets, greedy, tokenizer):
    """A draft over the target's embedding and a reduced vocabulary (its head: those rows of the target's),
    dense or quantized, keeps greedy decoding the target's and drafts only ids of its vocabulary."""
    target = targets["qwen2"]
    draft_vocab = torch.arange(3, VOCAB, 4)
    engine = Engine(target, tokenizer, max_len=256)
    draft = random_draft(target.config, shared_vocab=True)
    drafter = GlideDrafter(engine.target, draft, draft_vocab=draft_vocab, weights=weights)
    quantized = [m for m in drafter.model.modules() if type(m) is not nn.Linear and hasattr(m, "in_features")]
    assert len(quantized) == (0 if weights is None else 9)  # q / k / v / o, cross q / o, gate / up / down
    engine.set_drafter(drafter, 12)
    assert run(engine, PROMPT, 48)[0] == greedy["qwen2"]
    tree = drafter.propose(12, GREEDY)
    assert len(tree) == 12 and set(tree.tokens) <= set(draft_vocab.tolist())


def test_a_shared_vocabulary_copy_gets_its_chains_accepted(targets, greedy, tokenizer):
    """The copy of the target again, reading the target's embedding and predicting through the rows of its
    head that a draft vocabulary (here all of them) copies."""
    engine = Engine(targets["llama"], tokenizer, max_len=256)
    draft = copy_of(targets["llama"], shared_vocab=True)
    assert draft.lm_head is None and draft.model.embed_tokens is None
    engine.set_drafter(GlideDrafter(engine.target, draft, draft_vocab=torch.arange(VOCAB)), 20)
    out, events = run(engine, PROMPT, 48)
    assert out == greedy["llama"]
    steps = events[1:]
    assert sum(event.origins == ["glide"] * 4 + ["target"] for event in steps) >= len(steps) - 2


# --- the CAPE tree ----------------------------------------------------------------------------------------


def fixed_head(draft: GlideModel, confidence: float) -> list[int]:
    """Make the draft's logits the same everywhere: top-1 probability `confidence`, then distinct ranks.
    Returns the tokens by rank."""
    vocab = draft.config.vocab_size
    ranked = torch.randperm(vocab, generator=torch.Generator().manual_seed(1))
    rest = torch.arange(1, vocab, dtype=torch.float64).neg().mul(0.01).exp()
    probs = torch.empty(vocab, dtype=torch.float64)
    probs[ranked] = torch.cat([torch.tensor([confidence], dtype=torch.float64), rest / rest.sum() * (1 - confidence)])
    head = nn.Linear(draft.config.hidden_size, vocab, bias=True)
    nn.init.zeros_(head.weight)
    head.bias.data = probs.log().float()
    draft.lm_head = head
    return ranked.tolist()


def drafter_after_a_turn(target, tokenizer, draft: GlideModel, **options) -> GlideDrafter:
    engine = Engine(target, tokenizer, max_len=256)
    drafter = GlideDrafter(engine.target, draft, **options)
    engine.set_drafter(drafter, 8)
    run(engine, PROMPT, 6)
    return drafter


@pytest.mark.parametrize("confidence, siblings", [(0.2, 8), (0.45, 6), (0.7, 4), (0.9, 2), (0.999, 2)])
def test_cape_siblings_follow_the_bins(confidence, siblings, targets, tokenizer):
    draft = random_draft(targets["llama"].config)
    ranked = fixed_head(draft, confidence)
    drafter = drafter_after_a_turn(targets["llama"], tokenizer, draft)
    for budget in (4 + 4 * siblings, 64):  # CAPE's tree, then the budget filled with the next-ranked tokens
        tree = drafter.propose(budget, GREEDY)
        assert set(tree.origins) == {"glide"}
        assert tree.tokens[:4] == [ranked[0]] * 4 and tree.parents[:4] == [ROOT, 0, 1, 2]  # the chain first
        assert len(tree) == min(budget, 36)
        for step, parent in enumerate([ROOT, 0, 1, 2]):  # then each step's runners-up, in rank order
            nodes = range(4 + step * siblings, 4 + (step + 1) * siblings)
            assert [tree.parents[i] for i in nodes] == [parent] * siblings
            assert [tree.tokens[i] for i in nodes] == ranked[1 : 1 + siblings]
        extra = 8 - siblings
        for step, parent in enumerate([ROOT, 0, 1, 2] if budget == 64 else []):
            nodes = range(4 + 4 * siblings + step * extra, 4 + 4 * siblings + (step + 1) * extra)
            assert [tree.parents[i] for i in nodes] == [parent] * extra
            assert [tree.tokens[i] for i in nodes] == ranked[1 + siblings : 9]


def cape_reference(ranked: list[list[int]], siblings: list[int], budget: int) -> tuple[list[int], list[int]]:
    """CAPE's tree node by node: the chain, each step's runners-up its bin asks, then the others, while the budget
    lasts."""
    tokens, parents = [step[0] for step in ranked][:budget], [ROOT, 0, 1, 2][:budget]
    for first, last in [(lambda count: 1, lambda count: 1 + count), (lambda count: 1 + count, lambda count: 9)]:
        for step, count in enumerate(siblings):
            for token in ranked[step][first(count) : last(count)]:
                if len(tokens) < budget:
                    tokens.append(token)
                    parents.append(step - 1)
    return tokens, parents


@pytest.mark.parametrize("budget", [1, 3, 4, 10, 24, 30, 36, 64])
def test_the_layout_puts_each_steps_bin_first_and_fills_the_budget_after(budget, targets, tokenizer):
    """Steps of different confidences: the tree laid out on the device is CAPE's, node for node."""
    engine = Engine(targets["llama"], tokenizer, max_len=64)
    drafter = GlideDrafter(engine.target, random_draft(targets["llama"].config))
    ranked = torch.arange(36).reshape(4, 9) * 7 + 100
    confidences = torch.tensor([0.2, 0.9, 0.5, 0.7])  # bins of 8, 2, 6 and 4 runners-up
    length = min(4, budget)
    tokens, parents = drafter._layout(ranked[:length], confidences[:length], budget)
    assert (tokens.tolist(), parents.tolist()) == cape_reference(ranked[:length].tolist(), [8, 2, 6, 4][:length],
                                                                 budget)  # fmt: skip


@pytest.mark.parametrize("budget, chain_length, per_step", [(1, 1, []), (3, 3, []), (4, 4, []), (10, 4, [6]),
                                                            (18, 4, [8, 6]), (36, 4, [8] * 4)])  # fmt: skip
def test_budget_caps_the_tree(budget, chain_length, per_step, targets, tokenizer):
    draft = random_draft(targets["llama"].config)
    fixed_head(draft, 0.1)
    tree = drafter_after_a_turn(targets["llama"], tokenizer, draft).propose(budget, GREEDY)
    assert len(tree) == min(budget, 36)
    assert tree.parents[:chain_length] == [ROOT, *range(chain_length - 1)] and tree.depth == chain_length
    counts = [tree.parents[chain_length:].count(parent) for parent in [ROOT, 0, 1, 2]]
    assert counts == per_step + [0] * (4 - len(per_step))


def test_chain_length_and_bins_are_parameters(targets, tokenizer):
    draft = random_draft(targets["llama"].config)
    fixed_head(draft, 0.5)
    bins = ((0.55, 1), (math.inf, 3))
    drafter = drafter_after_a_turn(targets["llama"], tokenizer, draft, chain=6, bins=bins)
    tree = drafter.propose(12, GREEDY)
    assert tree.depth == 6 and len(tree) == 6 + 6 * 1 and tree.parents[6:] == [ROOT, 0, 1, 2, 3, 4]
    assert len(drafter.propose(64, GREEDY)) == 6 + 6 * 3  # each step's 3 ranked after the top
    assert CAPE_BINS == ((0.3, 8), (0.6, 6), (0.8, 4), (math.inf, 2))


# --- catching up ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_catch_up_equals_a_fresh_drafter(family, targets, tokenizer):
    """After steps that commit several tokens each, and after a second turn, the root's draft logits and the
    draft's cache are those of a drafter that saw all the ids at once."""
    target = targets[family]
    draft = copy_of(target) if family == "llama" else random_draft(target.config, layers=2)
    engine = Engine(target, tokenizer, max_len=256)
    drafter = GlideDrafter(engine.target, draft)
    engine.set_drafter(drafter, 12)
    for prompt, n in ((PROMPT, 30), (PROMPT + [9, 8, 7], 10), (PROMPT[:20] + [4], 7)):  # extend, then diverge
        run(engine, prompt, n)
        ids = list(engine.ids)
        assert drafter.ids == ids
        fresh = GlideDrafter(engine.target, draft)
        fresh.prefill(ids, engine._no_rows, 0)
        expected = fresh.root_logits()
        torch.testing.assert_close(drafter.root_logits(), expected, atol=1e-4, rtol=1e-4)
        for mine, theirs in ((drafter.kv.keys, fresh.kv.keys), (drafter.kv.values, fresh.kv.values)):
            torch.testing.assert_close(mine[:, :, : len(ids)], theirs[:, :, : len(ids)], atol=1e-4, rtol=1e-4)
    if family == "llama":  # the copy's root logits are the target's next-token logits
        with torch.inference_mode():
            logits = target(torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(expected, logits, atol=1e-3, rtol=1e-3)


def test_catch_up_in_chunks(targets, tokenizer, monkeypatch):
    """A prompt longer than one catch-up chunk gives the same root logits as one chunk."""
    from specchat.drafters.glide import drafter as glide

    target = targets["qwen2"]
    engine = Engine(target, tokenizer, max_len=256)
    draft = random_draft(target.config, layers=2)
    engine.set_drafter(GlideDrafter(engine.target, draft), 4)
    run(engine, PROMPT * 3, 2)
    ids = list(engine.ids)
    whole = GlideDrafter(engine.target, draft)
    whole.prefill(ids, engine._no_rows, 0)
    monkeypatch.setattr(glide, "CHUNK", 7)
    chunked = GlideDrafter(engine.target, draft)
    chunked.prefill(ids, engine._no_rows, 0)
    torch.testing.assert_close(chunked.root_logits(), whole.root_logits(), atol=1e-4, rtol=1e-4)


# --- the loader -------------------------------------------------------------------------------------------


def outputs(draft: GlideModel, target, seed: int = 0) -> torch.Tensor:
    """Logits of a draft forward over 12 tokens against random target keys / values."""
    config = draft.config
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (12,), generator=generator)
    shape = (config.cross_kv_heads, 11, config.cross_head_dim)
    target_kv = [(torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))
                 for _ in range(config.num_hidden_layers)]  # fmt: skip
    kv = GlideKV(config, 16, dtype=torch.float32, device=torch.device("cpu"))
    positions = torch.arange(12)
    cos, sin = target.model.rotary_emb(kv.keys, positions[None])
    with torch.inference_mode():
        x = draft.model.embed_tokens(tokens)
        return draft.lm_head(draft(x, 0, kv, draft.target_kv(target_kv), (cos[0], sin[0])))


def test_save_then_load_gives_the_same_outputs(targets, tmp_path):
    target = targets["qwen2"]
    draft = random_draft(target.config, layers=2, hidden_size=48, intermediate_size=96, num_attention_heads=3,
                         num_key_value_heads=1, head_dim=16)  # fmt: skip
    save_glide(tmp_path / "glide", draft)
    loaded, draft_vocab = load_glide(tmp_path / "glide", target.config)
    assert loaded.config == draft.config and draft_vocab is None
    torch.testing.assert_close(outputs(loaded, target), outputs(draft, target), atol=0, rtol=0)


def test_a_shared_vocabulary_checkpoint_holds_its_layers_and_vocabulary_only(targets, tmp_path):
    target = targets["llama"]
    draft = random_draft(target.config, shared_vocab=True, intermediate_size=96)
    draft_vocab = torch.arange(0, VOCAB, 3)
    save_glide(tmp_path / "glide", draft, dtype=torch.bfloat16, draft_vocab=draft_vocab)
    with safe_open(tmp_path / "glide" / "model.safetensors", "pt") as stored:
        names = set(stored.keys())
    assert "draft_vocab" in names and not any("embed_tokens" in name or "lm_head" in name for name in names)
    loaded, vocab = load_glide(tmp_path / "glide", target.config)
    assert loaded.config == draft.config and loaded.lm_head is None and torch.equal(vocab, draft_vocab)
    for name, tensor in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.bfloat16().float()), name


@pytest.mark.parametrize("per_head", [True, False])
def test_remap_checkpoint_loads(per_head, targets, tmp_path):
    """remap_k / remap_v load (as the identity here, the draft's outputs are the plain draft's); a training
    prefix and the unused cross-attention k / v projections are stripped."""
    target = targets["llama"]
    config = target.config
    width = 16 if per_head else 2 * 16  # head_dim, or kv_heads * head_dim
    plain = random_draft(config, layers=2)
    tensors = {f"draft_model.{k}": v for k, v in plain.state_dict().items()}
    for layer in range(2):
        for name in ("remap_k", "remap_v"):
            tensors[f"draft_model.model.layers.{layer}.cross_attn.{name}.weight"] = torch.eye(width)
        for name in ("k_proj", "v_proj"):
            tensors[f"draft_model.model.layers.{layer}.cross_attn.{name}.weight"] = torch.zeros(32, 64)
    write_checkpoint(tmp_path / "remap", plain.config.to_dict(), tensors)
    loaded, _ = load_glide(tmp_path / "remap", config)
    assert loaded.config.remap == width and isinstance(loaded.model.layers[1].cross_attn.remap_v, nn.Linear)
    torch.testing.assert_close(outputs(loaded, target), outputs(plain, target))
    with torch.no_grad():
        loaded.model.layers[0].cross_attn.remap_k.weight.mul_(3.0)
    assert not torch.allclose(outputs(loaded, target), outputs(plain, target))


def test_wrong_head_count_is_one_line(targets, tmp_path):
    config = targets["llama"].config
    other = type(config).from_dict({**config.to_dict(), "num_attention_heads": 8, "head_dim": 8})
    save_glide(tmp_path / "glide", random_draft(other))  # cross-attention q_proj is 64 wide either way
    with pytest.raises(SpecchatError) as error:
        load_glide(tmp_path / "glide", config)
    message = str(error.value)
    assert "\n" not in message and "8 heads" in message and "4 heads" in message and "of 16" in message

    bare = random_draft(other).state_dict()  # no large_* keys in its config: the query's width tells
    bare["model.layers.0.cross_attn.q_proj.weight"] = torch.zeros(6 * 16, 64)
    bare["model.layers.0.cross_attn.o_proj.weight"] = torch.zeros(64, 6 * 16)
    write_checkpoint(tmp_path / "bare", {k: v for k, v in random_draft(config).config.to_dict().items()
                                         if not k.startswith("large_")}, bare)  # fmt: skip
    with pytest.raises(SpecchatError, match="^[^\n]*has 6 heads of 16; the target's attention has 4 heads"):
        load_glide(tmp_path / "bare", config)


def test_wrong_vocabulary_or_depth_is_one_line(targets, tmp_path):
    config = targets["llama"].config
    save_glide(tmp_path / "vocab", random_draft(config, vocab_size=1000))
    with pytest.raises(SpecchatError, match="^[^\n]*1000 tokens; the target has 1024$"):
        load_glide(tmp_path / "vocab", config)
    save_glide(tmp_path / "deep", random_draft(config, layers=3))
    with pytest.raises(SpecchatError, match="3 layers; the target has only 2"):
        load_glide(tmp_path / "deep", config)


def test_pickles_are_refused(targets, tmp_path):
    config = targets["llama"].config
    (tmp_path / "draft.bin").write_bytes(b"not read")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "config.json").write_text("{}")
    (tmp_path / "dir" / "pytorch_model.bin").write_bytes(b"not read")
    for path in (tmp_path / "draft.bin", tmp_path / "dir"):
        with pytest.raises(SpecchatError, match="only safetensors"):
            load_glide(path, config)


def test_build_loads_and_drafts(targets, tokenizer, tmp_path):
    target = targets["llama"]
    save_glide(tmp_path / "glide", random_draft(target.config))
    engine = Engine(target, tokenizer, max_len=256)
    drafter = build(engine.target, tmp_path / "glide")
    assert isinstance(drafter, GlideDrafter) and drafter.kind == "glide"
    engine.set_drafter(drafter, 8)
    assert len(run(engine, PROMPT, 5)[0]) == 5


@pytest.mark.parametrize("rows", [1, 5, 20])
def test_attention_of_few_rows_is_sdpa(rows, monkeypatch):
    """A draft step's attention (matmuls) and a catch-up's (SDPA) agree, over keys and values read in place from a
    longer cache; a row that sees nothing gets zeros."""
    from specchat.drafters import draft_attention as attention

    generator = torch.Generator().manual_seed(rows)
    q, keys = torch.randn(4, rows, 16, generator=generator), torch.randn(2, 48, 16, generator=generator)[:, :30]
    values = torch.randn(2, 48, 16, generator=generator)[:, :30]
    mask = torch.arange(30)[None] < torch.arange(rows)[:, None] * 3  # row 0 sees nothing
    results = []
    for few in (64, 0):
        monkeypatch.setattr(attention, "FEW_ROWS", few)
        results += [attention.attend(q, keys, values, mask), attention.attend(q, keys, values, None)]
    torch.testing.assert_close(results[0], results[2])
    torch.testing.assert_close(results[1], results[3])
    assert not results[0][:, 0].any()
