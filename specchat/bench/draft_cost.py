"""`specchat bench draft`: what a LongSpec draft costs per proposal, against the target's decode and the
verification of the tree it drafted, and the memory it holds, as the context grows.

The draft has random weights (its cost does not depend on them); the target is a real model or a
random-weight one with Llama-3.1-8B's shapes, and its cache is filled with random keys and values to each
context, as `bench verify-cost` does. Each reduced draft vocabulary (`--vocab`, 0 = the target's whole one)
is the first N token ids: the LM head over N rows is what it changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specchat.bench.progress import NO_PROGRESS
from specchat.bench.synthetic import WARMUP, check_contexts, check_range, significant
from specchat.bench.verify_cost import fill_cache
from specchat.drafters.longspec.drafter import LongSpecDrafter
from specchat.drafters.longspec.model import LongSpecConfig, LongSpecLayer
from specchat.engine.cache import TreeCache
from specchat.engine.drafter import TargetView
from specchat.engine.sampling import SamplingConfig
from specchat.engine.target_forward import target_forward
from specchat.engine.timing import Timer
from specchat.engine.verify_forward import verification_forward
from specchat.errors import SpecchatError


@dataclass
class DraftCostRow:
    context: int  # committed tokens in the target's cache
    vocab: int  # tokens the draft predicts over
    budget: int  # most nodes asked for (beam widths 4, 16, 16, 16, 16)
    nodes: int  # nodes the draft proposed
    draft_ms: float  # one proposal: the root's and each depth's draft forward, the beam search
    decode_ms: float  # one target decode step
    verify_ms: float  # the target verifying the drafted tree
    vs_decode: float  # draft_ms / decode_ms
    mib: float  # draft weights, reduced LM head and ring buffer: the same at every context


def draft_cost(model, *, contexts: list[int], vocabs: list[int], budgets: list[int], intermediate: int = 0,
               repeats: int = 5, seed: int = 0,
               step: Callable[[str], None] = NO_PROGRESS) -> list[DraftCostRow]:  # fmt: skip
    """`intermediate`: the draft MLP's width (0: the target's, as LongSpec's layer has)."""
    check_contexts(contexts)
    check_range("--intermediate", intermediate, 0)
    check_range("--repeats", repeats, 1)
    config = model.config
    for vocab in vocabs:
        check_range("--vocab", vocab, 0, config.vocab_size)
    for budget in budgets:
        check_range("--budget", budget, 1, 64)
    if max(contexts) + 66 > config.max_position_embeddings:
        raise SpecchatError(f"--context must be at most {config.max_position_embeddings - 66} for this model")
    device, dtype = model.device, model.dtype
    cache = TreeCache(config.num_hidden_layers, max(contexts) + 66)
    target = TargetView.of(model, cache)
    torch.manual_seed(seed)
    layer = LongSpecLayer(LongSpecConfig.for_target(config, intermediate=intermediate))
    run = target_forward(model, cache)

    def forward(tokens, *, positions, tree_mask):  # the engine's, over this cache
        return run(tokens, positions, tree_mask, cache)

    timer = Timer(device, repeats=repeats, warmup=WARMUP)
    ids = torch.randint(0, config.vocab_size, (max(contexts) + 1,), generator=torch.Generator().manual_seed(seed))
    rows = []
    with torch.inference_mode():
        for context in contexts:
            fill_cache(cache, context, config, dtype, device)
            decode = timer.seconds(verification_forward(forward, cache, device, tree=0))
            for vocab in vocabs:
                draft_vocab = torch.arange(vocab) if vocab else None
                drafter = LongSpecDrafter(target, layer, draft_vocab=draft_vocab)
                drafter.prefill(ids[: context + 1].tolist(), torch.empty(0), 0)
                for budget in budgets:
                    step(f"context {context}, vocab {vocab or config.vocab_size}, budget {budget}")
                    propose = lambda: drafter.propose(budget, SamplingConfig())  # noqa: E731
                    drafted = timer.seconds(propose)
                    tree = propose()
                    verify = timer.seconds(verification_forward(forward, cache, device, tree=tree))
                    rows.append(DraftCostRow(
                        context=context, vocab=vocab or config.vocab_size, budget=budget, nodes=len(tree),
                        draft_ms=significant(drafted * 1e3), decode_ms=significant(decode * 1e3),
                        verify_ms=significant(verify * 1e3), vs_decode=significant(drafted / decode),
                        mib=significant((drafter.weight_bytes() + drafter.memory_bytes()) / 2**20),
                    ))  # fmt: skip
    return rows
