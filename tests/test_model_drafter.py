"""The standalone draft model (SpecExtend): its cache policies, the working cache's compact positions, dynamic
trees, the target's attention row it ranks chunks by, and that drafting with it is lossless.

On tiny random models: the draft is a student made of the target's own layers, so under the full cache it
predicts what the target will say and nearly every draft is accepted (a wrong position, mask or rotation
would show at once); under streaming and retrieval it reads part of the context, and the output is still
the target's.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_model
from transformers import AutoTokenizer

from specchat.drafters.cache_policy import (
    CHUNK,
    FullCache,
    RetrievalCache,
    StreamingCache,
    rank_chunks,
    recent_chunks,
    target_attention,
)
from specchat.drafters.draft_layers import rotate
from specchat.drafters.model.drafter import ModelDrafter
from specchat.drafters.model.dynamic_tree import CHILDREN, grow_tree
from specchat.drafters.model.model import DraftModel, check_tokenizers, load_draft_model, student_from_target
from specchat.drafters.model.working_cache import WorkingCache
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.tree import ROOT
from specchat.errors import SpecchatError

VOCAB = 96


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", vocab_size=VOCAB, seed=7)


def small_policy(name: str, engine: Engine):
    """The policies at sizes a 200-token text exercises: chunks of 8, 4 of them kept, 4 sinks + 36 recent."""
    if name == "full":
        return FullCache()
    if name == "streaming":
        return StreamingCache(sinks=4, read=40)
    return RetrievalCache(lambda: target_attention(engine.target), chunk=8, top=4)


@pytest.mark.parametrize("policy", ["full", "streaming", "retrieval"])
@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(suppress=(2,)), SamplingConfig(temperature=1.0, top_p=0.9, seed=3, suppress=(2,))],
    ids=["greedy", "sampled"],
)
def test_each_cache_policy_is_lossless(model, tokenizer, policy, sampling):
    prompt = torch.randint(3, VOCAB, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    expected = [t for e in Engine(model, tokenizer, max_len=400).generate(prompt, sampling=sampling, max_new_tokens=80)
                for t in e.tokens]  # fmt: skip
    engine = Engine(model, tokenizer, max_len=400)
    drafter = ModelDrafter(engine.target, DraftModel(student_from_target(model, 2), student=True))
    drafter.use_cache_policy(small_policy(policy, engine))
    engine.set_drafter(drafter, 8)
    events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=80))
    assert [t for e in events for t in e.tokens] == expected
    stats = events[-1].stats
    assert stats.accepted > 0
    if policy == "full" and sampling.greedy:  # the draft is the target: its best path is the target's
        assert sum(stats.accepted_at_depth) >= 0.9 * sum(stats.proposed_at_depth)
    if policy != "full":
        assert drafter.cache.size < drafter.cache.length  # it read part of the context
    if policy == "retrieval":
        assert drafter.policy.steps >= 8


def test_retrieval_ranks_chunks_by_mean_score_and_keeps_the_newest():
    scores = torch.zeros(99)  # the target's row lags the draft's context (100 positions) by the root
    scores[8:16] = 0.5  # chunk 1: mean 0.5
    scores[16] = 3.0  # chunk 2: one high position, mean 0.375
    scores[40:48] = 1.0  # chunk 5: mean 1.0
    scores[90:] = 9.0  # chunk 11 (88..95): mean 6.75; the newest chunk is 12 (96..99)
    kept = rank_chunks(scores, 100, chunk=8, top=3).tolist()
    assert kept == [*range(8, 16), *range(40, 48), *range(88, 96), *range(96, 100)]
    assert rank_chunks(scores, 30, chunk=8, top=3).tolist() == list(range(30))  # everything fits
    assert recent_chunks(100, 8, 3).tolist() == list(range(72, 100))


def test_working_cache_rotates_stored_keys_at_compact_positions(model):
    rotary = model.model.rotary_emb
    cache = WorkingCache(2, 2, 16, 64, 64, dtype=torch.float32, device=torch.device("cpu"), rotaries=[rotary])
    keys = torch.randn(2, 2, 10, 16)
    values = torch.randn(2, 2, 10, 16)
    cache.append(keys, values, torch.zeros_like(keys))
    cache.select(torch.tensor([1, 4, 9]))
    cos, sin = rotary(keys, torch.arange(3)[None])
    torch.testing.assert_close(cache.keys[:, :, :3], rotate(keys[:, :, [1, 4, 9]], cos[0], sin[0]))
    assert torch.equal(cache.values[:, :, :3], values[:, :, [1, 4, 9]])
    # attention scores depend only on distances: a query at compact position 3 sees key 9 as one step back
    q = torch.randn(16)
    at = lambda x, p: rotate(x[None], *(t[0] for t in rotary(x, torch.tensor([[p]]))))[0]  # noqa: E731
    assert torch.allclose(at(q, 3) @ cache.keys[0, 0, 2], at(q, 10) @ at(keys[0, 0, 9], 9), atol=1e-4)


def test_dynamic_tree_takes_the_most_probable_nodes_and_stops_when_a_depth_adds_little():
    vocab = 20

    def certain(columns, parents):  # always sure of the next token: a chain as deep as allowed
        return torch.nn.functional.one_hot(torch.tensor(columns) % vocab, vocab).float() * 0.98 + 0.001

    tree = grow_tree(torch.nn.functional.one_hot(torch.tensor(3), vocab).float(), certain, 12, "model", max_depth=10)
    assert len(tree) <= 12 and tree.depth == 10
    assert all(parent < node for node, parent in enumerate(tree.parents))

    calls = []

    def uniform(columns, parents):
        calls.append(len(columns))
        return torch.full((len(columns), vocab), 1 / vocab)

    flat = grow_tree(torch.full((vocab,), 1 / vocab), uniform, 10, "model")
    assert calls == [] and len(flat) == CHILDREN and flat.depth == 1  # depth 1 adds 0.4 <= 0.7: no forward

    peaked = torch.tensor([0.6, 0.3] + [0.1 / (vocab - 2)] * (vocab - 2))
    grown = grow_tree(peaked, lambda c, p: peaked.expand(len(c), -1), 6, "model")
    values = {}
    for node, (token, parent) in enumerate(zip(grown.tokens, grown.parents)):
        values[node] = peaked[token].item() * (1.0 if parent == ROOT else values[parent])
    assert sorted(values.values(), reverse=True)[:6] == pytest.approx(sorted(values.values(), reverse=True))
    assert min(values.values()) >= 0.3 * 0.3 - 1e-6  # the 6 best: 0.6, 0.36, 0.3, 0.216, 0.18, 0.18


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["torch-decoder", "cpu-decoder"])
def test_last_query_is_the_targets_last_layer_query_of_the_newest_cached_position(tokenizer, dtype):
    from specchat.engine.attention import use_attention

    target = tiny_model("llama", vocab_size=VOCAB, seed=7, head_dim=64).to(dtype)
    use_attention(target, "canonical" if dtype == torch.bfloat16 else "hybrid")
    engine = Engine(target, tokenizer, max_len=200)
    assert engine.canonical == (dtype == torch.bfloat16)
    prompt = torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    next(engine.generate(prompt, max_new_tokens=1))

    reference, captured = tiny_model("llama", vocab_size=VOCAB, seed=7, head_dim=64), []
    attention = reference.model.layers[-1].self_attn
    hook = attention.q_proj.register_forward_hook(lambda _m, _i, out: captured.append(out))
    reference(input_ids=torch.tensor([prompt]))
    hook.remove()
    query = captured[0][0, -1].view(-1, 64)
    cos, sin = reference.model.rotary_emb(query, torch.tensor([[29]]))
    tolerance = dict(atol=0.1, rtol=0.05) if dtype == torch.bfloat16 else {}  # bf16 activations in two layers
    torch.testing.assert_close(engine.target.last_query(), rotate(query, cos[0], sin[0]), **tolerance)
    row = target_attention(engine.target)
    assert row.shape == (30,) and abs(float(row.sum()) - 1) < 1e-4


def test_a_draft_model_must_speak_the_targets_vocabulary(model, tmp_path):
    """Up to 128 ids more or fewer (a family's padding, a larger sibling's added tokens): it drafts over the ids both
    have; more, and it is refused in one line."""
    far = tiny_model("llama", vocab_size=VOCAB + 129, seed=1)
    far.save_pretrained(tmp_path / "far")
    with pytest.raises(SpecchatError, match=f"vocabulary of {VOCAB + 129} tokens; the target's has {VOCAB}"):
        load_draft_model(tmp_path / "far", model)
    for size in (VOCAB, VOCAB + 4, VOCAB - 4):
        tiny_model("llama", vocab_size=size, seed=1).save_pretrained(tmp_path / str(size))
        draft = load_draft_model(tmp_path / str(size), model)
        assert not draft.student and draft.model.config.vocab_size == size
        shared = None if draft.draft_vocab is None else draft.draft_vocab.tolist()
        assert shared == (None if size == VOCAB else list(range(min(size, VOCAB))))


def test_a_draft_models_tokenizer_must_be_the_targets(tokenizer, hf_tokenizer, tmp_path):
    """The ids both tokenizers have must mean the same; one may list up to 128 more."""
    check_tokenizers(tokenizer, tokenizer, "same")
    hf_tokenizer.save_pretrained(tmp_path / "grown")
    grown = AutoTokenizer.from_pretrained(tmp_path / "grown")
    grown.add_tokens(["<extra-token>"])
    check_tokenizers(grown, tokenizer, "grown")
    check_tokenizers(tokenizer, grown, "shrunk")
    grown.add_tokens([f"<extra-{i}>" for i in range(128)])
    with pytest.raises(SpecchatError, match=f"'grown' has {len(tokenizer) + 129} tokens; "
                                            f"the target's tokenizer has {len(tokenizer)}"):
        check_tokenizers(grown, tokenizer, "grown")
    saved = json.loads((tmp_path / "grown" / "tokenizer.json").read_text())
    vocab = saved["model"]["vocab"]
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]  # two ids swapped
    (tmp_path / "grown" / "tokenizer.json").write_text(json.dumps(saved))
    swapped = AutoTokenizer.from_pretrained(tmp_path / "grown")
    with pytest.raises(SpecchatError, match="maps '(hello|world)' to another id than the target"):
        check_tokenizers(swapped, tokenizer, "swapped")


# The policies' sizes in the needle test: 6 chunks of 32 and the newest (224 positions) where the CLI's read 33
# (1056), so that a prompt of ~420 tokens holds the needle beyond the window (three prefills of 1.7K tokens in
# fp32 took 41 s, these 12 s).
NEEDLE_TOP = 6
NEEDLE_READ = (NEEDLE_TOP + 1) * CHUNK


def needle_prompt(tokenizer) -> tuple[list[int], list[int]]:
    """~420 tokens of the Python reference manual with a password planted ~290 tokens before the end (outside
    the NEEDLE_READ positions a working cache reads) and ~100 after its start, and a question whose answer copies
    it; and the password's tokens as the answer writes it (after "is")."""
    from pydoc_data.topics import topics

    document = "\n\n".join(topics[name] for name in sorted(topics))[:9000]
    fact = "\n\nThe password of the archive server is TULIP-4471-ORBIT.\n\n"
    text = (f"{document[2600:3000]}{fact}{document[3000:4100]}\n\n"
            "What is the password of the archive server? Answer with the password only.")
    return encode_prompt(tokenizer, text), tokenizer.encode(" TULIP-4471-ORBIT", add_special_tokens=False)


@pytest.mark.slow
def test_needle_retrieval_drafts_the_copied_fact_streaming_cannot(default_model):
    """On the real default model (fp32), whose answer copies a fact from ~290 tokens back: a draft that can copy
    (the target's own layers, reading its own cache) gets the fact's tokens accepted when it retrieves the chunks
    the target attends to, and not when it streams the recent tokens only: the needle lies outside streaming's
    window. (The policies at the CLI's sizes are the same classes, tested on their own above.)"""
    tokenizer = default_model.tokenizer
    prompt, secret = needle_prompt(tokenizer)
    [needle_at] = [i for i in range(len(prompt)) if prompt[i : i + len(secret)] == secret]
    assert len(prompt) - needle_at > NEEDLE_READ + CHUNK, (len(prompt), needle_at)
    drafted = {}
    # one engine: the second request reuses the target's cache of the prompt; each drafter is new and reads the
    # whole prompt into its own cache
    engine = Engine(default_model.model, tokenizer, max_len=len(prompt) + 32)
    policies = {
        "streaming": StreamingCache(read=NEEDLE_READ),
        "retrieval": RetrievalCache(lambda: target_attention(engine.target), top=NEEDLE_TOP),
    }
    for name, policy in policies.items():
        drafter = ModelDrafter(engine.target, DraftModel(default_model.model, student=False))
        drafter.use_cache_policy(policy)
        engine.set_drafter(drafter, 8)
        tokens, origins = [], []
        for event in engine.generate(prompt, max_new_tokens=24):
            tokens += event.tokens
            origins += event.origins
        starts = [i for i in range(len(tokens)) if tokens[i : i + len(secret)] == secret]
        assert starts, f"the answer does not copy the password: {tokenizer.decode(tokens)!r}"
        drafted[name] = origins[starts[0] : starts[0] + len(secret)].count("model")
    assert drafted["retrieval"] > drafted["streaming"], drafted


@pytest.mark.slow
def test_a_profile_alias_drafts_with_that_profiles_model(default_model):
    """`--drafter model:smollm2-135m`: the alias's model (here the target's own, dense), its tokenizer checked."""
    from specchat.drafters.model.drafter import build

    model, tokenizer = default_model.model, default_model.tokenizer
    prompt = encode_prompt(tokenizer, "Name three colours.")
    engine = Engine(model, tokenizer, max_len=len(prompt) + 24)
    expected = [t for e in engine.generate(prompt, max_new_tokens=16) for t in e.tokens]
    engine.set_drafter(build(engine.target, "smollm2-135m"), 6)
    events = list(engine.generate(prompt, max_new_tokens=16))
    assert [t for e in events for t in e.tokens] == expected
    assert events[-1].stats.accepted >= 8  # the target drafting for itself


@pytest.mark.parametrize("padded", ["target", "draft"])
def test_a_draft_listing_fewer_or_more_tokens_than_its_target_keeps_the_output_exact(tmp_path, padded):
    """A target listing 64 tokens more than its draft (Gemma 3 4B's and 1B's files), or fewer: the draft proposes
    only ids both have, embeds a target id it lacks as its last, and speculation gives the target's own tokens,
    greedy and sampled. The files are the same weights but for the padded rows, so most drafts are accepted, sampled
    as greedy: the draft races its own distribution under the target's keyed noise."""
    from gguf_files import write_tiny_model

    from specchat.loading import embedded_gguf_path, load_model

    paths = {role: write_tiny_model(tmp_path / f"{role}.gguf", embedded_gguf_path(),
                                    padded_vocab=64 if role == padded else 0)
             for role in ("target", "draft")}  # fmt: skip
    loaded = load_model(str(paths["target"]))
    draft = load_draft_model(str(paths["draft"]), loaded.model, loaded.tokenizer)
    sizes = sorted((loaded.model.config.vocab_size, draft.model.config.vocab_size))
    assert sizes[1] - sizes[0] == 64 and draft.draft_vocab.tolist() == list(range(sizes[0]))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    prompt = torch.randint(3, 2000, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    for sampling in (SamplingConfig(suppress=(2,)), SamplingConfig(temperature=1.0, seed=4, suppress=(2,))):
        engine.set_drafter(None)
        expected = [t for e in engine.generate(prompt, sampling=sampling, max_new_tokens=50)
                    for t in e.tokens]  # fmt: skip
        engine.set_drafter(ModelDrafter(engine.target, draft, policy="full"), 6)
        events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=50))
        assert [t for event in events for t in event.tokens] == expected
        stats = events[-1].stats
        assert stats.accepted >= 0.8 * stats.drafted_depth > 0  # sampled: it guesses the keyed draws (0.5 if not)
