"""Tool-call parsing for chat completions (vLLM's ``--enable-auto-tool-choice --tool-call-parser``).

``hermes``: the format of Hermes, Qwen2.5 and Qwen3 chat templates, one JSON object per call between tags::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A call whose body is not such an object stays in the content as text. Content is the text outside the calls
(``None`` when there is none, as vLLM returns it). The streaming parser emits content as it comes, holds back a
suffix that may begin a tag, and emits each call whole (name and arguments in one delta) once its closing tag (or the
end of the output) arrives.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

TOOL_PARSERS = ("hermes",)

START, END = "<tool_call>", "</tool_call>"


def _parse_call(body: str) -> dict[str, Any] | None:
    """``{"name": str, "arguments": object or JSON string}`` -> an OpenAI tool call, else None."""
    try:
        obj = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return _call(obj["name"], args)


def _held_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag`` (may still become the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def extract_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The whole output -> (content or None, tool calls)."""
    stream = HermesStream()
    content, calls = stream.feed(text)
    rest, more = stream.finish()
    content = (content + rest).strip()
    return (content or None), calls + more


class HermesStream:
    """Incremental ``hermes`` parsing of one choice's text: ``feed(delta)`` and, at the end, ``finish()`` each
    return (content to emit, tool calls completed)."""

    def __init__(self) -> None:
        self.buf = ""
        self.in_call = False
        self.num_calls = 0
        self.after_call = False  # whitespace right after a call is layout, not content

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        self.buf += delta
        return self._drain(final=False)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, list[dict[str, Any]]]:
        content: list[str] = []
        calls: list[dict[str, Any]] = []

        def text(piece: str) -> None:
            if self.after_call:
                piece = piece.lstrip()
                self.after_call = not piece
            if piece:
                content.append(piece)

        while True:
            if not self.in_call:
                i = self.buf.find(START)
                if i >= 0:
                    text(self.buf[:i])
                    self.buf, self.in_call = self.buf[i + len(START) :], True
                    continue
                keep = 0 if final else _held_suffix(self.buf, START)
                text(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                break
            j = self.buf.find(END)
            if j < 0 and not final:
                break
            body = self.buf if j < 0 else self.buf[:j]
            closing = "" if j < 0 else END
            self.buf, self.in_call = ("" if j < 0 else self.buf[j + len(END) :]), False
            call = _parse_call(body)
            if call is None:
                text(START + body + closing)
            else:
                calls.append(call)
                self.num_calls += 1
                self.after_call = True
            if j < 0:
                break
        return "".join(content), calls


# --------------------------------------------------------------------------- tool_choice "required" / named
def required_tools_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """vLLM's schema for ``tool_choice: "required"``: a non-empty JSON array of ``{"name", "parameters"}`` objects,
    each naming one of ``tools`` with arguments valid under its parameters schema."""
    alts = []
    for t in tools:
        fn = t.get("function") or {}
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        alts.append(
            {
                "properties": {"name": {"type": "string", "enum": [fn.get("name")]}, "parameters": params},
                "required": ["name", "parameters"],
            }
        )
    return {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": alts}}


def forced_tool_calls(text: str, name: str | None) -> list[dict[str, Any]] | None:
    """The calls of a structured output forced by ``tool_choice``: ``name`` set (a named choice): the text is the
    arguments of one call; None (``required``): the text is vLLM's ``[{"name", "parameters"}, ...]`` array. None
    when the text is not such JSON (an output cut by max_tokens)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if name is not None:
        return [_call(name, text)] if isinstance(obj, dict) else None
    if not isinstance(obj, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) for c in obj
    ):
        return None
    return [_call(c["name"], json.dumps(c.get("parameters", {}), ensure_ascii=False)) for c in obj]


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class ForcedToolStream:
    """Streaming for a named / ``required`` tool choice: no content; the calls, whole, when the output ends (the
    same interface as HermesStream)."""

    def __init__(self, name: str | None) -> None:
        self.name = name
        self.text = ""
        self.num_calls = 0

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        self.text += delta
        return "", []

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        calls = forced_tool_calls(self.text, self.name)
        if calls is None:
            return self.text, []
        self.num_calls += len(calls)
        return "", calls
