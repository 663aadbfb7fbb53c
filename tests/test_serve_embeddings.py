"""Embeddings: OpenAI's `/v1/embeddings` and Ollama's `/api/embed` / `/api/embeddings` read as their clients send
them, and the official `openai` and `ollama` clients talking to the real app over a small engine (no socket),
against the engine's own pooled states; the embedded model's vectors placing texts by meaning."""

from __future__ import annotations

import asyncio
import itertools

import httpx
import ollama
import pytest
import torch
from conftest import tiny_model
from test_tool_calls import InProcessServer

from specchat.engine.generate import Engine
from specchat.server.embeddings import ollama_embedding_request, openai_embedding_request
from specchat.server.requests import RequestError

TEXTS = ["The cat sat on the mat.", "Quarterly revenue rose by five percent."]


def test_each_form_of_input_is_read():
    assert openai_embedding_request({"input": "hi"}).inputs == ["hi"]
    assert openai_embedding_request({"input": [5, 6]}).inputs == [[5, 6]]
    both = openai_embedding_request({"input": [[5, 6], [7]], "encoding_format": "base64", "dimensions": 8})
    assert both.inputs == [[5, 6], [7]] and both.base64 and both.dimensions == 8 and both.unit_length
    embed = ollama_embedding_request({"model": "m", "input": TEXTS}, legacy=False)
    assert embed.inputs == TEXTS and embed.truncate and embed.unit_length and embed.model == "m"
    assert ollama_embedding_request({"model": "m"}, legacy=False).inputs == []  # how a client loads the model
    legacy = ollama_embedding_request({"prompt": "hi", "options": {"temperature": 0}}, legacy=True)
    assert legacy.inputs == ["hi"] and not legacy.unit_length


@pytest.mark.parametrize(("body", "param"), [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["a", 3]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": ["a"] * 2049}, "input"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "model": 3}, "model"),
])  # fmt: skip
def test_openai_bodies_at_fault_are_refused_by_name(body, param):
    with pytest.raises(RequestError) as refused:
        openai_embedding_request(body)
    assert refused.value.param == param


@pytest.mark.parametrize(("body", "legacy", "param"), [
    ({"input": ["a", ""]}, False, "input"),
    ({"input": 3}, False, "input"),
    ({"input": "a", "truncate": "yes"}, False, "truncate"),
    ({"prompt": ["a"]}, True, "prompt"),
])  # fmt: skip
def test_ollama_bodies_at_fault_are_refused_by_name(body, legacy, param):
    with pytest.raises(RequestError) as refused:
        ollama_embedding_request(body, legacy=legacy)
    assert refused.value.param == param


@pytest.fixture(scope="module")
def server(tokenizer):
    server = InProcessServer(Engine(tiny_model("llama", seed=5), tokenizer, max_len=256), tokenizer)
    yield server
    server.close()


def _pooled(server, text: str) -> torch.Tensor:
    """The engine's embedding of `text`, from an engine of its own over the server's model (the server idle)."""
    served = server.worker.served
    return Engine(served.engine.model, served.tokenizer, max_len=256).embedding(served.tokenizer.encode(text))


def test_the_openai_client_gets_unit_vectors_of_the_pooled_states(server):
    client = server.client
    as_base64 = client.embeddings.create(model="tiny", input=TEXTS)  # the client's default encoding
    as_floats = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    alone = [client.embeddings.create(model="tiny", input=text, encoding_format="float") for text in TEXTS]
    ids = server.worker.served.tokenizer.encode(TEXTS[0])
    by_ids = client.embeddings.create(model="tiny", input=ids, encoding_format="float")
    short = client.embeddings.create(model="tiny", input=TEXTS[0], dimensions=8, encoding_format="float")
    vectors = [torch.tensor(each.embedding) for each in as_floats.data]
    assert [each.index for each in as_floats.data] == [0, 1]
    assert as_floats.usage.prompt_tokens == sum(len(server.worker.served.tokenizer.encode(t)) for t in TEXTS)
    assert [each.embedding for each in as_base64.data] == [each.embedding for each in as_floats.data]
    assert [each.data[0].embedding for each in alone] == [each.embedding for each in as_floats.data]  # batch or not
    assert by_ids.data[0].embedding == as_floats.data[0].embedding
    for text, vector in zip(TEXTS, vectors):
        expected = torch.nn.functional.normalize(_pooled(server, text), dim=0)
        assert len(vector) == server.worker.served.engine.model.config.hidden_size
        torch.testing.assert_close(vector, expected)
    head = torch.nn.functional.normalize(vectors[0][:8], dim=0)
    torch.testing.assert_close(torch.tensor(short.data[0].embedding), head)


def test_the_ollama_client_embeds_as_ollama_does(server):
    async def ask():
        client = ollama.AsyncClient(host="http://testserver", transport=httpx.ASGITransport(app=server.http.app))
        return (await client.embed("tiny:latest", TEXTS), await client.embed("tiny"),
                await client.embeddings("tiny", TEXTS[0]))  # fmt: skip

    embedded, loaded, legacy = asyncio.run(ask())
    floats = server.client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    assert embedded.embeddings == [each.embedding for each in floats.data]
    assert embedded.prompt_eval_count == floats.usage.prompt_tokens and embedded.total_duration > 0
    assert loaded.embeddings == []
    torch.testing.assert_close(torch.tensor(legacy.embedding), _pooled(server, TEXTS[0]))  # not scaled


def test_a_text_too_long_is_refused_or_cut_and_answers_stay_exact(server):
    post = server.http.post
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 12}
    before = post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
    capacity = server.worker.served.engine.capacity
    long = list(itertools.islice(itertools.cycle([5, 6, 7]), capacity + 10))
    refused = post("/v1/embeddings", json={"model": "tiny", "input": long})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input"
    assert f"holds {capacity - 1}" in refused.json()["error"]["message"]
    text = " ".join(["word"] * capacity)
    cut = post("/api/embed", json={"model": "tiny", "input": text})
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == capacity - 1
    kept_whole = post("/api/embed", json={"model": "tiny", "input": text, "truncate": False})
    assert kept_whole.status_code == 400 and "tokens" in kept_whole.json()["error"]
    wide = post("/v1/embeddings", json={"model": "tiny", "input": "a", "dimensions": 10_000})
    assert wide.status_code == 400 and wide.json()["error"]["param"] == "dimensions"
    assert post("/v1/embeddings", json={"model": "gpt-4", "input": "a"}).status_code == 404
    after = post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
    assert after == before  # the embeddings changed nothing an answer depends on


def test_an_embedding_leaves_the_conversations_cache_as_it_was(tokenizer):
    engine = Engine(tiny_model("llama", seed=5), tokenizer, max_len=256)
    prompt = tokenizer.encode("Once upon a time")
    answer = [token for event in engine.generate(prompt, max_new_tokens=8) for token in event.tokens]
    length, ids = engine.cache.length, engine.ids[: engine.cache.length]
    engine.embedding(tokenizer.encode(TEXTS[1]))
    assert engine.cache.length == length and engine.ids[:length] == ids
    turn = prompt + answer + tokenizer.encode(" and then")
    [*_, last] = engine.generate(turn, max_new_tokens=2)
    assert last.stats.reused_tokens == length  # the next turn prefills only what is new


@pytest.mark.slow
def test_the_default_model_places_texts_by_meaning(default_model):
    engine = Engine(default_model.model, default_model.tokenizer, max_len=512)
    texts = ["The cat sat on the mat.", "A kitten rests on a carpet.", "Quarterly revenue rose by five percent."]
    cat, kitten, revenue = (torch.nn.functional.normalize(engine.embedding(default_model.tokenizer.encode(t)),
                                                          dim=0) for t in texts)  # fmt: skip
    assert cat @ kitten > max(cat @ revenue, kitten @ revenue) + 0.1
