"""``specserve bench serve``: online serving benchmark, a drop-in for ``vllm bench serve``.

Same flags, the same timing definitions (TTFT at the first chunk with choices, ITL per chunk, TPOT =
(latency - TTFT) / (output_tokens - 1), E2EL per request), the same printed report (including the
``Speculative Decoding`` block computed from ``/metrics`` scraped before and after the run) and the same
result-JSON keys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from specserve.bench.datasets import DATASET_NAMES, RemoteTokenizer, SampleRequest, get_samples
from specserve.errors import OneLineArgumentParser, parse_exit_code

BACKENDS = ("openai", "vllm", "openai-chat")
MILLISECONDS_TO_SECONDS_CONVERSION = 1000
_DETAIL_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")


# --------------------------------------------------------------------------- request functions


@dataclass
class RequestFuncInput:
    prompt: str | list[int]
    api_url: str
    prompt_len: int
    output_len: int
    model: str
    model_name: str | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    extra_body: dict[str, Any] | None = None
    extra_headers: dict[str, str] | None = None
    request_id: str | None = None


@dataclass
class RequestFuncOutput:
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    tpot: float = 0.0
    prompt_len: int = 0
    error: str = ""
    start_time: float = 0.0


def _headers(inp: RequestFuncInput) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if inp.extra_headers:
        headers.update(inp.extra_headers)
    if inp.request_id:
        headers["x-request-id"] = inp.request_id
    return headers


def _common_payload(payload: dict[str, Any], inp: RequestFuncInput) -> None:
    if inp.ignore_eos:
        payload["ignore_eos"] = True
    if inp.extra_body:
        payload.update(inp.extra_body)


class _SSEParser:
    """Splits a byte stream into SSE ``data:`` payloads (comment lines skipped)."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[str]:
        self.buf += data
        out = []
        while True:
            idx = min((i for i in (self.buf.find(b"\n\n"), self.buf.find(b"\r\n\r\n")) if i >= 0), default=-1)
            if idx < 0:
                break
            sep = 4 if self.buf[idx : idx + 4] == b"\r\n\r\n" else 2
            event, self.buf = self.buf[:idx], self.buf[idx + sep :]
            for line in event.decode("utf-8").splitlines():
                line = line.strip()
                if not line or line.startswith(":"):
                    continue
                out.append(line.removeprefix("data:").strip())
        return out


async def _stream_request(
    inp: RequestFuncInput, payload: dict[str, Any], session: Any, chat: bool, pbar: Any = None
) -> RequestFuncOutput:
    output = RequestFuncOutput(prompt_len=inp.prompt_len)
    generated = ""
    st = time.perf_counter()
    output.start_time = st
    most_recent = st
    first_chunk = False
    try:
        async with session.post(url=inp.api_url, json=payload, headers=_headers(inp)) as response:
            if response.status != 200:
                body = (await response.text())[:500]
                output.error = f"{response.reason or response.status}: {body}"
                output.success = False
            else:
                parser = _SSEParser()
                async for chunk_bytes in response.content.iter_any():
                    for message in parser.feed(chunk_bytes):
                        if message == "[DONE]":
                            continue
                        data = json.loads(message)
                        timestamp = time.perf_counter()
                        if "error" in data and not data.get("choices"):
                            output.error = str(data["error"].get("message", data["error"]))
                            continue
                        if choices := data.get("choices"):
                            if chat:
                                text = (choices[0].get("delta") or {}).get("content")
                            else:
                                text = choices[0].get("text")
                            if not first_chunk:
                                first_chunk = True
                                output.ttft = timestamp - st
                            else:
                                output.itl.append(timestamp - most_recent)
                            most_recent = timestamp
                            generated += text or ""
                        elif usage := data.get("usage"):
                            output.output_tokens = usage.get("completion_tokens") or 0
                            if usage.get("prompt_tokens"):
                                output.prompt_len = usage["prompt_tokens"]
                            if chat:
                                most_recent = timestamp
                if first_chunk and not output.error:
                    output.success = True
                else:
                    output.success = False
                    output.error = output.error or (
                        "Never received a valid chunk to calculate TTFT. This response will be marked as failed!"
                    )
                output.generated_text = generated
                output.latency = most_recent - st
    except Exception:  # noqa: BLE001 - a failed request is data, not a crash
        output.success = False
        output.error = "".join(traceback.format_exception(*sys.exc_info()))
    if pbar is not None:
        pbar.update(1)
    return output


async def async_request_openai_completions(
    inp: RequestFuncInput, session: Any, pbar: Any = None
) -> RequestFuncOutput:
    if not inp.api_url.endswith(("completions", "profile")):
        raise ValueError("OpenAI Completions API URL must end with 'completions' or 'profile'.")
    payload: dict[str, Any] = {
        "model": inp.model_name or inp.model,
        "prompt": inp.prompt,
        "repetition_penalty": 1.0,
        "max_tokens": inp.output_len,
        "logprobs": inp.logprobs,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    _common_payload(payload, inp)
    return await _stream_request(inp, payload, session, chat=False, pbar=pbar)


async def async_request_openai_chat_completions(
    inp: RequestFuncInput, session: Any, pbar: Any = None
) -> RequestFuncOutput:
    if not inp.api_url.endswith(("chat/completions", "profile")):
        raise ValueError("OpenAI Chat Completions API URL must end with 'chat/completions'.")
    if isinstance(inp.prompt, list):
        raise ValueError("the chat backend needs text prompts")
    payload: dict[str, Any] = {
        "model": inp.model_name or inp.model,
        "messages": [{"role": "user", "content": [{"type": "text", "text": inp.prompt}]}],
        "max_completion_tokens": inp.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if inp.logprobs is not None:
        payload["logprobs"] = True
        payload["top_logprobs"] = inp.logprobs
    _common_payload(payload, inp)
    return await _stream_request(inp, payload, session, chat=True, pbar=pbar)


ASYNC_REQUEST_FUNCS = {
    "openai": async_request_openai_completions,
    "vllm": async_request_openai_completions,
    "openai-chat": async_request_openai_chat_completions,
}


# --------------------------------------------------------------------------- spec-decode metrics


@dataclass
class SpecDecodeMetrics:
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)


def parse_spec_decode_metrics(text: str) -> SpecDecodeMetrics | None:
    """Sum every ``vllm:spec_decode*`` counter sample (over engines); None if the server exposes none."""
    m = SpecDecodeMetrics()
    found = False
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("vllm:spec_decode"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith("_created"):
            continue
        try:
            value = float(line.rsplit(" ", 1)[-1])
        except ValueError:
            continue
        found = True
        if "num_drafts" in name:
            m.num_drafts += value
        elif "num_draft_tokens" in name:
            m.num_draft_tokens += value
        elif "num_accepted_tokens_per_pos" in name:
            pos_label = 'position="'
            if pos_label in line:
                pos = int(line.split(pos_label, 1)[1].split('"', 1)[0])
                m.accepted_per_pos[pos] = m.accepted_per_pos.get(pos, 0.0) + value
        elif "num_accepted_tokens" in name:
            m.num_accepted_tokens += value
    return m if found else None


async def fetch_spec_decode_metrics(base_url: str, session: Any) -> SpecDecodeMetrics | None:
    try:
        async with session.get(f"{base_url}/metrics") as r:
            if r.status != 200:
                return None
            return parse_spec_decode_metrics(await r.text())
    except Exception:  # noqa: BLE001 - optional
        return None


def spec_decode_stats(
    before: SpecDecodeMetrics | None, after: SpecDecodeMetrics | None
) -> dict[str, Any] | None:
    if before is None or after is None:
        return None
    d_drafts = after.num_drafts - before.num_drafts
    d_tokens = after.num_draft_tokens - before.num_draft_tokens
    d_accepted = after.num_accepted_tokens - before.num_accepted_tokens
    per_pos: list[float] = []
    if d_drafts > 0:
        for pos in sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos)):
            b = before.accepted_per_pos.get(pos, 0.0)
            per_pos.append((after.accepted_per_pos.get(pos, b) - b) / d_drafts)
    if d_tokens <= 0:
        return None
    return {
        "num_drafts": d_drafts,
        "draft_tokens": d_tokens,
        "accepted_tokens": d_accepted,
        "acceptance_rate": d_accepted / d_tokens * 100,
        "acceptance_length": 1 + d_accepted / d_drafts if d_drafts > 0 else 0.0,
        "per_position_acceptance_rates": per_pos,
    }


# --------------------------------------------------------------------------- metrics


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    stats: dict[str, dict[str, Any]]  # metric -> {"mean","median","std","percentiles":[(p, v)]}, in ms


def _stats(values: list[float], percentiles: list[float]) -> dict[str, Any]:
    arr = values or [0.0]
    return {
        "mean": float(np.mean(arr)) * 1000,
        "median": float(np.median(arr)) * 1000,
        "std": float(np.std(arr)) * 1000,
        "percentiles": [(p, float(np.percentile(arr, p)) * 1000) for p in percentiles],
    }


def calculate_metrics(
    input_requests: list[SampleRequest],
    outputs: list[RequestFuncOutput],
    dur_s: float,
    tokenizer: Any,
    selected_percentiles: list[float],
    goodput_config: dict[str, float],
) -> tuple[BenchmarkMetrics, list[int]]:
    actual_output_lens: list[int] = []
    total_input = completed = good_completed = 0
    itls: list[float] = []
    tpots: list[float] = []
    all_tpots: list[float] = []
    ttfts: list[float] = []
    e2els: list[float] = []
    for req, out in zip(input_requests, outputs):
        if not out.success:
            actual_output_lens.append(0)
            continue
        output_len = out.output_tokens
        if not output_len:
            output_len = len(tokenizer.encode(out.generated_text, add_special_tokens=False))
        actual_output_lens.append(output_len)
        total_input += out.prompt_len or req.prompt_len
        tpot = 0.0
        if output_len > 1:
            tpot = (out.latency - out.ttft) / (output_len - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += out.itl
        ttfts.append(out.ttft)
        e2els.append(out.latency)
        completed += 1
    if goodput_config:
        valid, slos = [], []
        for key, values in (("ttft", ttfts), ("tpot", all_tpots), ("e2el", e2els)):
            if key in goodput_config:
                valid.append(values)
                slos.append(goodput_config[key] / MILLISECONDS_TO_SECONDS_CONVERSION)
        for req_metric in zip(*valid):
            if all(s >= r for s, r in zip(slos, req_metric)):
                good_completed += 1
    if completed == 0:
        print(
            "WARNING: All requests failed. This is likely due to a misconfiguration on the benchmark arguments."
        )
    max_tok_s, max_conc = 0.0, 0
    ok = [o for o in outputs if o.success]
    if ok:
        t0 = min(o.start_time for o in ok)
        t1 = max(o.start_time + o.latency for o in ok)
        n_sec = int(np.ceil(t1 - t0)) + 1
        tok_per_s = np.zeros(n_sec)
        conc = np.zeros(n_sec)
        for o in ok:
            t = o.start_time + o.ttft
            times = [t]
            for gap in o.itl:
                t += gap
                times.append(t)
            for tt in times:
                b = int(tt - t0)
                if 0 <= b < n_sec:
                    tok_per_s[b] += 1
            for s in range(int(o.start_time - t0), min(int(o.start_time + o.latency - t0) + 1, n_sec)):
                conc[s] += 1
        max_tok_s, max_conc = float(np.max(tok_per_s)), int(np.max(conc))
    total_output = sum(actual_output_lens)
    metrics = BenchmarkMetrics(
        completed=completed,
        failed=len(outputs) - completed,
        total_input=total_input,
        total_output=total_output,
        request_throughput=completed / dur_s,
        request_goodput=good_completed / dur_s,
        output_throughput=total_output / dur_s,
        total_token_throughput=(total_input + total_output) / dur_s,
        max_output_tokens_per_s=max_tok_s,
        max_concurrent_requests=max_conc,
        stats={
            "ttft": _stats(ttfts, selected_percentiles),
            "tpot": _stats(tpots, selected_percentiles),
            "itl": _stats(itls, selected_percentiles),
            "e2el": _stats(e2els, selected_percentiles),
        },
    )
    return metrics, actual_output_lens


# --------------------------------------------------------------------------- the run


async def get_request(
    input_requests: list[SampleRequest], request_rate: float, burstiness: float, seed: int
) -> Any:
    """Yield requests at ``request_rate`` (inf: all at once) with gamma-distributed gaps (burstiness 1 = Poisson),
    the total time normalized to N / rate as vLLM does."""
    rng = np.random.default_rng(seed)
    delays: list[float] = []
    for _ in input_requests:
        if request_rate == float("inf"):
            delays.append(0.0)
        elif burstiness == float("inf"):
            delays.append(1.0 / request_rate)
        else:
            theta = 1.0 / (request_rate * burstiness)
            delays.append(float(rng.gamma(shape=burstiness, scale=theta)))
    for i in range(1, len(delays)):
        delays[i] += delays[i - 1]
    if delays and delays[-1] != 0:
        factor = (len(input_requests) / request_rate) / delays[-1]
        delays = [d * factor for d in delays]
    start = time.perf_counter()
    for req, delay in zip(input_requests, delays):
        if delay > 0:
            wait = start + delay - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
        yield req


async def wait_for_endpoint(
    request_func: Any, test_input: RequestFuncInput, session: Any, timeout_seconds: float
) -> RequestFuncOutput:
    deadline = time.perf_counter() + timeout_seconds
    while True:
        out = await request_func(test_input, session)
        if out.success or time.perf_counter() >= deadline:
            return out
        if "Cannot connect" not in out.error and "Connect" not in out.error and "503" not in out.error:
            return out  # the server answered: a real error, not "not up yet"
        await asyncio.sleep(1.0)


def _print_row(label: str, value: Any, fmt: str = "{:<10}") -> None:
    print(("{:<40} " + fmt).format(label, value))


async def benchmark(
    *,
    backend: str,
    api_url: str,
    base_url: str,
    model_id: str,
    model_name: str,
    tokenizer: Any,
    input_requests: list[SampleRequest],
    logprobs: int | None,
    request_rate: float,
    burstiness: float,
    disable_tqdm: bool,
    num_warmups: int,
    selected_percentile_metrics: list[str],
    selected_percentiles: list[float],
    ignore_eos: bool,
    goodput_config: dict[str, float],
    max_concurrency: int | None,
    extra_headers: dict[str, str] | None,
    extra_body: dict[str, Any] | None,
    ready_check_timeout_sec: float,
    seed: int,
) -> dict[str, Any]:
    import aiohttp

    request_func = ASYNC_REQUEST_FUNCS[backend]
    connector = aiohttp.TCPConnector(
        limit=max_concurrency or 0,
        limit_per_host=max_concurrency or 0,
        keepalive_timeout=60,
        enable_cleanup_closed=True,
        force_close=False,
        ssl=("https://" in api_url),
    )
    session = aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 3600)
    )
    try:

        def make_input(req: Any, request_id: str | None = None) -> RequestFuncInput:
            return RequestFuncInput(
                prompt=req.prompt,
                api_url=api_url,
                prompt_len=req.prompt_len,
                output_len=req.expected_output_len,
                model=model_id,
                model_name=model_name,
                logprobs=logprobs,
                ignore_eos=ignore_eos,
                extra_body=extra_body,
                extra_headers=extra_headers,
                request_id=request_id,
            )

        test_input = make_input(input_requests[0])
        print("Starting initial single prompt test run...")
        if ready_check_timeout_sec > 0:
            test_output = await wait_for_endpoint(request_func, test_input, session, ready_check_timeout_sec)
            if not test_output.success:
                raise ValueError(
                    "Initial test run failed - Please make sure benchmark arguments are correctly specified. "
                    f"Error: {test_output.error}"
                )
            print("Initial test run completed.")
        else:
            print("Skipping endpoint ready check.")

        semaphore: Any = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
        if num_warmups > 0:
            print(f"Warming up with {num_warmups} requests...")
            wbar = None if disable_tqdm else _tqdm(num_warmups)

            async def warm() -> RequestFuncOutput:
                async with semaphore:
                    return await request_func(test_input, session, wbar)

            await asyncio.gather(*(warm() for _ in range(num_warmups)))
            if wbar is not None:
                wbar.close()
            print("Warmup run completed.")

        print("Starting main benchmark run...")
        distribution = "Poisson process" if burstiness == 1.0 else "Gamma distribution"
        print(f"Traffic request rate: {request_rate}")
        print(f"Burstiness factor: {burstiness} ({distribution})")
        print(f"Maximum request concurrency: {max_concurrency}")

        before = await fetch_spec_decode_metrics(base_url, session)
        pbar = None if disable_tqdm else _tqdm(len(input_requests))

        async def limited(inp: RequestFuncInput) -> RequestFuncOutput:
            async with semaphore:
                return await request_func(inp, session, pbar)

        start = time.perf_counter()
        tasks: list[asyncio.Task[RequestFuncOutput]] = []
        async for req in get_request(input_requests, request_rate, burstiness, seed):
            tasks.append(asyncio.create_task(limited(make_input(req, req.request_id))))
        outputs = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - start
        if pbar is not None:
            pbar.close()
        after = await fetch_spec_decode_metrics(base_url, session)
    finally:
        await session.close()

    spec = spec_decode_stats(before, after)
    metrics, actual_output_lens = calculate_metrics(
        input_requests, outputs, duration, tokenizer, selected_percentiles, goodput_config
    )

    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    _print_row("Successful requests:", metrics.completed)
    _print_row("Failed requests:", metrics.failed)
    if max_concurrency is not None:
        _print_row("Maximum request concurrency:", max_concurrency)
    if request_rate != float("inf"):
        _print_row("Request rate configured (RPS):", request_rate, "{:<10.2f}")
    _print_row("Benchmark duration (s):", duration, "{:<10.2f}")
    _print_row("Total input tokens:", metrics.total_input)
    _print_row("Total generated tokens:", metrics.total_output)
    _print_row("Request throughput (req/s):", metrics.request_throughput, "{:<10.2f}")
    if goodput_config:
        _print_row("Request goodput (req/s):", metrics.request_goodput, "{:<10.2f}")
    _print_row("Output token throughput (tok/s):", metrics.output_throughput, "{:<10.2f}")
    _print_row("Peak output token throughput (tok/s):", metrics.max_output_tokens_per_s, "{:<10.2f}")
    _print_row("Peak concurrent requests:", metrics.max_concurrent_requests, "{:<10.2f}")
    _print_row("Total token throughput (tok/s):", metrics.total_token_throughput, "{:<10.2f}")

    result: dict[str, Any] = {
        "duration": duration,
        "completed": metrics.completed,
        "failed": metrics.failed,
        "total_input_tokens": metrics.total_input,
        "total_output_tokens": metrics.total_output,
        "request_throughput": metrics.request_throughput,
        "request_goodput": metrics.request_goodput if goodput_config else None,
        "output_throughput": metrics.output_throughput,
        "total_token_throughput": metrics.total_token_throughput,
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": actual_output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "start_times": [o.start_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
        "max_output_tokens_per_s": metrics.max_output_tokens_per_s,
        "max_concurrent_requests": metrics.max_concurrent_requests,
        "rtfx": 0.0,
    }
    if spec is not None:
        result["spec_decode_acceptance_rate"] = spec["acceptance_rate"]
        result["spec_decode_acceptance_length"] = spec["acceptance_length"]
        result["spec_decode_num_drafts"] = int(spec["num_drafts"])
        result["spec_decode_draft_tokens"] = int(spec["draft_tokens"])
        result["spec_decode_accepted_tokens"] = int(spec["accepted_tokens"])
        result["spec_decode_per_position_acceptance_rates"] = spec["per_position_acceptance_rates"]

    for attr, name, header in (
        ("ttft", "TTFT", "Time to First Token"),
        ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
        ("itl", "ITL", "Inter-token Latency"),
        ("e2el", "E2EL", "End-to-end Latency"),
    ):
        if attr not in selected_percentile_metrics:
            continue
        s = metrics.stats[attr]
        print("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        _print_row(f"Mean {name} (ms):", s["mean"], "{:<10.2f}")
        _print_row(f"Median {name} (ms):", s["median"], "{:<10.2f}")
        result[f"mean_{attr}_ms"] = s["mean"]
        result[f"median_{attr}_ms"] = s["median"]
        result[f"std_{attr}_ms"] = s["std"]
        for p, value in s["percentiles"]:
            p_word = str(int(p)) if int(p) == p else str(p)
            _print_row(f"P{p_word} {name} (ms):", value, "{:<10.2f}")
            result[f"p{p_word}_{attr}_ms"] = value

    if spec is not None:
        print("{s:{c}^{n}}".format(s="Speculative Decoding", n=50, c="-"))
        _print_row("Acceptance rate (%):", spec["acceptance_rate"], "{:<10.2f}")
        _print_row("Acceptance length:", spec["acceptance_length"], "{:<10.2f}")
        _print_row("Drafts:", int(spec["num_drafts"]))
        _print_row("Draft tokens:", int(spec["draft_tokens"]))
        _print_row("Accepted tokens:", int(spec["accepted_tokens"]))
        if spec["per_position_acceptance_rates"]:
            print("Per-position acceptance (%):")
            for i, rate in enumerate(spec["per_position_acceptance_rates"]):
                _print_row(f"  Position {i}:", rate * 100, "{:<10.2f}")
    print("=" * 50)
    return result


def _tqdm(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total)


# --------------------------------------------------------------------------- arguments


def _parse_kv(items: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"{flag}: expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items or []:
        if ":" not in item:
            raise ValueError(f"--goodput: expected NAME:MS (e.g. ttft:500), got {item!r}")
        k, v = item.split(":", 1)
        if k not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"--goodput: invalid metric {k!r}; use ttft, tpot or e2el")
        try:
            f = float(v)
        except ValueError:
            raise ValueError(f"--goodput: invalid value {v!r} for {k}") from None
        if f < 0:
            raise ValueError(f"--goodput: {k} must be non-negative, got {f}")
        out[k] = f
    return out


def add_dataset_args(p: argparse.ArgumentParser, default_name: str | None = "random") -> None:
    """vLLM's dataset flags (``bench serve``, ``bench throughput``); :func:`get_samples` reads them."""
    d = p.add_argument_group("dataset")
    d.add_argument("--dataset-name", default=default_name, choices=DATASET_NAMES)
    d.add_argument("--dataset-path", default=None)
    d.add_argument("--num-prompts", type=int, default=1000)
    d.add_argument("--no-oversample", action="store_true")
    d.add_argument("--disable-shuffle", action="store_true")
    d.add_argument("--skip-chat-template", action="store_true")
    d.add_argument("--input-len", type=int, default=None, help="Generic input length (random dataset).")
    d.add_argument("--output-len", type=int, default=None, help="Generic output length (all datasets).")
    d.add_argument("--random-input-len", type=int, default=1024)
    d.add_argument("--random-output-len", type=int, default=128)
    d.add_argument("--random-range-ratio", type=float, default=0.0)
    d.add_argument("--random-prefix-len", type=int, default=0)
    d.add_argument("--sharegpt-output-len", type=int, default=None)
    d.add_argument("--custom-output-len", type=int, default=256)
    d.add_argument("--hf-name", default=None)
    d.add_argument("--hf-split", default=None)
    d.add_argument("--hf-subset", default=None)
    d.add_argument("--hf-output-len", type=int, default=None)
    d.add_argument("--spec-bench-output-len", type=int, default=256)
    d.add_argument("--spec-bench-category", default=None)


def resolve_dataset_lens(args: argparse.Namespace) -> None:
    """``--input-len`` / ``--output-len`` override every dataset's own length flags."""
    if args.output_len is not None:
        args.random_output_len = args.output_len
        args.hf_output_len = args.output_len
        args.custom_output_len = args.output_len
        args.sharegpt_output_len = args.output_len
        args.spec_bench_output_len = args.output_len
    if args.input_len is not None:
        args.random_input_len = args.input_len


def make_arg_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog="specserve bench serve", description="Benchmark the online serving throughput."
    )
    t = p.add_argument_group("target")
    t.add_argument("--backend", default="openai", choices=BACKENDS)
    t.add_argument("--base-url", default=None, help="Server base URL (else http://HOST:PORT).")
    t.add_argument("--host", default="127.0.0.1")
    t.add_argument("--port", type=int, default=8000)
    t.add_argument(
        "--endpoint", default=None, help="Default /v1/completions (/v1/chat/completions for openai-chat)."
    )
    t.add_argument("--header", nargs="+", default=None, help="Extra request headers KEY=VALUE.")
    t.add_argument("--model", default=None, help="Model id (default: the first model of /v1/models).")
    t.add_argument(
        "--served-model-name", default=None, help="Name sent in the 'model' field (default: --model)."
    )
    t.add_argument(
        "--tokenizer", default=None, help="Tokenizer (default: the model; else the server's /tokenize)."
    )
    t.add_argument("--trust-remote-code", action="store_true")
    t.add_argument("--ready-check-timeout-sec", type=float, default=600)
    t.add_argument("--request-id-prefix", default=f"bench-{uuid.uuid4().hex[:8]}-")

    add_dataset_args(p)

    load = p.add_argument_group("load")
    load.add_argument("--request-rate", type=float, default=float("inf"))
    load.add_argument("--burstiness", type=float, default=1.0)
    load.add_argument("--max-concurrency", type=int, default=None)
    load.add_argument("--num-warmups", type=int, default=0)
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--disable-tqdm", action="store_true")

    s = p.add_argument_group("sampling")
    s.add_argument("--temperature", type=float, default=None)
    s.add_argument("--top-p", type=float, default=None)
    s.add_argument("--top-k", type=int, default=None)
    s.add_argument("--min-p", type=float, default=None)
    s.add_argument("--frequency-penalty", type=float, default=None)
    s.add_argument("--presence-penalty", type=float, default=None)
    s.add_argument("--repetition-penalty", type=float, default=None)
    s.add_argument("--ignore-eos", action="store_true")
    s.add_argument("--logprobs", type=int, default=None)
    s.add_argument("--extra-body", default=None, help="JSON merged into every request body.")

    o = p.add_argument_group("output")
    o.add_argument("--save-result", action="store_true")
    o.add_argument("--save-detailed", action="store_true")
    o.add_argument("--append-result", action="store_true")
    o.add_argument("--result-dir", default=None)
    o.add_argument("--result-filename", default=None)
    o.add_argument("--label", default=None)
    o.add_argument("--metadata", nargs="*", default=None, help="KEY=VALUE pairs added to the result JSON.")
    o.add_argument("--percentile-metrics", default="ttft,tpot,itl")
    o.add_argument("--metric-percentiles", default="99")
    o.add_argument("--goodput", nargs="+", default=None, help="SLOs in ms, e.g. ttft:500 tpot:50.")
    return p


def _load_tokenizer(
    name: str, trust_remote_code: bool, base_url: str, model_name: str, headers: dict[str, str]
) -> Any:
    """The model's tokenizer when it can be had locally; else the server's /tokenize endpoint."""
    try:
        if os.path.exists(os.path.expanduser(name)):
            from specserve.loading import load_tokenizer

            return load_tokenizer(os.path.expanduser(name), trust_remote_code=trust_remote_code)
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(
                name, trust_remote_code=trust_remote_code, local_files_only=True
            )
        except Exception:  # noqa: BLE001 - not in the local HF cache
            if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
                raise
            return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except Exception as e:  # noqa: BLE001
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(
            f"Tokenizer {name!r} is not available locally ({first}); counting tokens with {base_url}/tokenize."
        )
        return RemoteTokenizer(base_url, model_name, headers)


def _first_model(base_url: str, headers: dict[str, str]) -> tuple[str, str]:
    import httpx

    r = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=30.0)
    r.raise_for_status()
    data = r.json()["data"]
    if not data:
        raise ValueError(f"{base_url}/v1/models lists no models")
    return data[0]["id"], data[0].get("root") or data[0]["id"]


def bench_main(argv: list[str]) -> int:
    """``specserve bench serve ...`` (argv after ``bench serve``). Returns the exit code."""
    parser = make_arg_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return parse_exit_code(e)
    try:
        return _run(args)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"specserve bench serve: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    random.seed(args.seed)
    np.random.seed(args.seed)
    if args.endpoint is None:
        args.endpoint = "/v1/chat/completions" if args.backend == "openai-chat" else "/v1/completions"
    if args.base_url:
        base_url = args.base_url.rstrip("/")
        api_url = f"{base_url}{args.endpoint}"
    else:
        base_url = f"http://{args.host}:{args.port}"
        api_url = f"{base_url}{args.endpoint}"
    headers = _parse_kv(args.header, "--header")
    auth_headers = dict(headers)
    if os.environ.get("OPENAI_API_KEY"):
        auth_headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be at least 1")
    resolve_dataset_lens(args)
    percentile_metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    for m in percentile_metrics:
        if m not in ("ttft", "tpot", "itl", "e2el"):
            raise ValueError(f"--percentile-metrics: unknown metric {m!r} (use ttft, tpot, itl, e2el)")
    percentiles = [float(p) for p in args.metric_percentiles.split(",") if p.strip()]
    goodput = parse_goodput(args.goodput)
    metadata = _parse_kv(args.metadata, "--metadata")
    extra_body: dict[str, Any] | None = None
    if args.extra_body:
        try:
            extra_body = json.loads(args.extra_body)
        except json.JSONDecodeError as e:
            raise ValueError(f"--extra-body is not valid JSON: {e.msg}") from None
        if not isinstance(extra_body, dict):
            raise ValueError("--extra-body must be a JSON object")

    if args.model is None:
        model_name, model_id = _first_model(base_url, auth_headers)
    else:
        model_id = args.model
        model_name = args.served_model_name or args.model
    if args.served_model_name:
        model_name = args.served_model_name
    tokenizer_id = args.tokenizer if args.tokenizer is not None else model_id
    tokenizer = _load_tokenizer(tokenizer_id, args.trust_remote_code, base_url, model_name, auth_headers)

    if (
        args.backend == "openai-chat"
        and not args.skip_chat_template
        and args.dataset_name in ("hf", "custom", "spec_bench")
    ):
        print(
            "WARNING: the prompts get the chat template applied and the chat endpoint applies it again; "
            "pass --skip-chat-template with --backend openai-chat."
        )
    input_requests = get_samples(args, tokenizer)
    ignore_eos = args.ignore_eos or args.dataset_name == "random"

    sampling = {
        k: v
        for k, v in {
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "min_p": args.min_p,
            "frequency_penalty": args.frequency_penalty,
            "presence_penalty": args.presence_penalty,
            "repetition_penalty": args.repetition_penalty,
        }.items()
        if v is not None
    }
    if "temperature" not in sampling:
        print(
            "WARNING: bench serve no longer sets temperature==0 (greedy) in requests by default. The default will "
            "be determined on the server side and can be model/API specific. For the old behavior, include "
            "--temperature=0."
        )
    if sampling:
        extra_body = {**sampling, **(extra_body or {})}

    result = asyncio.run(
        benchmark(
            backend=args.backend,
            api_url=api_url,
            base_url=base_url,
            model_id=model_id,
            model_name=model_name,
            tokenizer=tokenizer,
            input_requests=input_requests,
            logprobs=args.logprobs,
            request_rate=args.request_rate,
            burstiness=args.burstiness,
            disable_tqdm=args.disable_tqdm,
            num_warmups=args.num_warmups,
            selected_percentile_metrics=percentile_metrics,
            selected_percentiles=percentiles,
            ignore_eos=ignore_eos,
            goodput_config=goodput,
            max_concurrency=args.max_concurrency,
            extra_headers=headers or None,
            extra_body=extra_body,
            ready_check_timeout_sec=args.ready_check_timeout_sec,
            seed=args.seed,
        )
    )
    if isinstance(tokenizer, RemoteTokenizer):
        tokenizer.close()

    label = args.label or args.backend
    current_dt = datetime.now().strftime("%Y%m%d-%H%M%S")
    result_json: dict[str, Any] = {
        "date": current_dt,
        "endpoint_type": args.backend,
        "backend": args.backend,
        "label": label,
        "model_id": model_id,
        "tokenizer_id": tokenizer_id,
        "num_prompts": args.num_prompts,
        **metadata,
        "request_rate": args.request_rate if args.request_rate < float("inf") else "inf",
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        **result,
    }
    if not args.save_detailed:
        for key in _DETAIL_FIELDS:
            result_json.pop(key, None)
    if args.save_result or args.append_result:
        base_model_id = model_id.rstrip("/").split("/")[-1]
        conc = f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
        file_name = (
            args.result_filename or f"{label}-{args.request_rate}qps{conc}-{base_model_id}-{current_dt}.json"
        )
        if args.result_dir:
            os.makedirs(args.result_dir, exist_ok=True)
            file_name = os.path.join(args.result_dir, file_name)
        mode = "a" if args.append_result else "w"
        with open(file_name, mode, encoding="utf-8") as f:
            if args.append_result and f.tell() != 0:
                f.write("\n")
            json.dump(result_json, f)
    return 0 if result_json["completed"] > 0 else 1


def main() -> None:  # pragma: no cover - `python -m specserve.bench.serve`
    sys.exit(bench_main(sys.argv[1:]))


if __name__ == "__main__":  # pragma: no cover
    main()
