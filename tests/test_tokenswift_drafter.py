"""The TokenSwift drafter: the partial KV cache it drafts from, the tree it proposes, and that it is lossless.

Proven here, on tiny random models:
- the partial cache holds, per layer and KV head, the 16 sinks and exactly the positions whose keys score
  highest against the last query (checked against a brute force from transformers' own hidden states),
  their keys and values copied bit for bit; new positions overwrite the least important slots, and a new
  selection follows once they took every slot;
- the tree is [1, 3, 3, 3] (40 nodes) with n-gram chains merged in (siblings distinct, origins kept), and a
  smaller budget keeps the most probable nodes, parents first; without the draft forward it is [3, 3, 3]
  below the root, whose 4-grams it continues;
- heads trained over a draft vocabulary propose only its tokens;
- greedy and sampled (contextual penalty) output equals autoregressive output, over the full cache and a
  partial one small enough to be selected again several times, and without a draft forward;
- on a CPU the registry's drafter drafts without a forward unless a KV budget or the flag asks for one.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import rerun

from specchat.drafters.tokenswift.device_ngrams import DeviceNgrams
from specchat.drafters.tokenswift.drafter import KV_BUDGET, TokenSwiftDrafter, build
from specchat.drafters.tokenswift.heads_tree import Level, deepest, heads_tree, host_tree, product_levels
from specchat.drafters.tokenswift.model import TokenSwiftConfig, TokenSwiftHeads, save_heads
from specchat.drafters.tokenswift.ngram_table import NgramTable
from specchat.drafters.tokenswift.partial_kv import SINKS, PartialKV
from specchat.engine import cuda_graphs
from specchat.engine.generate import Engine
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.tree import DraftTree
from specchat.quant.int4_linear import Int4Linear
from specchat.quant.quantize import quantize_model

VOCAB = 96
PROMPT = torch.randint(3, VOCAB, (60,), generator=torch.Generator().manual_seed(2)).tolist()


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab_size=VOCAB, seed=5)


@pytest.fixture(scope="module")
def autoregressive(model, tokenizer):
    """The target's own 160 tokens after PROMPT under a sampling config, decoded once per config for the module."""

    @functools.cache
    def decode(sampling: SamplingConfig) -> list[int]:
        events = Engine(model, tokenizer, max_len=400).generate(PROMPT, sampling=sampling, max_new_tokens=160)
        return [t for e in events for t in e.tokens]

    return decode


def random_heads(model, seed: int = 0) -> TokenSwiftHeads:
    torch.manual_seed(seed)
    heads = TokenSwiftHeads(TokenSwiftConfig.for_target(model.config), model.model.norm.weight)
    with torch.no_grad():
        for head in heads.medusa_layers:
            head.linear.weight.normal_(0, 0.2)
    return heads.eval()


def brute_force_positions(model, ids: list[int], root: int, keep: int) -> list[torch.Tensor]:
    """Per layer [kv_heads, keep]: the positions >= SINKS whose keys score highest, from a fresh forward."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    with torch.no_grad():
        out = model(torch.tensor([ids + [root]]), output_hidden_states=True, use_cache=True)
    positions = torch.arange(len(ids) + 1)[None]
    result = []
    for layer, (block, hidden) in enumerate(zip(model.model.layers, out.hidden_states)):
        attention = block.self_attn
        x = block.input_layernorm(hidden)
        q = attention.q_proj(x).view(1, -1, model.config.num_attention_heads, attention.head_dim).transpose(1, 2)
        k = attention.k_proj(x).view(1, -1, model.config.num_key_value_heads, attention.head_dim).transpose(1, 2)
        cos, sin = model.model.rotary_emb(x, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        group = model.config.num_attention_heads // model.config.num_key_value_heads
        scores = []
        for kv in range(model.config.num_key_value_heads):
            query = q[0, kv * group : (kv + 1) * group, -1]  # [group, D]
            scores.append((k[0, kv, SINKS : len(ids)] @ query.T).sum(dim=1))
        result.append(torch.stack(scores).topk(keep, dim=-1).indices + SINKS)
    return result


def test_partial_cache_selects_the_most_important_positions(model, tokenizer):
    ids = torch.randint(3, VOCAB, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    engine = Engine(model, tokenizer, max_len=400)
    list(engine.generate(ids, max_new_tokens=1))  # prefill: the cache holds ids[:-1]... and the first token
    committed = list(engine.ids)
    root, prefix = committed[-1], committed[:-1]
    budget = 48
    partial = PartialKV(engine.target, budget)
    cache = partial.prepare(root)
    assert partial.selections == 1 and cache.length == budget
    expected = brute_force_positions(model, prefix, root, budget - SINKS)
    for layer, (mine, full, positions) in enumerate(zip(cache.layers, engine.cache.layers, expected)):
        for head in range(model.config.num_key_value_heads):
            want = torch.cat([torch.arange(SINKS), positions[head]])
            assert torch.equal(mine.keys[0, head, :budget], full.keys[0, head, want]), (layer, head)
            assert torch.equal(mine.values[0, head, :budget], full.values[0, head, want]), (layer, head)

    # one new position overwrites the least important slot; the rest stay
    before = cache.layers[0].keys[0, :, : budget - 1].clone()
    list(engine.generate(committed + [5], max_new_tokens=1))  # the engine's cache grows by two positions
    partial.prepare(engine.ids[-1])
    assert partial.selections == 1
    assert torch.equal(cache.layers[0].keys[0, :, : budget - 2], before[:, : budget - 2])
    new = engine.cache.length - 1
    assert torch.equal(cache.layers[0].keys[0, :, budget - 2], engine.cache.layers[0].keys[0, :, new])

    # rolling back: keeping every position keeps the slots; any cut empties them (they hold a selection)
    partial.truncate(partial.length)
    assert partial.length == engine.cache.length and cache.length == budget
    partial.truncate(partial.length - 1)
    assert partial.length == 0 and cache.length == 0


HEADS_VALUES = [[0.5, 0.3, 0.1]] * 3
HEADS_TOKENS = [[20 + row, 30 + row, 40 + row] for row in range(1, 4)]  # depth d's head: 2d, 3d, 4d (d from 1)


def product(values: list[list[float]], tokens: list[list[int]]) -> list[Level]:
    """The levels of heads that guess from the state alone (row d: depth d's tokens and probabilities)."""
    return product_levels(torch.tensor(values, dtype=torch.float64).reshape(-1, 3),
                          torch.tensor(tokens, dtype=torch.long).reshape(-1, 3))  # fmt: skip


def device_tree(levels: list[Level], table: NgramTable, budget: int, *, start: int, below: tuple[int, ...],
                below_p: float) -> DraftTree:  # fmt: skip
    """The tree laid out on the device, below the LM head's token `below` (probability `below_p`) or the root."""
    if budget < 1:
        return DraftTree.empty()
    ngrams = DeviceNgrams(table, torch.device("cpu"))
    ngrams.update()
    first = (torch.tensor(below), torch.tensor([below_p], dtype=torch.float64)) if below else None
    ranked = heads_tree(levels, *ngrams.lookup(torch.tensor([start])), budget, first)
    return ranked.tree(("tokenswift", "ngram"), deepest(len(levels), table.n - 1, bool(below)))


def host_layout(levels: list[Level], table: NgramTable, budget: int, *, start: int, below: tuple[int, ...],
                below_p: float) -> DraftTree:  # fmt: skip
    first = (torch.tensor(below), torch.tensor([below_p], dtype=torch.float64)) if below else None
    return host_tree(levels, table, budget, ("tokenswift", "ngram"), first, start)


def below_first(table: NgramTable, budget: int) -> DraftTree:
    """The heads' levels and the chains below the LM head's first token 10 (probability 0.9)."""
    return device_tree(product(HEADS_VALUES, HEADS_TOKENS), table, budget, start=10, below=(10,), below_p=0.9)


def test_tree_is_1_3_3_3_with_ngram_chains():
    table = NgramTable(lag=0)
    table.add([10, 21, 50, 51, 7, 10, 21, 50, 51, 7, 10, 60, 61, 62, 8])
    tree = below_first(table, 64)
    assert tree.tokens[0] == 10 and tree.depths[0] == 1
    assert len(tree) == 40  # as many as the heads' levels hold, the chains' nodes among them by their scores
    paths = {tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(len(tree))}
    assert (10, 21, 50, 51) in paths and (10, 60, 61, 62) in paths
    assert tree.origins[tree.tokens.index(50)] == "ngram" and tree.origins[tree.tokens.index(21)] == "tokenswift"
    siblings = {}
    for parent, token in zip(tree.parents, tree.tokens):
        assert token not in siblings.setdefault(parent, set())
        siblings[parent].add(token)
    small = below_first(table, 7)
    assert len(small) == 7
    assert all(parent < i for i, parent in enumerate(small.parents))
    assert small.scores == sorted(small.scores, reverse=True)  # best first: a cut is a prefix
    assert below_first(table, 0).tokens == []


def test_tree_without_the_draft_forward_is_3_3_3_below_the_root():
    table = NgramTable(lag=0)
    table.add([10, 50, 51, 52, 7, 10, 50, 51, 52, 7, 10])
    tree = device_tree(product(HEADS_VALUES, HEADS_TOKENS), table, 64, start=10, below=(), below_p=1.0)
    paths = {tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(len(tree))}
    assert len(tree) == 3 + 9 + 27
    assert {p for p in paths if len(p) == 1} == {(21,), (31,), (41,), (50,)}
    assert (21, 22, 23) in paths and (50, 51, 52) in paths  # the chain continues the root
    assert tree.origins[tree.tokens.index(50)] == "ngram"
    assert [tree.tokens[i] for i in range(len(tree)) if tree.depths[i] == 1][:2] == [50, 21]  # share 1.0, then 0.5


@pytest.mark.parametrize("seed", range(12))
def test_the_device_and_the_host_lay_out_the_same_tree(seed):
    """Random levels over a small vocabulary (a product's, or chained heads' that expand some of the level above's
    nodes), random texts whose 4-grams repeat the levels' paths and each other's prefixes (merged nodes, higher
    scores kept, siblings bounded), every budget: the same nodes in the same order, origins and scores."""
    rng = torch.Generator().manual_seed(seed)
    vocab = 6
    for forward, chained in [(True, False), (False, False), (True, True), (False, True)]:
        depth = int(torch.randint(0, 4, (1,), generator=rng))
        if chained:  # each level under some of the level above's nodes, a row each
            levels, count = [], 1
            for d in range(depth):
                rows = torch.randperm(count, generator=rng)[: int(torch.randint(1, count + 1, (1,), generator=rng))]
                values = torch.rand(len(rows), 3, generator=rng, dtype=torch.float64).sort(descending=True)[0]
                tokens = torch.stack([torch.randperm(vocab, generator=rng)[:3] for _ in rows])
                levels.append(Level(values, tokens, rows if d else None))
                count = 3 * len(rows)
        else:
            levels = product([sorted(torch.rand(3, generator=rng).tolist(), reverse=True) for _ in range(depth)],
                             [torch.randperm(vocab, generator=rng)[:3].tolist() for _ in range(depth)])  # fmt: skip
        table = NgramTable(lag=0, top=int(torch.randint(1, 8, (1,), generator=rng)))
        table.add(torch.randint(0, vocab, (int(torch.randint(0, 80, (1,), generator=rng)),), generator=rng).tolist())
        start = int(torch.randint(0, vocab, (1,), generator=rng))
        below, below_p = ((start,), 0.7) if forward else ((), 1.0)
        for budget in range(0, 42):
            want = host_layout(levels, table, budget, start=start, below=below, below_p=below_p)
            got = device_tree(levels, table, budget, start=start, below=below, below_p=below_p)
            assert len(got) == len(want)
            assert (got.tokens, got.parents, got.origins) == (want.tokens, want.parents, want.origins)
            assert (got.scores or []) == pytest.approx(want.scores or [], rel=1e-12)
            assert (got.scores or []) == sorted(got.scores or [], reverse=True)  # best first: a cut is a prefix


def vocab_heads(model) -> TokenSwiftHeads:
    """Random heads that rank only the even token ids, as heads trained over a draft vocabulary do."""
    heads = random_heads(model, seed=1)
    heads.draft_vocab = torch.arange(0, VOCAB, 2)
    return heads


def root_heads(model) -> TokenSwiftHeads:
    """Random heads that also read the root token (`root_input`), over a draft vocabulary."""
    torch.manual_seed(3)
    heads = TokenSwiftHeads(TokenSwiftConfig.for_target(model.config, root_input=True), model.model.norm.weight,
                            draft_vocab=torch.arange(0, VOCAB, 3))  # fmt: skip
    with torch.no_grad():
        for head in heads.medusa_layers:
            head.linear.weight.normal_(0, 0.2)
        heads.root_input.down.weight.normal_(0, 0.2)
    return heads.eval()


def chain_heads(model) -> TokenSwiftHeads:
    """Random heads that read the root and, after the first, the token the head before guessed (`chain_input`)."""
    torch.manual_seed(5)
    config = TokenSwiftConfig.for_target(model.config, root_input=True, chain_input=True)
    heads = TokenSwiftHeads(config, model.model.norm.weight, draft_vocab=torch.arange(0, VOCAB, 3))
    with torch.no_grad():
        for head in heads.medusa_layers:
            head.linear.weight.normal_(0, 0.2)
        heads.root_input.down.weight.normal_(0, 0.2)
        for block in heads.chain_inputs:
            block.down.weight.normal_(0, 2.0)  # strong enough that other tokens rank other children
    return heads.eval()


@pytest.mark.parametrize(
    ("forward", "kv_budget", "heads"),
    [(True, 0, random_heads), (True, 40, random_heads), (False, 0, random_heads), (False, 0, vocab_heads),
     (True, 0, vocab_heads), (False, 0, root_heads), (True, 0, root_heads), (False, 0, chain_heads),
     (True, 0, chain_heads)],
    ids=["forward-full-cache", "forward-partial-cache", "verified-state", "verified-state-draft-vocab",
         "forward-draft-vocab", "verified-state-root-input", "forward-root-input", "verified-state-chain-input",
         "forward-chain-input"],
)
@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(suppress=(2,)),  # no EOS: a book runs to its length
     SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.3, penalty_window=32, seed=4, suppress=(2,))],
    ids=["greedy", "sampled-penalised"],
)
@pytest.mark.parametrize("device_layout", [False, True], ids=["host-layout", "device-layout"])
def test_tokenswift_output_equals_autoregressive(model, tokenizer, autoregressive, forward, kv_budget, heads, sampling,
                                                device_layout):  # fmt: skip
    expected = autoregressive(sampling)
    engine = Engine(model, tokenizer, max_len=400)
    drafter = TokenSwiftDrafter(engine.target, heads(model), kv_budget=kv_budget, forward=forward, lag=16,
                                device_layout=device_layout)  # fmt: skip
    engine.set_drafter(drafter, 24)
    events = list(engine.generate(PROMPT, sampling=sampling, max_new_tokens=160))
    assert len(expected) == 160
    assert [t for e in events for t in e.tokens] == expected
    assert events[-1].stats.accepted > 0
    if kv_budget:
        assert drafter.partial.selections >= 3


@pytest.mark.parametrize(
    ("forward", "kv_budget", "heads"),
    [(True, 40, random_heads), (False, 0, random_heads), (True, 0, chain_heads), (False, 0, root_heads)],
    ids=["forward-partial-cache", "verified-state", "forward-chain-input", "verified-state-root-input"],
)
@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(suppress=(2,)),
     SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.3, penalty_window=32, seed=4, suppress=(2,))],
    ids=["greedy", "sampled-penalised"],
)
def test_a_graphed_proposal_drafts_as_called(model, tokenizer, monkeypatch, forward, kv_budget, heads, sampling):
    """What a GPU captures: the heads and the layout, from buffers each proposal's inputs are copied into, a graph
    per budget and sampling, captured anew when the n-gram lookup's tensors grow. Capture's stand-in (`rerun`) fails
    where the call moved data between host and device or dispatched other ops or host values than at its capture.
    Every proposal equals the one drafted as called, and the output is the target's."""
    captures = []
    monkeypatch.setattr("specchat.engine.cuda_graphs.graph_of",
                        lambda call, pool: captures.append(call) or rerun(call, pool))  # fmt: skip
    monkeypatch.setattr("specchat.drafters.tokenswift.drafter.NGRAM_ROWS", 4)  # its tensors grow as the text goes
    proposals, outputs = {}, {}
    for graphed in (False, True):
        engine = Engine(model, tokenizer, max_len=400)
        drafter = TokenSwiftDrafter(engine.target, heads(model), kv_budget=kv_budget, forward=forward, lag=16,
                                    device_layout=True)  # fmt: skip
        drafter.uses_graphs = graphed
        seen = proposals[graphed] = []
        propose = drafter.propose
        drafter.propose = lambda *args, propose=propose, seen=seen: seen.append(propose(*args)) or seen[-1]
        engine.set_drafter(drafter, 24)
        events = list(engine.generate(PROMPT, sampling=sampling, max_new_tokens=100))
        outputs[graphed] = [t for e in events for t in e.tokens]
    assert outputs[True] == outputs[False] and len(proposals[True]) > 10
    assert [(t.tokens, t.parents, t.origins, t.scores) for t in proposals[True]] == [
        (t.tokens, t.parents, t.origins, t.scores) for t in proposals[False]]  # fmt: skip
    guesses = forward and not sampling.greedy  # the draft forward guesses the target's keyed draws
    assert list(drafter.graphs) == [(24, replace(sampling, seed=None), sampling.uses_history, guesses)]
    assert len(captures) > 1


def test_under_keyed_draws_the_draft_forward_guesses_the_target_s_own_draw(model, tokenizer):
    """Over the full cache the draft forward's distribution is the target's own at the root, so the token the drafter
    guesses by racing it under the noise the target's keyed draw uses is the one the target draws: the first depth is
    accepted at (almost) every step, where its likeliest token (a drafter not handed the noise) is at a fraction."""
    prompt = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    sampling = SamplingConfig(temperature=1.0, min_p=0.05, penalty=1.3, penalty_window=32, seed=5, suppress=(2,))
    rates = {}
    for guesses in (True, False):
        engine = Engine(model, tokenizer, max_len=300)
        drafter = TokenSwiftDrafter(engine.target, random_heads(model), kv_budget=0, lag=16)
        if not guesses:
            propose = drafter.propose
            drafter.propose = lambda budget, sampling, least_chance=0.0, noise=None: propose(budget, sampling)
        engine.set_drafter(drafter, 4)
        stats = list(engine.generate(prompt, sampling=sampling, max_new_tokens=120))[-1].stats
        rates[guesses] = stats.accepted_at_depth[0] / stats.proposed_at_depth[0]
    assert rates[True] >= 0.95 and rates[False] < 0.8, rates


def drafter_after_a_prompt(model, tokenizer, heads: TokenSwiftHeads, forward: bool) -> TokenSwiftDrafter:
    """A drafter with `heads` that has followed a 30-token random prompt and 4 generated tokens."""
    engine = Engine(model, tokenizer, max_len=200)
    drafter = TokenSwiftDrafter(engine.target, heads, kv_budget=0, forward=forward, lag=16)
    engine.set_drafter(drafter, 40)
    prompt = torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(7)).tolist()
    list(engine.generate(prompt, max_new_tokens=4))
    return drafter


@pytest.mark.parametrize("forward", [True, False], ids=["forward", "verified-state"])
def test_heads_draft_only_inside_their_vocabulary(model, tokenizer, forward):
    drafter = drafter_after_a_prompt(model, tokenizer, vocab_heads(model), forward)
    tree = drafter.propose(40, SamplingConfig())
    heads_tokens = [t for t, o, d in zip(tree.tokens, tree.origins, tree.depths)
                    if o == "tokenswift" and (d > 1 or not forward)]
    assert len(heads_tokens) >= 27 and all(t % 2 == 0 for t in heads_tokens)


@pytest.mark.parametrize("forward", [True, False], ids=["forward", "verified-state"])
def test_heads_with_root_input_draft_from_the_token_the_target_chose(model, tokenizer, forward):
    """The heads' levels follow the token below them: the root (verified state) or the LM head's first token
    (forward); the same state with another token gives other guesses."""
    drafter = drafter_after_a_prompt(model, tokenizer, root_heads(model), forward)
    heard = []
    embed = drafter._embed
    drafter._embed = lambda tokens: heard.append(tokens) or embed(tokens)
    tree = drafter.propose(40, SamplingConfig())
    first = [t for t, d in zip(tree.tokens, tree.depths) if d == 1]
    assert [t.tolist() for t in heard] == [[first[0] if forward else drafter.ids[-1]]]  # one token: the start
    root = drafter.ids[-1]

    def guesses(token: int):
        levels = drafter._levels(drafter.heads.start(drafter.state, drafter._embed(torch.tensor([token]))), 3, 39,
                                 SamplingConfig(), None)  # fmt: skip
        return [level.tokens.tolist() for level in levels]

    assert guesses(root) != guesses((root + 1) % VOCAB)


def test_chained_heads_draft_each_node_s_children_from_its_own_token(model, tokenizer):
    """Head 2 runs once per depth-1 node, reading that node's token: each node's children are the top 3 of
    head 2 over the state head 1 left and the node's token, so nodes with other tokens get other children."""
    drafter = drafter_after_a_prompt(model, tokenizer, chain_heads(model), forward=False)
    greedy = SamplingConfig()
    tree = drafter.propose(40, greedy)
    heads, root = drafter.heads, drafter.ids[-1]
    first_state, _ = heads.step(0, heads.start(drafter.state, drafter._embed(torch.tensor([root]))))
    children = {}
    for i, (parent, origin) in enumerate(zip(tree.parents, tree.origins)):
        if origin == "tokenswift" and tree.depths[i] == 2:
            children.setdefault(parent, set()).add(tree.tokens[i])
    assert len(children) == 3
    for parent, tokens in children.items():
        _, out = heads.step(1, first_state, drafter._embed(torch.tensor([tree.tokens[parent]])))
        _, [top] = drafter._top(out, greedy, None)
        assert tokens == set(top.tolist())
    assert len({frozenset(tokens) for tokens in children.values()}) > 1


def test_chained_heads_expand_only_the_nodes_the_budget_can_keep(model, tokenizer):
    """A tree of 2 nodes keeps the best depth-1 node and its best child, or the two best depth-1 nodes: head 2
    runs over the depth-1 nodes still among the 2 best, not all 3; head 3 over at most one."""
    drafter = drafter_after_a_prompt(model, tokenizer, chain_heads(model), forward=False)
    rows = []
    for i, block in enumerate(drafter.heads.chain_inputs):
        block.up.register_forward_hook(lambda _m, args, _o, i=i: rows.append((i + 2, len(args[0]))))
    tree = drafter.propose(2, SamplingConfig())
    assert len(tree) == 2
    assert all(count <= 2 for head, count in rows if head == 2) and all(count <= 1 for head, count in rows if head == 3)
    rows.clear()
    drafter.propose(1, SamplingConfig())
    assert rows == []  # one node: head 1 alone


@pytest.mark.parametrize("forward", [True, False], ids=["forward", "verified-state"])
def test_a_small_budget_runs_only_the_heads_its_tree_can_reach(model, tokenizer, forward):
    drafter = drafter_after_a_prompt(model, tokenizer, root_heads(model), forward)
    ran = []
    for i, head in enumerate(drafter.heads.medusa_layers):
        head.linear.register_forward_pre_hook(lambda *_, i=i: ran.append(i))
    full = drafter.propose(40, SamplingConfig())
    ran.clear()
    small = drafter.propose(2 if forward else 1, SamplingConfig())
    assert ran == [0]  # one node below the root (or below the LM head's first token): the first head alone
    assert small.tokens[: len(small)] == full.tokens[: len(small)]  # the same most probable nodes
    ran.clear()
    if forward:
        assert len(drafter.propose(1, SamplingConfig())) == 1 and ran == []


def test_build_drafts_without_a_forward_on_a_cpu_unless_asked(model, tokenizer, tmp_path):
    save_heads(tmp_path / "heads", random_heads(model))
    target = Engine(model, tokenizer, max_len=64).target
    assert not build(target, tmp_path / "heads").forward  # a CPU step is a weight read: no second one to draft
    assert build(target, tmp_path / "heads", kv_budget=64).forward  # a KV budget sizes a draft forward
    assert build(target, tmp_path / "heads", draft_forward=True).partial.budget == KV_BUDGET


def test_over_a_quantized_cpu_target_the_heads_draft_in_int4_and_stay_lossless(tokenizer):
    model = tiny_model("llama", vocab_size=VOCAB, seed=5)
    quantize_model(model, "int4", dtype=torch.float32)
    engine = Engine(model, tokenizer, max_len=256)
    prompt = list(range(3, 23)) * 3

    def generate() -> list[int]:
        return [t for event in engine.generate(prompt, max_new_tokens=48) for t in event.tokens]

    expected = generate()
    drafter = TokenSwiftDrafter(engine.target, random_heads(model), forward=False)
    assert all(type(head.linear) is Int4Linear for head in drafter.heads.medusa_layers)
    engine.set_drafter(drafter)
    assert generate() == expected


def test_its_trees_carry_only_the_kinds_it_names(model, tokenizer):
    """The adaptive budget sizes its trees and prices its time by `next_kinds`: the nodes its n-gram reuse adds
    carry the n-gram kind, so that is named too."""
    engine = Engine(model, tokenizer, max_len=256)
    drafter = TokenSwiftDrafter(engine.target, random_heads(model), kv_budget=0, forward=False, lag=16)
    engine.set_drafter(drafter, 8)  # room for reuse paths: an adaptive budget on a slow minute leaves none
    origins = set()
    propose = drafter.propose
    drafter.propose = lambda *args, **kwargs: (tree := propose(*args, **kwargs), origins.update(tree.origins))[0]
    list(engine.generate(list(range(3, 23)) * 4, max_new_tokens=48))
    assert origins == drafter.next_kinds() == {"tokenswift", "ngram"}


def test_a_proposal_that_captured_a_graph_is_not_priced(model, tokenizer, monkeypatch, tmp_path):
    """A graph captured anew (the n-gram lookup's tensors grown) costs its proposal a capture's one-off time, which
    priced would make drafting at that budget look slow for steps after: like a drafter's first proposal at a
    setting, the engine gives the adaptive budget no time for it; the proposals after it are priced again."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    monkeypatch.setattr("specchat.engine.cuda_graphs.graph_of", rerun)
    monkeypatch.setattr("specchat.drafters.tokenswift.drafter.NGRAM_ROWS", 4)  # its tensors grow as the text goes
    engine = Engine(model, tokenizer, max_len=400)
    drafter = TokenSwiftDrafter(engine.target, random_heads(model), forward=True, lag=16, device_layout=True)
    drafter.uses_graphs = True  # as on a GPU
    engine.set_drafter(drafter)  # the adaptive budget
    launches = []  # (graphs captured during the launch, whether its drafting was priced)
    launch = engine._launch

    def counted(*args):
        before = cuda_graphs.captures()
        out = launch(*args)
        launches.append((cuda_graphs.captures() - before, out.priced))
        return out

    engine._launch = counted
    list(engine.generate(PROMPT, sampling=SamplingConfig(suppress=(2,)), max_new_tokens=100))
    captured = [priced for count, priced in launches if count]
    assert len(captured) > 1 and not any(captured)  # the first at the budget (15 nodes, always) and those anew
    assert sum(priced for count, priced in launches if not count) > 10
