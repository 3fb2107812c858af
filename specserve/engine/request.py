"""Per-request state. Pure Python: the scheduler and block manager never touch a tensor."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from specserve.outputs import Logprob
from specserve.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
        )


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved (never None)
    prompt: str | None = None
    parent_id: str | None = None  # n > 1: the user-facing request id
    index: int = 0  # completion index within the parent
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0  # scheduling_policy="priority": lower values are served first (ties: arrival_time)
    status: RequestStatus = RequestStatus.WAITING
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    num_computed_tokens: int = 0  # positions whose target KV is in the cache
    num_cached_tokens: int = 0  # prefix-cache hit at first schedule
    block_table: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)  # drafts to verify in the next step
    output_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    output_text: str = ""
    # incremental detokenization (vLLM's scheme): token_ids[prefix_offset:read_offset] is already in the text;
    # decoding from prefix_offset keeps a little left context so spaces and multi-byte characters come out right
    prefix_offset: int = 0
    read_offset: int = 0
    stop_reason: int | str | None = None
    first_token_time: float | None = None
    num_preemptions: int = 0
    # prompt_logprobs: entry p is position p's token's logprobs (entry 0 stays None), filled as prefill runs
    prompt_logprobs: list[dict[int, Logprob] | None] = field(default_factory=list)
    grammar: Any = None  # structured outputs: a GrammarMatcher (masks the logits of every step it samples)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        self.read_offset = len(self.prompt_token_ids)
        self.prefix_offset = max(0, self.read_offset - 5)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.finished else None
