"""`specchat bench` measures every method on the same prompts and reports exact-output checks."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch
from conftest import tiny_model
from gguf_files import write_tiny_model

from specchat.answer_format import AnswerFormat
from specchat.architectures.llama_model import CausalLM
from specchat.bench.compare import compare
from specchat.bench.llamacpp import CONTEXT_STEP, LlamaCpp, check_prompt_decodes
from specchat.bench.prompts import LONG_SETS, PROMPT_SETS, load_prompt_sets, long_document
from specchat.bench.runs import method_runner, transformers_model
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.target_forward import forward_path
from specchat.errors import SpecchatError
from specchat.loading import LoadedModel, ModelSource, embedded_gguf_path, load_model


def test_builtin_and_file_prompt_sets(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "one"}) + "\n\n" + json.dumps({"prompt": "two"}) + "\n")
    sets = load_prompt_sets(["code"], path)
    assert sets == {"code": PROMPT_SETS["code"], "mine": ["one", "two"]}


@pytest.mark.parametrize(
    ("content", "message"),
    [("not json\n", "mine.jsonl:1"), ('{"text": "x"}\n', "mine.jsonl:1"), ('{"prompt": ""}\n', "non-empty"),
     ("\n", "no prompts")],
)
def test_bad_prompt_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "mine.jsonl"
    path.write_text(content)
    with pytest.raises(SpecchatError, match=message):
        load_prompt_sets([], path)


@pytest.mark.parametrize("name", ["long4k", "long30k"])
def test_long_prompt_sets_hold_about_their_tokens_of_real_text(name, tokenizer):
    """Every task reads the same document; the recall task's answer lies in its first topic."""
    prompts = load_prompt_sets([name])[name]
    document = long_document(LONG_SETS[name])
    assert len(prompts) == 4 and all(prompt.startswith(document + "\n\n") for prompt in prompts)
    assert 0.8 < len(tokenizer.encode(document)) / LONG_SETS[name] < 1.25
    assert document.index('assert_stmt ::= "assert" expression') < 200


def test_unknown_prompt_set():
    with pytest.raises(SpecchatError, match="unknown prompt set 'poems'"):
        load_prompt_sets(["poems"])


def test_compare_rows_cover_every_method_and_check_identity(tokenizer):
    loaded = LoadedModel(tiny_model("llama"), tokenizer, ModelSource("tiny", "tiny"), 0.0)
    sets = {"loop": ["a b c a b c a b c a b c", "x y x y x y x y"]}
    steps = []
    rows = compare(loaded, sets, ["ngram", "hf", "hf-prompt-lookup"], max_new_tokens=24, repeats=1, draft_budget=4,
                   step=steps.append)  # fmt: skip
    by_method = {row.method: row for row in rows}
    # the progress bar hears every generation, as many as the CLI counts: per method a warm-up, then each prompt
    assert len(steps) == 4 * (1 + 1 * 2) and steps[0] == "none: warm-up" and "hf: loop prompt 2/2, repeat 1/1" in steps
    assert list(by_method) == ["none", "ngram", "hf", "hf-prompt-lookup"]
    assert all(row.identical_to_ar for row in rows)  # fp32 greedy: every method gives the same tokens
    assert by_method["none"].speedup_vs_ar == 1.0 and by_method["none"].mean_accepted_length == 1.0
    assert by_method["ngram"].mean_budget == 4.0
    assert by_method["ngram"].draft_ms_per_step > 0 and by_method["none"].draft_ms_per_step is None
    assert all(row.tokens_per_second > 0 and row.new_tokens > 0 for row in rows)
    assert set(rows[0].as_dict()) >= {
        "drafter", "prompt_set", "new_tokens", "tokens_per_second", "speedup_vs_ar",
        "mean_accepted_length", "acceptance_rate", "identical_to_ar", "decoder",
    }  # fmt: skip
    # each row says what computed it: ours the decoder and its code path, the baselines theirs
    assert by_method["ngram"].decoder == by_method["none"].decoder == forward_path(loaded.model)
    assert by_method["hf"].decoder == by_method["hf-prompt-lookup"].decoder == "transformers, cpu"


def test_the_transformers_baseline_of_a_gguf_file_is_the_file_dequantized(tmp_path):
    """A GGUF file runs on specchat's own modules, which have no `generate`: `--baseline hf` runs transformers' model
    of the file, dequantized as transformers loads one, in the same activation dtype and stopping where ours stops."""
    path = write_tiny_model(tmp_path / "tiny.gguf", embedded_gguf_path(), architecture="llama")
    loaded = load_model(str(path))
    rows = compare(loaded, {"loop": ["a b c a b c a b c"]}, ["hf"], max_new_tokens=8, repeats=1)
    dense = transformers_model(loaded)
    assert isinstance(loaded.model, CausalLM) and type(dense).__name__ == "LlamaForCausalLM"
    assert dense.dtype == torch.bfloat16
    assert dense.generation_config.eos_token_id == loaded.model.generation_config.eos_token_id
    by_method = {row.method: row for row in rows}
    assert by_method["hf"].weights == "bfloat16" and by_method["none"].weights != "bfloat16"
    assert by_method["hf"].new_tokens > 0 and by_method["hf"].tokens_per_second > 0


def test_sampled_rows_write_autoregressive_decodings_text(default_model):
    """Under sampling every method of ours draws the same keyed noise, so a drafter whose copies are accepted
    still writes AR's text (`identical_to_ar` still checks exactness), and that text is not the greedy one."""
    prompt = "Repeat this list exactly twice: apple, banana, cherry, grape, lemon, mango, orange, peach, pear, plum."
    sets = {"copy": [prompt]}
    sampling = SamplingConfig(temperature=0.7, top_k=20, seed=0)
    rows = compare(default_model, sets, ["ngram"], max_new_tokens=48, repeats=1, draft_budget=4, sampling=sampling)
    assert [row.method for row in rows] == ["none", "ngram"] and all(row.identical_to_ar for row in rows)
    assert rows[1].acceptance_rate > 0
    ids = encode_prompt(default_model.tokenizer, prompt)
    greedy = method_runner("none", default_model, 128, 48, None, None)(ids)
    assert method_runner("none", default_model, 128, 48, None, None, sampling=sampling)(ids).tokens != greedy.tokens


def test_the_table_fits_80_columns_with_human_headers(monkeypatch, capsys):
    from specchat.bench.compare import BenchRow
    from specchat.cli.common import report as _report

    rows = [
        BenchRow("none", "summarize", "q4_1", "bfloat16", "auto", 384, 75.479, 1.0, 1.0, None, True, None),
        BenchRow("ngram", "summarize", "int4-g32", "bfloat16", "auto", 384, 110.321, 1.462, 1.568, 0.412, True, 1.55,
                 0.42),
        BenchRow("ngram", "summarize", "q4_k", "bfloat16", "int8", 384, 112.5, 1.49, 1.568, 0.412, True, 1.55, 0.4),
        BenchRow("ngram", "summarize", "q4_1", "float32", "bf16", 384, 120.5, 1.6, 1.568, 0.412, True, 1.55, 0.4),
        BenchRow("llamacpp", "summarize", "gguf", "llama.cpp", "llama.cpp", 384, 136.479, 1.808, 1.0, None, False,
                 None),
    ]
    monkeypatch.setenv("COLUMNS", "80")
    _report([row.as_dict() for row in rows], False, title="t", table=[row.as_table_row() for row in rows])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out
    for header in ("method", "tok/s", "vs AR", "tau", "exact"):
        assert header in out
    assert "int4-g32·bf16" in out and "110.3" in out and "1.46x" in out and "q4_k·bf16·kv8" in out
    assert "q4_1·fp32·kv16" in out
    _report([row.as_dict() for row in rows], True, title="t")
    assert json.loads(capsys.readouterr().out)[1]["draft_ms_per_step"] == 0.42  # JSON keeps every field


def test_bench_logits_scores_the_embedded_model_against_its_dequantized_weights():
    """Our kernels on the Q4_1 blocks against gguf-py's dequantization run in fp32, as a prefill and a decode step
    at a time: a broken block layout, scale or attention would put the top token wrong at most positions and the
    KL far above bf16's rounding."""
    from specchat.bench.logits import logits_accuracy, text_ids
    from specchat.loading import load_model

    loaded = load_model(None, dtype="auto", device="cpu")
    rows = logits_accuracy(loaded, embedded_gguf_path(), text_ids(loaded.tokenizer, 48), llamacpp=False)
    assert [row.source.split(", ")[-1] for row in rows] == ["prefill)", "decode)"]
    for row in rows:
        assert row.tokens == 48 and row.source.startswith("specchat (q4_1")
        assert row.mean_kl < 0.02 and row.top1_agreement > 0.85 and 0 < row.rms_error < 0.5


@pytest.mark.parametrize("architecture", ["granite", "gemma2"])
def test_bench_logits_divides_and_caps_as_the_model_does(architecture, tmp_path):
    """An F32 file in fp32 gives its reference's logits: Granite's divided by its logit scale, Gemma 2's soft-capped,
    as the engine's forward gives them."""
    from specchat.bench.logits import logits_accuracy, text_ids

    path = write_tiny_model(tmp_path / f"{architecture}.gguf", embedded_gguf_path(), architecture=architecture,
                            unquantized=True)  # fmt: skip
    loaded = load_model(str(path), dtype="float32")
    for row in logits_accuracy(loaded, path, text_ids(loaded.tokenizer, 40), llamacpp=False):
        assert row.mean_kl < 1e-6 and row.max_abs_error < 1e-3, row


def test_held_rows_follow_their_format_and_are_exact(default_model):
    """`bench --format json`: every answer of ours one JSON object, every drafter's AR's; llama.cpp's under its
    own JSON grammar an object too; under `--grammar` both answers are the grammar's."""
    pytest.importorskip("llama_cpp")
    tokenizer = default_model.tokenizer
    prompt = "Give the name, age and city of a fictional person as JSON."
    llamacpp = LlamaCpp(embedded_gguf_path())
    rows = compare(default_model, {"json": [prompt]}, ["ngram"], max_new_tokens=64, repeats=1, llamacpp=[llamacpp],
                   held=AnswerFormat(json=True))  # fmt: skip
    assert [row.method for row in rows] == ["none", "ngram", "llamacpp"] and rows[1].identical_to_ar
    ids = encode_prompt(tokenizer, prompt)
    schema = {"type": "object", "required": ["age"], "properties": {"age": {"type": "integer"}}}
    for method in ("none", "llamacpp"):
        run = method_runner(method, default_model, 256, 64, None, llamacpp, held=AnswerFormat(json=True))(ids)
        assert isinstance(json.loads(tokenizer.decode(run.tokens, skip_special_tokens=True)), dict)
        run = method_runner(method, default_model, 256, 64, None, llamacpp, held=AnswerFormat(schema=schema))(ids)
        value = json.loads(tokenizer.decode(run.tokens, skip_special_tokens=True))
        assert list(value) == ["age"] and isinstance(value["age"], int)
        grammar = AnswerFormat(grammar='root ::= "Age: " [1-9] [0-9]? "."')
        run = method_runner(method, default_model, 256, 64, None, llamacpp, held=grammar)(ids)
        assert re.fullmatch(r"Age: [1-9][0-9]?\.", tokenizer.decode(run.tokens, skip_special_tokens=True))


def test_the_llamacpp_baseline_grows_its_context_to_the_prompt(tokenizer):
    """A prompt longer than llama.cpp's context reloads it larger instead of failing in llama_decode."""
    pytest.importorskip("llama_cpp")
    llamacpp = LlamaCpp(embedded_gguf_path(), context=64)
    ids = tokenizer.encode(" ".join(["The lighthouse keeper wrote in the log every night."] * 12))
    tokens, _ = llamacpp.generate(ids, 8, frozenset())
    assert len(ids) > 64 and len(tokens) == 8 and llamacpp.context == CONTEXT_STEP


def test_the_lookup_baseline_is_llamacpp_drafting_from_the_prompt(default_model, tokenizer):
    """`--baseline llamacpp,llamacpp-lookup`: both rows measured in one run; the lookup's llama.cpp drafts by
    prompt lookup and answers greedily as plain llama.cpp does (its batched rows may round apart later on)."""
    pytest.importorskip("llama_cpp")
    plain, lookup = (LlamaCpp.for_model(None, method) for method in ("llamacpp", "llamacpp-lookup"))
    assert plain.llm.draft_model is None and lookup.llm.draft_model.num_pred_tokens == 2
    prompt = "Repeat this line three times: the quick brown fox jumps over the lazy dog."
    rows = compare(default_model, {"copy": [prompt]}, [], max_new_tokens=32, repeats=1, llamacpp=[plain, lookup])
    assert [row.method for row in rows] == ["none", "llamacpp", "llamacpp-lookup"]
    assert rows[1].decoder == rows[2].decoder and rows[1].decoder.startswith("llama.cpp (llama-cpp-python 0.")
    ids = encode_prompt(tokenizer, prompt)
    answers = [method_runner(each.method, default_model, 256, 32, None, each)(ids).tokens for each in (plain, lookup)]
    assert answers[0][:8] == answers[1][:8]


def test_a_crash_in_llamacpps_prefill_is_a_one_line_error():
    """What a llama.cpp build with AMX runs before the bench: a short prompt decoded in a child process, whose crash
    (here a real segfault) or failure is an error naming the file, not the end of the bench."""
    path = str(embedded_gguf_path())
    with pytest.raises(SpecchatError, match=r"^llama.cpp crashed \(SIGSEGV\) decoding SmolLM2.*without AMX: CMAKE"):
        check_prompt_decodes(path, "import ctypes; ctypes.string_at(0)")
    with pytest.raises(SpecchatError, match="could not decode SmolLM2.*: exit status 3$"):
        check_prompt_decodes(path, "raise SystemExit(3)")
    if importlib.util.find_spec("llama_cpp"):
        check_prompt_decodes(path)  # the real prefill, where llama.cpp is installed


def test_bench_draft_times_a_draft_of_the_width_asked_for(tokenizer):
    from tui_harness import tiny_loaded

    from specchat.bench.draft_cost import draft_cost

    model = tiny_loaded(tokenizer).model
    wide, narrow = (draft_cost(model, contexts=[64], vocabs=[0], budgets=[3], intermediate=width, repeats=1)
                    for width in (0, 16))  # fmt: skip
    assert ([(row.context, row.budget, row.nodes) for row in wide] == [(64, 3, 3)]
            == [(r.context, r.budget, r.nodes) for r in narrow])
    assert narrow[0].mib < wide[0].mib and all(row.draft_ms > 0 and row.decode_ms > 0 for row in wide + narrow)
    with pytest.raises(SpecchatError, match="--intermediate must be at least 0"):
        draft_cost(model, contexts=[64], vocabs=[0], budgets=[3], intermediate=-1)


def test_the_oracle_sets_tau_and_every_run_writes_plain_decodings_text(tokenizer):
    from specchat.bench.oracle import expected_tau, oracle_runs
    from specchat.engine.generate import Engine

    engine = Engine(tiny_model("llama", vocab_size=512, seed=4), tokenizer, max_len=128)
    prompt = list(range(40, 72))
    plain, never, sometimes, always = oracle_runs(engine, prompt, acceptances=[0, 0.7, 1], budget=3, tokens=41)
    assert (plain.acceptance, plain.tau, plain.vs_plain) == (None, 1.0, 1.0)
    assert never.tau == 1.0 and never.expected_tau == 1.0
    assert always.tau == 4.0 and always.expected_tau == 4.0  # 40 tokens after the first: 10 steps of 4
    assert 1.0 < sometimes.tau < 4.0 and sometimes.expected_tau == pytest.approx(expected_tau(0.7, 3), rel=1e-3)
    assert all(row.exact for row in (never, sometimes, always))
    assert engine.drafter is None


def test_the_oracle_at_the_adaptive_budget_drafts_what_pays_and_writes_plain_decodings_text(tokenizer):
    """`--budget auto`: the engine sizes the oracle's chains itself, as for a user's drafter; it drafts long chains
    when every node is right and drafts less when none is."""
    from specchat.bench.oracle import oracle_runs
    from specchat.engine.generate import Engine

    engine = Engine(tiny_model("llama", vocab_size=512, seed=4), tokenizer, max_len=200)
    prompt = list(range(40, 72))
    plain, never, always = oracle_runs(engine, prompt, acceptances=[0, 1], budget=None, tokens=120)
    assert never.expected_tau is None and always.expected_tau is None
    assert never.exact and always.exact and never.tau == 1.0
    assert always.tau > 2.0 and always.budget > never.budget
    assert plain.budget == 0 and engine.drafter is None


def test_the_oracle_interleaves_its_repeats_and_sums_them(tokenizer):
    """`--repeats`: every round runs plain decoding and each acceptance in turn, so a machine's drift moves them
    alike; the rows count every round's steps."""
    from specchat.bench.oracle import oracle_runs
    from specchat.engine.generate import Engine

    engine = Engine(tiny_model("llama", vocab_size=512, seed=4), tokenizer, max_len=128)
    steps: list[str] = []
    plain, never, always = oracle_runs(engine, list(range(40, 72)), acceptances=[0, 1], budget=3, tokens=41,
                                       repeats=2, step=steps.append)  # fmt: skip
    assert steps == ["warm-up", "plain decoding", "acceptance 0, repeat 1/2", "acceptance 1, repeat 1/2",
                     "plain decoding, repeat 2/2", "acceptance 0, repeat 2/2", "acceptance 1, repeat 2/2"]
    assert plain.exact and never.exact and always.exact
    assert (never.tau, always.tau) == (1.0, 4.0)
    with pytest.raises(SpecchatError, match="--repeats must be at least 1"):
        oracle_runs(engine, [40], acceptances=[1], budget=3, tokens=8, repeats=0)


def test_a_random_weight_model_writes_with_a_word_tokenizer():
    from specchat.bench.oracle import word_tokenizer

    words = word_tokenizer(1000)
    assert words.decode([5, 999]) == "<5> <999>" and words.eos_token_id is None
