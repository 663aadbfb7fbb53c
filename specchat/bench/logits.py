"""`specchat bench logits`: how far our logits on a GGUF's own blocks are from exact arithmetic, next to
llama.cpp's on the same file.

The reference is the file's weights dequantized by gguf-py (`gguf_model.dequantized_model`) and run densely in
fp32 by transformers: what the quantized model computes with no rounding but the quantization's own. Ours come from the
engine's forward on the blocks (bf16 or fp32 activations, as `--dtype` says), twice: as one prefill, and a
decode step at a time (the arithmetic every generated token and verified tree row gets); llama.cpp's from
llama-cpp-python with `logits_all`. Each is scored against the reference at every position of a real text:
mean KL divergence (nats), how often the top token agrees, and the largest and root-mean-square logit error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specchat.architectures import parts
from specchat.bench.llamacpp import check_amx_build
from specchat.errors import SpecchatError


@dataclass(frozen=True)
class LogitsRow:
    source: str  # whose logits: "specchat (...)" or "llama.cpp"
    tokens: int
    mean_kl: float  # KL(reference || these), nats per position
    top1_agreement: float  # positions whose most likely token is the reference's
    max_abs_error: float
    rms_error: float


def logits_accuracy(loaded, path: Path, ids: list[int], *, llamacpp: bool, kv_cache: str = "auto") -> list[LogitsRow]:
    """`loaded`: the GGUF at `path` on its own blocks (its window stretched by `loaded.yarn`, and so the reference's
    and llama.cpp's); `ids`: the text's token ids; `kv_cache`: our engine's."""
    reference = _reference_logits(path, ids, loaded.yarn)
    from specchat.engine.target_forward import held_kv_cache

    held = held_kv_cache(loaded.model, kv_cache)  # auto may mean bf16
    cache = "" if held == "auto" else f", kv {held}"
    rows = [_score(f"specchat ({loaded.weights}, {loaded.dtype}{cache}, {way})",
                   _our_logits(loaded, ids, way, kv_cache), reference) for way in ("prefill", "decode")]  # fmt: skip
    if llamacpp:
        rows.append(_score("llama.cpp", _llamacpp_logits(path, ids, loaded), reference))
    return rows


def text_ids(tokenizer, tokens: int) -> list[int]:
    """`tokens` token ids of real text that every machine has: the Python standard library's own source."""
    import argparse
    import inspect

    ids = tokenizer.encode(inspect.getsource(argparse))[:tokens]
    if len(ids) < tokens:
        raise SpecchatError(f"the text has only {len(ids)} tokens")
    return ids


@torch.inference_mode()
def _reference_logits(path: Path, ids: list[int], yarn: float | None) -> torch.Tensor:
    from specchat.loading import gguf_checkpoint
    from specchat.quant.gguf_model import dequantized_model

    model = dequantized_model(path, gguf_checkpoint(path), yarn=yarn)
    logits = model(torch.tensor([ids])).logits[0].float()
    del model
    return logits


@torch.inference_mode()
def _our_logits(loaded, ids: list[int], way: str, kv_cache: str) -> torch.Tensor:
    from specchat.engine.generate import Engine

    engine = Engine(loaded.model, loaded.tokenizer, max_len=len(ids) + 1, kv_cache=kv_cache)
    hidden = engine.target_states(ids) if way == "prefill" else engine.decode_states(ids)
    decoder = parts(loaded.model)
    logits = decoder.head(decoder.norm(hidden)).float() / decoder.logit_scale  # Granite's
    return logits if not decoder.logit_cap else torch.tanh(logits / decoder.logit_cap) * decoder.logit_cap  # Gemma 2's


def _llamacpp_logits(path: Path, ids: list[int], loaded) -> torch.Tensor:
    try:
        from llama_cpp import LLAMA_ROPE_SCALING_TYPE_YARN, Llama
    except ImportError:
        raise SpecchatError('--llamacpp needs llama-cpp-python: pip install -e ".[llamacpp]"') from None
    check_amx_build(str(path))
    stretch = {}
    if loaded.yarn:  # llama.cpp's `--rope-scaling yarn --rope-scale F --yarn-orig-ctx N`
        trained = loaded.model.config.rope_parameters["original_max_position_embeddings"]
        stretch = {"rope_scaling_type": LLAMA_ROPE_SCALING_TYPE_YARN, "rope_freq_scale": 1 / loaded.yarn,
                   "yarn_orig_ctx": trained}  # fmt: skip
    llm = Llama(str(path), n_ctx=len(ids) + 8, n_batch=512, logits_all=True, n_threads=torch.get_num_threads(),
                verbose=False, **stretch)  # fmt: skip
    llm.eval(ids)
    return torch.from_numpy(llm.scores[: len(ids)].copy()).float()


def _score(source: str, logits: torch.Tensor, reference: torch.Tensor) -> LogitsRow:
    error = logits - reference
    log_ref, log_ours = reference.log_softmax(-1), logits.log_softmax(-1)
    kl = (log_ref.exp() * (log_ref - log_ours)).sum(-1)
    return LogitsRow(
        source=source,
        tokens=reference.shape[0],
        mean_kl=round(float(kl.mean()), 6),
        top1_agreement=round(float((logits.argmax(-1) == reference.argmax(-1)).float().mean()), 4),
        max_abs_error=round(float(error.abs().max()), 4),
        rms_error=round(float(error.pow(2).mean().sqrt()), 4),
    )
