"""The CLI end to end: bad input gets one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from cli_fork import run_specchat, start_specchat

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def specchat(*args: str, stdin: str | None = None, warm: bool = False) -> subprocess.CompletedProcess:
    """`python -m specchat ARGS`, run to its end. `warm`: for a command that imports torch (one that loads a
    model, or a check that needs torch): the process is forked from an interpreter that has imported torch and
    transformers already (`cli_fork.py`), which saves the ~6 s of a cold start's imports; a command that exits
    before importing torch is quicker cold (a fork carries torch's ~2 s of interpreter exit)."""
    if warm:
        return run_specchat(args, env=ENV, stdin=stdin, timeout=300)
    return subprocess.run(
        [sys.executable, "-m", "specchat", *args], input=stdin, capture_output=True, text=True, env=ENV, timeout=300
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    # a notice of once-per-machine work that ran slow (specchat/first_use.py) may come first, on a busy machine
    notices = re.compile(r".*once per .*(\.\.\.|: done in \d+ s)$")
    lines = [line for line in result.stderr.splitlines() if line.strip() and not notices.fullmatch(line)]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("run", "hi", "--model", "no-such-alias"), ("unknown model", "smollm2-135m", "llama3.1-8b")),
        (("run", "hi", "--model", "./no/such/dir"), ("no such model directory",)),
        (("run", "hi", "--model", "nobody/not-a-model"), ("not available offline", "hf download")),
        (("run", "   "), ("prompt is empty",)),
        (("run", "hi", "--max-new-tokens", "0"), ("--max-new-tokens",)),
        (("run", "hi", "--dtype", "float8"), ("invalid dtype", "bfloat16")),
        (("run", "hi", "--kv-cache", "q4"), ("invalid --kv-cache", "int8")),
        (("run", "hi", "--yarn", "1"), ("--yarn takes the window's multiple, above 1", "not 1")),
        (("chat", "--yarn", "0.5"), ("--yarn takes the window's multiple",)),
        (("serve", "--yarn", "100"), ("--yarn takes the window's multiple",)),
        (("write", "--out", "b.txt", "--yarn", "-4"), ("--yarn takes the window's multiple",)),
        (("bench", "verify-cost", "--kv-cache", "int8"), ("--kv-cache needs --model",)),
        (("bench", "verify-cost", "--yarn", "2"), ("--yarn and --quantize need --model",)),
        (("bench", "oracle", "--quantize", "Q4_K_M"), ("--quantize needs --model",)),
        (("run", "hi", "--quantize", "q3_k_s"), ("invalid --quantize 'q3_k_s'", "q4_k_m, q8_0, int4, int8")),
        (("bench", "gpu-forward", "--tree", "999"), ("--tree must be between",)),
        (("run", "hi", "--device", "tpu"), ("device",)),
        (("run", "hi", "--device", "cuda:0"), ("cuda",)),
        (("run", "hi", "--drafter", "psychic"), ("unknown drafter", "none")),
        (("run", "hi", "--top-p", "1.5"), ("--top-p",)),
        (("run", "hi", "--chat-template", "/no/such/template.jinja"), ("--chat-template", "No such file")),
        (("serve", "--chat-template", "/no/such/template.jinja"), ("--chat-template", "No such file")),
        (("run", "hi", "--frequency-penalty", "3"), ("--frequency-penalty must be in [-2, 2]",)),
        (("chat", "--presence-penalty", "-2.5"), ("--presence-penalty must be in [-2, 2]",)),
        (("run", "hi", "--temperature", "inf"), ("--temperature",)),
        (("run", "hi", "--seed", "99999999999999999999"), ("--seed", "between")),
        (("run", "hi", "--stop", ""), ("--stop",)),
        (("chat", "--stop", ""), ("--stop",)),
        (("run", "hi", "-n", "4", "--min-tokens", "9"), ("--min-tokens takes 0 to --max-new-tokens (4), not 9",)),
        (("run", "hi", "--format", "json", "--min-tokens", "2"), ("--min-tokens with JSON mode",)),
        (("run", "hi", "--drafter", "none", "--draft-budget", "8"), ("--draft-budget needs a drafter",)),
        (("bench", "--plot", "/nonexistent/dir/p.png"), ("--plot", "/nonexistent/dir")),
        (("run", "hi", "--max-new-tokens", "many"), ("Invalid value for '--max-new-tokens'",)),
        (("chat", "--bogus"), ("No such option: --bogus",)),
        (("run",), ("Missing argument",)),
        (("chat", "--drafter", "psychic"), ("unknown drafter", "ngram")),
        (("chat", "--temperature", "-1"), ("temperature",)),
        (("chat", "--model", "no-such-alias"), ("unknown model",)),
        (("chat", "--context", "8"), ("context must hold",)),
        (("chat", "--max-new-tokens", "0"), ("at least 1",)),
        (("chat", "--attention", "flash"), ("unknown attention",)),
        (("chat", "--kv-cache", "q4"), ("invalid --kv-cache 'q4'", "int8")),
        (("serve", "--kv-cache", "q4"), ("invalid --kv-cache 'q4'", "int8")),
        (("chat", "--draft-budget", "999"), ("--draft-budget",)),
        (("write", "--tokens", "0", "--out", "b.txt"), ("--tokens must be at least 1",)),
        (("bench", "--drafter", "psychic"), ("unknown drafter",)),
        (("bench", "--temperature", "-0.5"), ("--temperature must be a number >= 0",)),
        (("bench", "--prompt-set", "poems"), ("unknown prompt set", "summarize")),
        (("bench", "--format", "yaml"), ("--format must be text or json",)),
        (("bench", "--format", "json", "--baseline", "hf"), ("no transformers baseline",)),
        (("bench", "--schema", "/no/such/schema.json"), ("--schema: cannot read",)),
        (("run", "hi", "--logprobs", "2"), ("--logprobs takes 0 to 20 alternatives, with --json",)),
        (("run", "hi", "--json", "--logprobs", "21"), ("--logprobs takes 0 to 20",)),
        (("bench", "--prompts", "missing.jsonl"), ("no such prompts file",)),
        (("run", "hi", "--drafter", "ngram", "--draft-budget", "0"), ("--draft-budget",)),
        (("run", "hi", "--attention", "flash"), ("unknown attention", "hybrid")),
        (("bench", "--attention", "flex"), ("unknown attention", "canonical")),
        (("bench", "context", "--attention", "flex"), ("unknown attention",)),
        (("bench", "oracle", "--acceptance", "often"), ("--acceptance takes comma-separated numbers",)),
        (("bench", "oracle", "--budget", "many"), ("--budget takes a number of nodes or auto, not 'many'",)),
        (("bench", "oracle", "--acceptance", "0.5,1.5"), ("an acceptance is a chance between 0 and 1, not 1.5",)),
        (("bench", "oracle", "--budget", "0"), ("--budget must be between 1 and 64",)),
        (("bench", "oracle", "--repeats", "0"), ("--repeats must be at least 1, not 0",)),
        (("run", "hi", "--drafter", "none:./draft"), ("none drafter takes no checkpoint",)),
        (("run", "hi", "--drafter", "ngram:/no/such/answers"), ("/no/such/answers", "no such checkpoint directory")),
        (("run", "hi", "--drafter", "longspec:"), ("checkpoint directory after the colon",)),
        (("run", "hi", "--drafter", "glide"),
         ("no published glide drafter", "it has: none, ngram, longspec", "glide:PATH")),
        (("run", "hi", "--drafter", "glide:/no/such/draft"), ("/no/such/draft", "no such checkpoint directory")),
        (("bench", "--drafter", "none,glide"), ("no published glide drafter",)),
        (("run", "hi", "--drafter", "ngram", "--draft-cache", "streaming"),
         ("--draft-cache is for the longspec and model drafters, not ngram",)),
        (("run", "hi", "--drafter", "longspec", "--draft-cache", "lru"), ("unknown --draft-cache 'lru'", "retrieval")),
        (("bench", "--drafter", "ngram", "--draft-cache", "full"), ("--draft-cache is for",)),
        (("chat", "--drafter", "ngram", "--draft-cache", "full"), ("--draft-cache is for",)),
        (("run", "hi", "--drafter", "model:/no/such/draft"), ("could not load the draft model '/no/such/draft'",)),
    ],
)
def test_bad_input_is_one_line(args, needles, monkeypatch, capfd):
    if args in REFUSED_AFTER_A_MODEL_LOADS:
        result = specchat(*args, warm=True)
    else:
        result = specchat_in_process(monkeypatch, capfd, *args)
    assert_one_line_error(result, *needles)


# the bad input above that is refused only once the model has loaded: each runs as a process of its own
REFUSED_AFTER_A_MODEL_LOADS = {
    ("run", "hi", "--drafter", "glide:/no/such/draft"),
    ("bench", "--drafter", "none,glide"),
    ("run", "hi", "--drafter", "model:/no/such/draft"),
}


def specchat_in_process(monkeypatch, capfd, *args: str) -> subprocess.CompletedProcess:
    """`specchat ARGS` through `command_status`, what `python -m specchat` and the console script run, in this
    process (as tests/test_bench_attention.py's bad input): for input refused before any model loads, where a
    process of its own costs 0.3 s, or 2 s once torch is imported. Everything written to the file descriptors
    of stdout and stderr is captured; an exception that escapes it fails the test, as a traceback would. The
    process-wide settings a command makes on its way (transformers' logging and progress bars) are put back."""
    from transformers.utils import logging

    from specchat.cli import command_status

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    monkeypatch.setattr(sys, "argv", ["specchat", *args])
    capfd.readouterr()  # what the test printed before
    try:
        code = command_status()
    finally:
        logging.set_verbosity(verbosity)
        (logging.enable_progress_bar if bars else logging.disable_progress_bar)()
    captured = capfd.readouterr()
    return subprocess.CompletedProcess(["specchat", *args], code, captured.out, captured.err)


@pytest.mark.slow
def test_prompt_longer_than_the_context(default_model):
    result = specchat("run", "-", "--max-new-tokens", "4", stdin="word " * 9000, warm=True)
    assert_one_line_error(result, "tokens; the context holds", "the model's window (--yarn F reads F times as many)")


@pytest.mark.slow
def test_a_chat_template_file_replaces_the_models_own(tmp_path, default_model):
    """`--chat-template FILE`: the prompt is rendered by the file (a shorter one: fewer prompt tokens than SmolLM2's
    own template with its default system prompt); a template that does not render is one line, before anything
    is generated."""
    short = tmp_path / "short.jinja"
    short.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip
    reports = [json.loads(specchat("run", "hi", "-n", "2", "--json", *extra, warm=True).stdout)
               for extra in ((), ("--chat-template", str(short)))]  # fmt: skip
    assert reports[1]["prompt_tokens"] < reports[0]["prompt_tokens"]
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% if %}")
    assert_one_line_error(specchat("run", "hi", "--chat-template", str(broken), warm=True), "does not render")


@pytest.mark.slow
def test_run_json_report(default_model):
    result = specchat("run", "What is the capital of France?", "--temperature", "0", "--json", "-n", "24",
                      "--drafter", "none", warm=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "Paris" in report["text"]
    assert report["new_tokens"] == len(report["token_ids"]) == len(report["origins"]) <= 24
    assert set(report["origins"]) == {"target"}
    assert report["mean_accepted_length"] == 1.0 and report["acceptance_rate"] is None
    assert report["steps"] == report["new_tokens"] - 1
    assert report["model"] == "smollm2-135m" and report["drafter"] == "none" and report["yarn"] is None
    result = specchat("run", "What is the capital of France?", "--temperature", "0", "--json", "-n", "24",
                      "--drafter", "none", "--ignore-eos", warm=True)  # fmt: skip
    endless = json.loads(result.stdout)  # the same answer, then on past where it ended
    assert endless["new_tokens"] == 24 and endless["finish_reason"] == "length"
    assert endless["token_ids"][: report["new_tokens"] - 1] == report["token_ids"][:-1]
    least = report["new_tokens"] + 2  # past where the free answer ended, drafted (the default drafter)
    result = specchat("run", "What is the capital of France?", "--temperature", "0", "--json", "-n", "24",
                      "--min-tokens", str(least), warm=True)  # fmt: skip
    held = json.loads(result.stdout)
    assert held["new_tokens"] >= least and held["token_ids"][: least] == endless["token_ids"][: least]
    for key in ("prefill_seconds", "decode_seconds", "tokens_per_second"):
        assert report[key] > 0


@pytest.mark.slow
def test_run_streams_text_and_a_stats_line(default_model):
    result = specchat("run", "Say hello.", "--temperature", "0", "-n", "16", "--seed", "1", warm=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "tok/s" in result.stderr.splitlines()[-1]


@pytest.mark.slow
def test_a_seed_gives_the_same_sampled_text_whatever_drafts_it(default_model):
    """`--seed`'s promise (the same seed, the same text): every draw is keyed by its place in the text, so neither the
    drafter nor the trees the adaptive budget sized (timed, so run to run they differ) change what is drawn; an
    unseeded run reports the seed it drew."""

    def sampled(*seed: str, drafter: str = "ngram") -> dict:
        result = specchat("run", "Write a short story about a lighthouse keeper.", "--temperature", "0.8", *seed,
                          "-n", "48", "--json", "--drafter", drafter, warm=True)  # fmt: skip
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    text = sampled("--seed", "1", drafter="none")["token_ids"]
    assert sampled("--seed", "1")["token_ids"] == sampled("--seed", "1")["token_ids"] == text
    assert sampled("--seed", "2")["token_ids"] != text
    unseeded = sampled()  # a seed of its own, reported: given back, it writes the same text
    assert unseeded["seed"] is not None
    assert sampled("--seed", str(unseeded["seed"]))["token_ids"] == unseeded["token_ids"]


def test_models_lists_profiles_and_availability():
    result = specchat("models", warm=True)
    assert result.returncode == 0, result.stderr
    for alias in ("smollm2-135m", "llama3.1-8b", "llama3-8b-262k", "qwen2.5-7b", "vicuna-7b-16k", "qwq-32b"):
        assert alias in result.stdout
    assert "smollm2-135m (default)" in result.stdout
    assert "here; drafters: none, ngram, longspec" in result.stdout  # the embedded model, nothing to download
    assert "longspec: smollm2-135m-longspec (here)" in result.stdout  # shipped in models/checkpoints
    assert "not cached (offline)" in result.stdout  # HF_HUB_OFFLINE: nothing claims it can download
    assert "tokenswift: TokenSwift/TokenSwift-Llama-3.1-8B (not cached (offline))" in result.stdout
    assert "longspec: sail/longspec-vicuna-7b-v1.5-16k (not cached (offline))" in result.stdout
    assert "longspec, glide, model, eagle3: none published; --drafter NAME:DIR runs a local checkpoint" in result.stdout
    assert "model: smollm2-135m-model (here)" in result.stdout
    assert "model: double7/vicuna-68m (not cached (offline))" in result.stdout  # SpecExtend's published pair


def test_models_says_what_is_not_here_cannot_come_down_with_no_connection(monkeypatch, capfd):
    from huggingface_hub import constants

    with socket.socket() as closed:  # a port nothing listens on once closed: the hub out of reach
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    result = specchat_in_process(monkeypatch, capfd, "models")
    assert result.returncode == 0, result.stderr
    assert "tokenswift: TokenSwift/TokenSwift-Llama-3.1-8B (not cached (no connection))" in result.stdout
    assert "longspec: smollm2-135m-longspec (here)" in result.stdout


@pytest.mark.slow
def test_run_with_a_local_longspec_checkpoint_matches_autoregressive(default_model, tmp_path):
    import torch

    from specchat.drafters.longspec.model import LongSpecConfig, LongSpecLayer, save_longspec

    torch.manual_seed(0)
    save_longspec(tmp_path / "draft", LongSpecLayer(LongSpecConfig.for_target(default_model.model.config)),
                  draft_vocab=torch.arange(8192))  # fmt: skip
    common = ("run", "Name three colours.", "--temperature", "0", "--json", "-n", "24")
    ar = json.loads(specchat(*common, "--drafter", "none", warm=True).stdout)
    result = specchat(*common, "--drafter", f"longspec:{tmp_path / 'draft'}", "--draft-budget", "7", warm=True)
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)
    assert spec["token_ids"] == ar["token_ids"]
    assert spec["drafter"] == f"longspec:{tmp_path / 'draft'}"


@pytest.mark.slow
def test_run_ngram_reports_drafted_tokens_and_matches_autoregressive(default_model):
    prompt = "Repeat this list exactly, twice: red, green, blue, yellow, purple, orange, black, white."
    common = ("run", prompt, "--temperature", "0", "--json", "-n", "48")
    ar = json.loads(specchat(*common, "--drafter", "none", warm=True).stdout)
    spec = json.loads(specchat(*common, "--drafter", "ngram", "--draft-budget", "8", warm=True).stdout)
    assert spec["token_ids"] == ar["token_ids"]
    assert spec["drafter"] == "ngram" and spec["draft_budget"] == 8
    assert "ngram" in spec["origins"] and spec["mean_accepted_length"] > 1.0
    assert spec["steps"] < ar["steps"]


def _bytes_run(args: list[bytes], stdin: bytes = b"", **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable.encode(), b"-m", b"specchat", *args], input=stdin, capture_output=True,
                          env=ENV, timeout=300, **kwargs)  # fmt: skip


def test_input_that_is_not_utf8_is_refused():
    for result, needle in (
        (_bytes_run([b"run", b"-"], stdin=b"hi \xff\xfe"), "the prompt on stdin is not valid UTF-8"),
        (_bytes_run([b"run", b"hi \xff"]), "the prompt is not valid UTF-8"),
    ):
        assert result.returncode == 1
        assert result.stderr.decode().strip() == f"error: {needle}"


@pytest.mark.slow
def test_threads_set_the_cpu_threads_and_leave_the_answer_as_it_is(default_model):
    """llama.cpp's -t: the answer is the same on one thread as on two (each row's sums are fixed by its own keys
    and weights, not by how the work is split), and the report names the count."""
    reports = []
    for threads in ("1", "2"):
        result = specchat("run", "Name three colours.", "--temperature", "0", "--json", "-n", "12", "--threads",
                          threads, warm=True)  # fmt: skip
        assert result.returncode == 0, result.stderr
        reports.append(json.loads(result.stdout))
    assert reports[0]["forward"].endswith(", 1 thread") and reports[1]["forward"].endswith(", 2 threads")
    assert reports[0]["token_ids"] == reports[1]["token_ids"]


@pytest.mark.parametrize("command", [("run", "hi"), ("chat",), ("write", "--out", "book.txt"), ("serve",), ("bench",),
                                     ("bench", "verify-cost")])  # fmt: skip
def test_threads_below_one_are_refused_before_loading(command):
    result = refused_before_loading(*command, "--threads", "0")
    assert_one_line_error(result, "--threads must be at least 1, not 0")
    assert result.stdout.strip() == "False"


def test_version_is_printed_without_importing_torch():
    from importlib.metadata import version

    result = refused_before_loading("--version")
    printed, imported = result.stdout.splitlines()
    assert result.returncode == 0 and printed.startswith(f"specchat {version('specchat')} (torch {version('torch')}")
    assert imported == "False"


def test_chat_refuses_to_run_without_a_terminal():
    assert_one_line_error(specchat("chat", stdin="", warm=True), "chat needs a terminal")


@pytest.mark.parametrize(("command", "echo"), [("chat", False), ("run", True)])
def test_chat_stops_the_terminals_echo_before_importing_the_command_line(command, echo):
    """Keys typed as `specchat chat` starts are the app's to read: the terminal stops echoing them before the command
    line's imports (~0.2 s), not after. Other commands leave the terminal as it is."""
    import pty

    code = ("import sys, termios\n"
            f"sys.argv = ['specchat', '{command}']\n"
            "class Imports:  # reports the echo as the command line is imported\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'specchat.cli':\n"
            "            print(bool(termios.tcgetattr(0)[3] & termios.ECHO), file=sys.stderr)\n"
            "            sys.exit(0)\n"
            "sys.meta_path.insert(0, Imports())\n"
            "from specchat.launch import main\n"
            "main()\n")  # fmt: skip
    terminal, side = pty.openpty()
    try:
        result = subprocess.run([sys.executable, "-c", code], stdin=side, capture_output=True, text=True, env=ENV,
                                timeout=60)  # fmt: skip
    finally:
        os.close(terminal)
        os.close(side)
    assert result.returncode == 0 and result.stderr.strip() == str(echo), result.stderr


def refused_before_loading(*args: str) -> subprocess.CompletedProcess:
    """`specchat ARGS` run in a fresh interpreter whose stdout says whether torch was imported before the exit:
    a refusal that comes before any model load imports none of it."""
    code = (
        f"import sys; from specchat.cli import command_status; sys.argv = ['specchat', *{list(args)!r}]\n"
        "status = command_status()\nprint('torch' in sys.modules)\nsys.exit(status)"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)


def test_train_refuses_bad_output_and_options_before_loading(monkeypatch, capfd):
    """`--out` is checked before any model load, the options before the files they name."""
    result = refused_before_loading("train", "data", "--out", "/dev/null")
    assert_one_line_error(result, "--out /dev/null exists and is not a directory")
    assert result.stdout.strip() == "False"
    for args, needle in [
        (("train", "longspec", "--data", "/no/data", "--out", "/dev/null"),
         "--out /dev/null exists and is not a directory"),
        (("train", "glide", "--data", "/no/data", "--out", "o", "--lr", "nan"), "--lr"),
        (("train", "model-drafter", "--data", "/no/data", "--out", "o", "--epochs", "inf"), "--epochs"),
    ]:
        assert_one_line_error(specchat_in_process(monkeypatch, capfd, *args), needle)


def test_option_errors_do_not_import_torch():
    """Option checks answer before anything slow is imported (a bad flag used to take 1.5-2.7 s)."""
    code = (
        "import sys; from specchat.cli import command_status; sys.argv = ['specchat', 'run', 'hi', '--top-p', '2']\n"
        "command_status()\nprint('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_the_command_line_gives_specchats_warnings_one_line_each():
    code = ("import pathlib, sys, warnings; from specchat.cli import _one_line_warning; "
            "from specchat.engine.verify_cost import VerifyCost, cached_verify_cost; "
            "warnings.showwarning = _one_line_warning; "
            "cached_verify_cost(pathlib.Path(sys.argv[1]), 'a', lambda: VerifyCost((0,), (1.0,))); "
            "warnings.warn('not ours')")  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        result = subprocess.run([sys.executable, "-c", code, directory], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == f"warning: could not keep {directory} (Is a directory): it is measured again next time"
    assert lines[1].endswith("UserWarning: not ours")  # another's, as Python shows it

def test_no_arguments_print_the_help_once():
    result = specchat()
    assert result.stdout.count("Usage:") == 1


@pytest.mark.slow
def test_an_output_that_cannot_be_written_is_one_line(default_model):
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "specchat", "run", "hi", "-n", "2"], stdout=full,
                                stderr=subprocess.PIPE, text=True, env=ENV, timeout=300)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == "error: cannot write the output: No space left on device"



def test_a_file_that_cannot_be_written_is_named_in_its_one_line():
    """An OSError that escapes a command (a file specchat writes on a full disk) names its file, not the output."""
    code = ("import sys, specchat.profiles as profiles; from specchat.cli import command_status\n"
            "def full(): raise OSError(28, 'No space left on device', '/full/x')\n"
            "profiles.load_profiles = full; sys.argv = ['specchat', 'models']; command_status()")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert result.returncode == 1
    assert result.stderr == "error: /full/x: No space left on device\n"

@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(default_model):
    """`specchat run ... | head -c 1`: the reader leaves after a byte; specchat stops without a word, exit 0."""
    command = (f"{sys.executable} -m specchat run 'Count from 1 to 100, one number per line.' -n 300 "
               "--temperature 0 | head -c 1 > /dev/null; exit ${PIPESTATUS[0]}")  # fmt: skip
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=ENV, timeout=300)
    assert (result.returncode, result.stderr) == (0, "")


def test_the_attention_help_lists_every_choice():
    from specchat.engine.attention import CHOICES

    help_text = " ".join(specchat("run", "--help").stdout.split())
    assert all(choice in help_text for choice in CHOICES) and "canonical" in help_text


@pytest.mark.slow
def test_run_without_a_decode_step_says_so(default_model):
    result = specchat("run", "Say hello.", "-n", "1", warm=True)
    assert result.returncode == 0, result.stderr
    assert "no decode step" in result.stderr and "0.0 tok/s" not in result.stderr


def _interrupted(*args: str, wait: float | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """`specchat ARGS` sent SIGINT (Ctrl-C) once it has streamed some output, or after `wait` seconds when
    nothing streams (--json); also the seconds it ran before the signal."""
    start = time.monotonic()
    process = start_specchat(args, env=ENV)  # forked from a warm interpreter (cli_fork.py), signalled by its pid
    if wait is None:
        process.stdout.read(20)  # the answer is streaming
    else:
        time.sleep(wait)
    elapsed = time.monotonic() - start
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), elapsed


@pytest.mark.slow
def test_ctrl_c_exits_130_with_what_was_produced(default_model):
    prompt = "Write a very long story about a dragon and a lighthouse."
    # greedy and autoregressive: 4000 tokens, about 20 s here (a sampled story may end before the signal)
    long_run = ("run", prompt, "-n", "4000", "--temperature", "0", "--drafter", "none")
    streamed, to_first_output = _interrupted(*long_run)
    assert streamed.returncode == 130
    stats, notice = streamed.stderr.strip().splitlines()[-2:]
    assert "(interrupted)" in stats and "tok/s" in stats and notice == "interrupted"
    # --json streams nothing: signal well after the streamed run's first output (load times vary on a busy machine)
    report, _ = _interrupted(*long_run, "--json", wait=2 * to_first_output + 2)
    assert report.returncode == 130
    result = json.loads(report.stdout)
    assert result["finish_reason"] == "interrupted" and result["new_tokens"] == len(result["token_ids"]) > 0


def test_reading_the_prompt_from_a_terminal_says_so():
    """`run -` on a terminal tells the user it waits for stdin (it used to wait silently)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin and stdout are the terminal
        os.execve(sys.executable, [sys.executable, "-m", "specchat", "run", "-"], ENV)
    output = b""
    deadline = time.monotonic() + 30
    while b"Ctrl-D ends" not in output and time.monotonic() < deadline:
        output += os.read(fd, 1024)
    os.write(fd, b"\x04")  # Ctrl-D: an empty prompt
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 1024)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    _, status = os.waitpid(pid, 0)
    text = output.decode()
    assert "reading the prompt from stdin (Ctrl-D ends)" in text and "error: the prompt is empty" in text
    assert os.waitstatus_to_exitcode(status) == 1


def test_slow_first_use_work_says_what_it_is_and_quick_work_says_nothing(monkeypatch):
    """A first run compiled the CPU decoder and timed this CPU for minutes without a word."""
    from specchat import first_use

    lines = []
    monkeypatch.setattr(first_use, "AFTER_SECONDS", 0.05)
    first_use.tell(lines.append)
    try:
        with first_use.first_use("compiling the thing (once per machine)"):
            time.sleep(0.3)
        with first_use.first_use("a cached step"):
            pass
    finally:
        first_use.tell(first_use._stderr)
    assert lines == ["compiling the thing (once per machine) ...",
                     "compiling the thing (once per machine): done in 0 s"]
