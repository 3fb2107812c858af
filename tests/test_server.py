"""The OpenAI-compatible server over the real engine (tiny random Llama, SmolLM2 tokenizer), on real HTTP.

One engine is shared by two uvicorn servers (one without, one with an API key) running in threads on
127.0.0.1 with random free ports; clients are the official ``openai`` package and ``httpx``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny"
MAX_MODEL_LEN = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn in a background thread, stopped with ``should_exit``."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.time() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def tiny_engine(model_dir: str, **kw: Any) -> Any:
    """The AsyncLLM these tests serve: ``model_dir`` on the CPU in float32, 4 sequences (``kw``: EngineConfig
    overrides)."""
    from specserve.config import EngineConfig
    from specserve.engine.async_engine import AsyncLLM

    kw = {"max_model_len": MAX_MODEL_LEN, "max_num_seqs": 4, "num_gpu_blocks": 96, **kw}
    return AsyncLLM(EngineConfig(model=model_dir, device="cpu", dtype="float32", **kw))


def openai_client(url: str, timeout: float = 60) -> openai.OpenAI:
    """The ``openai`` client of the server at ``url`` (no retries: a failure shows at once)."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=timeout)


@contextlib.contextmanager
def tiny_server(model_dir: str, name: str = "tiny") -> Iterator[tuple[Any, str]]:
    """``model_dir`` served by a tiny_engine (64 blocks) as ``name`` on a thread: (the engine, the base url)."""
    from specserve.server.api_server import build_app

    eng = tiny_engine(model_dir, num_gpu_blocks=64)
    try:
        with ServerThread(build_app(eng, name)) as srv:
            yield eng, srv.url
    finally:
        eng.shutdown()


def tiny_openai_client(model_dir: str) -> Iterator[openai.OpenAI]:
    """For a module fixture: ``model_dir`` served by a tiny_server as "tiny", an ``openai`` client."""
    with tiny_server(model_dir) as (_, url):
        yield openai_client(url, timeout=120)


@pytest.fixture(scope="module")
def engine(tiny_llama_dir: str) -> Iterator[Any]:
    eng = tiny_engine(tiny_llama_dir)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[str]:
    from specserve.server.api_server import build_app

    with ServerThread(build_app(engine, MODEL)) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def auth_server(engine: Any) -> Iterator[str]:
    from specserve.server.api_server import build_app

    with ServerThread(build_app(engine, MODEL, api_key="sk-secret")) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai_client(server)


def sse_events(url: str, body: dict[str, Any]) -> list[Any]:
    """POST a streaming request; return the parsed ``data:`` payloads (``"[DONE]"`` kept as a string)."""
    events: list[Any] = []
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metrics_text(base: str) -> str:
    r = httpx.get(f"{base}/metrics", timeout=10)
    assert r.status_code == 200
    return r.text


def metric_value(text: str, name: str, **labels: str) -> float:
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"{name} {labels} not in /metrics"
    return total


def greedy_completion(client: openai.OpenAI, prompt: str, n_tokens: int) -> Any:
    return client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=n_tokens, temperature=0, extra_body={"ignore_eos": True}
    )


def assert_serving(client: openai.OpenAI) -> None:
    """A normal request right after an error must succeed."""
    out = greedy_completion(client, "Still alive?", 3)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 3


# --------------------------------------------------------------------------- basic endpoints


def test_models_health_version(server: str, client: openai.OpenAI, tiny_llama_dir: str) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    card = httpx.get(f"{server}/v1/models").json()
    assert card["object"] == "list"
    m = card["data"][0]
    assert m["owned_by"] == "specserve" and m["object"] == "model"
    assert m["root"] == tiny_llama_dir and m["max_model_len"] == MAX_MODEL_LEN and m["parent"] is None
    assert httpx.get(f"{server}/health").status_code == 200
    from specserve import __version__

    assert httpx.get(f"{server}/version").json() == {"version": __version__}


def test_tokenize_detokenize(server: str, engine: Any) -> None:
    r = httpx.post(f"{server}/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert r["tokens"] == engine.tokenizer.encode("Hello world")
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == MAX_MODEL_LEN
    assert len(r["token_strs"]) == r["count"]
    assert httpx.post(f"{server}/detokenize", json={"tokens": r["tokens"]}).json() == {
        "prompt": "Hello world"
    }
    chat = httpx.post(f"{server}/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
    text = httpx.post(f"{server}/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nHi<|im_end|>" in text


def test_completion(server: str, client: openai.OpenAI) -> None:
    out = greedy_completion(client, "The quick brown fox", 8)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == MODEL
    assert out.choices[0].finish_reason == "length" and out.choices[0].index == 0
    assert out.usage.completion_tokens == 8
    count = httpx.post(f"{server}/tokenize", json={"prompt": "The quick brown fox"}).json()["count"]
    assert out.usage.prompt_tokens == count and out.usage.total_tokens == count + 8
    # greedy decoding is deterministic, and token-id prompts give the same result as the text
    ids = httpx.post(f"{server}/tokenize", json={"prompt": "The quick brown fox"}).json()["tokens"]
    again = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    assert again.choices[0].text == out.choices[0].text


def test_chat(client: openai.OpenAI, server: str) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Tell me a story."}]}]
    out = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    choice = out.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length" and out.usage.completion_tokens == 6
    count = httpx.post(
        f"{server}/tokenize", json={"messages": [{"role": "user", "content": "Tell me a story."}]}
    )
    assert out.usage.prompt_tokens == count.json()["count"]
    # max_completion_tokens wins over max_tokens
    out2 = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=2,
        max_completion_tokens=4,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out2.usage.completion_tokens == 4
    assert choice.message.content.startswith(out2.choices[0].message.content)


def test_streaming_chat_chunk_order_and_usage(server: str, client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Count to ten."}]
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse_events(f"{server}/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    first = chunks[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""} and first["finish_reason"] is None
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12
    content = chunks[1:-1]
    assert content and all("usage" not in c for c in content)
    assert all("role" not in c["choices"][0]["delta"] for c in content)
    finish = [c["choices"][0]["finish_reason"] for c in content]
    assert finish[-1] == "length" and all(f is None for f in finish[:-1])
    # one logprob entry per generated token, so the chunks carried exactly completion_tokens tokens
    n_tokens = sum(len(c["choices"][0]["logprobs"]["content"]) for c in content)
    assert n_tokens == usage["completion_tokens"]
    streamed = "".join(c["choices"][0]["delta"]["content"] for c in content)
    plain = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert streamed == plain.choices[0].message.content
    # the official client parses the same stream
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    parts = list(stream)
    assert parts[-1].usage.completion_tokens == 12 and parts[-1].choices == []
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == streamed


def test_streaming_completion(server: str, client: openai.OpenAI) -> None:
    body = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 7,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse_events(f"{server}/v1/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 7
    text_chunks = chunks[:-1]
    assert all(c["object"] == "text_completion" for c in text_chunks)
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in text_chunks[:-1])
    plain = greedy_completion(client, "Once upon a time", 7)
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == plain.choices[0].text


def test_two_concurrent_streams(server: str) -> None:
    async def one(ac: openai.AsyncOpenAI, prompt: str) -> tuple[float, float, str, int]:
        stream = await ac.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        t_first = t_last = 0.0
        text, tokens = "", 0
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices:
                t_first = t_first or now
                t_last = now
                text += chunk.choices[0].delta.content or ""
            elif chunk.usage:
                tokens = chunk.usage.completion_tokens
        return t_first, t_last, text, tokens

    async def both() -> list[tuple[float, float, str, int]]:
        ac = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
        try:
            return list(await asyncio.gather(one(ac, "First prompt"), one(ac, "Another, different prompt")))
        finally:
            await ac.close()

    (a0, a1, _, na), (b0, b1, _, nb) = asyncio.run(both())
    assert na == 24 and nb == 24
    assert a0 < b1 and b0 < a1, "the two streams should be served at the same time"


def test_stop_string(client: openai.OpenAI) -> None:
    prompt = "A list of fruits:"
    full = greedy_completion(client, prompt, 16).choices[0].text
    assert len(full) > 4
    mid = len(full) // 2
    stop = full[mid : mid + 3]
    expected = full[: full.find(stop)]
    assert full.find(stop) > 0
    out = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    choice = out.choices[0]
    assert choice.text == expected
    assert choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop


def test_n_choices(client: openai.OpenAI, server: str) -> None:
    out = client.completions.create(
        model=MODEL,
        prompt="Pick a word:",
        n=2,
        max_tokens=5,
        temperature=1.0,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert out.usage.completion_tokens == 10
    # streaming chat with n=2: every choice gets a role chunk first and a finish chunk last
    events = sse_events(
        f"{server}/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "n": 2,
            "max_tokens": 4,
            "temperature": 0.8,
            "seed": 3,
            "ignore_eos": True,
            "stream": True,
        },
    )
    assert events[-1] == "[DONE]"
    by_index: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for c in events[:-1]:
        (choice,) = c["choices"]
        by_index[choice["index"]].append(choice)
    for choices in by_index.values():
        assert choices[0]["delta"] == {"role": "assistant", "content": ""}
        assert choices[-1]["finish_reason"] == "length"


def test_logprobs(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL,
        prompt="Numbers:",
        max_tokens=5,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == out.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0.0
        assert 3 <= len(top) <= 4
        assert chosen == pytest.approx(max(top.values()), abs=1e-4)  # greedy picks the most likely token
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-4)
        assert entry.bytes == list(entry.token.encode())


def test_client_abort_frees_kv_cache(server: str) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long essay."}],
        "max_tokens": 200,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
            if got >= 3:
                break
        text = metrics_text(server)
        assert metric_value(text, "vllm:num_requests_running") == 1
        assert metric_value(text, "vllm:kv_cache_usage_perc") > 0
    # the connection is closed: the request must be aborted and its blocks freed
    deadline = time.time() + 10
    while True:
        text = metrics_text(server)
        running = metric_value(text, "vllm:num_requests_running")
        usage = metric_value(text, "vllm:kv_cache_usage_perc")
        if (running, usage) == (0, 0) or time.time() > deadline:
            break
        time.sleep(0.1)
    assert running == 0 and usage == 0.0


def test_metrics_exposition(server: str, client: openai.OpenAI) -> None:
    greedy_completion(client, "metrics please", 4)
    text = metrics_text(server)
    labels = {"model_name": MODEL, "engine": "0"}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:inter_token_latency_seconds_count",
    ):
        metric_value(text, name, **labels)
    assert metric_value(text, "vllm:prompt_tokens_total", **labels) > 0
    assert metric_value(text, "vllm:generation_tokens_total", **labels) >= 4
    assert metric_value(text, "vllm:request_success_total", finished_reason="length", **labels) >= 1
    assert metric_value(text, "vllm:time_to_first_token_seconds_count", **labels) >= 1
    assert metric_value(text, "vllm:inter_token_latency_seconds_count", **labels) >= 3
    assert "vllm:spec_decode" not in text  # no speculation configured: vLLM exposes no spec_decode series


# --------------------------------------------------------------------------- errors


def _post_raw(url: str, content: bytes | str) -> httpx.Response:
    return httpx.post(url, content=content, headers={"content-type": "application/json"}, timeout=30)


def assert_error(r: httpx.Response, status: int, err_type: str, param: str | None = ...) -> dict[str, Any]:  # type: ignore[assignment]
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == err_type and err["code"] == status and err["message"]
    if param is not ...:
        assert err["param"] == param
    return err


def test_error_invalid_json(server: str, client: openai.OpenAI) -> None:
    assert_error(
        _post_raw(f"{server}/v1/chat/completions", b'{"model": "tiny", "messages": ['), 400, "BadRequestError"
    )
    assert_serving(client)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "messages"),  # missing field
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "lots"},
            "max_tokens",
        ),
        ({"model": MODEL, "messages": "hello"}, "messages"),
    ],
)
def test_error_schema(server: str, client: openai.OpenAI, body: dict[str, Any], param: str) -> None:
    assert_error(httpx.post(f"{server}/v1/chat/completions", json=body), 400, "BadRequestError", param)
    assert_serving(client)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"n": 0}, "n"),
        ({"logprobs": 50}, "logprobs"),
        ({"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
        # JSON bodies may carry NaN / Infinity (json.dumps writes them): refused, not sampled with
        ({"temperature": float("nan")}, "temperature"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"logit_bias": {"5": float("nan")}}, "logit_bias"),
        ({"n": 100_000}, "n"),  # above VLLM_MAX_N_SEQUENCES (16384): would queue 100k sequences
    ],
)
def test_error_bad_sampling_values(
    server: str, client: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, **extra}
    raw = json.dumps(body)  # json.dumps writes NaN / Infinity (httpx's json= refuses them)
    r = httpx.post(f"{server}/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert_error(r, 400, "BadRequestError", param)
    assert_serving(client)


def test_error_prompt_too_long(server: str, client: openai.OpenAI) -> None:
    prompt = " ".join(["word"] * (MAX_MODEL_LEN + 20))
    r = httpx.post(f"{server}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 10})
    err = assert_error(r, 400, "BadRequestError", "input_tokens")
    assert err["message"].startswith(f"This model's maximum context length is {MAX_MODEL_LEN} tokens.")
    # the official client raises BadRequestError with the same message
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=10
        )
    assert exc.value.status_code == 400 and "maximum context length" in str(exc.value)
    # streaming requests are validated before the stream starts
    r = httpx.post(f"{server}/v1/completions", json={"model": MODEL, "prompt": prompt, "stream": True})
    assert_error(r, 400, "BadRequestError", "input_tokens")
    assert_serving(client)


def test_error_max_tokens_too_large(server: str, client: openai.OpenAI) -> None:
    r = httpx.post(f"{server}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1000})
    err = assert_error(r, 400, "BadRequestError", "max_tokens")
    assert err["message"] == (
        f"max_tokens=1000 cannot be greater than max_model_len={MAX_MODEL_LEN}. Please request fewer output tokens."
    )
    assert_serving(client)


def test_error_unknown_model(server: str, client: openai.OpenAI) -> None:
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    )
    err = assert_error(r, 404, "NotFoundError", "model")
    assert err["message"] == "The model `nope` does not exist."
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert_serving(client)


def test_error_unknown_route(server: str) -> None:
    assert_error(httpx.get(f"{server}/v1/nothing-here"), 404, "NotFoundError")


def test_api_key(auth_server: str) -> None:
    r = httpx.get(f"{auth_server}/v1/models")
    assert_error(r, 401, "AuthenticationError")
    r = httpx.get(f"{auth_server}/v1/models", headers={"Authorization": "Bearer wrong"})
    assert_error(r, 401, "AuthenticationError")
    assert (
        httpx.get(f"{auth_server}/v1/models", headers={"Authorization": "Bearer sk-secret"}).status_code
        == 200
    )
    assert httpx.get(f"{auth_server}/health").status_code == 200
    assert httpx.get(f"{auth_server}/metrics").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{auth_server}/v1", api_key="wrong", max_retries=0).models.list()
    good = openai.OpenAI(base_url=f"{auth_server}/v1", api_key="sk-secret", max_retries=0)
    out = good.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 2


# --------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specserve", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (["--speculative-config", "{not json"], "--speculative-config"),
    ],
)
def test_cli_bad_flags_exit_2(args: list[str], needle: str) -> None:
    proc = _cli(*args)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "error:" in lines[0] and needle in lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "colour": 1}'],
            "'colour'",
        ),
        (["-sc", '["ngram"]'], "JSON object"),
        (["--max-model-len", "1.5K"], "--max-model-len"),
        (["--port", "abc"], "--port"),
        (["--dtype", "int3"], "--dtype"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--max-model", "9"], "unrecognized arguments"),  # no prefix matching of long flags
    ],
)
def test_serve_main_bad_values_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from specserve.server.api_server import serve_main

    assert serve_main(["some/model", *args]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("specserve serve: error:") and needle in lines[0]


def test_serve_main_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from specserve.server.api_server import serve_main

    assert (
        serve_main(["some/model", "--device", "tpu"]) == 2
    )  # EngineConfig ValueError, before any model is loaded
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "error:" in err[0] and "device" in err[0]
    assert serve_main(["--speculative-config", '{"method": "ngram"}']) == 2  # SpeculativeConfig ValueError
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "num_speculative_tokens" in err[0]


def test_cli_arg_parsing(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from specserve.server.cli_args import engine_config_from_args, parse_human_int, parse_serve_args

    assert parse_human_int("1k") == 1000 and parse_human_int("1K") == 1024
    assert parse_human_int("25.6k") == 25600 and parse_human_int("4096") == 4096
    assert parse_human_int("auto") is None and parse_human_int("-1") is None
    with caplog.at_level("WARNING"):
        args = parse_serve_args(["some/model", "--max-model-seqs", "3", "--max-model-len", "2K"])
    assert args.max_num_seqs == 3 and "--max-model-seqs" in caplog.text
    assert args.max_model_len == 2048 and args.model_tag == "some/model"
    args = parse_serve_args(
        [
            "m",
            "--speculative-config.method",
            "ngram",
            "--speculative_config.num_speculative_tokens=3",
            "--no-enable-prefix-caching",
        ]
    )
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 3}
    cfg = engine_config_from_args(args)
    assert cfg.enable_prefix_caching is False
    assert cfg.speculative_config is not None and cfg.speculative_config.num_speculative_tokens == 3
    sc = parse_serve_args(["m", "-sc", '{"method":"ngram","num_speculative_tokens":2}', "--no-speculation"])
    assert engine_config_from_args(sc).speculative_config is None
    assert parse_serve_args(["m", "--api-key", "sk-abc"]).api_key == "sk-abc"
    monkeypatch.setenv("VLLM_API_KEY", "sk-env")
    assert parse_serve_args(["m"]).api_key == "sk-env"


def test_async_engine_builds_and_steps_on_one_thread(
    tiny_llama_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine is constructed on its own thread, the one that runs its steps: torch's CPU work stays on one
    OpenMP pool (two pools on a 2-core machine made every CPU GEMM sleep between parallel regions). A
    construction error is raised on the caller's thread."""
    import asyncio
    import threading

    from specserve.config import EngineConfig
    from specserve.engine import async_engine
    from specserve.sampling_params import SamplingParams

    seen: dict[str, set[int]] = {"init": set(), "step": set()}

    class Recording(async_engine.LLMEngine):
        def __init__(self, config: EngineConfig) -> None:
            seen["init"].add(threading.get_ident())
            super().__init__(config)

        def step(self) -> Any:
            seen["step"].add(threading.get_ident())
            return super().step()

    monkeypatch.setattr(async_engine, "LLMEngine", Recording)
    cfg = dict(max_model_len=MAX_MODEL_LEN, max_num_seqs=2, num_gpu_blocks=32, device="cpu", dtype="float32")
    eng = async_engine.AsyncLLM(EngineConfig(model=tiny_llama_dir, **cfg))
    try:

        async def one() -> Any:
            last = None
            async for out in eng.generate("hello", SamplingParams(max_tokens=4, temperature=0), "r1"):
                last = out
            return last

        out = asyncio.run(one())
        assert out is not None and out.finished and len(out.outputs[0].token_ids) == 4
        assert seen["init"] == seen["step"] == {eng._thread.ident}
        assert threading.get_ident() not in seen["init"]
    finally:
        eng.shutdown()
    with pytest.raises(ValueError, match="not found"):
        async_engine.AsyncLLM(EngineConfig(model="/nonexistent/model-dir", **cfg))


def test_draft_model_speculation_over_http(tiny_llama_dir: str, client: openai.OpenAI) -> None:
    """`--speculative-config '{"model": <an LM>, ...}'` through the server: vLLM infers a draft model. The target as
    its own draft model under concurrent requests, gated at two by disable_by_batch_size: answers equal the
    non-speculative server's, and every draft is accepted (/metrics)."""
    from concurrent.futures import ThreadPoolExecutor

    from specserve.config import SpeculativeConfig
    from specserve.server.api_server import build_app

    spec = {"model": tiny_llama_dir, "num_speculative_tokens": 3, "disable_by_batch_size": 2}
    eng = tiny_engine(tiny_llama_dir, speculative_config=SpeculativeConfig.from_any(spec))
    prompts = ["The capital of France is", "1 2 3 4 5", "Once upon a time", "a"]
    lengths = [24, 6, 6, 6]  # while they overlap no drafts (gated), then the long one drafts alone
    try:
        with ThreadPoolExecutor(4) as pool:
            want = list(
                pool.map(lambda a: greedy_completion(client, *a).choices[0].text, zip(prompts, lengths))
            )
        with ServerThread(build_app(eng, MODEL)) as srv:
            spec_client = openai_client(srv.url)
            with ThreadPoolExecutor(4) as pool:
                got = list(
                    pool.map(
                        lambda a: greedy_completion(spec_client, *a).choices[0].text, zip(prompts, lengths)
                    )
                )
            text = metrics_text(srv.url)
    finally:
        eng.shutdown()
    assert got == want
    drafted = metric_value(text, "vllm:spec_decode_num_draft_tokens_total")
    assert drafted > 0 and metric_value(text, "vllm:spec_decode_num_accepted_tokens_total") == drafted
