"""OpenAI-compatible request / response models (the subset of vLLM's protocol that specserve serves).

Requests accept unknown fields (vLLM ignores them with a warning); numeric ranges are checked by
``SamplingParams`` so the error message names the field the same way everywhere.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


def random_uuid() -> str:
    return uuid.uuid4().hex


def now() -> int:
    return int(time.time())


# --------------------------------------------------------------------------- errors


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


# --------------------------------------------------------------------------- models


class ModelPermission(BaseModel):
    id: str = Field(default_factory=lambda: f"modelperm-{random_uuid()}")
    object: str = "model_permission"
    created: int = Field(default_factory=now)
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "specserve"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


# --------------------------------------------------------------------------- shared


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: dict[str, int] | None = None


class StreamOptions(BaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _RequestBase(BaseModel):
    """Sampling fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = 1
    best_of: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None  # vLLM: the prompt tokens' logprobs in the response (not with stream)
    user: str | None = None
    # vLLM's extras: --scheduling-policy priority's order (lower first); keep only the prompt's last N tokens
    # (-1: max_model_len); logprobs' tokens as "token_id:N" (None: --return-tokens-as-token-ids)
    priority: int = 0
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    return_tokens_as_token_ids: bool | None = None
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs and its older guided_* fields
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None


# --------------------------------------------------------------------------- completions


class CompletionRequest(_RequestBase):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    add_special_tokens: bool = True


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[Any] | None = None


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo


class CompletionResponseStreamChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = None

    def model_post_init(self, context: Any, /) -> None:
        # chunks are serialized with exclude_unset; these are always part of a chunk
        self.__pydantic_fields_set__.update({"object", "created"})


# --------------------------------------------------------------------------- chat completions


class ChatCompletionRequest(_RequestBase):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None


class ChatMessage(BaseModel):
    role: str
    content: str | None = None
    reasoning_content: str | None = None  # --reasoning-parser: the model's thinking
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ChatCompletionLogProb(BaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(BaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatCompletionResponseChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatCompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: list[Any] | None = None


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None  # --reasoning-parser
    tool_calls: list[dict[str, Any]] | None = None  # streamed tool calls (--tool-call-parser), each whole


class ChatCompletionResponseStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=now)
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None

    def model_post_init(self, context: Any, /) -> None:
        # chunks are serialized with exclude_unset; these are always part of a chunk
        self.__pydantic_fields_set__.update({"object", "created"})


# --------------------------------------------------------------------------- responses


class ResponsesRequest(BaseModel):
    """``/v1/responses``: OpenAI's Responses API, the text subset. ``input`` (and ``instructions``) become a chat
    request's messages (``responses.py``); stateful and tool features are refused there with a 400."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = True  # accepted; nothing is ever stored
    previous_response_id: str | None = None
    background: bool | None = False
    conversation: Any = None
    prompt: Any = None  # a stored prompt template
    include: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_schema" | "json_object", ...}}
    reasoning: dict[str, Any] | None = None  # accepted, ignored
    truncation: str | None = None
    # vLLM's extra sampling fields on its ResponsesRequest
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: dict[str, Any] | None = None
    priority: int = 0  # --scheduling-policy priority


class ResponseOutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ResponseOutputMessage(BaseModel):
    id: str = Field(default_factory=lambda: f"msg_{random_uuid()}")
    type: Literal["message"] = "message"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[ResponseOutputText] = Field(default_factory=list)


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int] = Field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens: int
    output_tokens_details: dict[str, int] = Field(default_factory=lambda: {"reasoning_tokens": 0})
    total_tokens: int


class ResponsesResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"resp_{random_uuid()}")
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=now)
    completed_at: int | None = None
    status: Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"] = "completed"
    incomplete_details: dict[str, str] | None = None
    error: dict[str, Any] | None = None
    model: str
    instructions: str | None = None
    output: list[ResponseOutputMessage] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    parallel_tool_calls: bool = False
    tool_choice: str = "none"
    tools: list[Any] = Field(default_factory=list)
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool = False
    background: bool = False
    truncation: str = "disabled"
    user: str | None = None


# --------------------------------------------------------------------------- tokenize / detokenize


class TokenizeRequest(BaseModel):
    """``/tokenize``: either ``prompt`` (completion form) or ``messages`` (chat form)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None  # default: True for prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool | None = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
