"""Sliding-window layers hold only what their rows still see (`WindowKVLayer`): the window and a forward's rows,
moved down to slot 0 as the text grows. On the tiny Gemma 3 (a window on one layer in two) and Phi-3 (on every
layer), with a few slots past the window so that they move down every few steps: every forward computes bitwise what
it computes over a cache holding every position, speculation equals the target alone, and what cannot be gone back
to (a far prefix, the keys a drafter would read) is refused or recomputed."""

from __future__ import annotations

import pytest
import torch
from drafters_for_tests import RandomTreeDrafter
from gguf_files import GEMMA3_WINDOW, PHI3_WINDOW, write_tiny_model
from test_gguf_model import GREEDY, SAMPLED, generate

from specchat.architectures import parts
from specchat.engine import cache as cache_module
from specchat.engine.attention import use_attention
from specchat.engine.cache import TreeCache, TreeKVLayer, WindowKVLayer
from specchat.engine.generate import Engine
from specchat.engine.lean_forward import lean_forward
from specchat.engine.prompt_cache import read_prompt_cache, write_prompt_cache
from specchat.engine.tree import DraftTree, tree_batch
from specchat.errors import SpecchatError
from specchat.loading import embedded_gguf_path, gguf_checkpoint, load_model
from specchat.quant.gguf_model import load_gguf_model

CPU = torch.device("cpu")
WINDOW = {"gemma3": GEMMA3_WINDOW, "phi3": PHI3_WINDOW}
HEADROOM = 20  # slots past the window in these tests: trees of up to 16 nodes move them down every few steps


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    made = {}

    def of(architecture: str):
        if architecture not in made:
            path = write_tiny_model(tmp_path_factory.mktemp(architecture) / f"tiny-{architecture}.gguf",
                                    embedded_gguf_path(), architecture=architecture)  # fmt: skip
            made[architecture] = path, gguf_checkpoint(path)
        return made[architecture]

    return of


@pytest.fixture
def few_slots(monkeypatch):
    monkeypatch.setattr(cache_module, "WINDOW_HEADROOM", HEADROOM)


def _ids(count: int, seed: int) -> list[int]:
    return torch.randint(3, 2000, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.inference_mode()
@pytest.mark.parametrize("architecture", ["gemma3", "phi3"])
def test_a_window_cache_computes_bitwise_what_a_whole_cache_does(tiny_file, architecture, few_slots, cpu_isa):
    """A prompt fed in pieces, then trees verified and random paths of them kept, 40 times: each forward's logits
    over the window's cache are those over a cache of every position (fed the prompt at once), bit for bit."""
    path, config_dir = tiny_file(architecture)
    model = load_gguf_model(path, config_dir, torch.bfloat16)
    use_attention(model, "canonical")
    lean = lean_forward(model)
    windows = [layer.window for layer in parts(model).layers]
    held, whole = TreeCache(2, 1024, windows=windows), TreeCache(2, 1024)
    assert [type(layer) for layer in held.layers] == [WindowKVLayer if w else TreeKVLayer for w in windows]
    window = WINDOW[architecture]
    assert held.rows_per_forward == HEADROOM + 1 and whole.rows_per_forward == 1024

    prompt = torch.tensor(_ids(3 * window, 0))
    want = lean(prompt, torch.arange(len(prompt)), None, whole).logits
    whole.commit()
    step = held.rows_per_forward
    for start in range(0, len(prompt), step):
        rows = prompt[start : start + step]
        got = lean(rows, torch.arange(start, start + len(rows)), None, held).logits
        held.commit()
        assert torch.equal(got, want[start : start + len(rows)]), f"prompt rows from {start}"

    generator = torch.Generator().manual_seed(1)
    moves = set()
    for _ in range(40):
        size = int(torch.randint(0, 17, (1,), generator=generator))
        parents = [-1] + [int(torch.randint(-1, i, (1,), generator=generator)) for i in range(1, size)]
        tokens = torch.randint(3, 2000, (size,), generator=generator).tolist()
        tree = DraftTree(tokens, parents[:size], ["test"] * size)
        batch = tree_batch(tree, 7, held.length, CPU)
        got, want = (lean(batch.input_ids, batch.position_ids, batch.tree_mask, c).logits for c in (held, whole))
        assert torch.equal(got, want), f"at {held.length}"
        path = tree.path_to(int(torch.randint(-1, size, (1,), generator=generator))) if size else []
        kept = [0] + [1 + node for node in path]
        held.commit(kept)
        whole.commit(kept)
        moves.add(held.layers[0].first)
    assert len(moves) > 5 and held.layers[0].first > 0
    assert held.reach(held.length - 3) == held.length - 3 and held.reach(window) == 0
    with pytest.raises(RuntimeError, match="ask `reach` first"):
        held.truncate(window)
    with pytest.raises(SpecchatError, match="keep only their last"):
        held.layers[0].read(slice(0, held.length))
    keys, _ = held.layers[0].read(slice(held.length - window + 1, held.length))
    assert torch.equal(keys, whole.layers[0].read(slice(held.length - window + 1, held.length))[0])


@pytest.mark.parametrize("architecture", ["gemma3", "phi3"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculation_over_a_window_cache_equals_the_target_alone(tiny_file, architecture, sampling, monkeypatch,
                                                                  cpu_isa):  # fmt: skip
    """The target alone over a cache of every position, then with a window's few slots, then speculating over
    them: the same tokens (the prompt is prefilled in pieces, the window's slots move down many times)."""
    loaded = load_model(str(tiny_file(architecture)[0]))
    prompt = _ids(150, 2)
    outputs = []
    for headroom, drafted in ((4096, False), (HEADROOM, False), (HEADROOM, True)):
        monkeypatch.setattr(cache_module, "WINDOW_HEADROOM", headroom)
        engine = Engine(loaded.model, loaded.tokenizer, max_len=1024)
        assert isinstance(engine.cache.layers[0], WindowKVLayer) == (headroom == HEADROOM)
        if drafted:
            reference = prompt + outputs[0]
            engine.set_drafter(RandomTreeDrafter(vocab_size=2000, seed=3, reference=reference, p_correct=0.8), 16)
        events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=80))
        outputs.append([t for event in events for t in event.tokens])
        assert not drafted or events[-1].stats.accepted > 0
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


def test_a_prompt_sharing_a_prefix_the_window_left_behind_is_prefilled_again(tiny_file, few_slots):
    """A follow-up that extends the cached text reuses it; one that leaves it far back (before what the window still
    holds) is prefilled from the start, as llama.cpp does; either answers as a fresh engine."""
    loaded = load_model(str(tiny_file("gemma3")[0]))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=1024)
    fresh = Engine(loaded.model, loaded.tokenizer, max_len=1024)
    first = _ids(200, 5)
    answer = generate(engine, first, 20, GREEDY)
    for prompt, reused in ((first + answer + _ids(10, 6), len(first) + len(answer) - 1), (first[:100] + _ids(5, 7), 0)):
        events = list(engine.generate(prompt, sampling=GREEDY, max_new_tokens=20))
        assert events[-1].stats.reused_tokens == reused
        assert [t for event in events for t in event.tokens] == generate(fresh, prompt, 20, GREEDY)


def test_kept_prefixes_and_prompt_cache_files_restore_a_window(tiny_file, few_slots, tmp_path):
    """A text kept by the prefix store and one written to a prompt cache file come back with their windows (their
    last positions): the next answer is a fresh engine's. Restoring such a copy far before its end is refused."""
    loaded = load_model(str(tiny_file("phi3")[0]))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=1024, prefix_bytes=2**26)
    fresh = Engine(loaded.model, loaded.tokenizer, max_len=1024)
    text = _ids(180, 8)
    answer = generate(engine, text, 10, GREEDY)
    assert write_prompt_cache(engine, tmp_path / "text.kv")
    generate(engine, _ids(120, 9), 10, GREEDY)  # another text takes the cache: the first is kept
    follow_up = text + answer + _ids(6, 10)
    events = list(engine.generate(follow_up, sampling=GREEDY, max_new_tokens=20))
    assert events[-1].stats.reused_tokens == len(text) + len(answer) - 1
    assert [t for event in events for t in event.tokens] == generate(fresh, follow_up, 20, GREEDY)

    reader = Engine(loaded.model, loaded.tokenizer, max_len=1024)
    assert read_prompt_cache(reader, tmp_path / "text.kv", follow_up) == len(text) + len(answer) - 1
    assert isinstance(reader.cache.layers[0], WindowKVLayer) and reader.cache.layers[0].first > 0
    assert generate(reader, follow_up, 20, GREEDY) == generate(fresh, follow_up, 20, GREEDY)
    copy = reader.cache.copy(reader.cache.length)
    assert not reader.cache.restorable(copy, PHI3_WINDOW) and reader.cache.restorable(copy, reader.cache.length - 2)


def test_a_long_context_allocates_its_full_layers_alone(tiny_file):
    """At 64K positions, Gemma's window layer holds its window and a forward's rows; the full layer every position."""
    loaded = load_model(str(tiny_file("gemma3")[0]))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=65536)
    window, full = engine.cache.layers
    assert (window.slots, full.slots) == (GEMMA3_WINDOW + cache_module.WINDOW_HEADROOM, engine.max_len)
    generate(engine, _ids(40, 11), 4, GREEDY)
    assert [stack[1].shape[-2] for stack in engine.cache.stacks] == [engine.max_len, window.slots]


def test_verify_cost_fills_a_window_cache_past_its_slots_and_back(tiny_file, few_slots):
    """`bench verify-cost` writes a random context through the layers (in pieces a window holds), going back to a
    shorter one from the start where the window has moved past it."""
    from specchat.bench.verify_cost import fill_cache, model_verify_cost

    loaded = load_model(str(tiny_file("gemma3")[0]))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=512)
    rows = model_verify_cost(engine, contexts=[300, 100, 200], trees=[0, 7], repeats=1)
    assert [(row.context, row.nodes) for row in rows] == [(c, n) for c in (300, 100, 200) for n in (0, 7)]
    window = engine.cache.layers[0]
    assert window.first > 0 and engine.cache.length == 200
    with torch.inference_mode():
        fill_cache(engine.cache, 190, engine.model.config, engine.model.dtype, CPU)
    assert engine.cache.length == 190 and window.first > 0  # near its end: held, no refill


@pytest.mark.parametrize("architecture", ["gemma3", "phi3"])
def test_a_draft_model_retrieves_chunks_by_the_last_layer_that_sees_every_position(tiny_file, architecture,
                                                                                   few_slots):  # fmt: skip
    """SpecExtend's retrieval ranks the context by the target's attention: Gemma's last layer has a window, so the
    query and keys are its last full-attention layer's (the forward gives back that layer's queries); where every
    layer has a window (Phi-3-mini's), the newest chunks stand in once the window has moved. Either way the output
    is the target's."""
    from specchat.drafters.cache_policy import target_attention
    from specchat.drafters.model.drafter import ModelDrafter
    from specchat.drafters.model.model import load_draft_model

    path = tiny_file(architecture)[0]
    loaded = load_model(str(path))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=1024)
    assert engine.target.query_layer == 1  # Gemma's second layer has no window; Phi-3's both do: the last
    tokens = torch.tensor(_ids(5, 12))
    with torch.inference_mode():
        out = engine.forward(tokens, torch.arange(5), None, TreeCache(2, 64), every_layer=True)
        assert torch.equal(engine.forward(tokens, torch.arange(5), None, TreeCache(2, 64)).queries,
                           out.queries[engine.target.query_layer])  # fmt: skip
    prompt = _ids(300, 13)
    expected = generate(engine, prompt, 40, GREEDY)
    draft = load_draft_model(str(path), loaded.model, loaded.tokenizer)
    engine.set_drafter(ModelDrafter(engine.target, draft, policy="retrieval"), 6)
    events = list(engine.generate(prompt, sampling=GREEDY, max_new_tokens=40))
    assert [t for event in events for t in event.tokens] == expected
    scores = target_attention(engine.target)
    if architecture == "gemma3":
        assert scores.shape == (engine.cache.length,) and float(scores.sum()) == pytest.approx(1, abs=1e-3)
    else:
        assert scores is None and engine.cache.layers[-1].first > 0


def test_the_prefix_store_keeps_a_text_a_longer_ones_window_cannot_restore(tiny_file, few_slots):
    """A kept text and a longer one that begins with it: with every position held the longer copy restores both, so
    the shorter is dropped; a window's copy holds its end only, so both stay, and a prompt that leaves the longer
    text where the shorter ends is restored from the shorter, as a fresh engine answers it."""
    loaded = load_model(str(tiny_file("gemma3")[0]))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=1024, prefix_bytes=2**26)
    fresh = Engine(loaded.model, loaded.tokenizer, max_len=1024)
    first = _ids(100, 20)
    text = first + generate(engine, first, 10, GREEDY)
    generate(engine, _ids(120, 21), 4, GREEDY)  # keeps `text`
    longer = text + _ids(80, 22)
    generate(engine, longer, 10, GREEDY)  # reuses `text`, then runs past its end by far more than a window
    generate(engine, _ids(120, 23), 4, GREEDY)  # keeps `longer` and its answer
    # the cache holds a text but its last token (the next step's root)
    assert sorted(len(prefix.ids) for prefix in engine.prefixes.kept) == sorted([123, len(text) - 1, len(longer) + 9])
    follow_up = text + _ids(8, 24)
    events = list(engine.generate(follow_up, sampling=GREEDY, max_new_tokens=12))
    assert events[-1].stats.reused_tokens == len(text) - 1
    assert [t for event in events for t in event.tokens] == generate(fresh, follow_up, 12, GREEDY)
