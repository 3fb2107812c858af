"""Prometheus metrics with vLLM's names.

Engine-side numbers (queue sizes, KV usage, token and spec-decode counters) are read from
``engine.get_metrics()`` at scrape time by a custom collector, so the engine keeps plain integers and
never touches prometheus_client. Latency histograms (TTFT, inter-token, end-to-end) are measured by the
HTTP layer, which is where a client sees them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

logger = logging.getLogger(__name__)

__all__ = ["CONTENT_TYPE_LATEST", "EngineCollector", "RequestTimer", "ServerMetrics"]

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
E2E_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]

FINISH_REASONS = ("stop", "length", "abort")

# (metric name without _total, engine metrics key, help)
_COUNTERS = (
    ("vllm:prompt_tokens", "prompt_tokens_total", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "generation_tokens_total", "Number of generation tokens processed."),
    ("vllm:num_preemptions", "num_preemptions_total", "Cumulative number of preemptions from the engine."),
    (
        "vllm:prefix_cache_queries",
        "prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    (
        "vllm:prefix_cache_hits",
        "prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
)
_SPEC_COUNTERS = (
    ("vllm:spec_decode_num_drafts", "spec_decode_num_drafts", "Number of spec decoding drafts."),
    ("vllm:spec_decode_num_draft_tokens", "spec_decode_num_draft_tokens", "Number of draft tokens."),
    ("vllm:spec_decode_num_accepted_tokens", "spec_decode_num_accepted_tokens", "Number of accepted tokens."),
)


class EngineCollector:
    """Reads ``engine.get_metrics()`` on every scrape and yields vLLM-named gauges and counters."""

    def __init__(self, engine: Any, model_name: str, engine_index: str = "0") -> None:
        self.engine = engine
        self.labels = [model_name, engine_index]
        self.label_names = ["model_name", "engine"]

    def describe(self) -> list[Metric]:
        return []

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=self.label_names)
        g.add_metric(self.labels, float(value))
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=self.label_names)
        c.add_metric(self.labels, float(value))
        return c

    def collect(self) -> Iterator[Metric]:
        try:
            m = self.engine.get_metrics() or {}
        except Exception:  # a scrape must never take the server down
            logger.exception("engine.get_metrics() failed")
            return
        yield self._gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            m.get("num_requests_running", 0),
        )
        yield self._gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            m.get("num_requests_waiting", 0),
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            m.get("kv_cache_usage_perc", 0.0),
        )
        for name, key, doc in _COUNTERS:
            yield self._counter(name, doc, m.get(key, 0))
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*self.label_names, "finished_reason"],
        )
        by_reason = dict(m.get("request_success_total") or {})
        for reason in FINISH_REASONS:
            by_reason.setdefault(reason, 0)
        for reason, n in sorted(by_reason.items()):
            success.add_metric([*self.labels, str(reason)], float(n))
        yield success
        if int(m.get("num_speculative_tokens", 0) or 0) > 0:
            for name, key, doc in _SPEC_COUNTERS:
                yield self._counter(name, doc, m.get(key, 0))
            per_pos = CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                labels=[*self.label_names, "position"],
            )
            counts = list(m.get("spec_decode_num_accepted_tokens_per_pos") or [])
            k = int(m.get("num_speculative_tokens", 0) or 0)
            counts += [0] * max(0, k - len(counts))
            for i, n in enumerate(counts):
                per_pos.add_metric([*self.labels, str(i)], float(n))
            yield per_pos


class ServerMetrics:
    """One registry per app: the engine collector plus the latency histograms the server measures."""

    def __init__(self, engine: Any, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(engine, model_name))
        labels = ["model_name", "engine"]
        kw: dict[str, Any] = {"labelnames": labels, "registry": self.registry}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            buckets=TTFT_BUCKETS,
            **kw,
        ).labels(model_name, "0")
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            buckets=ITL_BUCKETS,
            **kw,
        ).labels(model_name, "0")
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            buckets=E2E_BUCKETS,
            **kw,
        ).labels(model_name, "0")
        self.prompt_tokens = Histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", buckets=TOKEN_BUCKETS, **kw
        ).labels(model_name, "0")
        self.generation_tokens = Histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            buckets=TOKEN_BUCKETS,
            **kw,
        ).labels(model_name, "0")

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def timer(self) -> RequestTimer:
        return RequestTimer(self)


class RequestTimer:
    """Per-request latency bookkeeping: call ``step(num_new_tokens)`` per engine output, ``finish`` at the end.

    With speculative decoding one engine step can add several tokens; like vLLM, one step is one inter-token
    latency sample.
    """

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.arrival = time.perf_counter()
        self.last: float | None = None
        self.done = False

    def step(self, num_new_tokens: int) -> None:
        if num_new_tokens <= 0:
            return
        t = time.perf_counter()
        if self.last is None:
            self.metrics.ttft.observe(t - self.arrival)
        else:
            self.metrics.itl.observe(t - self.last)
        self.last = t

    def finish(self, prompt_tokens: int, generation_tokens: int) -> None:
        if self.done:
            return
        self.done = True
        self.metrics.e2e.observe(time.perf_counter() - self.arrival)
        self.metrics.prompt_tokens.observe(prompt_tokens)
        self.metrics.generation_tokens.observe(generation_tokens)
