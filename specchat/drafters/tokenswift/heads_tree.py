"""TokenSwift's tree laid out on the device: the heads' levels and the reused 4-grams merged, scored and ranked by
tensor ops, so that a proposal queues its tree without the host reading a token of it (`heads_tree`); and the same
tree laid out on the host (`host_tree`), where a read costs nothing and Python's dicts take half the time.

Every candidate's place is known before its values: the LM head's token (with the draft forward), then each
level's nodes, 3 under each expanded node of the level above (place 3 r + j past the level's first: row r's j-th
guess), then the 4-grams' prefixes, gram-major (3 g + k - 1 past the first: gram g's first k tokens). A path that
a candidate placed earlier already has is not a node of its own: a level's node that a gram's prefix equals keeps
the higher of their scores. Scores are bounded as `siblings_bounded` bounds them, and the tree keeps the `budget`
best candidates, ranked by score, then depth (as `DraftTree.best` ranks paths), then place. It lists its nodes
best first (a parent outranks its children) and has at most as many as the heads' levels hold, which are never
empty: its size needs no read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.drafters.tokenswift.ngram_table import NgramTable
from specchat.engine.host_data import to_host
from specchat.engine.tree import ROOT, DraftTree, Ranked, best_first


@dataclass
class Level:
    """One head's guesses: `values` and `tokens` [m, 3] under the level above's nodes `rows` [m] (None: below the
    start, one row)."""

    values: torch.Tensor
    tokens: torch.Tensor
    rows: torch.Tensor | None


def product_levels(values: torch.Tensor, tokens: torch.Tensor) -> list[Level]:
    """The levels of heads that guess from the state alone: level d's guesses `values[d]` and `tokens[d]` ([levels,
    width] each) under every node of the level above (TokenSwift's product)."""
    width, device = tokens.shape[1], tokens.device
    return [Level(values[d].expand(width**d, width), tokens[d].expand(width**d, width),
                  torch.arange(width**d, device=device) if d else None) for d in range(tokens.shape[0])]  # fmt: skip


def heads_tree(levels: list[Level], grams: torch.Tensor, counts: torch.Tensor, budget: int,
               below: tuple[torch.Tensor, torch.Tensor] | None) -> Ranked:  # fmt: skip
    """The nodes, ranked on the device, of the tree of the `budget` (at least 1) best among `levels`' and the
    prefixes of the 4-grams' continuations `grams` [top, 3] (their `counts` [top], 0 for none); their kinds 0 for
    the heads' guesses, 1 for the grams'. `below`: the LM head's token and probability ([1] each) that the rest
    hangs from, else the rest hangs from the root. Tensor ops alone (a graph can replay them)."""
    device = grams.device
    top, n = grams.shape
    deep = max(len(levels), n)  # the longest path below the start
    start_p = torch.ones(1, dtype=torch.float64, device=device) if below is None else below[1].double()
    # blocks of candidates: tokens, paths below the start [c, deep] (-1 past their ends), scores by the heads, the
    # places of their parents [c] (ROOT: the root), depths
    tokens, paths, raws, parents, depths = [], [], [], [], []
    if below is not None:
        tokens.append(below[0].long())
        paths.append(torch.full((1, deep), -1, device=device))
        raws.append(start_p)
        parents.append(torch.full((1,), ROOT, device=device))
        depths.append(torch.ones(1, dtype=torch.long, device=device))
    under = len(depths)  # the start's depth: the root's 0, the LM head's token's 1
    start = torch.full((1,), ROOT if below is None else 0, device=device)  # the start's place
    above, above_raw, above_paths = start, start_p, torch.zeros(1, 0, dtype=torch.long, device=device)
    heads = under
    for depth, level in enumerate(levels, 1):
        rows = torch.zeros(1, dtype=torch.long, device=device) if level.rows is None else level.rows
        width = level.tokens.shape[1]
        above_raw = (above_raw[rows][:, None] * level.values.double()).reshape(-1)
        above_paths = torch.cat([above_paths[rows].repeat_interleave(width, 0), level.tokens.reshape(-1, 1)], dim=1)
        tokens.append(level.tokens.reshape(-1))
        paths.append(torch.nn.functional.pad(above_paths, (0, deep - depth), value=-1))
        raws.append(above_raw)
        parents.append(above[rows].repeat_interleave(width))
        depths.append(torch.full_like(above_raw, under + depth, dtype=torch.long))
        above = heads + torch.arange(above_raw.shape[0], device=device)
        heads += above_raw.shape[0]

    # each gram's first k tokens, gram-major: place heads + g n + k - 1, its parent the prefix one shorter
    ends = torch.arange(1, n + 1, device=device)[:, None] > torch.arange(deep, device=device)  # [k, deep]
    padded = torch.nn.functional.pad(grams, (0, deep - n), value=-1)
    tokens.append(grams.reshape(-1))
    paths.append(torch.where(ends, padded[:, None, :], -1).reshape(top * n, deep))
    raws.append(torch.zeros(top * n, dtype=torch.float64, device=device))
    parents.append(torch.cat([start.expand(top)[:, None], heads + torch.arange(top, device=device)[:, None] * n
                              + torch.arange(n - 1, device=device)], dim=1).reshape(-1))  # fmt: skip
    depths.append((under + torch.arange(1, n + 1, device=device)).repeat(top))

    path = torch.cat(paths)
    grams_counts = counts.double().repeat_interleave(n)
    counted = torch.cat([torch.zeros(heads, dtype=torch.float64, device=device), grams_counts])
    valid = torch.cat([torch.ones(heads, dtype=torch.bool, device=device), grams_counts > 0])
    same = valid[None, :].expand(path.shape[0], -1)  # [c, c']: c' a valid candidate of c's path
    for column in path.T:  # a column at a time: a reduction over a third axis costs more on a CPU
        same = same & (column[:, None] == column[None, :])
    node = same.long().argmax(1)  # the first candidate of each path is its node
    kept = valid & (node == torch.arange(node.shape[0], device=device))
    share = (same.double() @ counted) / counts.sum().clamp(min=1.0)  # of the grams' counts, the path's
    raw = torch.maximum(torch.cat(raws), start_p * share)  # a path both give keeps the higher score
    parent = torch.cat(parents)
    parent = torch.where(parent < 0, ROOT, node[parent.clamp(min=0)])
    chance = _siblings_bounded(raw, parent, kept, under + deep)
    kind = (torch.arange(parent.shape[0], device=device) >= heads).long()
    return best_first(torch.cat(tokens), parent, chance, torch.cat(depths), min(budget, heads), kinds=kind, kept=kept)


def deepest(levels: int, grams: int, below: bool) -> int:
    """The depth of a tree of `heads_tree`'s at most: `levels` levels and grams of `grams` tokens below the start,
    the LM head's token (`below`) or the root."""
    return below + max(levels, grams)


def _siblings_bounded(raw: torch.Tensor, parents: torch.Tensor, kept: torch.Tensor, deepest: int) -> torch.Tensor:
    """Each candidate's chance: its parent's times its own given its parent's, its `kept` siblings' scaled to sum
    to at most 1 (`siblings_bounded`, on the device); settled from the root down in `deepest` passes."""
    one = torch.ones(1, dtype=raw.dtype, device=raw.device)
    given = torch.cat([one, raw])[parents + 1]  # the root's is 1
    sums = torch.zeros(raw.shape[0] + 1, dtype=raw.dtype, device=raw.device)
    sums.index_add_(0, parents + 1, torch.where(kept, raw, 0.0))
    conditional = (raw / given / (sums[parents + 1] / given).clamp(min=1.0)).nan_to_num(0.0)  # 0 under a parent of 0
    chance = conditional
    for _ in range(deepest - 1):
        chance = conditional * torch.cat([one, chance])[parents + 1]
    return chance


def host_tree(levels: list[Level], table: NgramTable, budget: int, kinds: tuple[str, str],
              below: tuple[torch.Tensor, torch.Tensor] | None, root: int) -> DraftTree:  # fmt: skip
    """`heads_tree`'s tree built on the host from its inputs read in one wait (the 4-grams from the table itself),
    where reading costs nothing: on a CPU, Python's dicts lay it out in half the time of its tensor ops. Below the
    `root` when `below` is None."""
    read = to_host(*(below or ()), *(t for level in levels for t in (level.values, level.tokens)),
                   *(level.rows for level in levels if level.rows is not None))  # fmt: skip
    (token, p), read = (((read[0][0], read[1][0]), read[2:]) if below is not None else ((None, 1.0), read))
    start, above = (token if below is not None else root), [((token,) if below is not None else (), p)]
    candidates = {above[0][0]: (p, kinds[0])} if below is not None else {}
    guesses, rows = read[: 2 * len(levels)], iter(read[2 * len(levels) :])
    for values, tokens, level in zip(guesses[0::2], guesses[1::2], levels):
        parents = [0] if level.rows is None else next(rows)
        above = [(above[r][0] + (t,), above[r][1] * v) for r, row_values, row_tokens in zip(parents, values, tokens)
                 for v, t in zip(row_values, row_tokens)]  # fmt: skip
        candidates.update((path, (score, kinds[0])) for path, score in above)
    heads = len(candidates)
    if min(budget, heads) < 1:
        return DraftTree.empty()
    grams = table.continuations(start)
    counts = [table.counts[(start, *rest)] for rest in grams]
    for rest in grams:
        for depth in range(1, len(rest) + 1):
            path = (token,) * (below is not None) + rest[:depth]
            score = p * sum(c for r, c in zip(grams, counts) if r[:depth] == rest[:depth]) / sum(counts)
            if candidates.get(path, (-1.0,))[0] < score:
                candidates[path] = (score, candidates[path][1] if path in candidates else kinds[1])
    return DraftTree.best(candidates, min(budget, heads))
