"""`specchat serve` as a real process on a free port, driven by the official `openai` client and by raw HTTP."""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from cli_fork import run_specchat

from specchat.engine.prompt import encode_chat

KEY = "sk-specchat-test"
MODEL = "smollm2-135m"
COLOURS = [{"role": "user", "content": "List three colours."}]
PROMPTS = ["List three colours.", "Name two rivers.", "What is 2 + 3?", "Say hello in French."]
COUNTING = "1, 2, 3, 4, 5, 6,"  # the model counts on for as long as it is let
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


class Server:
    def __init__(self, *args: str):
        self.process = subprocess.Popen([sys.executable, "-m", "specchat", "serve", "--port", "0", *args],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        env=ENV)  # fmt: skip
        self.lines = []
        while "listening on" not in (line := self._line()):
            assert line, f"the server ended before listening: {self.lines}"
        self.port = int(line.rsplit(":", 1)[1].split()[0])

    def wait_ready(self) -> None:
        while "ready at" not in (line := self._line()):
            assert line, f"the server ended before it was ready: {self.lines}"

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0)

    def request(self, method: str, path: str, body=None, *, key: str | None = KEY, raw: bytes | None = None):
        """(status, headers, parsed JSON body) of one raw HTTP request."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
        connection.request(method, path, raw if raw is not None else json.dumps(body) if body is not None else None,
                           headers)  # fmt: skip
        response = connection.getresponse()
        payload = response.read()
        connection.close()
        return response.status, response.headers, json.loads(payload) if payload else None

    def open_stream(self, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                           {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})  # fmt: skip
        response = connection.getresponse()
        assert response.status == 200
        return connection, response

    def health(self) -> dict:
        return self.request("GET", "/health", key=None)[2]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)

    def _line(self) -> str:
        line = self.process.stderr.readline()
        self.lines.append(line)
        return line


def events(response) -> list:
    """The server-sent events of a stream, as parsed JSON, and "[DONE]"."""
    found = []
    for line in response:
        line = line.decode().strip()
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            found.append(data if data == "[DONE]" else json.loads(data))
            if data == "[DONE]":
                break
    return found


@pytest.fixture(scope="module")
def server():
    running = Server("--api-key", KEY, "--context", "1024", "--max-body-mb", "0.05")
    running.wait_ready()
    yield running
    assert running.stop() == 0


def at_once(client, count: int) -> None:
    """`client(index)` for `count` indices, each on a thread of its own, all at once; their errors raised here."""
    errors = []

    def run(index: int) -> None:
        try:
            client(index)
        except Exception as error:  # reported below, with the others
            errors.append(error)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def chat(server, messages, **fields) -> str:
    reply = server.client().chat.completions.create(model=MODEL, messages=messages, temperature=0, **fields)
    return reply.choices[0].message.content


def test_a_greedy_answer_is_what_specchat_run_prints(server):
    run = run_specchat(["run", COLOURS[0]["content"], "--temperature", "0", "-n", "24", "--json"], env=ENV)
    expected = json.loads(run.stdout)
    reply = server.client().chat.completions.create(model=MODEL, messages=COLOURS, temperature=0, max_tokens=24)
    [choice] = reply.choices
    assert choice.message.content == expected["text"] and choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (expected["prompt_tokens"], 24)
    figures = reply.model_extra["specchat"]
    assert figures["drafter"] == "ngram" and len(figures["origins"]) == len(expected["origins"]) == 24
    # which tokens were drafted is timed, not fixed: the budget keeps the nodes that pay on this machine now
    assert figures["drafted_tokens"] == sum(origin != "target" for origin in figures["origins"])


def test_json_mode_and_grammars_hold_the_answer(server):
    """`response_format: {"type": "json_object"}` (the OpenAI client's JSON mode), a schema, llama-server's `grammar`
    and vLLM's `structured_outputs` reach the engine's constraint."""
    messages = [{"role": "user", "content": "Give the name, age and city of a fictional person as JSON."}]
    reply = server.client().chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=120,
                                                    response_format={"type": "json_object"})  # fmt: skip
    [choice] = reply.choices
    assert choice.finish_reason == "stop" and isinstance(json.loads(choice.message.content), dict)
    schema = {"type": "object", "required": ["name", "age"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}  # fmt: skip
    reply = server.client().chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": schema}})
    value = json.loads(reply.choices[0].message.content)
    assert list(value) == ["name", "age"] and isinstance(value["age"], int)
    grammar = r'root ::= "Name: " [A-Z] [a-z]+ "\nAge: " [1-9] [0-9]?'
    reply = server.client().completions.create(model=MODEL, prompt="A person:\n", temperature=0, max_tokens=30,
                                               extra_body={"grammar": grammar})  # fmt: skip
    assert re.fullmatch(r"Name: [A-Z][a-z]+\nAge: [1-9][0-9]?", reply.choices[0].text)
    review = [{"role": "user", "content": "Is this review positive or negative? 'I loved every minute of it.'"}]
    reply = server.client().chat.completions.create(model=MODEL, messages=review, temperature=0, max_tokens=10,
                                                    extra_body={"structured_outputs": {"choice": ["positive",
                                                                                                  "negative"]}})
    assert reply.choices[0].message.content in ("positive", "negative")


def test_logprobs_of_every_token_whole_and_streamed(server):
    """Chat's `logprobs` / `top_logprobs` and a completion's `logprobs`: one entry a completion token, their texts
    the answer's, the greedy token the most likely, a stream's chunks the whole answer's entries."""
    client = server.client()
    reply = client.chat.completions.create(model=MODEL, messages=COLOURS, temperature=0, max_tokens=16, logprobs=True,
                                           top_logprobs=3)  # fmt: skip
    [choice] = reply.choices
    content = choice.logprobs.content
    assert len(content) == reply.usage.completion_tokens == 16
    assert "".join(entry.token for entry in content) == choice.message.content
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
        assert entry.logprob == entry.top_logprobs[0].logprob <= 0 and bytes(entry.bytes).decode() == entry.token
        assert [e.logprob for e in entry.top_logprobs] == sorted((e.logprob for e in entry.top_logprobs), reverse=True)
    stream = client.chat.completions.create(model=MODEL, messages=COLOURS, temperature=0, max_tokens=16, logprobs=True,
                                            top_logprobs=3, stream=True)  # fmt: skip
    streamed = [entry for chunk in stream for c in chunk.choices if c.logprobs for entry in c.logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    text = client.completions.create(model=MODEL, prompt="The colours of the rainbow are", max_tokens=8, temperature=0,
                                     logprobs=2)  # fmt: skip
    scored = text.choices[0].logprobs
    assert len(scored.tokens) == len(scored.token_logprobs) == len(scored.top_logprobs) == 8
    assert "".join(scored.tokens) == text.choices[0].text
    assert scored.text_offset == [sum(map(len, scored.tokens[:i])) for i in range(8)]
    assert all(len(top) == 2 for top in scored.top_logprobs)


def test_echo_scores_the_prompt_as_evaluation_harnesses_ask(server, tokenizer):
    """`echo` with `logprobs` (lm-eval's loglikelihood: token ids, one token generated; or `max_tokens: 0`, the prompt
    alone): the text begins with the prompt, one entry a prompt token (the first None), then the completion's; the
    prompt's entries the same either way and streamed."""
    client = server.client()
    prompt = "The colours of the rainbow are red, orange, yellow"
    alone = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0)
    [choice] = alone.choices
    scored = choice.logprobs
    count = alone.usage.prompt_tokens
    assert choice.text == prompt and choice.finish_reason == "length" and alone.usage.completion_tokens == 0
    assert len(scored.tokens) == len(scored.token_logprobs) == count > 5 and "".join(scored.tokens) == prompt
    assert scored.token_logprobs[0] is None and scored.top_logprobs[0] is None
    assert all(lp <= max(top.values()) <= 0 for lp, top in zip(scored.token_logprobs[1:], scored.top_logprobs[1:]))
    ids = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0).usage
    assert ids.prompt_tokens == count
    tokens = tokenizer.encode(prompt)  # the embedded model's, as the server's
    harness = client.completions.create(model=MODEL, prompt=[tokens], max_tokens=1, echo=True, logprobs=1,
                                        temperature=0)  # fmt: skip
    [choice] = harness.choices
    assert choice.text.startswith(prompt) and len(choice.logprobs.token_logprobs) == count + 1
    assert choice.logprobs.token_logprobs[:count] == scored.token_logprobs
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True, logprobs=1,
                                         temperature=0, stream=True)  # fmt: skip
    chunks = [chunk.choices[0] for chunk in streamed if chunk.choices]
    assert chunks[0].text == prompt and chunks[0].logprobs.token_logprobs == scored.token_logprobs
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True, temperature=0)
    assert plain.choices[0].text.startswith(prompt) and plain.choices[0].logprobs is None


def test_logit_bias_bans_and_favours_tokens(server, tokenizer):
    client = server.client()
    first = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=1, temperature=0).choices[0].text
    [token] = tokenizer.encode(first, add_special_tokens=False)
    banned = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=1, temperature=0,
                                       logit_bias={str(token): -100}).choices[0].text  # fmt: skip
    favoured = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=3, temperature=0,
                                         logit_bias={str(token): 100}).choices[0].text  # fmt: skip
    assert banned != first and favoured == first * 3
    short = [{"role": "user", "content": "Say hi."}]
    ends = client.chat.completions.create(model=MODEL, messages=short, max_tokens=40, temperature=0)
    runs_on = client.chat.completions.create(model=MODEL, messages=short, max_tokens=40, temperature=0,
                                             extra_body={"ignore_eos": True})  # fmt: skip
    assert ends.choices[0].finish_reason == "stop" and ends.usage.completion_tokens < 40
    assert runs_on.choices[0].finish_reason == "length" and runs_on.usage.completion_tokens == 40
    assert runs_on.choices[0].message.content.startswith(ends.choices[0].message.content)


def test_n_answers_one_prompt_several_times_whole_and_streamed(server):
    """OpenAI's `n`: choices indexed 0..n-1 under one id, a seeded request's choices drawn from seeds of their own
    (the first is the request alone: a seed keys its draws, whatever the drafts), the usage counting the prompt
    once; streamed choice after choice."""
    client = server.client()
    sampled = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0, "seed": 11}
    three = client.completions.create(n=3, **sampled)
    assert [choice.index for choice in three.choices] == [0, 1, 2]
    assert three.choices[0].text == client.completions.create(**sampled).choices[0].text
    assert len({choice.text for choice in three.choices}) > 1
    assert three.usage.completion_tokens == 24 and three.usage.total_tokens == three.usage.prompt_tokens + 24
    stream = client.chat.completions.create(model=MODEL, messages=COLOURS, max_tokens=6, temperature=0, n=2,
                                            stream=True, stream_options={"include_usage": True})  # fmt: skip
    texts, finished, usage = ["", ""], [], None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.append(choice.index)
        usage = chunk.usage or usage
    assert texts[0] == texts[1] != "" and finished == [0, 1] and usage.completion_tokens == 12  # greedy: the same


def test_tokenize_and_detokenize_in_both_servers_shapes(server, tokenizer):
    """llama-server's `content` (ids, or ids with pieces) and vLLM's `prompt` / `messages` (count, ids, the
    context's size); ids back to text under both names."""

    def post(path: str, body: dict) -> httpx.Response:
        return httpx.post(f"http://127.0.0.1:{server.port}{path}", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60)  # fmt: skip

    text = "Hello, wörld!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert post("/tokenize", {"content": text}).json() == {"tokens": ids}
    pieces = post("/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [piece["id"] for piece in pieces] == ids and "".join(piece["piece"] for piece in pieces) == text
    counted = post("/tokenize", {"model": MODEL, "prompt": text, "return_token_strs": True}).json()
    assert counted["tokens"] == tokenizer.encode(text) and counted["count"] == len(counted["tokens"])
    assert counted["max_model_len"] > 0 and len(counted["token_strs"]) == counted["count"]
    chat = post("/tokenize", {"messages": [{"role": "user", "content": text}]}).json()
    assert chat["tokens"] == encode_chat(tokenizer, [{"role": "user", "content": text}])
    assert post("/detokenize", {"tokens": ids}).json() == {"prompt": text, "content": text}
    refused = post("/detokenize", {"tokens": [10**9]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens"
    assert post("/tokenize", {"prompt": text, "model": "other"}).status_code == 404


def test_an_int8_kv_cache_answers_as_specchat_run_does_on_one(server):
    """`serve --kv-cache int8` reaches the engine: /health says so, and a greedy answer is `run --kv-cache int8`'s."""
    run = run_specchat(["run", COLOURS[0]["content"], "--temperature", "0", "-n", "24", "--json", "--kv-cache", "int8"],
                       env=ENV)  # fmt: skip
    expected = json.loads(run.stdout)["text"]
    int8 = Server("--context", "1024", "--kv-cache", "int8")
    try:
        int8.wait_ready()
        answer = chat(int8, COLOURS, max_tokens=24)
        # the cache held: the default model's auto is bf16 beside its fp32 activations
        assert (int8.health()["kv_cache"], server.health()["kv_cache"]) == ("int8", "bf16")
    finally:
        assert int8.stop() == 0
    assert answer == expected


def test_conversations_reusing_their_cached_prefixes_answer_as_prompts_prefilled_whole(server):
    """On the CPU decoder the prompt cache is on by default, and exact: each turn of a conversation, its earlier
    turns reused from the cache, gets the answer of a server that prefills every prompt whole (`specchat run`'s,
    test_a_greedy_answer_is_what_specchat_run_prints); so do 8 clients' conversations taking turns at once."""
    whole = Server("--context", "1024", "--no-prompt-cache")
    try:
        whole.wait_ready()
        assert server.health()["prompt_cache"] is True and whole.health()["prompt_cache"] is False
        conversation = list(COLOURS)
        previous_prompt = 0
        for turn, question in enumerate(["And three more?", "Which of them is the darkest?", None]):
            reply = server.client().chat.completions.create(model=MODEL, messages=conversation, temperature=0,
                                                            max_tokens=24)  # fmt: skip
            alone = whole.client().chat.completions.create(model=MODEL, messages=conversation, temperature=0,
                                                           max_tokens=24)  # fmt: skip
            answer = reply.choices[0].message.content
            assert answer == alone.choices[0].message.content, turn
            assert alone.model_extra["specchat"]["reused_tokens"] == 0
            if turn:  # the earlier turns were in the cache: only the new ones were prefilled
                assert reply.model_extra["specchat"]["reused_tokens"] >= previous_prompt
            previous_prompt = reply.usage.prompt_tokens
            if question:
                conversation += [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]
        talks = {index: [{"role": "user", "content": f"{PROMPTS[index % 4]} (I am client {index}.)"}]
                 for index in range(8)}  # fmt: skip
        answers = {}

        def talk(index: int) -> None:  # two turns, the second after the other clients' requests took the cache
            messages = talks[index]
            for turn, question in enumerate(["And why?", None]):
                answers[index, turn] = chat(server, messages, max_tokens=16)
                if question:
                    messages += [{"role": "assistant", "content": answers[index, turn]},
                                 {"role": "user", "content": question}]  # fmt: skip

        at_once(talk, 8)
        for index, messages in talks.items():
            assert answers[index, 0] == chat(whole, messages[:1], max_tokens=16), index
            assert answers[index, 1] == chat(whole, messages, max_tokens=16), index
    finally:
        assert whole.stop() == 0


def test_a_body_of_8_mb_is_answered_413_by_every_client(server):
    """A body far over --max-body-mb (0.05 here) is read to its end and answered, not cut off with a reset."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (8 * 2**20)}]}
    with pytest.raises(openai.APIStatusError) as refused:
        server.client().chat.completions.create(**body)
    assert refused.value.status_code == 413
    answer = httpx.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", json=body,
                        headers={"Authorization": f"Bearer {KEY}"}, timeout=120)  # fmt: skip
    assert answer.status_code == 413 and "over" in answer.json()["error"]["message"]
    curl = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {KEY}",
                           "-H", "Content-Type: application/json", "--data-binary", "@-",
                           f"http://127.0.0.1:{server.port}/v1/chat/completions"],
                          input=json.dumps(body), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (curl.returncode, curl.stdout) == (0, "413")
    assert chat(server, COLOURS, max_tokens=4)


def test_speculation_asked_per_request_changes_the_speed_not_the_answer(server):
    """`speculative`: the target alone ("none"), or a fixed draft budget, for one request; the answer stays the
    target's, and the server's own drafting comes back for the next request."""
    asked = {}
    for name, speculative in [("server's", None), ("none", {"drafter": "none"}), ("budget", {"draft_budget": 3}),
                              ("ngram", {"drafter": "ngram"}), ("after", None)]:  # fmt: skip
        extra = {} if speculative is None else {"extra_body": {"speculative": speculative}}
        asked[name] = server.client().completions.create(model=MODEL, prompt=COUNTING, max_tokens=24, temperature=0,
                                                         **extra)  # fmt: skip
    answers = {name: reply.choices[0].text for name, reply in asked.items()}
    assert len(set(answers.values())) == 1, answers
    alone, budget = asked["none"].model_extra, asked["budget"].model_extra
    assert alone["specchat"]["drafter"] == "none" and alone["timings"]["draft_n"] == 0
    assert alone["specchat"]["undrafted_steps"] == alone["specchat"]["steps"]
    assert 0 < budget["timings"]["draft_n"] <= 3 * budget["specchat"]["steps"]
    drafters = {name: reply.model_extra["specchat"]["drafter"] for name, reply in asked.items()}
    assert drafters["after"] == drafters["server's"] == "ngram"


def scrape(server) -> dict[str, float]:
    """`GET /metrics`, as {sample: value} (a sample: its name and labels, as the text format writes them)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", "/metrics")
    response = connection.getresponse()
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
    lines = response.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}


def test_metrics_count_what_the_answers_say(server):
    before = scrape(server)
    replies = [server.client().completions.create(model=MODEL, prompt=COUNTING, max_tokens=n, temperature=0)
               for n in (12, 20)]  # fmt: skip
    refused = server.request("POST", "/v1/chat/completions", {"model": MODEL, "messages": COLOURS, "n": 17})
    after = scrape(server)
    grew = {name: after[name] - before.get(name, 0.0) for name in after}
    assert refused[0] == 400 and grew['specchat_requests_total{status="400"}'] == 1
    assert grew['specchat_requests_total{status="200"}'] == 2
    assert grew["specchat_generation_tokens_total"] == sum(reply.usage.completion_tokens for reply in replies) == 32
    assert grew["specchat_prompt_tokens_total"] == sum(reply.usage.prompt_tokens for reply in replies)
    timings = [reply.model_extra["timings"] for reply in replies]
    assert grew["specchat_prompt_tokens_cached_total"] == sum(t["cache_n"] for t in timings)
    assert grew["specchat_spec_decode_num_draft_tokens_total"] == sum(t["draft_n"] for t in timings)
    assert grew["specchat_spec_decode_num_accepted_tokens_total"] == sum(t["draft_n_accepted"] for t in timings)
    assert grew["specchat_time_to_first_token_seconds_count"] == 2
    assert after["specchat_num_requests_waiting"] == 0 and after["specchat_mean_accepted_length"] >= 1


def test_a_stream_carries_the_same_answer_its_origins_and_the_usage(server):
    whole = chat(server, COLOURS, max_tokens=20)
    chunks = list(server.client().chat.completions.create(
        model=MODEL, messages=COLOURS, temperature=0, max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    *body, finish, usage = chunks
    assert "".join(chunk.choices[0].delta.content or "" for chunk in body) == whole
    assert sum(len(chunk.model_extra["specchat"]["origins"]) for chunk in body[1:]) == 20
    assert finish.choices[0].finish_reason == "length" and finish.model_extra["specchat"]["mean_accepted_length"] >= 1
    assert usage.choices == [] and usage.usage.completion_tokens == 20
    assert finish.model_extra["timings"]["predicted_n"] == 20


def test_timings_in_llama_servers_words_agree_with_the_answer():
    """llama-server's `timings` (what its clients read), for an answer drafted by n-gram lookup on a text that
    repeats: its counts are the usage's and the `specchat` object's."""
    lookup = Server("--context", "1024", "--drafter", "ngram", "--draft-budget", "4")
    try:
        lookup.wait_ready()
        reply = lookup.client().completions.create(model=MODEL, prompt=COUNTING, max_tokens=32, temperature=0)
    finally:
        assert lookup.stop() == 0
    timings, figures = reply.model_extra["timings"], reply.model_extra["specchat"]
    assert timings["predicted_n"] == reply.usage.completion_tokens == 32
    assert timings["prompt_n"] + timings["cache_n"] == reply.usage.prompt_tokens
    assert timings["draft_n_accepted"] == figures["drafted_tokens"] > 0
    assert 4 * figures["steps"] >= timings["draft_n"] >= timings["draft_n_accepted"]
    assert timings["prompt_ms"] > 0 and timings["predicted_ms"] > 0


def test_completions_continue_text_and_stop_at_a_stop_string(server):
    client = server.client()
    reply = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=12, temperature=0)
    assert reply.choices[0].text.startswith(" 7, 8") and reply.choices[0].finish_reason == "length"
    stopped = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=12, temperature=0, stop=[" 9"])
    assert stopped.choices[0].text == " 7, 8," and stopped.choices[0].finish_reason == "stop"
    [card] = client.models.list().data
    assert card.id == MODEL and card.model_extra["max_model_len"] == 1024  # --context 1024


def test_concurrent_clients_get_what_they_get_alone(server):
    alone = {prompt: chat(server, [{"role": "user", "content": prompt}], max_tokens=24) for prompt in PROMPTS}
    together = {}

    def ask(index: int) -> None:
        together[index] = chat(server, [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}], max_tokens=24)

    at_once(ask, 8)
    assert together == {index: alone[PROMPTS[index % len(PROMPTS)]] for index in range(8)}


def test_bad_requests_get_openai_errors_and_change_nothing(server):
    before = chat(server, COLOURS, max_tokens=16)
    good = {"model": MODEL, "messages": COLOURS}
    cases = [
        (("POST", "/v1/chat/completions"), {"raw": b"{not json"}, 400, None),
        (("POST", "/v1/chat/completions"), {"body": good, "key": None}, 401, None),
        (("POST", "/v1/chat/completions"), {"body": good, "key": "sk-wrong"}, 401, None),
        (("GET", "/v1/models"), {"key": "sk-wrong"}, 401, None),
        (("POST", "/v1/chat/completions"), {"body": {**good, "model": "gpt-4o"}}, 404, "model"),
        (("POST", "/v1/chat/completions"), {"body": {**good, "max_tokens": -1}}, 400, "max_tokens"),
        (("POST", "/v1/chat/completions"), {"body": {**good, "temperature": 9}}, 400, "temperature"),
        (("POST", "/v1/chat/completions"), {"body": {"model": MODEL}}, 400, "messages"),
        (("POST", "/v1/chat/completions"), {"body": {**good, "n": 0}}, 400, "n"),
        (("POST", "/v1/completions"), {"body": {"prompt": ["a", "b"]}}, 400, "prompt"),
        (("POST", "/v1/chat/completions"), {"raw": json.dumps({**good, "pad": "x" * 60_000}).encode()}, 413, None),
        (("POST", "/v1/chat/completions"),
         {"body": {**good, "messages": [{"role": "user", "content": "word " * 1100}]}}, 400, "messages"),
        (("POST", "/v1/chat/completions"), {"body": {**good, "speculative": 5}}, 400, "speculative"),
        (("POST", "/v1/chat/completions"), {"body": {**good, "speculative": {"drafter": "eagle3"}}}, 400,
         "speculative.drafter"),
        (("POST", "/v1/chat/completions"), {"body": {**good, "speculative": {"draft_budget": 0}}}, 400,
         "speculative.draft_budget"),
        (("POST", "/v1/chat/completions"), {"body": {**good, "speculative": {"draft_budget": "4"}}}, 400,
         "speculative.draft_budget"),
        (("POST", "/v1/chat/completions"), {"body": {**good, "speculative": {"drafter": "none", "draft_budget": 2}}},
         400, "speculative.draft_budget"),
        (("POST", "/v1/chat/completions"), {"body": {**good, "speculative": {"budget": 2}}}, 400, "speculative.budget"),
        (("POST", "/v1/audio/speech"), {}, 404, None),
        (("GET", "/v1/chat/completions"), {}, 405, None),
    ]  # fmt: skip
    for (method, path), options, status, param in cases:
        answer_status, headers, body = server.request(method, path, **options)
        assert (answer_status, body["error"]["param"]) == (status, param), (method, path, body)
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
    too_long = server.request("POST", "/v1/chat/completions", body=cases[11][1]["body"])[2]["error"]["message"]
    assert "the context holds 1024" in too_long and "--context" in too_long
    assert chat(server, COLOURS, max_tokens=16) == before
    assert server.health()["waiting"] == 0


def bad_inputs() -> list[tuple[str, str, dict]]:
    """(method, path, request options) of bad requests, one field or shape wrong in each."""
    chat_body, text_body = {"model": MODEL, "messages": COLOURS}, {"model": MODEL, "prompt": "Hi"}
    fields = {
        "model": [123, [], {}, True],
        "max_tokens": [-1, 0, "5", 1.5, True, [], -(2**40)],
        "max_completion_tokens": [-3, "7", 2.5],
        "temperature": [-1, 2.5, "hot", [], {}, True],
        "top_p": [0, 1.5, -0.1, "x", [0.5]],
        "top_k": [-2, 1.5, "k", [3]],
        "min_p": [1, -0.5, 1.5, "m"],
        "repetition_penalty": [0, -1, 11, "r"],
        "seed": [-1, 2**70, "s", 1.5, [1]],
        "stop": [5, [1], ["a"] * 17, {"a": 1}, [["a"]]],
        "stream": ["yes", 1, [], {}],
        "stream_options": [{"include_usage": True}, "x", 5],
        "n": [17, 0, -1, "1"],
        "frequency_penalty": [3, -2.5, "1"],
        "presence_penalty": [2.5, True],
        "logprobs": ["yes"],
        "top_logprobs": [3],
        "tools": [[{"type": "function", "function": {"name": "f"}}]],
        "logit_bias": [{"50256": -100}],
        "response_format": [{"type": "json_schema"}, "text", 5],
        "speculative": [5, "none", [], {"drafter": 5}, {"drafter": ""}, {"drafter": "eagle3"}, {"draft_budget": 0},
                        {"draft_budget": 65}, {"draft_budget": 2.5}, {"draft_budget": True}, {"draft_budget": "4"},
                        {"drafter": "none", "draft_budget": 2}, {"budget": 2}],
    }  # fmt: skip
    cases = [("POST", "/v1/chat/completions", {"body": {**chat_body, name: value}})
             for name, values in fields.items() for value in values]  # fmt: skip
    messages = [None, [], "hi", [1], [{"role": "robot", "content": "hi"}], [{"role": "user"}],
                [{"role": "user", "content": 5}], [{"content": "hi"}], [{"role": "user", "content": None}],
                [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                [{"role": "user", "content": "word " * 1100}]]  # fmt: skip
    cases += [("POST", "/v1/chat/completions", {"body": {"model": MODEL, "messages": m}}) for m in messages]
    prompts = [5, [], [-1], [10**9], [1.5], {"a": 1}, [[1, 2], [3]], ["a", "b"], True, "word " * 1100]
    cases += [("POST", "/v1/completions", {"body": {"model": MODEL, "prompt": p}}) for p in prompts]
    cases += [("POST", "/v1/completions", {"body": {**text_body, name: value}})
              for name, value in [("echo", "yes"), ("suffix", "x"), ("best_of", 2), ("max_tokens", -5)]]  # fmt: skip
    cases += [("POST", "/v1/chat/completions", {"body": {**chat_body, "max_tokens": 4, "max_completion_tokens": 4}})]
    cases += [("POST", "/v1/chat/completions", {"raw": raw}) for raw in
              [b"", b"{not json", b"[1, 2]", b'"text"', b"null", b"\xff\xfe", b'{"model": "' + b"x" * 10 + b'"',
               b"123"]]
    cases += [("POST", "/v1/chat/completions", {"body": {**chat_body, "model": "gpt-4o"}}),
              ("POST", "/v1/chat/completions", {"body": chat_body, "key": None}),
              ("POST", "/v1/chat/completions", {"body": chat_body, "key": "sk-wrong"}),
              ("POST", "/v1/completions", {"body": text_body, "key": "Bearer"}),
              ("GET", "/v1/models", {"key": "sk-wrong"}),
              ("GET", "/v1/models/gpt-4o", {}),
              ("GET", "/v1/embeddings", {}), ("POST", "/v1/embeddings", {"body": {}}),
              ("GET", "/v1/chat/completions", {}), ("DELETE", "/v1/models", {}), ("PUT", "/v1/completions", {}),
              ("POST", "/v1/chat/completions",
               {"raw": json.dumps({**chat_body, "pad": "x" * 60_000}).encode()})]  # fmt: skip
    return cases


def test_a_hundred_bad_requests_each_get_an_openai_error_and_change_nothing(server):
    before = chat(server, COLOURS, max_tokens=16)
    cases = bad_inputs()
    assert len(cases) >= 100
    for method, path, options in cases:
        status, _, body = server.request(method, path, **options)
        assert 400 <= status < 500, (method, path, options, status, body)
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"], body
        assert "\n" not in body["error"]["message"] and "Traceback" not in body["error"]["message"]
    assert chat(server, COLOURS, max_tokens=16) == before
    assert server.health()["waiting"] == 0


def test_a_client_that_hangs_up_mid_stream_frees_the_engine(server):
    start = server.health()["tokens_generated"]
    connection, response = server.open_stream({"prompt": COUNTING, "max_tokens": 900, "temperature": 0})
    chunks = 0
    while chunks < 2:  # two steps' chunks, then hang up
        chunks += response.readline().startswith(b"data: ")
    connection.sock.shutdown(2)
    connection.close()
    deadline = time.monotonic() + 60
    while server.health()["generating"] and time.monotonic() < deadline:
        time.sleep(0.05)
    made = server.health()["tokens_generated"] - start
    assert made < 100, f"{made} tokens generated for a client that hung up after two chunks"
    assert chat(server, COLOURS, max_tokens=8)


def test_loading_a_prompt_cache_a_full_queue_then_sigterm_ending_every_request_cleanly():
    server = Server("--max-queue", "1", "--context", "1024", "--prompt-cache")
    try:
        status, headers, body = server.request("GET", "/health", key=None)  # the model is still loading
        assert (status, body["status"]) == (503, "loading") and headers["Retry-After"]
        status, headers, body = server.request("POST", "/v1/completions", {"prompt": "Hi"})
        assert status == 503 and "loading" in body["error"]["message"] and headers["Retry-After"]
        server.wait_ready()
        assert server.health()["status"] == "ready"

        first = server.client().chat.completions.create(model=MODEL, messages=COLOURS, temperature=0, max_tokens=8)
        turn = [*COLOURS, {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And three more?"}]  # fmt: skip
        second = server.client().chat.completions.create(model=MODEL, messages=turn, temperature=0, max_tokens=8)
        assert second.model_extra["specchat"]["reused_tokens"] >= first.usage.prompt_tokens
        assert first.model_extra["specchat"]["reused_tokens"] < first.usage.prompt_tokens

        connection, running = server.open_stream({"prompt": COUNTING, "max_tokens": 900, "temperature": 0})
        assert running.readline().startswith(b"data: ")  # generating now
        queued = {}
        waiter = threading.Thread(target=lambda: queued.update(answer=server.request(
            "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 4})))  # fmt: skip
        waiter.start()
        while server.health()["waiting"] < 1:
            time.sleep(0.02)
        status, headers, body = server.request("POST", "/v1/completions", {"prompt": "Hi"})
        assert status == 429 and body["error"]["type"] == "rate_limit_error" and headers["Retry-After"]

        server.process.send_signal(signal.SIGTERM)
        rest = events(running)
        assert rest[-1] == "[DONE]" and rest[-2]["choices"][0]["finish_reason"] == "length"
        waiter.join(timeout=30)
        assert queued["answer"][0] == 503 and "shutting down" in queued["answer"][2]["error"]["message"]
        assert server.process.wait(timeout=15) == 0
        assert "stopped" in server.process.stderr.read()
    finally:
        server.stop()


def test_bench_serve_reports_each_client_count():
    run = run_specchat(["bench", "serve", "--clients", "1,2", "-n", "4", "--json"], env=ENV)
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)
    assert [(row["clients"], row["requests"], row["tokens"]) for row in rows] == [(1, 3, 12), (2, 6, 24)]
    assert all(row["ttft_ms"] > 0 and row["tokens_per_second"] > 0 and row["direct_tokens_per_second"] > 0
               for row in rows)  # fmt: skip
    assert rows[0]["overhead"] is not None and rows[1]["overhead"] is None


def test_a_conversation_without_a_system_message_takes_the_models_own(tokenizer):
    """An ollama model's SYSTEM goes before a conversation that brings none, as ollama's /api/chat puts it."""
    from tui_harness import tiny_loaded

    from specchat.engine.generate import Engine
    from specchat.engine.prompt import encode_chat
    from specchat.server.app import Served
    from specchat.server.requests import chat_request

    loaded = tiny_loaded(tokenizer)
    served = Served(Engine(loaded.model, loaded.tokenizer, max_len=256), loaded.tokenizer, "tiny", frozenset(), "none",
                    {}, system="Answer in French.")  # fmt: skip
    user = {"role": "user", "content": "Hi"}
    own = {"role": "system", "content": "Be brief."}
    assert served.prompt_ids(chat_request({"messages": [user]})) == encode_chat(
        tokenizer, [{"role": "system", "content": "Answer in French."}, user])
    assert served.prompt_ids(chat_request({"messages": [own, user]})) == encode_chat(tokenizer, [own, user])


def test_a_prompt_past_the_models_window_is_told_of_yarn_not_of_context(tokenizer):
    """At the model's whole window a larger --context holds no more: the 400 names --yarn instead."""
    from tui_harness import tiny_loaded

    from specchat.engine.generate import Engine
    from specchat.server.app import Served
    from specchat.server.requests import RequestError, text_request

    loaded = tiny_loaded(tokenizer)
    for max_len, remedy in ((None, "the model's window: --yarn F stretches it"), (64, "a larger --context")):
        served = Served(Engine(loaded.model, loaded.tokenizer, max_len=max_len), loaded.tokenizer, "tiny", frozenset(),
                        "none", {})  # fmt: skip
        with pytest.raises(RequestError, match=remedy):
            served.prompt_ids(text_request({"prompt": [5] * loaded.model.config.max_position_embeddings}))
