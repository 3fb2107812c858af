"""OpenAI-compatible HTTP server (FastAPI + uvicorn), a drop-in for ``vllm serve``.

The engine steps in its own thread (``AsyncLLM``); this layer only tokenizes, enqueues and streams.
``build_app`` wires the routes over any object with the ``AsyncLLM`` interface (tests use it directly);
``serve_main`` is ``specserve serve``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import secrets
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError as FastAPIValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from specserve.errors import RequestValidationError as EngineValidationError
from specserve.errors import first_line, parse_exit_code, startup_exit_code
from specserve.outputs import Logprob, RequestOutput
from specserve.sampling_params import SamplingParams, StructuredOutputsParams
from specserve.server.metrics import CONTENT_TYPE_LATEST, RequestTimer, ServerMetrics
from specserve.server.protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
    DeltaMessage,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    ResponsesRequest,
    ResponsesResponse,
    TokenizeRequest,
    TokenizeResponse,
    UsageInfo,
    now,
    random_uuid,
)
from specserve.server.reasoning_parsers import REASONING_PARSERS, ReasoningStream, extract_reasoning
from specserve.server.responses import (
    ResponseEvents,
    chat_request,
    finished_response,
    new_response,
    renamed_params,
)
from specserve.server.tool_parsers import (
    TOOL_PARSERS,
    ForcedToolStream,
    HermesStream,
    extract_tool_calls,
    forced_tool_calls,
    required_tools_schema,
)

logger = logging.getLogger("specserve.server")

__all__ = ["APIError", "build_app", "serve_main"]

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "RequestEntityTooLargeError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}
DEMO_MODEL_NAME = "SmolLM2-135M-Instruct"  # served name of the bundled demo (no MODEL given)
_SAMPLING_FIELDS = {
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "max_tokens",
    "min_tokens",
    "logprobs",
    "prompt_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
}


class APIError(Exception):
    """An error that becomes an OpenAI-style error body with ``status``."""

    def __init__(
        self, status: int, message: str, param: str | None = None, err_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type or _ERROR_TYPES.get(
            status, HTTPStatus(status).phrase.replace(" ", "") + "Error"
        )


def error_response(
    status: int, message: str, param: str | None = None, err_type: str | None = None
) -> JSONResponse:
    err = APIError(status, message, param, err_type)
    body = ErrorResponse(error=ErrorInfo(message=message, type=err.err_type, param=param, code=status))
    return JSONResponse(body.model_dump(), status_code=status)


def _stream_error(e: Exception, request_id: str) -> list[str]:
    """An error raised mid-stream: an SSE error event, then [DONE] (vLLM's behaviour)."""
    if not isinstance(e, (ValueError, APIError)):
        logger.exception("error while streaming %s", request_id)
    return [_sse(_error_json(_to_api_error(e))), _sse("[DONE]")]


def _error_json(err: APIError) -> str:
    return ErrorResponse(
        error=ErrorInfo(message=err.message, type=err.err_type, param=err.param, code=err.status)
    ).model_dump_json()


# structured_outputs fields vLLM accepts that change nothing here (backend choices, whitespace options)
_SO_IGNORED = frozenset(
    (
        "disable_fallback",
        "disable_additional_properties",
        "whitespace_pattern",
        "_backend",
    )
)


def _prompt_logprobs_json(plp: list[dict[int, Logprob] | None] | None) -> list[Any] | None:
    """vLLM's ``prompt_logprobs`` in a response: per prompt token None (the first) or {token id: Logprob}."""
    if plp is None:
        return None
    return [
        None
        if d is None
        else {
            str(t): {"logprob": max(lp.logprob, -9999.0), "rank": lp.rank, "decoded_token": lp.decoded_token}
            for t, lp in d.items()
        }
        for d in plp
    ]


def _param_from_message(message: str) -> str | None:
    first = message.split(" ", 1)[0].strip("`'\":,")
    return first if first in _SAMPLING_FIELDS else None


def _to_api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineValidationError):
        return APIError(400, exc.message, exc.param)
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        msg = str(exc) or type(exc).__name__
        return APIError(400, msg, _param_from_message(msg))
    if isinstance(exc, NotImplementedError):
        return APIError(501, str(exc) or "Not implemented.")
    try:
        from jinja2 import TemplateError

        if isinstance(exc, TemplateError):
            return APIError(400, f"Chat template error: {exc}")
    except ImportError:  # pragma: no cover - jinja2 ships with transformers
        pass
    return APIError(500, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def _renamed_error(exc: BaseException, names: dict[str, str]) -> APIError:
    """An error of the chat path under another API's parameter names (``names``: chat name -> that API's)."""
    err = _to_api_error(exc)
    message = err.message
    for old, new in names.items():
        if old != "messages":  # "messages[i]" indices count the instructions' message too: left as they are
            message = message.replace(old, new)
    param = names.get(err.param, err.param) if err.param is not None else None
    return APIError(err.status, message, param, err.err_type)


@functools.lru_cache(maxsize=32)
def template_content_format(template: str) -> str:
    """vLLM's ``--chat-template-content-format auto``: ``openai`` when the Jinja template loops over a message's
    content (``for part in message['content']``, directly or through a variable set from it; the template then
    expects a list of parts), else ``string``."""
    import jinja2
    from jinja2 import nodes

    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])
    try:
        tree = env.parse(template)
    except jinja2.TemplateError:
        return "string"

    def is_content(node: nodes.Node) -> bool:
        if isinstance(node, nodes.Getattr):
            return node.attr == "content"
        if isinstance(node, nodes.Getitem):
            return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
        return False

    names = {
        a.target.name
        for a in tree.find_all(nodes.Assign)
        if isinstance(a.target, nodes.Name) and is_content(a.node)
    }
    for loop in tree.find_all(nodes.For):
        it = loop.iter
        while isinstance(it, nodes.Filter) and it.node is not None:  # content | selectattr(...)
            it = it.node
        if is_content(it) or (isinstance(it, nodes.Name) and it.name in names):
            return "openai"
    return "string"


class APIKeyMiddleware:
    """Require ``Authorization: Bearer <key>`` on ``/v1/*`` (pure ASGI, so streaming is untouched)."""

    def __init__(self, app: ASGIApp, api_keys: Sequence[str]) -> None:
        self.app = app
        self.tokens = [f"Bearer {k}".encode() for k in api_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") != "OPTIONS":
            path = scope.get("path", "")
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            if path.startswith("/v1"):
                given = Headers(scope=scope).get("authorization", "").encode()
                if not any(secrets.compare_digest(given, t) for t in self.tokens):
                    resp = error_response(401, "Unauthorized: missing or invalid API key.")
                    await resp(scope, receive, send)
                    return
        await self.app(scope, receive, send)


# --------------------------------------------------------------------------- generation plumbing


@dataclass
class _Gen:
    """One engine request: its id, iterator, the primed first output and whether it finished."""

    request_id: str
    it: AsyncIterator[RequestOutput]
    first: RequestOutput | None = None
    finished: bool = False
    final: RequestOutput | None = None


def _sse(payload: str) -> str:
    return f"data: {payload}\n\n"


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class OpenAIServing:
    """The request handlers; one instance per app."""

    def __init__(
        self,
        engine: Any,
        served_model_names: list[str],
        metrics: ServerMetrics,
        chat_template: str | None = None,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        *,
        response_role: str = "assistant",
        max_logprobs: int = 20,
        generation_overrides: dict[str, Any] | None = None,
        return_tokens_as_token_ids: bool = False,
        enable_prompt_tokens_details: bool = False,
        enable_force_include_usage: bool = False,
        chat_template_content_format: str = "auto",
    ) -> None:
        if chat_template_content_format not in ("auto", "string", "openai"):
            raise ValueError(
                f"chat_template_content_format must be auto, string or openai; got {chat_template_content_format!r}"
            )
        self.engine = engine
        self.served_model_names = served_model_names
        self.metrics = metrics
        self.chat_template = chat_template
        # --enable-auto-tool-choice --tool-call-parser NAME: tool calls parsed out of chat outputs (tool_parsers.py)
        self.tool_parser = tool_parser
        # --reasoning-parser NAME: <think>...</think> split into reasoning_content (reasoning_parsers.py)
        self.reasoning_parser = reasoning_parser
        self.response_role = response_role  # --response-role
        self.max_logprobs = max_logprobs  # --max-logprobs (-1: up to the vocabulary size)
        self.generation_overrides = dict(generation_overrides or {})  # --override-generation-config
        self.return_tokens_as_token_ids = return_tokens_as_token_ids  # --return-tokens-as-token-ids
        self.enable_prompt_tokens_details = enable_prompt_tokens_details  # --enable-prompt-tokens-details
        self.enable_force_include_usage = enable_force_include_usage  # --enable-force-include-usage
        self.chat_template_content_format = chat_template_content_format  # --chat-template-content-format
        self._background: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ helpers
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def check_model(self, model: str | None) -> str:
        if model is None or model == "":
            return self.served_model_names[0]
        if model not in self.served_model_names:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        return model

    def _defaults(self) -> dict[str, Any]:
        """Request defaults: the generation config's, then --override-generation-config's."""
        return {
            **(getattr(self.engine, "default_sampling_overrides", None) or {}),
            **self.generation_overrides,
        }

    def check_logprobs(self, name: str, value: int | None) -> None:
        """--max-logprobs: a request may ask for at most that many (log)probs per token."""
        cap = self.max_logprobs if self.max_logprobs >= 0 else len(self.tokenizer)
        if value is not None and not 0 <= value <= cap:
            raise APIError(400, f"{name} must be an integer in [0, {cap}], got {value}.", name)

    def chat_role(self, req: ChatCompletionRequest) -> str:
        """As vLLM: --response-role after a generation prompt, else the continued last message's role."""
        return self.response_role if req.add_generation_prompt else str(req.messages[-1].get("role"))

    @staticmethod
    def structured_outputs(
        req: CompletionRequest | ChatCompletionRequest, forced: dict[str, Any] | None = None
    ) -> StructuredOutputsParams | None:
        """The request's output constraint, from whichever of OpenAI's ``response_format``, vLLM's
        ``structured_outputs`` or its older ``guided_json`` / ``guided_choice`` / ... it uses (one at most), or
        ``forced``: the JSON schema a named / ``required`` tool choice imposes."""
        specs: list[tuple[str, dict[str, Any]]] = []
        rf = req.response_format
        if rf is not None:
            kind = rf.get("type", "text") if isinstance(rf, dict) else None
            if kind == "json_object":
                specs.append(("response_format", {"json_object": True}))
            elif kind == "json_schema":
                js = rf.get("json_schema")
                schema = js.get("schema", js.get("json_schema")) if isinstance(js, dict) else None
                if schema is None:
                    raise APIError(
                        400, "response_format: json_schema must carry a `schema`.", "response_format"
                    )
                specs.append(("response_format", {"json": schema}))
            elif kind != "text":
                raise APIError(
                    400,
                    f"response_format: type must be 'text', 'json_object' or 'json_schema', got {kind!r}.",
                    "response_format",
                )
        if req.structured_outputs is not None:
            if not isinstance(req.structured_outputs, dict):
                raise APIError(400, "structured_outputs must be an object.", "structured_outputs")
            so = {k: v for k, v in req.structured_outputs.items() if v is not None and k not in _SO_IGNORED}
            specs.append(("structured_outputs", so))
        for field, key in (
            ("guided_json", "json"),
            ("guided_regex", "regex"),
            ("guided_choice", "choice"),
            ("guided_grammar", "grammar"),
        ):
            v = getattr(req, field)
            if v is not None:
                specs.append((field, {key: v}))
        if forced is not None:
            if specs:
                raise APIError(
                    400,
                    f"A named or 'required' tool_choice cannot be combined with {specs[0][0]}.",
                    "tool_choice",
                )
            specs.append(("tool_choice", {"json": forced}))
        if not specs:
            return None
        if len(specs) > 1:
            raise APIError(
                400,
                f"Only one kind of structured outputs constraint may be set; got {specs[0][0]} and {specs[1][0]}.",
                specs[1][0],
            )
        where, spec = specs[0]
        unknown = sorted(set(spec) - set(StructuredOutputsParams.__dataclass_fields__))
        if unknown:
            raise APIError(400, f"{where}: unknown field(s) {', '.join(unknown)}.", where)
        try:
            return StructuredOutputsParams(**spec)
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), where) from None

    def build_params(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        max_tokens: int | None,
        logprobs: int | None,
        forced_schema: dict[str, Any] | None = None,
    ) -> SamplingParams:
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of is not supported; use n.", "best_of")
        logit_bias = None
        if req.logit_bias:
            try:  # as vLLM: token ids as strings, biases clamped to [-100, 100]
                biases = {int(t): float(b) for t, b in req.logit_bias.items()}
                if not all(map(math.isfinite, biases.values())):
                    raise ValueError
                logit_bias = {t: min(100.0, max(-100.0, b)) for t, b in biases.items()}
            except (TypeError, ValueError):
                raise APIError(400, "logit_bias must map token ids to numbers.", "logit_bias") from None
        if req.prompt_logprobs is not None and req.stream:
            raise APIError(400, "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if req.stream_options is not None and not req.stream:
            raise APIError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
        self.check_logprobs(
            "top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs", logprobs
        )
        self.check_logprobs("prompt_logprobs", req.prompt_logprobs)
        structured = self.structured_outputs(req, forced_schema)
        d = self._defaults()

        def pick(name: str, fallback: Any) -> Any:
            v = getattr(req, name)
            return v if v is not None else d.get(name, fallback)

        try:
            return SamplingParams(
                n=req.n,
                temperature=pick("temperature", 1.0),
                top_p=pick("top_p", 1.0),
                top_k=pick("top_k", 0),
                min_p=pick("min_p", 0.0),
                seed=req.seed,
                stop=req.stop,
                stop_token_ids=req.stop_token_ids,
                ignore_eos=req.ignore_eos,
                max_tokens=max_tokens,
                min_tokens=req.min_tokens,
                logprobs=logprobs,
                skip_special_tokens=req.skip_special_tokens,
                include_stop_str_in_output=req.include_stop_str_in_output,
                structured_outputs=structured,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                repetition_penalty=pick("repetition_penalty", 1.0),
                logit_bias=logit_bias,
                allowed_token_ids=req.allowed_token_ids,
                prompt_logprobs=req.prompt_logprobs,
                bad_words=req.bad_words,
            )
        except (ValueError, TypeError) as e:
            msg = str(e)
            raise APIError(400, msg, _param_from_message(msg)) from None

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        template = chat_template or self.chat_template
        fmt = self.chat_template_content_format
        if fmt == "auto":
            source = template if template is not None else getattr(self.tokenizer, "chat_template", None)
            fmt = template_content_format(source) if isinstance(source, str) else "string"
        conv: list[dict[str, Any]] = []
        for i, m in enumerate(messages):
            if not isinstance(m.get("role"), str):
                raise APIError(400, f"messages[{i}]: 'role' must be a string.", "messages")
            msg = dict(m)
            content = msg.get("content")
            if isinstance(content, list):
                texts = []
                for part in content:
                    if isinstance(part, str):
                        texts.append(part)
                    elif isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                        texts.append(str(part.get("text", "")))
                    elif isinstance(part, dict) and part.get("type") == "refusal":
                        texts.append(str(part.get("refusal", "")))
                    else:
                        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                        raise APIError(
                            400, f"messages[{i}]: content part of type {kind!r} is not supported.", "messages"
                        )
                msg["content"] = (
                    "\n".join(texts) if fmt == "string" else [{"type": "text", "text": t} for t in texts]
                )
            elif isinstance(content, str) and fmt == "openai":
                msg["content"] = [{"type": "text", "text": content}]
            elif content is not None and not isinstance(content, str):
                raise APIError(
                    400, f"messages[{i}]: 'content' must be a string or a list of parts.", "messages"
                )
            conv.append(msg)
        if continue_final_message and add_generation_prompt:
            raise APIError(
                400,
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )
        kwargs: dict[str, Any] = dict(chat_template_kwargs or {})
        if template is not None:
            kwargs["chat_template"] = template
        if tools:
            kwargs["tools"] = tools
        try:
            text = self.tokenizer.apply_chat_template(
                conv,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **kwargs,
            )
        except APIError:
            raise
        except Exception as e:  # jinja errors, missing template, bad roles
            raise APIError(400, f"Chat template error: {e}", "messages") from None
        if not isinstance(text, str):  # some tokenizers return a list for batched input
            text = text[0]
        return text

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def truncate(self, ids: list[int], req: CompletionRequest | ChatCompletionRequest) -> list[int]:
        """vLLM's truncate_prompt_tokens: keep the prompt's last N tokens (-1: max_model_len)."""
        n = req.truncate_prompt_tokens
        if n is None:
            return ids
        max_len = int(self.engine.max_model_len)
        if n == -1:
            n = max_len
        if n == 0:
            raise APIError(
                400, "truncate_prompt_tokens must be -1 or at least 1, got 0.", "truncate_prompt_tokens"
            )
        if n > max_len:
            raise APIError(
                400,
                f"truncate_prompt_tokens value ({n}) is greater than max_model_len ({max_len}). "
                "Please request a smaller truncation size.",
                "truncate_prompt_tokens",
            )
        return ids[-n:]

    def _decoded(self, token_id: int, lp: Logprob) -> str:
        if lp.decoded_token is not None:
            return lp.decoded_token
        return self.tokenizer.decode([token_id])

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_all(self, gens: Iterable[_Gen]) -> None:
        for g in gens:
            if g.finished:
                continue
            with suppress(BaseException):
                aclose = getattr(g.it, "aclose", None)
                if aclose is not None:
                    await aclose()
            with suppress(BaseException):
                await self.engine.abort(g.request_id)

    def cleanup(self, gens: list[_Gen]) -> None:
        """Abort unfinished requests in a fresh task (safe to call while this task is being cancelled)."""
        if any(not g.finished for g in gens):
            self._spawn(self._abort_all(list(gens)))

    async def start(
        self, prompts: list[list[int]], params: SamplingParams, base_id: str, priority: int = 0
    ) -> list[_Gen]:
        """Submit every prompt and wait for each first output, so validation errors surface as 4xx before any
        byte of a stream is sent. ``priority``: the request's, for --scheduling-policy priority."""
        gens: list[_Gen] = []
        extra = {"priority": priority} if priority else {}
        for i, ids in enumerate(prompts):
            rid = base_id if len(prompts) == 1 else f"{base_id}-{i}"
            p = params if len(prompts) == 1 else params.clone()
            gens.append(_Gen(rid, self.engine.generate(ids, p, rid, **extra).__aiter__()))
        try:
            results = await asyncio.gather(*(g.it.__anext__() for g in gens), return_exceptions=True)
        except BaseException:
            self.cleanup(gens)
            raise
        errors = [r for r in results if isinstance(r, BaseException)]
        for g, r in zip(gens, results):
            if isinstance(r, BaseException):
                g.finished = True  # nothing to abort: it never started or already ended
            else:
                g.first = r
                g.finished = r.finished
        if errors:
            self.cleanup(gens)
            err = errors[0]
            if isinstance(err, StopAsyncIteration):
                raise APIError(500, "The engine ended the request without producing output.")
            raise err
        return gens

    async def _iterate(self, g: _Gen) -> AsyncIterator[RequestOutput]:
        if g.first is not None:
            first, g.first = g.first, None
            g.final = first
            yield first
            if first.finished:
                g.finished = True
                return
        async for out in g.it:
            g.final = out
            if out.finished:
                g.finished = True
            yield out
            if out.finished:
                return

    async def _merged(
        self, gens: list[_Gen], timer: RequestTimer
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, output) from every request as they come, with latency bookkeeping."""

        def count(out: RequestOutput) -> int:
            return sum(len(o.token_ids) for o in out.outputs)

        seen = [0] * len(gens)
        if len(gens) == 1:
            async for out in self._iterate(gens[0]):
                c = count(out)
                timer.step(c - seen[0])
                seen[0] = c
                yield 0, out
            return
        q: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        done = object()

        async def drain(i: int, g: _Gen) -> None:
            try:
                async for out in self._iterate(g):
                    await q.put((i, out))
                await q.put((i, done))
            except Exception as e:  # noqa: BLE001 - re-raised in the consumer
                await q.put((i, e))

        tasks = [asyncio.get_running_loop().create_task(drain(i, g)) for i, g in enumerate(gens)]
        try:
            remaining = len(tasks)
            while remaining:
                i, item = await q.get()
                if item is done:
                    remaining -= 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                c = count(item)
                timer.step(c - seen[i])
                seen[i] = c
                yield i, item
        finally:
            for t in tasks:
                t.cancel()

    def _finish_timer(self, gens: list[_Gen], timer: RequestTimer) -> None:
        finals = [g.final for g in gens if g.final is not None]
        timer.finish(
            sum(len(f.prompt_token_ids) for f in finals),
            sum(len(o.token_ids) for f in finals for o in f.outputs),
        )

    async def collect(
        self, gens: list[_Gen], raw_request: Request, timer: RequestTimer
    ) -> list[RequestOutput] | None:
        """Run every request to the end; None if the client went away first (the requests are aborted)."""

        async def consume() -> None:
            async for _ in self._merged(gens, timer):
                pass

        task = asyncio.ensure_future(consume())
        watcher = asyncio.ensure_future(_wait_for_disconnect(raw_request))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                task.result()
                self._finish_timer(gens, timer)
                return [g.final for g in gens]  # type: ignore[misc]
            logger.info("client disconnected; aborting %s", ", ".join(g.request_id for g in gens))
            return None
        finally:
            watcher.cancel()
            if not task.done():
                task.cancel()
            self.cleanup(gens)

    # ------------------------------------------------------------------ logprobs
    def as_token_ids(self, req: CompletionRequest | ChatCompletionRequest) -> bool:
        """Logprobs name tokens as ``token_id:N``: the request's return_tokens_as_token_ids, else the server's."""
        flag = getattr(req, "return_tokens_as_token_ids", None)
        return self.return_tokens_as_token_ids if flag is None else bool(flag)

    def _token_name(self, token_id: int, lp: Logprob | None, as_ids: bool) -> str:
        if as_ids:
            return f"token_id:{token_id}"
        return self._decoded(token_id, lp) if lp is not None else self.tokenizer.decode([token_id])

    def completion_logprobs(
        self,
        token_ids: list[int],
        logprobs: Sequence[dict[int, Logprob] | None],
        text_offset: int,
        as_ids: bool = False,
    ) -> CompletionLogProbs:
        """A completion's logprobs; a None step (an echoed prompt's first token) has none, as in vLLM. With
        ``as_ids`` tokens are named ``token_id:N`` (text offsets still count the decoded text)."""
        # built as lists and passed in: a stream chunk is dumped with exclude_unset, which drops fields only
        # mutated in place
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        text_offsets: list[int] = []
        offset = text_offset
        for tid, step in zip(token_ids, logprobs):
            chosen = step.get(tid) if step else None
            text = self._token_name(tid, chosen, False)
            tokens.append(f"token_id:{tid}" if as_ids else text)
            token_logprobs.append(max(chosen.logprob, -9999.0) if chosen is not None else None)
            top_logprobs.append(
                {self._token_name(t, lp, as_ids): max(lp.logprob, -9999.0) for t, lp in step.items()}
                if step
                else None
            )
            text_offsets.append(offset)
            offset += len(text)
        return CompletionLogProbs(
            text_offset=text_offsets, token_logprobs=token_logprobs, tokens=tokens, top_logprobs=top_logprobs
        )

    def chat_logprobs(
        self,
        token_ids: list[int],
        logprobs: list[dict[int, Logprob]],
        top_logprobs: int,
        as_ids: bool = False,
    ) -> ChatCompletionLogProbs:
        """A chat choice's logprobs; with ``as_ids`` tokens are named ``token_id:N`` and ``bytes`` stay the
        decoded text's."""
        content = []
        for tid, step in zip(token_ids, logprobs):
            chosen = step.get(tid)
            text = self._token_name(tid, chosen, False)
            ranked = sorted(step.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
            top = [
                ChatCompletionLogProb(
                    token=self._token_name(t, lp, as_ids),
                    logprob=max(lp.logprob, -9999.0),
                    bytes=list(self._token_name(t, lp, False).encode("utf-8", errors="replace")),
                )
                for t, lp in ranked[:top_logprobs]
            ]
            content.append(
                ChatCompletionLogProbsContent(
                    token=f"token_id:{tid}" if as_ids else text,
                    logprob=max(chosen.logprob, -9999.0) if chosen is not None else -9999.0,
                    bytes=list(text.encode("utf-8", errors="replace")),
                    top_logprobs=top,
                )
            )
        return ChatCompletionLogProbs(content=content)

    # ------------------------------------------------------------------ /v1/completions
    def completion_prompts(self, req: CompletionRequest) -> tuple[list[list[int]], list[str | None]]:
        prompt = req.prompt
        if req.suffix:
            raise APIError(400, "suffix is not currently supported.", "suffix")
        items: list[str | list[int]]
        if isinstance(prompt, str):
            items = [prompt]
        elif len(prompt) == 0:
            raise APIError(400, "The prompt cannot be empty.", "prompt")
        elif all(isinstance(p, int) for p in prompt):
            items = [list(prompt)]  # type: ignore[arg-type]
        else:
            items = list(prompt)  # type: ignore[arg-type]
        ids_list: list[list[int]] = []
        texts: list[str | None] = []
        for item in items:
            if isinstance(item, str):
                if item == "":
                    raise APIError(400, "The prompt cannot be empty.", "prompt")
                ids_list.append(self.encode(item, req.add_special_tokens))
                texts.append(item)
            else:
                if len(item) == 0:
                    raise APIError(400, "The prompt cannot be empty.", "prompt")
                ids_list.append(list(item))
                texts.append(None)
        return ids_list, texts

    async def create_completion(self, req: CompletionRequest, raw_request: Request) -> Response:
        timer = self.metrics.timer()
        model = self.check_model(req.model)
        prompts, texts = self.completion_prompts(req)
        if req.truncate_prompt_tokens is not None:  # echo then shows the prompt the model saw
            prompts = [self.truncate(p, req) for p in prompts]
            texts = [None] * len(prompts)
        params = self.build_params(req, req.max_tokens, req.logprobs)
        # echo with logprobs (lm-eval's loglikelihood requests): the echoed prompt carries its tokens' logprobs
        echo_lp = bool(req.echo) and req.logprobs is not None
        as_ids = self.as_token_ids(req)
        if echo_lp:
            params.prompt_logprobs = max(req.logprobs or 0, req.prompt_logprobs or 0)
        request_id = f"cmpl-{random_uuid()}"
        created = now()
        gens = await self.start(prompts, params, request_id, req.priority)
        if req.echo:
            texts = [t if t is not None else self.tokenizer.decode(p) for t, p in zip(texts, prompts)]
        echo = [t or "" for t in texts] if req.echo else [""] * len(prompts)
        if req.stream:
            return StreamingResponse(
                self.completion_stream(req, params, gens, request_id, created, model, echo, timer),
                media_type="text/event-stream",
            )
        finals = await self.collect(gens, raw_request, timer)
        if finals is None:
            return Response(status_code=499)
        choices = []
        prompt_tokens = completion_tokens = cached = 0
        for pi, final in enumerate(finals):
            prompt_tokens += len(final.prompt_token_ids)
            cached += final.num_cached_tokens
            for o in final.outputs:
                completion_tokens += len(o.token_ids)
                lp = None
                if params.logprobs is not None and o.logprobs is not None:
                    lp = self.completion_logprobs(o.token_ids, o.logprobs, len(echo[pi]), as_ids)
                    if echo_lp and final.prompt_logprobs is not None:
                        head = self.completion_logprobs(
                            final.prompt_token_ids, final.prompt_logprobs, 0, as_ids
                        )
                        for f in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                            setattr(lp, f, getattr(head, f) + getattr(lp, f))
                choices.append(
                    CompletionResponseChoice(
                        index=pi * params.n + o.index,
                        text=echo[pi] + o.text,
                        logprobs=lp,
                        finish_reason=o.finish_reason,
                        stop_reason=o.stop_reason,
                        prompt_logprobs=_prompt_logprobs_json(final.prompt_logprobs)
                        if req.prompt_logprobs is not None
                        else None,
                    )
                )
        usage = self.usage_info(prompt_tokens, completion_tokens, cached)
        resp = CompletionResponse(id=request_id, created=created, model=model, choices=choices, usage=usage)
        return JSONResponse(resp.model_dump())

    async def completion_stream(
        self,
        req: CompletionRequest,
        params: SamplingParams,
        gens: list[_Gen],
        request_id: str,
        created: int,
        model: str,
        echo: list[str],
        timer: RequestTimer,
    ) -> AsyncIterator[str]:
        n = params.n
        include_usage, continuous = self.usage_flags(req)
        as_ids = self.as_token_ids(req)
        prev_text = [[0] * n for _ in gens]
        prev_toks = [[0] * n for _ in gens]
        sent_echo = [[False] * n for _ in gens]
        done = [[False] * n for _ in gens]
        prompt_lens = [0] * len(gens)
        cached = [0] * len(gens)
        try:
            async for pi, out in self._merged(gens, timer):
                prompt_lens[pi] = len(out.prompt_token_ids)
                cached[pi] = out.num_cached_tokens
                for o in out.outputs:
                    i = o.index
                    if done[pi][i]:
                        continue
                    delta = o.text[prev_text[pi][i] :]
                    new_ids = o.token_ids[prev_toks[pi][i] :]
                    if not delta and not new_ids and o.finish_reason is None:
                        continue
                    lp = None
                    if params.logprobs is not None and o.logprobs is not None:
                        lp = self.completion_logprobs(
                            new_ids,
                            o.logprobs[prev_toks[pi][i] :],
                            len(echo[pi]) + prev_text[pi][i],
                            as_ids,
                        )
                    if not sent_echo[pi][i]:
                        delta = echo[pi] + delta
                        sent_echo[pi][i] = True
                        if lp is not None and req.echo and out.prompt_logprobs is not None:
                            # as vLLM: the echoed prompt's tokens and logprobs lead the first chunk
                            head = self.completion_logprobs(
                                out.prompt_token_ids, out.prompt_logprobs, 0, as_ids
                            )
                            for f in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                                setattr(lp, f, getattr(head, f) + getattr(lp, f))
                    prev_text[pi][i] = len(o.text)
                    prev_toks[pi][i] = len(o.token_ids)
                    finished = o.finish_reason is not None
                    done[pi][i] = finished
                    chunk = CompletionStreamResponse(
                        id=request_id,
                        created=created,
                        model=model,
                        choices=[
                            CompletionResponseStreamChoice(
                                index=pi * n + i,
                                text=delta,
                                logprobs=lp,
                                finish_reason=o.finish_reason,
                                stop_reason=o.stop_reason if finished else None,
                            )
                        ],
                    )
                    if continuous:
                        chunk.usage = self._usage(prompt_lens, prev_toks, cached)
                    yield _sse(chunk.model_dump_json(exclude_unset=True))
            self._finish_timer(gens, timer)
            if include_usage:
                chunk = CompletionStreamResponse(
                    id=request_id,
                    created=created,
                    model=model,
                    choices=[],
                    usage=self._usage(prompt_lens, prev_toks, cached),
                )
                yield _sse(chunk.model_dump_json(exclude_unset=True, exclude_none=False))
            yield _sse("[DONE]")
        except Exception as e:  # noqa: BLE001 - reported in-band, as vLLM does
            for event in _stream_error(e, request_id):
                yield event
        finally:
            self.cleanup(gens)

    def _usage(self, prompt_lens: list[int], toks: list[list[int]], cached: list[int]) -> UsageInfo:
        return self.usage_info(sum(prompt_lens), sum(sum(t) for t in toks), sum(cached))

    def usage_info(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
        """A response's usage; with --enable-prompt-tokens-details also the prompt tokens the prefix cache
        served (``prompt_tokens_details.cached_tokens``)."""
        usage = UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        if self.enable_prompt_tokens_details:
            usage.prompt_tokens_details = {"cached_tokens": cached_tokens}
        return usage

    def usage_flags(self, req: CompletionRequest | ChatCompletionRequest) -> tuple[bool, bool]:
        """(a final usage chunk, usage in every chunk) for a stream, as vLLM: stream_options.include_usage or
        --enable-force-include-usage; continuous_usage_stats only with the final one."""
        so = req.stream_options
        if so is None:
            return self.enable_force_include_usage, False
        include = bool(so.include_usage) or self.enable_force_include_usage
        return include, include and bool(so.continuous_usage_stats)

    # ------------------------------------------------------------------ /v1/chat/completions
    def chat_inputs(
        self, req: ChatCompletionRequest, forced_schema: dict[str, Any] | None = None
    ) -> tuple[list[int], SamplingParams]:
        """A chat request's prompt token ids (its messages through the chat template) and sampling parameters;
        /v1/chat/completions and /v1/responses (as a chat request) both come through here."""
        text = self.render_chat(
            req.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template=req.chat_template,
            chat_template_kwargs=req.chat_template_kwargs,
            tools=req.tools,
        )
        prompt_ids = self.truncate(self.encode(text, req.add_special_tokens), req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if max_tokens is None:
            max_tokens = self._defaults().get("max_tokens")
        top_n = (req.top_logprobs or 0) if req.logprobs else None
        return prompt_ids, self.build_params(req, max_tokens, top_n, forced_schema)

    async def create_chat_completion(self, req: ChatCompletionRequest, raw_request: Request) -> Response:
        timer = self.metrics.timer()
        model = self.check_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        # a named or "required" tool choice: the output is constrained to the call's JSON (as vLLM)
        forced_schema: dict[str, Any] | None = None
        forced_name: str | None = None
        tc = req.tool_choice
        if tc not in (None, "none", "auto") and not req.tools:
            raise APIError(400, "When using `tool_choice`, `tools` must be set.", "tool_choice")
        if isinstance(tc, dict):
            fn = tc.get("function") if tc.get("type") == "function" else None
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str):
                raise APIError(
                    400,
                    'A named tool_choice must be {"type": "function", "function": {"name": ...}}.',
                    "tool_choice",
                )
            tool = next((t for t in req.tools or [] if (t.get("function") or {}).get("name") == name), None)
            if tool is None:
                raise APIError(400, f"Tool '{name}' has not been passed in `tools`.", "tool_choice")
            forced_schema = tool["function"].get("parameters") or {"type": "object", "properties": {}}
            forced_name = name
        elif tc == "required":
            forced_schema = required_tools_schema(req.tools or [])
        elif tc not in (None, "none", "auto"):
            raise APIError(
                400, "tool_choice must be 'none', 'auto', 'required' or a named function.", "tool_choice"
            )
        if tc == "auto" and req.tools and self.tool_parser is None:
            raise APIError(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
                "tool_choice",
            )
        forced = (forced_name, tc == "required") if forced_schema is not None else None
        parse_tools = bool(req.tools) and self.tool_parser is not None and tc in (None, "auto")
        prompt_ids, params = self.chat_inputs(req, forced_schema)
        top_n = params.logprobs
        request_id = f"chatcmpl-{random_uuid()}"
        created = now()
        gens = await self.start([prompt_ids], params, request_id, req.priority)
        if req.stream:
            return StreamingResponse(
                self.chat_stream(
                    req,
                    params,
                    gens,
                    request_id,
                    created,
                    model,
                    timer,
                    parse_tools,
                    self.reasoning_parser,
                    forced,
                ),
                media_type="text/event-stream",
            )
        finals = await self.collect(gens, raw_request, timer)
        if finals is None:
            return Response(status_code=499)
        final = finals[0]
        choices = []
        completion_tokens = 0
        role = self.chat_role(req)
        for o in final.outputs:
            completion_tokens += len(o.token_ids)
            lp = None
            if top_n is not None and o.logprobs is not None:
                lp = self.chat_logprobs(o.token_ids, o.logprobs, top_n, self.as_token_ids(req))
            message = ChatMessage(role=role, content=o.text)
            finish_reason = o.finish_reason
            if self.reasoning_parser is not None:
                reasoning, content = extract_reasoning(o.text, self.reasoning_parser)
                message = ChatMessage(role=role, content=content, reasoning_content=reasoning)
            if parse_tools:
                content, calls = extract_tool_calls(message.content or "")
                message.content, message.tool_calls = content, calls
                if calls:
                    finish_reason = "tool_calls"  # as vLLM, whatever ended the output
            elif forced is not None:
                forced_calls = forced_tool_calls(message.content or "", forced[0])
                if forced_calls is not None:  # as vLLM: empty content; "tool_calls" for a required choice
                    message.content, message.tool_calls = "", forced_calls
                    if forced[1] and finish_reason == "stop":
                        finish_reason = "tool_calls"
            choices.append(
                ChatCompletionResponseChoice(
                    index=o.index,
                    message=message,
                    logprobs=lp,
                    finish_reason=finish_reason,
                    stop_reason=o.stop_reason,
                )
            )
        usage = self.usage_info(len(final.prompt_token_ids), completion_tokens, final.num_cached_tokens)
        resp = ChatCompletionResponse(
            id=request_id,
            created=created,
            model=model,
            choices=choices,
            usage=usage,
            prompt_logprobs=_prompt_logprobs_json(final.prompt_logprobs)
            if req.prompt_logprobs is not None
            else None,
        )
        return JSONResponse(resp.model_dump())

    async def chat_stream(
        self,
        req: ChatCompletionRequest,
        params: SamplingParams,
        gens: list[_Gen],
        request_id: str,
        created: int,
        model: str,
        timer: RequestTimer,
        parse_tools: bool = False,
        reasoning_parser: str | None = None,
        forced: tuple[str | None, bool] | None = None,
    ) -> AsyncIterator[str]:
        n = params.n
        tool_streams: list[Any] | None = None
        if parse_tools:
            tool_streams = [HermesStream() for _ in range(n)]
        elif forced is not None:
            tool_streams = [ForcedToolStream(forced[0]) for _ in range(n)]
        reasoning_streams = (
            [ReasoningStream(reasoning_parser) for _ in range(n)] if reasoning_parser else None
        )
        tools_called = [False] * n
        include_usage, continuous = self.usage_flags(req)
        as_ids = self.as_token_ids(req)
        top_n = params.logprobs
        prev_text = [0] * n
        prev_toks = [0] * n
        done = [False] * n
        prompt_len = cached = 0
        first = True
        try:
            async for _, out in self._merged(gens, timer):
                prompt_len = len(out.prompt_token_ids)
                cached = out.num_cached_tokens
                if first:
                    first = False
                    for i in range(n):
                        chunk = ChatCompletionStreamResponse(
                            id=request_id,
                            created=created,
                            model=model,
                            choices=[
                                ChatCompletionResponseStreamChoice(
                                    index=i,
                                    delta=DeltaMessage(role=self.chat_role(req), content=""),
                                    logprobs=None,
                                    finish_reason=None,
                                )
                            ],
                        )
                        if continuous:
                            chunk.usage = self.usage_info(prompt_len, 0, cached)
                        yield _sse(chunk.model_dump_json(exclude_unset=True))
                for o in out.outputs:
                    i = o.index
                    if done[i]:
                        continue
                    delta = o.text[prev_text[i] :]
                    new_ids = o.token_ids[prev_toks[i] :]
                    if not delta and not new_ids and o.finish_reason is None:
                        continue
                    lp = None
                    if top_n is not None and o.logprobs is not None:
                        lp = self.chat_logprobs(new_ids, o.logprobs[prev_toks[i] :], top_n, as_ids)
                    prev_text[i] = len(o.text)
                    prev_toks[i] = len(o.token_ids)
                    finished = o.finish_reason is not None
                    done[i] = finished
                    message = DeltaMessage(content=delta)
                    finish_reason = o.finish_reason
                    if tool_streams is not None or reasoning_streams is not None:
                        reasoning, text = "", delta
                        if reasoning_streams is not None:
                            reasoning, text = reasoning_streams[i].feed(delta)
                            if finished:
                                r2, t2 = reasoning_streams[i].finish()
                                reasoning, text = reasoning + r2, text + t2
                        calls: list[dict[str, Any]] = []
                        if tool_streams is not None:
                            text, calls = tool_streams[i].feed(text)
                            if finished:
                                rest, more = tool_streams[i].finish()
                                text, calls = text + rest, calls + more
                        message = DeltaMessage(content=text) if text or not reasoning else DeltaMessage()
                        if reasoning:
                            message.reasoning_content = reasoning
                        if calls:
                            assert tool_streams is not None
                            k = tool_streams[i].num_calls - len(calls)
                            message.tool_calls = [dict(c, index=k + j) for j, c in enumerate(calls)]
                            tools_called[i] = True
                        if (
                            finished
                            and tools_called[i]
                            and (forced is None or (forced[1] and finish_reason == "stop"))
                        ):
                            finish_reason = "tool_calls"
                        if not text and not reasoning and not calls and not finished and lp is None:
                            continue  # held back: may begin a tag
                    choice = ChatCompletionResponseStreamChoice(
                        index=i, delta=message, logprobs=lp, finish_reason=finish_reason
                    )
                    if finished:
                        choice.stop_reason = o.stop_reason
                    chunk = ChatCompletionStreamResponse(
                        id=request_id, created=created, model=model, choices=[choice]
                    )
                    if continuous:
                        chunk.usage = self.usage_info(prompt_len, sum(prev_toks), cached)
                    yield _sse(chunk.model_dump_json(exclude_unset=True))
            self._finish_timer(gens, timer)
            if include_usage:
                chunk = ChatCompletionStreamResponse(
                    id=request_id,
                    created=created,
                    model=model,
                    choices=[],
                    usage=self.usage_info(prompt_len, sum(prev_toks), cached),
                )
                yield _sse(chunk.model_dump_json(exclude_unset=True))
            yield _sse("[DONE]")
        except Exception as e:  # noqa: BLE001 - reported in-band, as vLLM does
            for event in _stream_error(e, request_id):
                yield event
        finally:
            self.cleanup(gens)

    # ------------------------------------------------------------------ /v1/responses
    async def create_response(self, req: ResponsesRequest, raw_request: Request) -> Response:
        """OpenAI's Responses API, text only (``responses.py``): the request as a chat request, through the chat
        path's rendering, parameters and engine plumbing; the output as a Response object or its events."""
        timer = self.metrics.timer()
        model = self.check_model(req.model)
        chat_req = chat_request(req, int(self.engine.max_model_len))
        response_id = f"resp_{random_uuid()}"
        try:
            prompt_ids, params = self.chat_inputs(chat_req)
            gens = await self.start([prompt_ids], params, response_id, chat_req.priority)
        except (APIError, EngineValidationError) as e:
            raise _renamed_error(e, renamed_params(req)) from None
        resp = new_response(req, response_id, model, params)
        message_id = f"msg_{random_uuid()}"
        if req.stream:
            return StreamingResponse(
                self.responses_stream(resp, message_id, gens, timer), media_type="text/event-stream"
            )
        finals = await self.collect(gens, raw_request, timer)
        if finals is None:
            return Response(status_code=499)
        return JSONResponse(finished_response(resp, message_id, finals[0]).model_dump(mode="json"))

    async def responses_stream(
        self, resp: ResponsesResponse, message_id: str, gens: list[_Gen], timer: RequestTimer
    ) -> AsyncIterator[str]:
        events = ResponseEvents(message_id)
        try:
            for event in events.opening(resp):
                yield event
            sent = 0
            final: RequestOutput | None = None
            async for _, out in self._merged(gens, timer):
                final = out
                text = out.outputs[0].text
                if len(text) > sent:  # one delta per engine output that adds text
                    yield events.delta(text[sent:])
                    sent = len(text)
            self._finish_timer(gens, timer)
            if final is None:
                raise APIError(500, "The engine ended the request without producing output.")
            for event in events.closing(finished_response(resp, message_id, final)):
                yield event
        except Exception as e:  # noqa: BLE001 - reported in-band, as OpenAI does
            if not isinstance(e, (ValueError, APIError)):
                logger.exception("error while streaming %s", resp.id)
            err = _to_api_error(e)
            yield events.error(err.message, err.err_type, err.param)
        finally:
            self.cleanup(gens)

    # ------------------------------------------------------------------ tokenize
    def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        if req.model is not None:
            self.check_model(req.model)
        if req.messages is not None:
            text = self.render_chat(
                req.messages,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template=req.chat_template,
                chat_template_kwargs=req.chat_template_kwargs,
            )
            add_special = bool(req.add_special_tokens) if req.add_special_tokens is not None else False
        elif req.prompt is not None:
            text = req.prompt
            add_special = req.add_special_tokens if req.add_special_tokens is not None else True
        else:
            raise APIError(400, "Either `prompt` or `messages` must be given.", "prompt")
        tokens = self.encode(text, add_special)
        strs = self.tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None
        return TokenizeResponse(
            count=len(tokens), max_model_len=int(self.engine.max_model_len), tokens=tokens, token_strs=strs
        )

    def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        if req.model is not None:
            self.check_model(req.model)
        vocab = len(self.tokenizer)
        bad = [t for t in req.tokens if t < 0 or t >= vocab]
        if bad:
            raise APIError(400, f"Token id {bad[0]} is out of vocabulary (0..{vocab - 1}).", "tokens")
        return DetokenizeResponse(prompt=self.tokenizer.decode(req.tokens))


# --------------------------------------------------------------------------- the app


def build_app(
    engine: Any,
    served_model_name: str | Sequence[str] | None = None,
    api_key: str | Sequence[str] | None = None,
    chat_template: str | None = None,
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
    *,
    response_role: str = "assistant",
    max_logprobs: int = 20,
    generation_overrides: dict[str, Any] | None = None,
    allowed_origins: Sequence[str] = ("*",),
    allowed_methods: Sequence[str] = ("*",),
    allowed_headers: Sequence[str] = ("*",),
    allow_credentials: bool = False,
    return_tokens_as_token_ids: bool = False,
    enable_prompt_tokens_details: bool = False,
    enable_force_include_usage: bool = False,
    chat_template_content_format: str = "auto",
    disable_fastapi_docs: bool = False,
) -> FastAPI:
    """The FastAPI app over ``engine`` (an ``AsyncLLM`` or anything with its interface); ``tool_parser`` (one of
    ``tool_parsers.TOOL_PARSERS``) parses tool calls out of chat outputs when a request gives tools;
    ``reasoning_parser`` (``reasoning_parsers.REASONING_PARSERS``) splits the thinking into ``reasoning_content``."""
    from specserve import __version__

    if served_model_name is None:
        names = [str(engine.model_path)]
    elif isinstance(served_model_name, str):
        names = [served_model_name]
    else:
        names = [str(n) for n in served_model_name] or [str(engine.model_path)]
    metrics = ServerMetrics(engine, names[0])
    if tool_parser is not None and tool_parser not in TOOL_PARSERS:
        raise ValueError(f"unknown tool-call parser {tool_parser!r}; choose from {', '.join(TOOL_PARSERS)}")
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        raise ValueError(
            f"unknown reasoning parser {reasoning_parser!r}; choose from {', '.join(REASONING_PARSERS)}"
        )
    serving = OpenAIServing(
        engine,
        names,
        metrics,
        chat_template,
        tool_parser,
        reasoning_parser,
        response_role=response_role,
        max_logprobs=max_logprobs,
        generation_overrides=generation_overrides,
        return_tokens_as_token_ids=return_tokens_as_token_ids,
        enable_prompt_tokens_details=enable_prompt_tokens_details,
        enable_force_include_usage=enable_force_include_usage,
        chat_template_content_format=chat_template_content_format,
    )

    if disable_fastapi_docs:  # --disable-fastapi-docs: no /docs, /redoc or /openapi.json
        app = FastAPI(title="specserve", version=__version__, openapi_url=None, docs_url=None, redoc_url=None)
    else:
        app = FastAPI(title="specserve", version=__version__)
    app.state.engine = engine
    app.state.serving = serving
    app.state.metrics = metrics
    keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
    if keys:
        app.add_middleware(APIKeyMiddleware, api_keys=keys)
    # outermost, as in vLLM: browsers' preflight requests never reach the key check
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(allowed_origins),
        allow_methods=list(allowed_methods),
        allow_headers=list(allowed_headers),
        allow_credentials=allow_credentials,
    )

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.err_type)

    @app.exception_handler(FastAPIValidationError)
    async def _validation_error(_: Request, exc: FastAPIValidationError) -> JSONResponse:
        errors = exc.errors()
        parts = []
        param = None
        for err in errors:
            loc = [str(x) for x in err.get("loc", ()) if x != "body"]
            if param is None and loc:
                param = loc[0]
            where = ".".join(loc)
            parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
        if any(err.get("type") == "json_invalid" for err in errors):
            message = "Invalid JSON body: " + "; ".join(
                str(e.get("ctx", {}).get("error", e.get("msg"))) for e in errors
            )
            param = None
        else:
            message = f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}: " + "; ".join(parts)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(ValueError)
    async def _value_error(_: Request, exc: ValueError) -> JSONResponse:
        err = _to_api_error(exc)
        return error_response(err.status, err.message, err.param, err.err_type)

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
        err = _to_api_error(exc)
        if err.status >= 500:
            logger.error("internal error: %r", exc, exc_info=exc)
        return error_response(err.status, err.message, err.param, err.err_type)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.is_running() else 503)

    @app.get("/ping")
    @app.post("/ping")
    async def ping() -> Response:
        return Response(status_code=200 if engine.is_running() else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(content=metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models() -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=n, root=str(engine.model_path), max_model_len=int(engine.max_model_len))
                for n in names
            ]
        )

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw_request: Request) -> Response:
        return await serving.create_completion(request, raw_request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest, raw_request: Request) -> Response:
        return await serving.create_chat_completion(request, raw_request)

    @app.post("/v1/responses")
    async def responses(request: ResponsesRequest, raw_request: Request) -> Response:
        return await serving.create_response(request, raw_request)

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> TokenizeResponse:
        return serving.tokenize(request)

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        return serving.detokenize(request)

    return app


# --------------------------------------------------------------------------- `specserve serve`


def _load_chat_template(value: str | None) -> str | None:
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if any(c in value for c in "{%"):
        return value  # inline Jinja
    raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template")


def served_model_names(args: Any) -> list[str]:
    """``--served-model-name``, else the ``--model`` given, else the demo's name."""
    return args.served_model_name or [args.model_tag if args.model_tag is not None else DEMO_MODEL_NAME]


def serve_main(argv: list[str]) -> int:
    """``specserve serve [MODEL] [flags]``: load the engine and serve until interrupted. Returns the exit code."""
    from specserve.server.cli_args import engine_config_from_args, parse_serve_args, print_error

    try:
        args = parse_serve_args(argv)
    except SystemExit as e:  # argparse: --help or a bad flag
        return parse_exit_code(e)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    try:
        config = engine_config_from_args(args)
        chat_template = _load_chat_template(args.chat_template)
    except (ValueError, TypeError) as e:
        print_error(str(e))
        return 2

    import uvicorn

    from specserve.engine.async_engine import AsyncLLM

    try:
        engine = AsyncLLM(config)
    except (ValueError, OSError, RuntimeError) as e:
        print_error(first_line(e))
        return startup_exit_code(e)
    try:
        names = served_model_names(args)
        tool_parser = args.tool_call_parser if args.enable_auto_tool_choice else None
        app = build_app(
            engine,
            names,
            api_key=args.api_key,
            chat_template=chat_template,
            tool_parser=tool_parser,
            reasoning_parser=args.reasoning_parser,
            response_role=args.response_role,
            max_logprobs=args.max_logprobs,
            generation_overrides=args.override_generation_config,
            allowed_origins=args.allowed_origins,
            allowed_methods=args.allowed_methods,
            allowed_headers=args.allowed_headers,
            allow_credentials=args.allow_credentials,
            return_tokens_as_token_ids=args.return_tokens_as_token_ids,
            enable_prompt_tokens_details=args.enable_prompt_tokens_details,
            enable_force_include_usage=args.enable_force_include_usage,
            chat_template_content_format=args.chat_template_content_format,
            disable_fastapi_docs=args.disable_fastapi_docs,
        )
        host = args.host if args.host is not None else "0.0.0.0"
        where = f"unix:{args.uds}" if args.uds else f"http://{host}:{args.port}"
        logger.info("Starting specserve API server on %s (model %s)", where, names[0])
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=host,
                port=args.port,
                uds=args.uds,  # --uds: a Unix domain socket instead of host / port
                log_level=args.uvicorn_log_level,
                access_log=not args.disable_uvicorn_access_log,
                timeout_keep_alive=5,
                root_path=args.root_path or "",  # --root-path: the prefix a proxy strips
                ssl_keyfile=args.ssl_keyfile,
                ssl_certfile=args.ssl_certfile,
            )
        )
        try:
            server.run()
        except SystemExit as e:  # uvicorn exits 1 when it cannot bind
            return e.code if isinstance(e.code, int) else 1
        return 0 if server.started else 1
    finally:
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
