"""TokenSwift's n-gram reuse table against a brute force over the text.

Proven here: after any number of appends, in any chunking, the continuations of every token are exactly the
brute force's most frequent 4-grams of the text old enough (ending `lag` or more tokens before its end), in
descending count (ties in either order), at most `top`; nothing newer than the lag is counted; the table
holds bounded state per token added; its copy on the device looks up the same.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from queue_drains import QueueDrains

from specchat.drafters.tokenswift.device_ngrams import DeviceNgrams
from specchat.drafters.tokenswift.ngram_table import NgramTable


def brute_force(text: list[int], lag: int, n: int = 4) -> Counter:
    old = text[: max(0, len(text) - lag)]
    return Counter(tuple(old[i : i + n]) for i in range(len(old) - n + 1))


@pytest.mark.parametrize("lag, top, vocab", [(0, 20, 5), (16, 3, 4), (40, 20, 12), (7, 1, 3)])
def test_continuations_are_the_most_frequent_old_4grams(lag, top, vocab):
    rng = random.Random(lag * 31 + top)
    table, text = NgramTable(lag=lag, top=top), []
    while len(text) < 600:
        chunk = [rng.randrange(vocab) for _ in range(rng.randint(1, 9))]
        table.add(chunk)
        text += chunk
        counts = brute_force(text, lag)
        for first in range(vocab):
            got = [(first, *rest) for rest in table.continuations(first)]
            mine = {gram: count for gram, count in counts.items() if gram[0] == first}
            assert len(got) == min(top, len(mine))
            assert all(gram in mine for gram in got)
            got_counts = [mine[gram] for gram in got]
            assert got_counts == sorted(got_counts, reverse=True)
            if got:  # nothing left out beats what is in
                assert max((c for g, c in mine.items() if g not in got), default=0) <= got_counts[-1]


def test_nothing_newer_than_the_lag_is_reused():
    table = NgramTable(lag=8)
    table.add([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3])  # 11 tokens: only the first 3 are 8 tokens old
    assert table.continuations(1) == []
    table.add([9])
    assert table.continuations(1) == [(2, 3, 4)]
    table.add([9] * 8)  # now the first 12 are old: 1 2 3 4 twice, 1 2 3 9 once
    assert table.continuations(1) == [(2, 3, 4), (2, 3, 9)] and table.continuations(2) == [(3, 4, 1)]
    assert len(table.recent) <= 8 + 4


def test_the_device_copy_looks_up_what_the_table_holds():
    """Looked up by a token on the device after any run of appends (rows added, rows changed, room grown past a
    token id or a row count seen before): each token's continuations and counts, most frequent first, zeros past
    the last; a token never seen first, or beyond every id seen, has none. Copies go without a wait."""
    rng = random.Random(5)
    table = NgramTable(lag=3, top=4)
    table.add([rng.randrange(6) for _ in range(20)])
    device = DeviceNgrams(table, torch.device("cpu"))
    for vocab in (6, 6, 40, 40, 300):
        table.add([rng.randrange(vocab) for _ in range(rng.randint(1, 60))])
        for first in range(vocab + 2):
            token = torch.tensor([first])
            with QueueDrains() as drains:
                device.update()
                grams, counts = device.lookup(token)
            assert drains.drains == 0, drains.causes
            best = table.best.get(first, [])
            assert grams.shape == (4, 3) and counts.shape == (4,)
            assert grams[: len(best)].tolist() == [list(gram[1:]) for gram in best]
            assert counts.tolist() == [table.counts[gram] for gram in best] + [0] * (4 - len(best))


def test_the_device_copy_follows_a_new_table_in_the_same_tensors():
    """A new text's table, mirrored in the tensors the last one was (a graph that read them stays valid): its
    continuations, and none of the old table's."""
    old, new = NgramTable(lag=2, top=4), NgramTable(lag=2, top=4)
    old.add([5, 6, 7, 8, 5, 6, 7, 9, 1, 1])
    new.add([6, 5, 4, 3, 6, 5, 4, 2, 1, 1])
    device = DeviceNgrams(old, torch.device("cpu"), tokens=16, rows=8)
    device.update()
    storage = device.storage
    device.follow(new)
    device.update()
    assert all(now is then for now, then in zip(device.storage, storage))
    for first in range(16):
        grams, counts = device.lookup(torch.tensor([first]))
        best = new.best.get(first, [])
        assert grams[: len(best)].tolist() == [list(gram[1:]) for gram in best]
        assert counts.tolist() == [new.counts[gram] for gram in best] + [0] * (4 - len(best))
