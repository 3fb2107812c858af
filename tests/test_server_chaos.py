"""The HTTP server under a random concurrent mix: greedy completions and chat streams (n=1/2, priorities),
streams the client drops after a chunk or two, and malformed requests, all at once against a tiny engine with too
few KV blocks for its batch (preemption). Every valid answer equals the same request served alone, every bad one
is an OpenAI-style 4xx, nothing answers 5xx, and once the dust settles no request runs and no KV block is held."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_server import ServerThread, metric_value, metrics_text, tiny_engine

from specserve.server.api_server import build_app

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
]
LENGTHS = [1, 5, 16]
BAD = [
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**7}, 400),
    ("/v1/completions", {"prompt": "x", "model": "no-such-model"}, 404),
    ("/v1/completions", {"prompt": "x", "logprobs": 10**6}, 400),
    ("/v1/completions", {"prompt": [10**9]}, 400),
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": float("nan")}, 400),
]


@pytest.fixture(scope="module")
def server(tiny_llama_dir: str) -> Iterator[tuple[Any, str]]:
    # 4 sequences, 10 blocks of 16 positions: a batch of long prompts + 16 tokens does not fit, so some are
    # preempted and recomputed while others stream
    eng = tiny_engine(tiny_llama_dir, num_gpu_blocks=10, scheduling_policy="priority")
    try:
        with ServerThread(build_app(eng, "tiny")) as srv:
            yield eng, srv.url
    finally:
        eng.shutdown()


def _body(path: str, prompt: str, max_tokens: int, n: int = 1, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    body.update({"n": n, "stream": stream})
    if path == "/v1/completions":
        body["prompt"] = prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
    return body


async def _text(c: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[str]:
    """The choices' texts of a request, streamed or not."""
    if not body.get("stream"):
        r = await c.post(path, json=body)
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        return [ch["text"] if "text" in ch else ch["message"]["content"] for ch in choices]
    texts = [""] * body.get("n", 1)
    async with c.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            for ch in event["choices"]:
                texts[ch["index"]] += ch.get("text") or (ch.get("delta") or {}).get("content") or ""
    return texts


def test_random_concurrent_mix(server: tuple[Any, str]) -> None:
    _, url = server
    paths = ["/v1/completions", "/v1/chat/completions"]

    num_dropped = 0

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            # each (endpoint, prompt, length) alone first: the answers the mix must reproduce
            ref = {}
            for path in paths:
                for p in PROMPTS:
                    for m in LENGTHS:
                        ref[path, p, m] = (await _text(c, path, _body(path, p, m)))[0]
            rng = random.Random(0)

            async def valid() -> None:
                path, p, m = rng.choice(paths), rng.choice(PROMPTS), rng.choice(LENGTHS)
                n = rng.choice([1, 1, 2])
                body = _body(path, p, m, n=n, stream=rng.random() < 0.5)
                body["priority"] = rng.randint(-1, 1)
                assert await _text(c, path, body) == [ref[path, p, m]] * n

            async def dropped() -> None:
                nonlocal num_dropped
                num_dropped += 1
                path = rng.choice(paths)
                body = _body(path, rng.choice(PROMPTS), 64, stream=True)  # far from done when dropped
                async with c.stream("POST", path, json=body) as r:
                    assert r.status_code == 200
                    got = 0
                    async for line in r.aiter_lines():
                        got += line.startswith("data: ")
                        if got >= rng.choice([1, 2]):
                            break  # leaving the block closes the connection mid-stream

            async def bad() -> None:
                path, body, status = rng.choice(BAD)
                payload = json.dumps({"model": "tiny", **body}, allow_nan=True)  # NaN as JS writes it
                r = await c.post(path, content=payload, headers={"content-type": "application/json"})
                assert r.status_code == status, r.text
                err = r.json()["error"]
                assert (
                    err["code"] == status
                    and err["type"]
                    and "validation error: Input should be" not in err["message"]
                )

            jobs = [rng.choice([valid, valid, valid, dropped, bad])() for _ in range(48)]
            results = await asyncio.gather(*jobs, return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            assert not failures, failures[:3]

    asyncio.run(run())
    deadline = time.time() + 20
    while True:  # aborts of dropped streams land asynchronously
        text = metrics_text(url)
        state = (
            metric_value(text, "vllm:num_requests_running"),
            metric_value(text, "vllm:kv_cache_usage_perc"),
        )
        if state == (0, 0) or time.time() > deadline:
            break
        time.sleep(0.1)
    assert state == (0, 0)
    assert num_dropped > 0  # every dropped stream was aborted, none ran to its end
    assert metric_value(text, "vllm:request_success_total", finished_reason="abort") == num_dropped
    assert metric_value(text, "vllm:num_preemptions_total") > 0  # the mix did run out of blocks
