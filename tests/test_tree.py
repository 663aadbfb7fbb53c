"""Draft trees, their verification inputs, and the acceptance walk are exactly their definitions.

Proven here: `DraftTree` computes depths and root paths and rejects any node whose parent does not precede
it; `from_chains` / `TreeBuilder` merge shared prefixes once, keep siblings distinct, never exceed the budget
and keep every chain's prefix that fits as a root path; `tree_batch` lets each row attend to exactly its
ancestors and itself (a literal table, and the definition on random trees), places each node at
prefix_len + depth, and builds a queued tree's batch on the device unread (the tree read once, with the
choices); a tree forward through the engine's forward and `TreeCache` gives every node the logits of
transformers' plain forward over the prefix plus its root path, on
all four model families; `node_histories` rows are the committed tail plus the row's own ancestors, cut to the
window and padded with -1; `accept` walks the deepest matching path and takes the bonus at its last row
(literal cases, the empty tree included).
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import TINY_FAMILIES, tiny_model
from queue_drains import QueueDrains

from specchat.engine.cache import TreeCache
from specchat.engine.host_data import to_device
from specchat.engine.target_forward import target_forward
from specchat.engine.tree import ROOT, DraftTree, TreeBuilder, best_first, node_histories, tree_batch
from specchat.engine.verify import Verdict, accept

CPU = torch.device("cpu")

#       root
#      /    \
#    n0(10)  n1(11)
#    /   \      \
#  n2(12) n5(15) n4(14)
#   |
#  n3(13)
TOKENS = [10, 11, 12, 13, 14, 15]
PARENTS = [ROOT, ROOT, 0, 2, 1, 0]
TREE = DraftTree(TOKENS, PARENTS, ["x"] * 6)


def random_tree(rng: random.Random, size: int, vocab: int = 50) -> DraftTree:
    builder = TreeBuilder()
    for _ in range(size):
        builder.add(rng.choice([ROOT, *range(len(builder))]), rng.randrange(vocab), "r")
    return builder.build()


# --- DraftTree ------------------------------------------------------------------------------------------


def test_depths_and_paths():
    assert TREE.depths == [1, 1, 2, 3, 2, 2]
    assert TREE.depth == 3 and len(TREE) == 6
    assert TREE.path_to(3) == [0, 2, 3]
    assert TREE.path_to(4) == [1, 4]
    assert TREE.path_to(5) == [0, 5]
    assert TREE.path_to(ROOT) == []
    empty = DraftTree.empty()
    assert len(empty) == 0 and empty.depth == 0 and empty.depths == []


@pytest.mark.parametrize(
    "parents",
    [
        [0],  # its own parent
        [1, ROOT],  # parent after the child
        [ROOT, 2, 1],  # a cycle
        [ROOT, -2],  # below the root
        [ROOT, 5],  # no such node
    ],
)
def test_parent_must_precede_child(parents):
    with pytest.raises(ValueError, match="parents must precede children"):
        DraftTree(list(range(len(parents))), parents, ["x"] * len(parents))


# --- TreeBuilder / from_chains --------------------------------------------------------------------------


def test_from_chains_merges_shared_prefixes_once():
    tree = DraftTree.from_chains([[1, 2, 3], [1, 2, 4], [1, 5], [6], [1, 2, 3]], "ngram", budget=10)
    assert tree.tokens == [1, 2, 3, 4, 5, 6]
    assert tree.parents == [ROOT, 0, 1, 1, 0, ROOT]
    assert tree.origins == ["ngram"] * 6


@pytest.mark.parametrize(
    "chains, budget, tokens, parents",
    [
        ([[1, 2, 3], [1, 2, 4], [1, 5], [6]], 4, [1, 2, 3, 4], [ROOT, 0, 1, 1]),
        ([[1, 2, 3], [1, 2, 4], [1, 5], [6]], 5, [1, 2, 3, 4, 5], [ROOT, 0, 1, 1, 0]),
        ([[1, 2, 3, 4]], 3, [1, 2, 3], [ROOT, 0, 1]),
        ([[1, 2, 3], [1, 9, 9, 9]], 4, [1, 2, 3, 9], [ROOT, 0, 1, 0]),  # shared prefix costs nothing
        ([[1, 2], [1, 2, 7]], 3, [1, 2, 7], [ROOT, 0, 1]),
        ([[1, 2, 3]], 0, [], []),
        ([[], [4]], 2, [4], [ROOT]),
    ],
)
def test_from_chains_budget_cap(chains, budget, tokens, parents):
    tree = DraftTree.from_chains(chains, "ngram", budget=budget)
    assert (tree.tokens, tree.parents) == (tokens, parents)


def test_from_chains_properties_on_random_chains():
    rng = random.Random(0)
    for _ in range(300):
        chains = [[rng.randrange(4) for _ in range(rng.randint(0, 6))] for _ in range(rng.randint(0, 6))]
        budget = rng.randint(0, 20)
        tree = DraftTree.from_chains(chains, "c", budget=budget)
        assert len(tree) <= budget
        pairs = list(zip(tree.parents, tree.tokens))
        assert len(set(pairs)) == len(pairs), "siblings must be distinct"
        paths = {tuple(tree.tokens[j] for j in tree.path_to(i)) for i in range(len(tree))}
        # every node lies on some chain's prefix (nothing invented) ...
        assert all(any(list(p) == c[: len(p)] for c in chains) for p in paths)
        # ... and the first chain is kept as deep as the budget allows
        if chains and chains[0] and budget:
            assert tuple(chains[0][:budget]) in paths
        if len(tree) < budget:  # nothing was cut: every chain is fully present
            assert all(tuple(c[:k]) in paths for c in chains for k in range(1, len(c) + 1))


def test_builder_returns_existing_node_for_same_parent_and_token():
    builder = TreeBuilder()
    a = builder.add(ROOT, 7, "x")
    b = builder.add(a, 8, "x")
    assert builder.add(ROOT, 7, "y") == a and builder.add(a, 8, "y") == b
    assert builder.add(b, 7, "x") == 2  # the same token under another parent is another node
    tree = builder.build()
    assert tree.tokens == [7, 8, 7] and tree.parents == [ROOT, 0, 1] and tree.origins == ["x", "x", "x"]


# --- tree_batch -----------------------------------------------------------------------------------------

# rows and columns: root, n0 .. n5
EXPECTED_MASK = [
    [1, 0, 0, 0, 0, 0, 0],  # root
    [1, 1, 0, 0, 0, 0, 0],  # n0
    [1, 0, 1, 0, 0, 0, 0],  # n1
    [1, 1, 0, 1, 0, 0, 0],  # n2 <- n0
    [1, 1, 0, 1, 1, 0, 0],  # n3 <- n2 <- n0
    [1, 0, 1, 0, 0, 1, 0],  # n4 <- n1
    [1, 1, 0, 0, 0, 0, 1],  # n5 <- n0
]


def test_tree_batch_literal():
    batch = tree_batch(TREE, root_token=99, prefix_len=7, device=CPU)
    assert batch.input_ids.tolist() == [99, 10, 11, 12, 13, 14, 15]
    assert batch.position_ids.tolist() == [7, 8, 8, 9, 10, 9, 9]
    assert batch.tree_mask.dtype == torch.bool
    assert batch.tree_mask.int().tolist() == EXPECTED_MASK


def test_tree_batch_of_empty_tree_is_the_root_alone():
    batch = tree_batch(DraftTree.empty(), root_token=5, prefix_len=3, device=CPU)
    assert batch.input_ids.tolist() == [5] and batch.position_ids.tolist() == [3]
    assert batch.tree_mask.tolist() == [[True]]


def test_tree_mask_is_ancestors_and_self_on_random_trees():
    rng = random.Random(1)
    for size in [0, 1, 2, 5, 17, 64]:
        tree = random_tree(rng, size)
        batch = tree_batch(tree, root_token=0, prefix_len=11, device=CPU)
        expected = torch.zeros(len(tree) + 1, len(tree) + 1, dtype=torch.bool)
        expected[:, 0] = True
        expected[0, 0] = True
        for i in range(len(tree)):
            for j in tree.path_to(i):
                expected[i + 1, j + 1] = True
        assert torch.equal(batch.tree_mask, expected)
        assert batch.position_ids.tolist() == [11] + [11 + d for d in tree.depths]
        assert batch.input_ids.tolist() == [0, *tree.tokens]


def test_a_queued_trees_batch_is_built_on_the_device_and_read_once_with_the_choices():
    """A tree its drafter left on the device gets the host tree's batch without a read; the host then reads its
    nodes with the target's choices in one wait, and has its lists from then on. The drafter may bound its depth
    (fewer squarings of the ancestry) or not."""
    rng = random.Random(2)
    for size, bounded in [(0, False), (1, True), (9, False), (9, True), (64, False), (64, True)]:
        host = random_tree(rng, size)
        queued = DraftTree.queued(torch.tensor(host.tokens), torch.tensor(host.parents), "x",
                                  depth=host.depth if bounded else None)  # fmt: skip
        with QueueDrains() as drains:
            batch = tree_batch(queued, root_token=3, prefix_len=20, device=CPU)
            choices = batch.input_ids * 2  # work queued after the batch
        assert drains.drains == 0, drains.causes
        expected = tree_batch(host, root_token=3, prefix_len=20, device=CPU)
        for got, want in zip(vars(batch).values(), vars(expected).values(), strict=True):
            assert torch.equal(got, want)
        with QueueDrains() as drains:
            assert queued.read_with(choices) == [3 * 2, *(2 * t for t in host.tokens)]
            assert (queued.tokens, queued.parents, queued.depths) == (host.tokens, host.parents, host.depths)
        assert drains.drains == 1, drains.causes


def test_a_queued_trees_scores_and_origins_are_read_in_the_same_wait():
    """A drafter that scores its nodes and names several origins leaves both on the device too: the tree's length is
    known unread, and its scores and origins come with its nodes in the acceptance's wait (or where first asked)."""
    tokens, parents = torch.tensor([4, 5, 6]), torch.tensor([ROOT, 0, ROOT])
    scores, kinds = torch.tensor([0.75, 0.5, 0.25], dtype=torch.float64), torch.tensor([0, 1, 0])
    queued = DraftTree.queued(tokens * 1, parents, ("heads", "lookup"), depth=2, scores=scores, kinds=kinds)
    with QueueDrains() as drains:
        assert len(queued) == 3
        choices = tokens + 1  # work queued after the tree
        assert queued.read_with(choices) == [5, 6, 7]
        assert queued.origins == ["heads", "lookup", "heads"] and queued.scores == [0.75, 0.5, 0.25]
        assert queued.depths == [1, 2, 1]
    assert drains.drains == 1, drains.causes
    unread = DraftTree.queued(tokens, parents, ("heads", "lookup"), scores=scores, kinds=kinds)
    assert unread.scores == [0.75, 0.5, 0.25] and unread.tokens == [4, 5, 6]


def test_the_best_of_candidates_on_the_device_are_ranked_as_paths_are():
    """Candidates scored as a drafter scores them (a child no likelier than its parent, ties of score and of depth
    included), ranked on the device as `best` ranks paths (by score, then depth), then by place: the best `size`,
    node for node, listed best first, laid out without a wait."""
    rng = random.Random(4)
    for _ in range(40):
        tokens, parents, scores, depths, paths = scored_candidates(rng)
        for size in range(len(tokens) + 1):
            tensors = torch.tensor(tokens), torch.tensor(parents), torch.tensor(scores, dtype=torch.float64)
            with QueueDrains() as drains:
                queued = ranked_tree(*tensors, depths, size)
            assert drains.drains == 0, drains.causes
            ranked = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i], i))[:size]
            assert [paths[i] for i in ranked] == [tuple(queued.tokens[j] for j in queued.path_to(node))
                                                   for node in range(size)]  # fmt: skip
            assert queued.scores == [scores[i] for i in ranked]


def test_the_first_nodes_of_a_tree_ranked_on_the_device_are_its_best():
    """Cut to its first n nodes, unread, a tree ranked on the device is the tree of its n best: how the engine cuts a
    scored tree it has not read."""
    rng = random.Random(5)
    for _ in range(20):
        tokens, parents, scores, depths, _ = scored_candidates(rng)
        tensors = torch.tensor(tokens), torch.tensor(parents), torch.tensor(scores, dtype=torch.float64)
        ranked = ranked_tree(*tensors, depths, len(tokens))
        for n in range(len(tokens) + 2):
            with QueueDrains() as drains:
                cut = ranked.first(n)
            assert drains.drains == 0, drains.causes
            best = ranked_tree(*tensors, depths, min(n, len(tokens)))
            assert (cut.tokens, cut.parents, cut.scores) == (best.tokens, best.parents, best.scores)
    with pytest.raises(ValueError, match="best first"):
        DraftTree.queued(torch.tensor([4, 5]), torch.tensor([ROOT, 0]), "x").first(1)  # unscored: no ranking


def ranked_tree(tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, depths: list[int], size: int):
    """The queued tree of the `size` best candidates, ranked on the device."""
    ranked = best_first(tokens, parents, scores, to_device(depths, tokens.device), size)  # an asynchronous copy
    return ranked.tree("x", max(depths, default=0))


def scored_candidates(rng: random.Random):
    """Up to 30 candidates (tokens, parents, scores, depths, paths) scored as a drafter scores them: a child no
    likelier than its parent, ties of score and of depth included."""
    tokens, parents, scores, depths, paths = [], [], [], [], {}
    for i in range(rng.randint(1, 30)):
        parent = rng.choice([ROOT, *range(i)])
        path = (paths[parent] if parent != ROOT else ()) + (i,)  # distinct tokens: distinct paths
        above = scores[parent] if parent != ROOT else 1.0
        score = rng.choice([above, above * rng.choice([0.5, 0.25]), above * rng.random()])
        tokens.append(i)
        parents.append(parent)
        scores.append(score)
        depths.append(len(path))
        paths[i] = path
    return tokens, parents, scores, depths, paths


def test_a_queued_tree_is_read_where_its_lists_are_first_needed():
    queued = DraftTree.queued(torch.tensor([4, 5, 6]), torch.tensor([ROOT, 0, 0]), "x")
    assert len(queued) == 3 and queued.origins == ["x"] * 3
    assert queued.path_to(2) == [0, 2] and queued.tokens == [4, 5, 6]
    with pytest.raises(ValueError, match="parents must precede children"):
        DraftTree.queued(torch.tensor([4, 5]), torch.tensor([1, ROOT]), "x").read_with(torch.tensor([0]))


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tree_forward_gives_each_node_its_paths_logits(family):
    """Through the engine's forward and cache: one masked forward over the tree equals transformers' plain forwards
    per path."""
    model = tiny_model(family, vocab_size=1024, seed=3)
    prefix = list(range(300, 313))
    root = 500
    tree = DraftTree(
        [40, 41, 42, 40, 43, 44, 42], [ROOT, ROOT, 0, 1, 2, 1, 5], ["x"] * 7
    )  # token 40 twice and 42 twice, under different parents
    cache = TreeCache(model.config.num_hidden_layers, 64)
    forward = target_forward(model, cache)
    with torch.inference_mode():
        forward(torch.tensor(prefix), torch.arange(len(prefix)), None, cache)
        cache.commit()
        batch = tree_batch(tree, root, len(prefix), CPU)
        logits = forward(batch.input_ids, batch.position_ids, batch.tree_mask, cache).logits
        for row, node in enumerate([ROOT, *range(len(tree))]):
            path = [root] + [tree.tokens[j] for j in tree.path_to(node)]
            plain = model(input_ids=torch.tensor([prefix + path])).logits[0, -1]
            torch.testing.assert_close(logits[row], plain, atol=1e-4, rtol=1e-4)


# --- node_histories -------------------------------------------------------------------------------------


def test_node_histories_window_literal():
    rows = node_histories(TREE, committed=[1, 2, 3, 4, 5], window=3)
    assert rows.tolist() == [
        [3, 4, 5],  # root: the committed tail, the root (5) included
        [4, 5, 10],  # n0
        [4, 5, 11],  # n1
        [5, 10, 12],  # n2: the oldest committed ids fall out of the window
        [10, 12, 13],  # n3: only its own ancestors and itself remain
        [5, 11, 14],  # n4
        [5, 10, 15],  # n5: never its sibling n2
    ]


def test_node_histories_pad_short_rows():
    rows = node_histories(TREE, committed=[1, 2, 3], window=6)
    assert rows.tolist() == [
        [1, 2, 3, -1, -1, -1],
        [1, 2, 3, 10, -1, -1],
        [1, 2, 3, 11, -1, -1],
        [1, 2, 3, 10, 12, -1],
        [1, 2, 3, 10, 12, 13],
        [1, 2, 3, 11, 14, -1],
        [1, 2, 3, 10, 15, -1],
    ]


def test_node_histories_of_empty_tree():
    assert node_histories(DraftTree.empty(), [7, 8, 9], window=2).tolist() == [[8, 9]]
    assert node_histories(DraftTree.empty(), [7, 8, 9], window=5).tolist() == [[7, 8, 9]]


def test_node_histories_match_definition_on_random_trees():
    rng = random.Random(2)
    for _ in range(50):
        tree = random_tree(rng, rng.randint(0, 20))
        committed = [rng.randrange(100, 200) for _ in range(rng.randint(1, 12))]
        window = rng.randint(1, 10)
        rows = node_histories(tree, committed, window).tolist()
        for row, node in zip(rows, [ROOT, *range(len(tree))]):
            seen = committed + [tree.tokens[j] for j in tree.path_to(node)]
            expected = seen[-window:]
            assert row[: len(expected)] == expected and set(row[len(expected) :]) <= {-1}


# --- accept ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "choices, path, bonus",
    [
        # rows:  root n0  n1  n2  n3  n4  n5
        ([10, 12, 0, 13, 99, 0, 0], [0, 2, 3], 99),  # the deepest path; bonus = choice at n3
        ([10, 15, 0, 13, 99, 0, 8], [0, 5], 8),  # the other child of n0; n2's row is ignored
        ([11, 12, 77, 13, 99, 0, 0], [1], 77),  # n1 accepted, its choice (77) has no child: bonus
        ([11, 12, 14, 13, 99, 6, 0], [1, 4], 6),  # a leaf accepted: bonus = the leaf's choice
        ([42, 12, 14, 13, 99, 6, 8], [], 42),  # first child rejected: bonus = the root's choice
        ([12, 12, 14, 13, 99, 6, 8], [], 12),  # a token of the tree, but not a child of the root
        ([10, 13, 14, 13, 99, 6, 8], [0], 13),  # n3's token chosen at n0: a grandchild, not a child
    ],
)
def test_accept_literal(choices, path, bonus):
    assert accept(TREE, choices) == Verdict(path, bonus)


def test_accept_empty_tree_is_the_roots_choice():
    assert accept(DraftTree.empty(), [5]) == Verdict([], 5)


def test_accept_equals_walk_on_random_trees():
    """Every accepted node's token is its parent's choice, and the walk stops only where no child matches."""
    rng = random.Random(3)
    for _ in range(300):
        tree = random_tree(rng, rng.randint(0, 30), vocab=4)
        choices = [rng.randrange(4) for _ in range(len(tree) + 1)]
        verdict = accept(tree, choices)
        parent = ROOT
        for node in verdict.path:
            assert tree.parents[node] == parent and tree.tokens[node] == choices[parent + 1]
            parent = node
        assert verdict.bonus == choices[parent + 1]
        assert not any(p == parent and t == verdict.bonus for p, t in zip(tree.parents, tree.tokens))
