"""TokenSwift's tree laid out on the device: the heads' levels and the reused 4-grams merged, scored and ranked by
tensor ops, so that a proposal queues its tree without the host reading a token of it.

Every candidate's place is known before its values: the LM head's token (with the draft forward), then each
level's nodes, 3 under each expanded node of the level above (index 3 r + j: row r's j-th guess), then the
4-grams' prefixes, gram-major (index 3 g + k - 1: gram g's first k tokens). A prefix that a level already holds,
or an earlier gram, is not a node of its own: the node it equals keeps the higher of their scores. Scores are
bounded as `siblings_bounded` bounds them, a depth at a time, and the tree keeps the `budget` best candidates,
ranked by score, then depth (as `DraftTree.best` ranks paths), then place. The tree lists its
nodes best first (a parent outranks its children), and has at most as many nodes as the heads' levels hold,
which are never empty: its size needs no read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.engine.host_data import to_device
from specchat.engine.tree import ROOT, DraftTree


@dataclass
class Level:
    """One head's guesses: `values` and `tokens` [m, 3] under the level above's nodes `rows` [m] (None: below the
    start, one row)."""

    values: torch.Tensor
    tokens: torch.Tensor
    rows: torch.Tensor | None


def heads_tree(levels: list[Level], grams: torch.Tensor, counts: torch.Tensor, budget: int, kinds: tuple[str, str],
               below: tuple[torch.Tensor, torch.Tensor] | None) -> DraftTree:  # fmt: skip
    """The queued tree of the `budget` best nodes among `levels`' and the prefixes of the 4-grams' continuations
    `grams` [top, 3] (their `counts` [top], 0 for none). `below`: the LM head's token and probability ([1] each)
    that the rest hangs from, else the rest hangs from the root. `kinds`: the heads' origin and the grams'."""
    device = grams.device
    start_p = torch.ones(1, dtype=torch.float64, device=device) if below is None else below[1].double()
    tokens, raws, parents, depths = [], [], [], []  # blocks of candidates: [c] each, the depths on the host
    if below is not None:
        tokens.append(below[0].long())
        raws.append(start_p)
        parents.append(torch.full((1,), ROOT, device=device))
        depths.append(1)
    under = len(depths)  # the start's depth: the root's 0, the LM head's token's 1
    start = torch.full((1,), ROOT if below is None else 0, device=device)  # the start's candidate index
    above = start  # the level above's candidate indices
    above_raw, above_paths = start_p, torch.zeros(1, 0, dtype=torch.long, device=device)
    level_paths = []  # per level: its first candidate's index and its nodes' token paths below the start [c, depth]
    for level in levels:
        rows = torch.zeros(1, dtype=torch.long, device=device) if level.rows is None else level.rows
        width, offset = level.tokens.shape[1], len(depths)
        above_raw = (above_raw[rows][:, None] * level.values.double()).reshape(-1)
        above_paths = torch.cat([above_paths[rows].repeat_interleave(width, 0), level.tokens.reshape(-1, 1)], dim=1)
        tokens.append(level.tokens.reshape(-1))
        raws.append(above_raw)
        parents.append(above[rows].repeat_interleave(width))
        depths += [under + len(level_paths) + 1] * above_raw.shape[0]
        level_paths.append((offset, above_paths))
        above = offset + torch.arange(above_raw.shape[0], device=device)
    heads = len(depths)
    size = min(budget, heads)
    if size < 1:
        return DraftTree.empty()

    top, n = grams.shape
    valid = counts > 0
    total = counts.sum().clamp(min=1.0)
    earlier = torch.ones(top, top, dtype=torch.bool, device=device).tril(-1)  # [g, g']: g' comes before g
    gram_raw, gram_parents, gram_kept, gram_nodes = [], [], [], []  # per prefix length k: [top] each
    for k in range(1, n + 1):
        same = (grams[:, None, :k] == grams[None, :, :k]).all(-1) & valid[None, :]  # [g, g']: the same k tokens
        repeated = (same & earlier).any(1)
        node = torch.where(repeated, heads + same.long().argmax(1) * n + k - 1,  # the first gram with them
                           heads + torch.arange(top, device=device) * n + k - 1)
        in_heads = torch.zeros(top, dtype=torch.bool, device=device)
        if k <= len(level_paths):
            offset, paths = level_paths[k - 1]
            equal = (paths[None, :, :] == grams[:, None, :k]).all(-1)  # [g, c]: a level's path (at most one)
            in_heads = equal.any(1) & valid
            node = torch.where(in_heads, offset + equal.long().argmax(1), node)
        gram_raw.append(start_p * (same.double() @ counts) / total)
        gram_parents.append(start.expand(top) if k == 1 else gram_nodes[-1])
        gram_kept.append(valid & ~in_heads & ~repeated)
        gram_nodes.append(node)
    gram_raw, gram_parents, gram_kept, gram_nodes = (torch.stack(x, 1).reshape(-1)
                                                     for x in (gram_raw, gram_parents, gram_kept, gram_nodes))
    depths += [under + k for _ in range(top) for k in range(1, n + 1)]

    in_levels = gram_nodes < heads  # a prefix a level holds: its node keeps the higher score
    raw = torch.cat(raws).scatter_reduce(0, gram_nodes.clamp(max=heads - 1), torch.where(in_levels, gram_raw, 0.0),
                                        "amax")  # fmt: skip
    raw = torch.cat([raw, gram_raw])
    kept = torch.cat([torch.ones(heads, dtype=torch.bool, device=device), gram_kept])
    parents = torch.cat([*parents, gram_parents])
    depth = to_device(depths, device)
    chance = _siblings_bounded(raw, parents, kept, depth, max(depths))
    order = torch.sort(depth, stable=True).indices  # best first: by chance, then depth, then place
    order = order[torch.sort(torch.where(kept, -chance, torch.inf)[order], stable=True).indices][:size]
    place = torch.full_like(parents, ROOT)
    place[order] = torch.arange(size, device=device)
    chosen = parents[order]
    kind = torch.cat([torch.zeros(heads, dtype=torch.long, device=device),
                      torch.ones(top * n, dtype=torch.long, device=device)])
    return DraftTree.queued(torch.cat([*tokens, grams.reshape(-1)])[order],
                            torch.where(chosen < 0, ROOT, place[chosen.clamp(min=0)]), kinds, depth=max(depths),
                            scores=chance[order], kinds=kind[order])  # fmt: skip


def _siblings_bounded(raw: torch.Tensor, parents: torch.Tensor, kept: torch.Tensor, depths: torch.Tensor,
                      deepest: int) -> torch.Tensor:  # fmt: skip
    """Each candidate's chance: its parent's times its own given its parent's, its `kept` siblings' scaled to sum
    to at most 1 (`siblings_bounded`, on the device), a depth at a time."""
    given = torch.where(parents < 0, 1.0, raw[parents.clamp(min=0)])
    sums = torch.zeros(raw.shape[0] + 1, dtype=raw.dtype, device=raw.device)
    sums.index_add_(0, parents + 1, torch.where(kept, raw, 0.0))
    total = torch.where(given > 0, (sums[parents + 1] / given).clamp(min=1.0), 1.0)
    conditional = torch.where(given > 0, raw / given / total, 0.0)
    chance = torch.ones_like(raw)
    for depth in range(1, deepest + 1):
        above = torch.where(parents < 0, 1.0, chance[parents.clamp(min=0)])
        chance = torch.where(depths == depth, above * conditional, chance)
    return chance
