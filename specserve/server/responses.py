"""OpenAI's Responses API (``POST /v1/responses``), the text subset vLLM serves, over the chat machinery.

A request becomes a ``ChatCompletionRequest`` (``instructions`` a leading system message, ``input`` the messages,
``text.format`` the ``response_format``), so its prompt is rendered, tokenized, constrained and generated exactly as
``/v1/chat/completions`` would do it (``OpenAIServing.chat_inputs``). This module builds that request and the
Response object and stream events around the engine's output. Nothing is stored (as vLLM without
``VLLM_ENABLE_RESPONSES_API_STORE``): ``previous_response_id``, ``background`` and ``conversation`` are refused
with a 400, and so are tools.
"""

from __future__ import annotations

import json
from typing import Any

from specserve.errors import RequestValidationError
from specserve.outputs import RequestOutput
from specserve.sampling_params import SamplingParams
from specserve.server.protocol import (
    ChatCompletionRequest,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponsesRequest,
    ResponsesResponse,
    ResponseUsage,
    now,
)

__all__ = ["ResponseEvents", "chat_request", "finished_response", "new_response", "renamed_params"]

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")
# chat-side parameter names -> the Responses API's, for the errors the shared chat path raises
_RENAMED_PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text", "messages": "input"}


def _bad(message: str, param: str) -> RequestValidationError:
    return RequestValidationError(message, param)


def check_supported(req: ResponsesRequest, max_model_len: int) -> None:
    """400 for what this server cannot do: stored state, tools, prompt templates, logprobs."""
    if req.previous_response_id is not None:
        raise _bad(
            "previous_response_id is not supported: this server does not store responses, so there is none to "
            "continue; send the whole conversation in `input`.",
            "previous_response_id",
        )
    if req.background:
        raise _bad("background is not supported: this server does not store responses.", "background")
    if req.conversation is not None:
        raise _bad("conversation is not supported: this server does not store responses.", "conversation")
    if req.prompt is not None:
        raise _bad("prompt (a stored prompt template) is not supported.", "prompt")
    if req.tools:
        raise _bad("tools are not supported by /v1/responses on this server.", "tools")
    if req.tool_choice not in (None, "none", "auto"):  # "auto" without tools: no tool call possible
        raise _bad(
            f"tool_choice must be 'none' or 'auto' (tools are not supported by /v1/responses on this server), "
            f"got {req.tool_choice!r}.",
            "tool_choice",
        )
    if req.include and "message.output_text.logprobs" in req.include:
        raise _bad("include: 'message.output_text.logprobs' is not supported.", "include")
    mt = req.max_output_tokens
    if mt is not None and mt < 1:
        raise _bad(f"max_output_tokens must be at least 1, got {mt}.", "max_output_tokens")
    if mt is not None and mt > max_model_len:
        raise _bad(
            f"max_output_tokens={mt} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_output_tokens",
        )


def _content(i: int, content: Any) -> str | list[dict[str, Any]]:
    """A message's content as chat content: a string, or its text parts as chat ``text`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"input[{i}]: 'content' must be a string or a list of content parts.", "input")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if isinstance(part, dict) and kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif isinstance(part, dict) and kind == "refusal":
            parts.append({"type": "refusal", "refusal": str(part.get("refusal", ""))})
        else:
            raise _bad(f"input[{i}]: content part of type {kind!r} is not supported.", "input")
    return parts


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` (a system message, first) and ``input`` as chat messages."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        if not req.input:
            raise _bad("input cannot be empty.", "input")
        messages.append({"role": "user", "content": req.input})
        return messages
    if not req.input:
        raise _bad("input cannot be empty.", "input")
    for i, item in enumerate(req.input):
        kind = item.get("type", "message")
        if kind != "message":
            raise _bad(f"input[{i}]: items of type {kind!r} are not supported (only messages).", "input")
        role = item.get("role")
        if role not in _ROLES:
            raise _bad(f"input[{i}]: role must be one of {', '.join(_ROLES)}, got {role!r}.", "input")
        messages.append({"role": role, "content": _content(i, item.get("content"))})
    return messages


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (None for plain text)."""
    fmt = None if text is None else text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _bad("text.format must be an object.", "text")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise _bad("text.format: a json_schema format must carry a `schema` object.", "text")
        js: dict[str, Any] = {"schema": schema}
        for key in ("name", "strict", "description"):
            if key in fmt:
                js[key] = fmt[key]
        return {"type": "json_schema", "json_schema": js}
    raise _bad(f"text.format: type must be 'text', 'json_schema' or 'json_object', got {kind!r}.", "text")


def renamed_params(req: ResponsesRequest) -> dict[str, str]:
    """The chat path's parameter names as ``req`` knows them, for its errors: the engine's structured-outputs
    errors are ``text``'s when the constraint came from ``text.format``."""
    names = dict(_RENAMED_PARAMS)
    if req.structured_outputs is None and response_format(req.text) is not None:
        names["structured_outputs"] = "text"
    return names


def chat_request(req: ResponsesRequest, max_model_len: int) -> ChatCompletionRequest:
    """The chat request that generates ``req``'s response (after the 400s for what is not supported)."""
    check_supported(req, max_model_len)
    return ChatCompletionRequest(
        model=req.model,
        messages=input_messages(req),
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=req.stop,
        ignore_eos=req.ignore_eos,
        repetition_penalty=req.repetition_penalty,
        logit_bias=req.logit_bias,
        skip_special_tokens=req.skip_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        structured_outputs=req.structured_outputs,
        response_format=response_format(req.text),
        user=req.user,
        stream=bool(req.stream),
        priority=req.priority,
    )


def new_response(
    req: ResponsesRequest, response_id: str, model: str, params: SamplingParams
) -> ResponsesResponse:
    """The response as created (``in_progress``, no output yet): the request's settings echoed back."""
    return ResponsesResponse(
        id=response_id,
        status="in_progress",
        model=model,
        instructions=req.instructions,
        temperature=params.temperature,
        top_p=params.top_p,
        max_output_tokens=req.max_output_tokens,
        metadata=dict(req.metadata or {}),
        text=req.text
        if req.text is not None and req.text.get("format") is not None
        else {"format": {"type": "text"}},
        reasoning=req.reasoning,
        user=req.user,
    )


def finished_response(resp: ResponsesResponse, message_id: str, final: RequestOutput) -> ResponsesResponse:
    """``resp`` once generation ended with ``final``: its status, the assistant message and the usage."""
    out = final.outputs[0]
    status: Any = "completed"
    incomplete: dict[str, str] | None = None
    if out.finish_reason == "length":  # max_output_tokens or the context length ended it
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    elif out.finish_reason == "abort":
        status = "cancelled"
    message = ResponseOutputMessage(
        id=message_id,
        status="completed" if status == "completed" else "incomplete",
        content=[ResponseOutputText(text=out.text)],
    )
    p, c = len(final.prompt_token_ids), len(out.token_ids)
    usage = ResponseUsage(
        input_tokens=p,
        input_tokens_details={"cached_tokens": final.num_cached_tokens},
        output_tokens=c,
        total_tokens=p + c,
    )
    return resp.model_copy(
        update={
            "status": status,
            "incomplete_details": incomplete,
            "output": [message],
            "usage": usage,
            "completed_at": now(),
        }
    )


class ResponseEvents:
    """One streamed response's server-sent events (``event: TYPE`` + ``data: JSON``), numbered in order."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.sequence_number = 0

    def event(self, type_: str, **fields: Any) -> str:
        payload = {"type": type_, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {type_}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def opening(self, resp: ResponsesResponse) -> list[str]:
        """created, in_progress, then the assistant message and its (empty) text part."""
        body = resp.model_dump(mode="json")
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        return [
            self.event("response.created", response=body),
            self.event("response.in_progress", response=body),
            self.event(
                "response.output_item.added",
                output_index=0,
                item=ResponseOutputMessage(id=self.message_id, status="in_progress").model_dump(mode="json"),
            ),
            self.event("response.content_part.added", **where, part=ResponseOutputText(text="").model_dump()),
        ]

    def delta(self, text: str) -> str:
        return self.event(
            "response.output_text.delta",
            item_id=self.message_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def closing(self, final: ResponsesResponse) -> list[str]:
        """The text, its part and the message done, then ``response.completed`` with the whole response (as
        vLLM, whatever the status: ``incomplete`` included)."""
        item = final.output[0]
        part = item.content[0]
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        return [
            self.event("response.output_text.done", **where, text=part.text, logprobs=[]),
            self.event("response.content_part.done", **where, part=part.model_dump(mode="json")),
            self.event("response.output_item.done", output_index=0, item=item.model_dump(mode="json")),
            self.event("response.completed", response=final.model_dump(mode="json")),
        ]

    def error(self, message: str, code: str, param: str | None) -> str:
        """An error mid-stream (OpenAI's ``error`` event); the stream ends after it."""
        return self.event("error", code=code, message=message, param=param)
