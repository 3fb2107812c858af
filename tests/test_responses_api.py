"""``POST /v1/responses`` (OpenAI's Responses API, the text subset) over the real engine and real HTTP, through the
official ``openai`` client: the same prompt and text as /v1/chat/completions, the Response object, the stream's
events, structured outputs via ``text.format``, the 4xx errors, and no KV block left behind."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseTextDeltaEvent,
)
from test_server import MODEL, assert_error, metric_value, metrics_text, openai_client, tiny_server

N = 8  # output tokens of the greedy requests (ignore_eos: exactly this many)
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
STREAM_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture(scope="module")
def served(tiny_llama_dir: str) -> Iterator[tuple[Any, str]]:
    with tiny_server(tiny_llama_dir, MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def engine(served: tuple[Any, str]) -> Any:
    return served[0]


@pytest.fixture(scope="module")
def server(served: tuple[Any, str]) -> str:
    return served[1]


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai_client(server)


def chat_text(client: openai.OpenAI, messages: list[dict[str, Any]], n: int = N) -> tuple[str, int]:
    out = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=n, **GREEDY)
    return out.choices[0].message.content or "", out.usage.prompt_tokens


def test_text_and_object_match_chat(client: openai.OpenAI, server: str) -> None:
    resp = client.responses.create(
        model=MODEL, input="Tell me a story.", max_output_tokens=N, metadata={"k": "v"}, **GREEDY
    )
    assert isinstance(resp, Response)
    text, prompt_tokens = chat_text(client, [{"role": "user", "content": "Tell me a story."}])
    assert resp.output_text == text and text
    assert resp.id.startswith("resp_") and resp.object == "response" and resp.model == MODEL
    assert isinstance(resp.created_at, (int, float)) and resp.error is None
    assert len(resp.output) == 1
    msg = resp.output[0]
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [(c.type, c.text, c.annotations) for c in msg.content] == [("output_text", text, [])]
    assert resp.usage is not None
    assert resp.usage.input_tokens == prompt_tokens and resp.usage.output_tokens == N
    assert resp.usage.total_tokens == prompt_tokens + N
    assert resp.usage.input_tokens_details.cached_tokens >= 0
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert resp.metadata == {"k": "v"} and resp.temperature == 0 and resp.top_p == 1.0
    assert resp.max_output_tokens == N and resp.parallel_tool_calls is False
    assert resp.tool_choice == "none" and resp.tools == [] and resp.text.format.type == "text"
    # list input: typed message items and content parts, accepted fields that change nothing, unknown fields
    again = client.responses.create(
        model=MODEL,
        input=[
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Tell me a story."}],
            }
        ],
        max_output_tokens=N,
        temperature=0,
        store=False,
        user="someone",
        reasoning={"effort": "low"},
        text={"format": {"type": "text"}},
        tool_choice="auto",  # what some client frameworks always send: no tools, so no tool call
        extra_body={"ignore_eos": True, "not_a_field": 1},
    )
    assert again.output_text == text and again.user == "someone"
    # a conversation with an assistant turn: the same prompt as the chat request's
    conv = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "Tell me a story."},
    ]
    chat_conv = [{"role": m["role"], "content": m["content"]} for m in conv]
    chat_conv[1]["content"] = "Hello!"
    multi = client.responses.create(model=MODEL, input=conv, max_output_tokens=N, **GREEDY)
    text2, prompt2 = chat_text(client, chat_conv)
    assert multi.output_text == text2 and multi.usage.input_tokens == prompt2


def test_instructions_are_a_leading_system_message(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=MODEL, instructions="Answer in French.", input="Hi there", max_output_tokens=N, **GREEDY
    )
    text, prompt_tokens = chat_text(
        client, [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi there"}]
    )
    assert resp.output_text == text and resp.usage.input_tokens == prompt_tokens
    assert resp.instructions == "Answer in French."
    plain = client.responses.create(model=MODEL, input="Hi there", max_output_tokens=N, **GREEDY)
    assert plain.usage.input_tokens != prompt_tokens


def test_max_output_tokens_incomplete(client: openai.OpenAI) -> None:
    resp = client.responses.create(model=MODEL, input="Count to ten.", max_output_tokens=3, **GREEDY)
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage.output_tokens == 3
    assert resp.usage.total_tokens == resp.usage.input_tokens + 3
    full = client.responses.create(model=MODEL, input="Count to ten.", max_output_tokens=N, **GREEDY)
    assert full.output_text.startswith(resp.output_text)


def test_streaming_events(client: openai.OpenAI, server: str) -> None:
    kw: dict[str, Any] = {"model": MODEL, "input": "Count to ten.", "max_output_tokens": N, **GREEDY}
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    deltas = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert len(deltas) >= 2
    assert types == STREAM_ORDER[:4] + ["response.output_text.delta"] * len(deltas) + STREAM_ORDER[5:]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = client.responses.create(**kw).output_text
    assert "".join(d.delta for d in deltas) == text
    created, added, part_added, done = events[0], events[2], events[3], events[-4]
    assert created.response.status == "in_progress" and created.response.output == []
    item_id = added.item.id
    assert added.item.status == "in_progress" and part_added.part.text == ""
    assert all(d.item_id == item_id and d.output_index == 0 and d.content_index == 0 for d in deltas)
    assert done.text == text
    final = events[-1]
    assert isinstance(final, ResponseCompletedEvent)
    assert final.response.id == created.response.id
    assert final.response.output_text == text and final.response.output[0].id == item_id
    assert final.response.status == "incomplete"  # the token limit ended it
    assert final.response.usage is not None and final.response.usage.output_tokens == N
    # on the wire: each event's `event:` line names its type
    body = {
        "model": MODEL,
        "input": "Count to ten.",
        "max_output_tokens": 2,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{server}/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert len(lines) % 2 == 0
    for ev, data in zip(lines[::2], lines[1::2]):
        assert ev.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[len("data: ") :])["type"] == ev[len("event: ") :]


SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


def test_json_schema_format(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}
    resp = client.responses.create(
        model=MODEL,
        input="Yes or no?",
        max_output_tokens=64,
        temperature=0,
        text={"format": fmt},
    )
    assert resp.status == "completed" and resp.incomplete_details is None
    jsonschema.validate(json.loads(resp.output_text), SCHEMA)
    assert resp.text.format.type == "json_schema"
    # the same constraint as chat's response_format
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Yes or no?"}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
    )
    assert chat.choices[0].message.content == resp.output_text
    events = list(
        client.responses.create(
            model=MODEL,
            input="Yes or no?",
            max_output_tokens=64,
            temperature=0,
            text={"format": fmt},
            stream=True,
        )
    )
    assert "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)) == resp.output_text
    assert events[-1].type == "response.completed" and events[-1].response.status == "completed"


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"previous_response_id": "resp_123"}, 400, "previous_response_id"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {}}]}, 400, "tools"),
        ({"tool_choice": "required"}, 400, "tool_choice"),
        ({"model": "nope"}, 404, "model"),
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, 400, "input"),
        ({"input": [{"role": "tool", "content": "x"}]}, 400, "input"),
        ({"max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"max_output_tokens": 1000}, 400, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text"),
        ({"text": {"format": {"type": "xml"}}}, 400, "text"),
        (
            {"text": {"format": {"type": "json_schema", "schema": {"type": "string", "maxLength": 3}}}},
            400,
            "text",
        ),
        (
            {"text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a+"}},
            400,
            "structured_outputs",
        ),
        ({"include": ["message.output_text.logprobs"]}, 400, "include"),
        ({"temperature": -1}, 400, "temperature"),
        ({"background": True}, 400, "background"),
        ({"stream": True, "previous_response_id": "resp_1"}, 400, "previous_response_id"),
    ],
)
def test_errors(server: str, body: dict[str, Any], status: int, param: str) -> None:
    req = {"model": MODEL, "input": "Hi", "max_output_tokens": 4, **body}
    err_type = "NotFoundError" if status == 404 else "BadRequestError"
    err = assert_error(httpx.post(f"{server}/v1/responses", json=req, timeout=30), status, err_type, param)
    if param == "previous_response_id":
        assert "not stored" in err["message"] or "does not store" in err["message"]


def test_errors_through_the_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_x")
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.responses.create(
            model=MODEL,
            input="Hi",
            tools=[{"type": "function", "name": "f", "parameters": {}, "strict": True}],
        )
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="Hi")
    with pytest.raises(openai.BadRequestError, match="input"):
        client.responses.create(model=MODEL, input="")
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.responses.create(model=MODEL, input="word " * 300, max_output_tokens=4)


def test_metrics_count_responses(client: openai.OpenAI, server: str) -> None:
    labels = {"model_name": MODEL, "engine": "0"}
    before = metric_value(metrics_text(server), "vllm:e2e_request_latency_seconds_count", **labels)
    client.responses.create(model=MODEL, input="metrics", max_output_tokens=2, **GREEDY)
    list(client.responses.create(model=MODEL, input="metrics", max_output_tokens=2, stream=True, **GREEDY))
    after = metric_value(metrics_text(server), "vllm:e2e_request_latency_seconds_count", **labels)
    assert after == before + 2


def test_client_disconnect_aborts(server: str, engine: Any) -> None:
    body = {"model": MODEL, "input": "Write a long essay.", "max_output_tokens": 200, "stream": True}
    body["ignore_eos"] = True
    with httpx.stream("POST", f"{server}/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200
        deltas = 0
        for line in r.iter_lines():
            deltas += line == "event: response.output_text.delta"
            if deltas >= 3:
                break
        assert engine.get_metrics()["num_free_blocks"] < engine.get_metrics()["num_gpu_blocks"]
    assert_all_blocks_free(engine)


def assert_all_blocks_free(engine: Any) -> None:
    deadline = time.time() + 10
    while True:  # an abort lands on the engine's thread shortly after the disconnect
        m = engine.get_metrics()
        if m["num_free_blocks"] == m["num_gpu_blocks"] or time.time() > deadline:
            break
        time.sleep(0.05)
    assert m["num_free_blocks"] == m["num_gpu_blocks"]


def test_no_block_leak(engine: Any) -> None:
    assert_all_blocks_free(engine)  # last: every request above released its KV blocks
