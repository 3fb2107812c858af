"""Sampling parameters, shaped like vLLM's ``SamplingParams``."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5


def max_n_sequences() -> int:
    """The largest ``n`` a request may ask for: vLLM's ``VLLM_MAX_N_SEQUENCES`` (its default 16384), also read as
    ``SPECSERVE_MAX_N_SEQUENCES``; lower it on a public server, where one request's ``n`` queues that many
    sequences ahead of everyone else's."""
    for name in ("SPECSERVE_MAX_N_SEQUENCES", "VLLM_MAX_N_SEQUENCES"):
        v = os.environ.get(name)
        if v:
            try:
                return max(1, int(v))
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {v!r}.") from None
    return 16384


@dataclass
class StructuredOutputsParams:
    """vLLM's ``StructuredOutputsParams``: constrain the output to a JSON schema (``json``: a dict or its JSON
    text), to any JSON object (``json_object=True``), to a match of ``regex`` or to one of the strings in
    ``choice``. Exactly one may be set. ``grammar`` and ``structural_tag`` are vLLM's too and are refused here."""

    json: str | dict | None = None  # type: ignore[type-arg]
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False  # JSON without whitespace between its tokens

    def __post_init__(self) -> None:
        kinds = [
            k
            for k in ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
            if getattr(self, k) is not None and getattr(self, k) is not False
        ]
        if len(kinds) != 1:
            raise ValueError(
                "structured_outputs must set exactly one of json, json_object, regex or choice"
                + (f"; got {', '.join(kinds)}." if kinds else ".")
            )
        if kinds[0] in ("grammar", "structural_tag"):
            raise ValueError(
                f"structured_outputs: {kinds[0]} is not supported by specserve (json, json_object, regex and "
                "choice are)."
            )

    def cache_key(self) -> str:
        import json as _json

        # key order kept: a schema's property order is part of its grammar
        return _json.dumps(
            [self.json, self.choice, self.regex, bool(self.json_object), bool(self.disable_any_whitespace)]
        )


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None  # the prompt tokens' logprobs (+ this many top ones) in the output
    bad_words: list[str] | None = None  # words never generated (vLLM's: with and without a leading space)
    # filled by the engine (EOS from generation_config / tokenizer; bad_words as token ids); not user-facing
    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)
    _bad_words_token_ids: list[list[int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self.validate()

    def validate(self) -> None:
        def bad(name: str, msg: str) -> ValueError:
            return ValueError(f"{name} {msg}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", f"must be at least 1, got {self.n}.")
        if self.n > (cap := max_n_sequences()):
            raise bad("n", f"must be at most {cap} (VLLM_MAX_N_SEQUENCES), got {self.n}.")
        # NaN passes every comparison below unnoticed (JSON bodies may carry NaN / Infinity): refuse it first
        for name in (
            "temperature",
            "top_p",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ):
            v = getattr(self, name)
            if isinstance(v, float) and not math.isfinite(v):
                raise bad(name, f"must be a finite number, got {v}.")
        if self.temperature is None or self.temperature < 0.0:
            raise bad("temperature", f"must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p}.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", f"must be 0 or -1 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", f"must be at least 1, got {self.max_tokens}.")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", f"must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad(
                "min_tokens",
                f"must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}.",
            )
        # the upper bound is the engine's max_logprobs (EngineConfig, --max-logprobs; vLLM's default 20)
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise bad("logprobs", f"must be a non-negative integer, got {self.logprobs}.")
        if self.bad_words is not None and not all(isinstance(w, str) and w.strip() for w in self.bad_words):
            raise bad("bad_words", f"must be a list of non-empty strings, got {self.bad_words!r}.")
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int) or self.prompt_logprobs < 0
        ):
            raise bad("prompt_logprobs", f"must be a non-negative integer, got {self.prompt_logprobs}.")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", f"must be an integer, got {self.seed!r}.")
        for s in self.stop or []:
            if not isinstance(s, str) or not s:
                raise bad("stop", f"must contain non-empty strings, got {s!r}.")
        for t in self.stop_token_ids or []:
            if not isinstance(t, int) or t < 0:
                raise bad("stop_token_ids", f"must contain non-negative integers, got {t!r}.")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not -2.0 <= v <= 2.0:
                raise bad(name, f"must be in [-2, 2], got {v}.")
        if not isinstance(self.repetition_penalty, (int, float)) or self.repetition_penalty <= 0.0:
            raise bad("repetition_penalty", f"must be greater than zero, got {self.repetition_penalty}.")
        if self.logit_bias is not None:
            for t, b in self.logit_bias.items():
                if (
                    not isinstance(t, int)
                    or isinstance(t, bool)
                    or t < 0
                    or not isinstance(b, (int, float))
                    or not math.isfinite(b)
                ):
                    raise bad("logit_bias", f"must map token ids to numbers, got {t!r}: {b!r}.")
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise bad("allowed_token_ids", f"must be a non-empty list of token ids, got {ids!r}.")

    @property
    def processes_logits(self) -> bool:
        """Penalties, a logit bias or an allowed-token list: the host sampling path edits this request's logits."""
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
            or bool(self.logit_bias)
            or self.allowed_token_ids is not None
            or bool(self.bad_words)
        )

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or top_k=1) means argmax decoding."""
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    def clone(self) -> SamplingParams:
        import copy

        return copy.deepcopy(self)
