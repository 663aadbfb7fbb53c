"""Embeddings of texts, as OpenAI's `/v1/embeddings` and Ollama's `/api/embed` and `/api/embeddings` give them.

A generative model's embedding of a text is its final norm's output averaged over the text's tokens
(`Engine.embedding`: mean pooling, what Ollama and llama-server do for a model that declares no pooling of its own).
`/v1/embeddings` and `/api/embed` scale it to unit length, so that cosine similarity is a dot product;
`/api/embeddings`, Ollama's older route, gives it as it is. `dimensions` keeps the first N values, then scales
them to unit length. OpenAI's `encoding_format` "base64" (what its Python client asks for) is the little-endian
float32 bytes. A text too long for the context is refused, or with Ollama's `truncate` (its default) cut to fit.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import torch

from specchat.server.requests import RequestError, json_object, model_name

MAX_INPUTS = 2048  # texts a request may embed, as OpenAI's limit


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str | None
    inputs: list[str | list[int]]  # texts, or their token ids
    route: str  # "openai", "ollama" (/api/embed) or "ollama-legacy" (/api/embeddings)
    dimensions: int | None = None  # the first N values, scaled to unit length
    base64: bool = False
    truncate: bool = False  # a text longer than the context is cut to fit, not refused

    @property
    def unit_length(self) -> bool:
        return self.route != "ollama-legacy"


def openai_embedding_request(body: object) -> EmbeddingRequest:
    """`POST /v1/embeddings`: `input` a text, token ids, or a list of either."""
    body = json_object(body)
    given = body.get("input")
    if isinstance(given, str) or _is_ids(given):
        inputs = [given]
    elif isinstance(given, list) and given and all(isinstance(each, str) or _is_ids(each) for each in given):
        inputs = given
    else:
        raise RequestError("input must be a text, token ids, or a list of texts or of token ids", param="input")
    if any(not each for each in inputs):
        raise RequestError("input must not be empty", param="input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise RequestError('encoding_format must be "float" or "base64"', param="encoding_format")
    return EmbeddingRequest(model_name(body), _limited(inputs), "openai", _dimensions(body),
                            base64=encoding == "base64")  # fmt: skip


def ollama_embedding_request(body: object, *, legacy: bool) -> EmbeddingRequest:
    """`POST /api/embed` (`input`: a text or a list of texts; no input only loads the model, as Ollama's clients
    ask) or, `legacy`, `POST /api/embeddings` (`prompt`: one text)."""
    body = json_object(body)
    name = "prompt" if legacy else "input"
    given = body.get(name)
    if given is None or given == "":
        inputs = []
    elif isinstance(given, str):
        inputs = [given]
    elif not legacy and isinstance(given, list) and all(isinstance(each, str) and each for each in given):
        inputs = given
    else:
        raise RequestError(f"{name} must be " + ("a text" if legacy else "a text or a list of texts"), param=name)
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise RequestError("truncate must be a boolean", param="truncate")
    dimensions = None if legacy else _dimensions(body)
    return EmbeddingRequest(model_name(body), _limited(inputs), "ollama-legacy" if legacy else "ollama", dimensions,
                            truncate=truncate)  # fmt: skip


def input_ids(wanted: EmbeddingRequest, tokenizer, capacity: int, width: int) -> list[list[int]]:
    """Each input's token ids, refused or cut (`truncate`) where they would not fit the context's `capacity`;
    `dimensions` checked against the model's `width` (its hidden size)."""
    if wanted.dimensions is not None and wanted.dimensions > width:
        raise RequestError(f"dimensions must be at most the model's {width}", param="dimensions")
    texts = []
    for index, given in enumerate(wanted.inputs):
        ids = tokenizer.encode(given) if isinstance(given, str) else given
        if max(ids, default=0) >= len(tokenizer):
            raise RequestError(f"token ids must be below the vocabulary size {len(tokenizer)}", param="input")
        if len(ids) >= capacity:
            if not wanted.truncate:
                raise RequestError(f"input {index} has {len(ids)} tokens; the context holds {capacity - 1} to embed "
                                   "(start the server with a larger --context)", param="input")  # fmt: skip
            ids = ids[: capacity - 1]
        texts.append(ids)
    return texts


def embedding_body(wanted: EmbeddingRequest, model: str, vectors: list[torch.Tensor], tokens: int,
                   seconds: float) -> dict:  # fmt: skip
    """The response: `vectors` (one per input, as `Engine.embedding` gives them) in the route's shape."""
    shaped = [_shaped(vector, wanted) for vector in vectors]
    if wanted.route == "ollama-legacy":
        return {"embedding": shaped[0].tolist() if shaped else []}
    if wanted.route == "ollama":
        nanoseconds = round(seconds * 1e9)
        return {"model": model, "embeddings": [vector.tolist() for vector in shaped],
                "total_duration": nanoseconds, "load_duration": 0, "prompt_eval_count": tokens}  # fmt: skip
    data = [{"object": "embedding", "index": index, "embedding": _encoded(vector, wanted.base64)}
            for index, vector in enumerate(shaped)]  # fmt: skip
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _shaped(vector: torch.Tensor, wanted: EmbeddingRequest) -> torch.Tensor:
    kept = vector[: wanted.dimensions] if wanted.dimensions is not None else vector
    return torch.nn.functional.normalize(kept, dim=0) if wanted.unit_length else kept


def _encoded(vector: torch.Tensor, as_base64: bool) -> list[float] | str:
    if not as_base64:
        return vector.tolist()
    return base64.b64encode(vector.to(torch.float32).numpy().astype("<f4").tobytes()).decode("ascii")


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in value)  # fmt: skip


def _dimensions(body: dict) -> int | None:
    value = body.get("dimensions")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise RequestError("dimensions must be a positive integer", param="dimensions")
    return value


def _limited(inputs: list) -> list:
    if len(inputs) > MAX_INPUTS:
        raise RequestError(f"at most {MAX_INPUTS} inputs a request, not {len(inputs)}", param="input")
    return inputs
