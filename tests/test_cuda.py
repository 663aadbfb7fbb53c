"""On CUDA: every drafter is lossless through the torch decoder and its CUDA graphs, on tiny random models of each
family in fp32 (peaked logits), and in bf16 with logits that nearly tie (where any rounding a verified row does not
share with the decode step shows). Skipped without a GPU; the same properties are proven on CPU by the drafters' own
test files.

The tokenizer is a word-level one built here (one word per id): these tests need no model file, so they run
on a GPU machine that has only torch, triton and transformers."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter, ScoredChainDrafter, random_eagle3
from test_glide import random_draft
from test_longspec import random_layer
from test_speculative import random_prompt
from test_tokenswift_drafter import random_heads
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specchat.drafters.composite import CompositeDrafter
from specchat.drafters.eagle3.drafter import Eagle3Drafter
from specchat.drafters.glide.drafter import GlideDrafter
from specchat.drafters.longspec.drafter import LongSpecDrafter
from specchat.drafters.model.drafter import ModelDrafter
from specchat.drafters.model.model import DraftModel, student_from_target
from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.drafters.tokenswift.drafter import TokenSwiftDrafter
from specchat.engine.cuda_graphs import capture
from specchat.engine.generate import Engine
from specchat.engine.host_data import to_device
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.step_clock import StepClock
from specchat.engine.target_forward import TorchForward
from specchat.kernels.attention.configs import prefix_config, tree_config

VOCAB = 1024
CUDA = torch.device("cuda")
NO_EOS = SamplingConfig(suppress=(2,))  # random models would otherwise stop at random places
SAMPLED = SamplingConfig(temperature=1.0, top_p=0.9, seed=3, suppress=(2,))


def word_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0", eos_token="w2", pad_token="w2")


TOKENIZER = word_tokenizer(VOCAB)

DRAFTERS = {
    "ngram": lambda engine, model, reference: NgramDrafter(),
    "random": lambda engine, model, reference: RandomTreeDrafter(vocab_size=VOCAB, seed=1, reference=reference),
    "longspec": lambda engine, model, reference: LongSpecDrafter(engine.target, random_layer(model)),
    "longspec-draft-vocab": lambda engine, model, reference: LongSpecDrafter(
        engine.target, random_layer(model), draft_vocab=torch.arange(0, VOCAB, 2)
    ),
    "glide": lambda engine, model, reference: GlideDrafter(engine.target, random_draft(model.config)),
    "glide-shared-vocab": lambda engine, model, reference: GlideDrafter(
        engine.target, random_draft(model.config, shared_vocab=True), draft_vocab=torch.arange(3, VOCAB, 4)
    ),
    "tokenswift": lambda engine, model, reference: TokenSwiftDrafter(engine.target, random_heads(model), lag=16),
    "model": lambda engine, model, reference: ModelDrafter(
        engine.target, DraftModel(student_from_target(model, 1), student=True)
    ),
    "longspec+ngram": lambda engine, model, reference: CompositeDrafter(
        LongSpecDrafter(engine.target, random_layer(model)), NgramDrafter()
    ),
    "eagle3": lambda engine, model, reference: Eagle3Drafter(engine.target, random_eagle3(model)),
    "tokenswift+ngram": lambda engine, model, reference: CompositeDrafter(  # merged on the device
        TokenSwiftDrafter(engine.target, random_heads(model), lag=16), NgramDrafter()
    ),
}


def generate(engine: Engine, prompt: list[int], n: int, sampling: SamplingConfig) -> list[int]:
    events = engine.generate(prompt, sampling=sampling, max_new_tokens=n)
    return [t for event in events for t in event.tokens]


def cuda_model(family: str, seed: int = 0):
    return tiny_model(family, vocab_size=VOCAB, seed=seed).to(CUDA)


def test_the_hopper_block_configs_are_chosen():
    major, _ = torch.cuda.get_device_capability()
    if major < 9:
        pytest.skip("not a Hopper GPU")
    assert tree_config(CUDA, 128).num_stages == 3
    assert prefix_config(CUDA, 128, rows=8).num_stages == 4


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_greedy_speculation_on_cuda_equals_autoregressive(family, drafter):
    """The torch decoder replayed as CUDA graphs: trees verified in row buckets equal plain decoding."""
    prompt = random_prompt(40, seed=2, vocab=VOCAB)
    reference_model = cuda_model(family)
    expected = generate(Engine(reference_model, TOKENIZER, max_len=256), prompt, 100, NO_EOS)
    model = cuda_model(family)
    engine = Engine(model, TOKENIZER, max_len=256)
    assert isinstance(engine.forward, TorchForward) and engine.forward.graphed
    engine.set_drafter(DRAFTERS[drafter](engine, model, prompt + expected), 16)
    events = list(engine.generate(prompt, sampling=NO_EOS, max_new_tokens=100))
    assert [t for e in events for t in e.tokens] == expected
    if drafter == "random":
        assert events[-1].stats.accepted > 0
    follow_up = prompt + expected[:30] + [5, 6, 7]  # a second turn over the cached prefix
    want = generate(Engine(reference_model, TOKENIZER, max_len=256), follow_up, 40, NO_EOS)
    assert generate(engine, follow_up, 40, NO_EOS) == want


@pytest.mark.parametrize("drafter", ["random", "longspec", "tokenswift", "tokenswift+ngram"])
def test_greedy_speculation_at_the_adaptive_budget_on_cuda_equals_autoregressive(drafter):
    """As a user runs it: trees sized by the adaptive budget from verification costs timed on this GPU, through the
    bucket graphs (the calibration's forwards among them)."""
    prompt = random_prompt(40, seed=2, vocab=VOCAB)
    model = cuda_model("llama")
    expected = generate(Engine(model, TOKENIZER, max_len=256), prompt, 100, NO_EOS)
    engine = Engine(model, TOKENIZER, max_len=256)
    engine.set_drafter(DRAFTERS[drafter](engine, model, prompt + expected))
    events = list(engine.generate(prompt, sampling=NO_EOS, max_new_tokens=100))
    assert [t for e in events for t in e.tokens] == expected
    assert engine.policy is not None and events[-1].stats.budget_total > 0


@pytest.mark.parametrize("drafter", ["random", "longspec"])
def test_greedy_speculation_in_bf16_with_near_ties_equals_autoregressive(drafter):
    """Exactness to the bit: a bf16 model whose head is scaled down has logits that nearly tie everywhere, so a
    verified row that rounded otherwise than the decode step at its position would change the greedy text."""
    prompt = random_prompt(40, seed=6, vocab=VOCAB)
    model = cuda_model("llama").to(torch.bfloat16)
    model.lm_head.weight.mul_(0.02)
    expected = generate(Engine(model, TOKENIZER, max_len=256), prompt, 100, NO_EOS)
    engine = Engine(model, TOKENIZER, max_len=256)
    engine.set_drafter(DRAFTERS[drafter](engine, model, prompt + expected), 16)
    events = list(engine.generate(prompt, sampling=NO_EOS, max_new_tokens=100))
    assert [t for e in events for t in e.tokens] == expected
    if drafter == "random":  # drafts from the expected text: deep rows verified (a random LongSpec layer's: roots)
        assert events[-1].stats.accepted > 0


@pytest.mark.parametrize("drafter", ["random", "longspec", "glide-shared-vocab", "model"])
def test_seeded_sampling_on_cuda_equals_autoregressive(drafter):
    """Keyed draws (`PositionNoise`) draw each token from its own seeded stream, so a sampled run is comparable
    token for token (the chi-square tests of the distributions run on CPU)."""
    prompt = random_prompt(40, seed=4, vocab=VOCAB)
    model = cuda_model("llama")
    expected = generate(Engine(model, TOKENIZER, max_len=256), prompt, 80, SAMPLED)
    engine = Engine(model, TOKENIZER, max_len=256)
    engine.set_drafter(DRAFTERS[drafter](engine, model, prompt + expected), 16)
    assert generate(engine, prompt, 80, SAMPLED) == expected


@pytest.mark.parametrize(("drafter", "sampling", "drafted"), [
    ("longspec", NO_EOS, 0), ("longspec", SAMPLED, 0), ("longspec-draft-vocab", NO_EOS, 0), ("glide", NO_EOS, 0),
    ("tokenswift", NO_EOS, 0), ("tokenswift", SAMPLED, 0), ("eagle3", NO_EOS, 0), ("tokenswift+ngram", NO_EOS, 0),
    (None, NO_EOS, 0)],
    ids=["longspec", "longspec-sampled", "longspec-draft-vocab", "glide", "tokenswift", "tokenswift-sampled",
         "eagle3", "tokenswift+ngram", "none"])  # fmt: skip
def test_a_step_synchronises_with_the_gpu_at_the_acceptance(drafter, sampling, drafted):
    """What `test_device_waits.py` models on a CPU, counted by CUDA itself (`set_sync_debug_mode`): once its
    graphs are captured, a greedy step, or one sampled with top-p (keyed draws, the draft forward guessing them),
    synchronises where the host reads the target's choices (with a tree its drafter
    left on the device), and a proposal only at its end where its tree is sized by its values."""
    prompt = random_prompt(40, seed=2, vocab=VOCAB)
    model = cuda_model("llama")
    engine = Engine(model, TOKENIZER, max_len=256)
    if drafter is not None:
        engine.set_drafter(DRAFTERS[drafter](engine, model, None), 16)
    steps, proposals, where = synchronisations(engine, prompt, sampling, 24)
    assert len(steps) > 4  # on a GPU each launched ahead, none after the last
    assert steps[3:] == [1 + drafted] * len(steps[3:]), where[3:5]
    assert proposals[3:] == [drafted] * len(proposals[3:])


def test_a_scored_tree_left_on_the_gpu_is_cut_without_a_synchronisation():
    """At the adaptive budget a scored tree left on the device, best first (TokenSwift's and EAGLE-3's), is cut to
    the size the last tree's scores chose, and sized once the acceptance has read it: its step synchronises once."""
    prompt = random_prompt(40, seed=2, vocab=VOCAB)
    model = cuda_model("llama")
    engine = Engine(model, TOKENIZER, max_len=256)
    reference = prompt + generate(engine, prompt, 80, NO_EOS)
    engine.set_drafter(ScoredChainDrafter(reference, vocab_size=VOCAB, depth=8, device=CUDA))  # trees that pay
    steps, proposals, where = synchronisations(engine, prompt, NO_EOS, 80)
    assert engine.drafter.ids == reference and len(steps) > 6
    assert steps[3:] == [1] * len(steps[3:]), where[3:5]
    assert proposals[2:] == [0] * len(proposals[2:])


def synchronisations(engine: Engine, prompt: list[int], sampling: SamplingConfig, tokens: int):
    """Per decode step of `engine.generate`: the synchronisations of its launch, its verification and the drafter's
    commit together; of each proposal; and the Python lines that synchronised, a list a step."""
    calls = {"launch": [], "step": [], "commit": [], "propose": []}  # name -> (synchronisations, lines) a call

    def counting(call, name):
        def counted(*args, **kwargs):
            before = len(caught)  # the warnings recorded below
            out = call(*args, **kwargs)
            syncs = [w for w in caught[before:] if "synchroniz" in str(w.message)]
            calls[name].append((len(syncs), [f"{w.filename.rsplit('/', 2)[-1]}:{w.lineno}" for w in syncs]))
            return out

        return counted

    engine._launch, engine._step = counting(engine._launch, "launch"), counting(engine._step, "step")
    if engine.drafter is not None:
        engine.drafter.propose = counting(engine.drafter.propose, "propose")
        engine.drafter.commit = counting(engine.drafter.commit, "commit")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            list(engine.generate(prompt, sampling=sampling, max_new_tokens=tokens))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert len(calls["launch"]) == len(calls["step"])  # on a GPU each step launched ahead, none after the last
    commits = calls["commit"][1:] or [(0, [])] * len(calls["step"])  # the first: the prefill's token
    steps = [[launched, verified, committed] for launched, verified, committed
             in zip(calls["launch"], calls["step"], commits)]  # fmt: skip
    return ([sum(count for count, _ in step) for step in steps], [count for count, _ in calls["propose"]],
            [[line for _, lines in step for line in lines] for step in steps])


def test_the_step_clock_times_what_the_device_ran():
    """The host's clock sees queued work end when it is queued; the step clock, when the device has run it."""
    torch.cuda._sleep(1)  # the first launch's setup, outside the clock
    torch.cuda.synchronize()
    clock = StepClock(CUDA)
    torch.cuda._sleep(400_000_000)  # ~0.2 s of the device's cycles, queued at once
    clock.mark()
    queued = clock.host_seconds()
    torch.zeros(1, device=CUDA).item()  # a read queued after the mark: the device has passed it
    [ran] = clock.seconds()
    assert ran > 0.1 and ran > 4 * queued


def test_tokenswifts_draft_forward_replays_a_graph_over_its_partial_cache():
    """TokenSwift's one-row draft forward over its partial cache (here smaller than the context: selected, then
    overwritten) replays a CUDA graph of that cache, with the logits of the forward as called."""
    prompt = random_prompt(120, seed=5, vocab=VOCAB)
    model = cuda_model("llama")
    engine = Engine(model, TOKENIZER, max_len=256)
    drafter = TokenSwiftDrafter(engine.target, random_heads(model), kv_budget=48, lag=16)
    engine.set_drafter(drafter, 16)
    list(engine.generate(prompt, sampling=NO_EOS, max_new_tokens=24))
    graphs = engine.forward.draft_graph
    assert graphs is not None and graphs.cache is drafter.partial.cache and list(graphs.buckets) == [1]
    with torch.inference_mode():  # as the engine runs: the partial cache's tensors are inference tensors
        cache = drafter.partial.prepare(engine.ids[-1])
        token, position = (torch.full((1,), value, device=CUDA) for value in (engine.ids[-1], engine.cache.length))
        replayed = engine.forward(token, position, None, cache).logits
        called = engine.forward.decoder(token, position, cache, None).logits
    torch.testing.assert_close(replayed, called)


GRAPHED_DRAFTERS = {  # a drafter whose depths replay CUDA graphs, and the shapes a budget of 15 captures
    "longspec-beam": (lambda engine, model: LongSpecDrafter(engine.target, random_layer(model)), [(4, 11)]),
    "longspec-chain": (lambda engine, model: LongSpecDrafter(engine.target, random_layer(model), widths=(1,) * 15),
                       [(1,) * 15]),
    "glide": (lambda engine, model: GlideDrafter(engine.target, random_draft(model.config, layers=2)), [4]),
    "tokenswift": (lambda engine, model: TokenSwiftDrafter(engine.target, random_heads(model), lag=16),
                   [(15, NO_EOS, False)]),
    "eagle3": (lambda engine, model: Eagle3Drafter(engine.target, random_eagle3(model)), [15]),
}  # fmt: skip


@pytest.mark.parametrize("drafter", list(GRAPHED_DRAFTERS))
def test_draft_depths_replay_a_graph_and_draft_as_called(drafter, monkeypatch):
    """LongSpec's beam or greedy chain and GLIDE's chain replay one CUDA graph of their depths per shape, reading
    the target's cache to the root's length on the device, TokenSwift's heads and layout one per budget and
    sampling, EAGLE-3's depths one per budget: every proposal equals the one drafted as called, the output the
    target's."""
    prompt = random_prompt(60, seed=7, vocab=VOCAB)
    model = cuda_model("llama")
    engine = Engine(model, TOKENIZER, max_len=256)
    expected = generate(engine, prompt, 40, NO_EOS)
    make, shapes = GRAPHED_DRAFTERS[drafter]
    proposals = {}
    for graphed in (False, True):
        draft = make(engine, model)
        if not graphed and hasattr(draft, "uses_graphs"):
            draft.uses_graphs = False
        elif not graphed:
            monkeypatch.setattr(draft, "_graphed", lambda: False)
        seen = proposals[graphed] = []
        propose = draft.propose
        draft.propose = lambda *args, propose=propose, seen=seen: seen.append(propose(*args)) or seen[-1]
        engine.set_drafter(draft, 15)
        assert generate(engine, prompt, 40, NO_EOS) == expected
    assert [(t.tokens, t.parents) for t in proposals[True]] == [(t.tokens, t.parents) for t in proposals[False]]
    assert list(draft.graphs) == shapes


def test_asynchronous_copies_of_host_data_arrive_whole():
    """`to_device`'s pinned blocks are freed as soon as the host drops them; the caching host allocator must not hand
    one out again before its copy has run."""
    copies = [to_device(list(range(i, i + 4096)), CUDA) for i in range(64)]
    torch.cuda.synchronize()
    assert all(copy.tolist() == list(range(i, i + 4096)) for i, copy in enumerate(copies))


def test_no_collection_runs_inside_a_capture():
    """The warm-ups run with the collector as it is; the captured call without it; after, it is back."""
    enabled = []
    x = torch.zeros(4, device="cuda")
    graph, out = capture(lambda: enabled.append(gc.isenabled()) or x + 1)
    graph.replay()
    assert enabled == [True, True, False] and gc.isenabled() and out.tolist() == [1.0] * 4
