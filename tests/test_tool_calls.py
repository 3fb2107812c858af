"""Tool calls (``--enable-auto-tool-choice --tool-call-parser hermes``) and reasoning (``--reasoning-parser``) in
chat completions, as vLLM parses them.

The parsers alone (whole outputs and every way of splitting them into stream deltas), then the real server over the
real engine with the official ``openai`` client. A tiny random model cannot write a tool call, so there the engine's
outputs keep their tokens, finish reasons and timing but their text is a script revealed as the tokens arrive.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from test_server import ServerThread, tiny_engine

from specserve.server.reasoning_parsers import ReasoningStream, extract_reasoning
from specserve.server.tool_parsers import HermesStream, extract_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
TWO = (
    "Let me look both up.\n"
    + CALL
    + '\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>'
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def _strip_ids(calls: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_extract_whole_output() -> None:
    content, calls = extract_tool_calls(TWO)
    assert content == "Let me look both up."
    assert _strip_ids(calls) == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("get_time", {"tz": "Europe/Paris"}),
    ]
    assert all(c["type"] == "function" and c["id"].startswith("chatcmpl-tool-") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    # only a call: no content (None, as vLLM); no call: the text unchanged
    assert extract_tool_calls(CALL)[0] is None
    assert extract_tool_calls("The weather is fine.") == ("The weather is fine.", [])
    # a body that is not a call stays content; string arguments pass through; an unclosed call at the end counts
    bad = "<tool_call>\nnot json\n</tool_call>"
    assert extract_tool_calls(bad) == (bad, [])
    assert extract_tool_calls('<tool_call>{"name": "f"}</tool_call>')[1][0]["function"]["arguments"] == "{}"
    _, calls = extract_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}')
    assert _strip_ids(calls) == [("f", {"x": 1})]


@pytest.mark.parametrize("seed", range(6))
def test_stream_equals_whole_output_for_any_split(seed: int) -> None:
    text = "Sure <tool_ — no, " + TWO + "\nDone."
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 40))) if seed else list(range(1, len(text)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    stream = HermesStream()
    content, calls = "", []
    for p in pieces:
        c, k = stream.feed(p)
        assert "<tool_call" not in c and "</tool_call" not in c  # tags never leak, not even half of one
        content, calls = content + c, calls + k
    c, k = stream.finish()
    content, calls = content + c, calls + k
    want_content, want_calls = extract_tool_calls(text)
    assert content.strip() == want_content
    assert _strip_ids(calls) == _strip_ids(want_calls)


class ScriptedText:
    """The real engine with each output's text replaced by ``script``, revealed in proportion to the tokens made so
    far (the whole script once the output finishes)."""

    def __init__(self, engine: Any, script: str) -> None:
        self.engine, self.script = engine, script

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def generate(self, ids: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        async for out in self.engine.generate(ids, params, request_id):
            for o in out.outputs:
                shown = len(self.script) * len(o.token_ids) // max(1, params.max_tokens)
                o.text = self.script if o.finish_reason else self.script[:shown]
            yield out


@pytest.fixture(scope="module")
def real_engine(tiny_llama_dir: str) -> Iterator[Any]:
    eng = tiny_engine(tiny_llama_dir, num_gpu_blocks=64)
    yield eng
    eng.shutdown()


def _client(
    engine: Any, script: str, tool_parser: str | None, reasoning_parser: str | None = None
) -> tuple[ServerThread, openai.OpenAI]:
    from specserve.server.api_server import build_app

    app = build_app(
        ScriptedText(engine, script), "tiny", tool_parser=tool_parser, reasoning_parser=reasoning_parser
    )
    srv = ServerThread(app)
    return srv, openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _ask(client: openai.OpenAI, stream: bool = False, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        max_tokens=16,
        temperature=0,
        stream=stream,
        extra_body={"ignore_eos": True},
        **kw,
    )


def test_tool_calls_non_streaming(real_engine: Any) -> None:
    srv, client = _client(real_engine, TWO, "hermes")
    with srv:
        r = _ask(client, tools=TOOLS)
        (choice,) = r.choices
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me look both up."
        calls = choice.message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris", "unit": "celsius"}),
            ("get_time", {"tz": "Europe/Paris"}),
        ]
        assert all(c.type == "function" and c.id for c in calls)
        # tool_choice "none": no parsing; no tools: no parsing
        for kw in ({"tools": TOOLS, "tool_choice": "none"}, {}):
            r = _ask(client, **kw)
            assert r.choices[0].message.content == TWO and not r.choices[0].message.tool_calls
            assert r.choices[0].finish_reason == "length"


def test_tool_calls_streaming(real_engine: Any) -> None:
    srv, client = _client(real_engine, TWO, "hermes")
    with srv:
        content, calls, finish = "", {}, None
        for chunk in _ask(client, stream=True, tools=TOOLS):
            for ch in chunk.choices:
                d = ch.delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    assert tc.index not in calls and tc.id and tc.type == "function"
                    calls[tc.index] = (tc.function.name, json.loads(tc.function.arguments))
                finish = ch.finish_reason or finish
        assert "<tool_call" not in content and content.strip() == "Let me look both up."
        assert calls == {
            0: ("get_weather", {"city": "Paris", "unit": "celsius"}),
            1: ("get_time", {"tz": "Europe/Paris"}),
        }
        assert finish == "tool_calls"


def test_tool_call_that_is_not_json_stays_content(real_engine: Any) -> None:
    bad = "<tool_call>\nget_weather(Paris)\n</tool_call>"
    srv, client = _client(real_engine, bad, "hermes")
    with srv:
        r = _ask(client, tools=TOOLS)
        assert r.choices[0].message.content == bad and not r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "length"


def test_auto_tool_choice_needs_the_parser(real_engine: Any) -> None:
    srv, client = _client(real_engine, CALL, None)
    with srv:
        with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
            _ask(client, tools=TOOLS, tool_choice="auto")
        # a named / "required" choice needs no parser (structured outputs; tests/test_structured.py), but valid
        with pytest.raises(openai.BadRequestError, match="tool_choice must be"):
            _ask(client, tools=TOOLS, tool_choice="sometimes")
        # tools without a tool_choice and without a parser: the raw text, as before
        r = _ask(client, tools=TOOLS)
        assert r.choices[0].message.content == CALL and not r.choices[0].message.tool_calls


def test_serve_flags(capsys: Any) -> None:
    from specserve.server.api_server import serve_main

    assert serve_main(["some/model", "--enable-auto-tool-choice"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tool-call-parser" in err[0]
    assert serve_main(["some/model", "--enable-auto-tool-choice", "--tool-call-parser", "nope"]) == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text,qwen3,deepseek_r1",
    [
        ("<think>\nhmm\n</think>\n\nParis.", ("\nhmm\n", "\n\nParis."), ("\nhmm\n", "\n\nParis.")),
        ("Paris.", (None, "Paris."), ("Paris.", None)),  # qwen3: no think block; r1: still thinking
        ("<think>cut short", ("cut short", None), ("cut short", None)),
        (
            "hmm</think>Paris.",
            (None, "hmm</think>Paris."),
            ("hmm", "Paris."),
        ),  # r1: <think> was in the prompt
        ("<think></think>Paris.", (None, "Paris."), (None, "Paris.")),
    ],
)
def test_extract_reasoning(text: str, qwen3: tuple, deepseek_r1: tuple) -> None:
    assert extract_reasoning(text, "qwen3") == qwen3
    assert extract_reasoning(text, "deepseek_r1") == deepseek_r1


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("seed", range(4))
def test_reasoning_stream_equals_whole_output_for_any_split(parser: str, seed: int) -> None:
    for text in ("<think>\nI think </thin not yet.\n</think>\n\nParis <think> is", "a</think>b", "<thi", "<"):
        rng = random.Random(seed)
        n = len(text)
        cuts = sorted(rng.sample(range(1, n), rng.randint(1, n - 1))) if seed and n > 2 else list(range(1, n))
        stream = ReasoningStream(parser)
        reasoning, content = "", ""
        for a, b in zip([0, *cuts], [*cuts, n]):
            r, c = stream.feed(text[a:b])
            assert "</think>" not in r
            reasoning, content = reasoning + r, content + c
        r, c = stream.finish()
        assert ((reasoning + r) or None, (content + c) or None) == extract_reasoning(text, parser)


def test_reasoning_and_tool_calls_over_http(real_engine: Any) -> None:
    script = "<think>\nThe user wants the weather.\n</think>\n\n" + CALL
    srv, client = _client(real_engine, script, "hermes", "qwen3")
    with srv:
        r = _ask(client, tools=TOOLS)
        msg = r.choices[0].message
        assert msg.reasoning_content == "\nThe user wants the weather.\n"
        assert msg.content is None and r.choices[0].finish_reason == "tool_calls"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
            ("get_weather", {"city": "Paris", "unit": "celsius"})
        ]
        reasoning, content, names = "", "", []
        for chunk in _ask(client, stream=True, tools=TOOLS):
            for ch in chunk.choices:
                reasoning += getattr(ch.delta, "reasoning_content", None) or ""
                content += ch.delta.content or ""
                names += [tc.function.name for tc in ch.delta.tool_calls or []]
        assert reasoning == "\nThe user wants the weather.\n"
        assert "<t" not in content and not content.strip() and names == ["get_weather"]
    # no reasoning parser: the think block stays in the content
    srv, client = _client(real_engine, script, None)
    with srv:
        msg = _ask(client).choices[0].message
        assert msg.content == script and getattr(msg, "reasoning_content", None) is None


def test_reasoning_parser_flag(capsys: Any) -> None:
    from specserve.server.api_server import serve_main

    assert serve_main(["some/model", "--reasoning-parser", "nope"]) == 2
    assert "invalid choice" in capsys.readouterr().err
