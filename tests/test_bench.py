"""``specserve bench serve`` against a live ``specserve serve`` (n-gram speculation on a tiny random Llama),
plus the dataset loaders and the metric arithmetic on synthetic inputs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"
MT_BENCH = SHARED / "data" / "mt_bench_question.jsonl"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}

RESULT_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p99_itl_ms",
}  # fmt: skip
SPEC_KEYS = {
    "spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
    "spec_decode_draft_tokens", "spec_decode_accepted_tokens", "spec_decode_per_position_acceptance_rates",
}  # fmt: skip


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="2")
    return env


@pytest.fixture(scope="module")
def spec_server(tiny_llama_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`specserve serve` in a subprocess, with n-gram speculation."""
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    cmd = [
        sys.executable, "-m", "specserve", "serve", tiny_llama_dir,
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
        "--max-model-len", "1K", "--max-num-seqs", "4", "--num-gpu-blocks", "256", "--device", "cpu",
        "--speculative-config", json.dumps(NGRAM), "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=_env())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, f"server exited early:\n{log.read_text()}"
            assert time.time() < deadline, f"server did not come up:\n{log.read_text()}"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _row(report: str, label: str) -> str:
    m = re.search(rf"^{re.escape(label)}\s+(\S+)\s*$", report, re.M)
    assert m, f"{label!r} not in report:\n{report}"
    return m.group(1)


def test_bench_serve_mt_bench_with_speculation(spec_server: str, tmp_path: Path, tiny_llama_dir: str) -> None:
    if not MT_BENCH.is_file():
        pytest.skip(f"shared data not found at {MT_BENCH}")
    cmd = [
        sys.executable, "-m", "specserve", "bench", "serve", "--base-url", spec_server,
        "--dataset-name", "hf", "--hf-name", "philschmid/mt-bench", "--dataset-path", str(MT_BENCH),
        "--num-prompts", "4", "--max-concurrency", "2", "--hf-output-len", "8", "--temperature", "0",
        "--save-result", "--result-dir", "tmp",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    start = out.index("============ Serving Benchmark Result ============")
    report = out[start:]
    assert report.rstrip().endswith("=" * 50)
    assert _row(report, "Successful requests:") == "4"
    assert _row(report, "Failed requests:") == "0"
    assert _row(report, "Maximum request concurrency:") == "2"
    total_out = int(_row(report, "Total generated tokens:"))
    duration = float(_row(report, "Benchmark duration (s):"))
    throughput = float(_row(report, "Output token throughput (tok/s):"))
    assert 4 <= total_out <= 32
    # The report prints the duration rounded to 2 decimals (vLLM's format): the throughput must lie between the
    # token count divided by the largest and the smallest duration that rounds to the printed one.
    assert (
        total_out / (duration + 0.005) - 0.01 <= throughput <= total_out / max(duration - 0.005, 1e-9) + 0.01
    )
    for header in ("Time to First Token", "Time per Output Token (excl. 1st token)", "Inter-token Latency"):
        assert "{s:{c}^{n}}".format(s=header, n=50, c="-") in report
    assert "---------------Speculative Decoding---------------" in report
    for label in (
        "Acceptance rate (%):",
        "Acceptance length:",
        "Drafts:",
        "Draft tokens:",
        "Accepted tokens:",
    ):
        _row(report, label)
    assert "Per-position acceptance (%):" in report and _row(report, "  Position 0:")
    assert float(_row(report, "Acceptance length:")) >= 1.0

    (result_file,) = (tmp_path / "tmp").glob("*.json")
    # --model omitted: the served name from /v1/models, the model id (and tokenizer) from its root
    assert result_file.name.startswith(f"openai-infqps-concurrency2-{Path(tiny_llama_dir).name}-")
    result = json.loads(result_file.read_text())
    assert RESULT_KEYS | SPEC_KEYS <= set(result)
    assert "input_lens" not in result and "ttfts" not in result  # only with --save-detailed
    assert result["completed"] == 4 and result["failed"] == 0 and result["num_prompts"] == 4
    assert (
        result["request_rate"] == "inf" and result["max_concurrency"] == 2 and result["backend"] == "openai"
    )
    assert result["total_output_tokens"] == total_out
    assert result["output_throughput"] == pytest.approx(result["total_output_tokens"] / result["duration"])
    assert result["request_throughput"] == pytest.approx(4 / result["duration"])
    # the prompts were chat-templated (ChatML) for the completions endpoint, and counted by the server
    assert result["total_input_tokens"] > 4 * 20
    spec = (
        result["spec_decode_num_drafts"],
        result["spec_decode_draft_tokens"],
        result["spec_decode_accepted_tokens"],
    )
    assert spec[0] > 0 and spec[1] >= spec[0] and 0 <= spec[2] <= spec[1]
    assert result["spec_decode_acceptance_length"] == pytest.approx(1 + spec[2] / spec[0])
    assert len(result["spec_decode_per_position_acceptance_rates"]) == NGRAM["num_speculative_tokens"]


def test_bench_chat_backend_random_dataset_remote_tokenizer(
    spec_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specserve.bench.serve import bench_main

    rc = bench_main(
        [
            "--backend", "openai-chat", "--base-url", spec_server, "--model", "tiny",
            "--tokenizer", str(tmp_path / "no-such-tokenizer"),
            "--dataset-name", "random", "--random-input-len", "12", "--random-output-len", "5",
            "--num-prompts", "3", "--max-concurrency", "3", "--request-rate", "50", "--seed", "1",
            "--temperature", "0", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--save-result", "--save-detailed", "--result-dir", str(tmp_path),
            "--result-filename", "out.json", "--metadata", "run=ci", "--goodput", "e2el:60000",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "counting tokens with" in out  # the tokenizer fell back to the server's /tokenize
    assert "Request rate configured (RPS):" in out and "Request goodput (req/s):" in out
    assert "{s:{c}^{n}}".format(s="End-to-end Latency", n=50, c="-") in out
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["completed"] == 3 and result["run"] == "ci" and result["endpoint_type"] == "openai-chat"
    assert result["total_output_tokens"] == 15  # random datasets send ignore_eos
    assert result["request_goodput"] == pytest.approx(3 / result["duration"])
    assert {"p50_e2el_ms", "p99_e2el_ms", "mean_e2el_ms", "p50_ttft_ms", "p99_itl_ms"} <= set(result)
    assert result["output_lens"] == [5, 5, 5] and len(result["itls"]) == 3
    assert all(12 < n < 100 for n in result["input_lens"])  # server-counted, chat-templated prompts


def test_bench_main_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    from specserve.bench.serve import bench_main

    assert bench_main(["--dataset-name", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dataset-name" in err[0]


# --------------------------------------------------------------------------- offline pieces


def test_parse_spec_decode_metrics_and_deltas() -> None:
    from specserve.bench.serve import parse_spec_decode_metrics, spec_decode_stats

    def exposition(drafts: float, tokens: float, accepted: float, per_pos: list[float]) -> str:
        lab = 'engine="0",model_name="m"'
        lines = [
            "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
            f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
            f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e9",
            f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {tokens}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {accepted}",
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
            for i, v in enumerate(per_pos)
        ]
        return "\n".join(lines)

    before = parse_spec_decode_metrics(exposition(10, 30, 12, [8, 4, 0]))
    assert before is not None and before.num_drafts == 10 and before.num_accepted_tokens == 12
    assert before.num_draft_tokens == 30 and before.accepted_per_pos == {0: 8, 1: 4, 2: 0}
    after = parse_spec_decode_metrics(exposition(30, 90, 52, [24, 14, 0]))
    stats = spec_decode_stats(before, after)
    assert stats is not None
    assert (stats["num_drafts"], stats["draft_tokens"], stats["accepted_tokens"]) == (20, 60, 40)
    assert stats["acceptance_rate"] == pytest.approx(40 / 60 * 100)
    assert stats["acceptance_length"] == pytest.approx(1 + 40 / 20)
    assert stats["per_position_acceptance_rates"] == pytest.approx([16 / 20, 10 / 20, 0.0])
    assert parse_spec_decode_metrics('vllm:num_requests_running{engine="0"} 1.0') is None
    assert spec_decode_stats(before, before) is None  # no drafts during the run: no block


def test_calculate_metrics_definitions() -> None:
    from specserve.bench.datasets import SampleRequest
    from specserve.bench.serve import RequestFuncOutput, calculate_metrics

    reqs = [SampleRequest("a", 10, 5), SampleRequest("b", 20, 5), SampleRequest("c", 30, 5)]
    outs = [
        RequestFuncOutput(success=True, latency=1.0, ttft=0.2, itl=[0.3, 0.5], output_tokens=5, prompt_len=11, start_time=100.0),
        RequestFuncOutput(success=True, latency=2.0, ttft=0.4, itl=[1.6], output_tokens=3, prompt_len=20, start_time=100.5),
        RequestFuncOutput(success=False, error="boom", prompt_len=30, start_time=100.0),
    ]  # fmt: skip
    m, lens = calculate_metrics(
        reqs, outs, dur_s=4.0, tokenizer=None, selected_percentiles=[50, 99], goodput_config={"ttft": 300}
    )
    assert lens == [5, 3, 0]
    assert (m.completed, m.failed, m.total_input, m.total_output) == (2, 1, 31, 8)
    assert m.output_throughput == pytest.approx(8 / 4.0) and m.request_throughput == pytest.approx(0.5)
    assert m.total_token_throughput == pytest.approx((31 + 8) / 4.0)
    assert m.request_goodput == pytest.approx(1 / 4.0)  # only the first request met TTFT <= 300 ms
    tpots = [(1.0 - 0.2) / 4, (2.0 - 0.4) / 2]
    assert m.stats["tpot"]["mean"] == pytest.approx(1000 * sum(tpots) / 2)
    assert m.stats["itl"]["mean"] == pytest.approx(1000 * (0.3 + 0.5 + 1.6) / 3)
    assert m.stats["ttft"]["median"] == pytest.approx(300.0)
    assert dict(m.stats["e2el"]["percentiles"])[50] == pytest.approx(1500.0)
    assert m.max_concurrent_requests == 2


def _args(**kw: Any) -> SimpleNamespace:
    base = dict(
        dataset_name="custom", dataset_path=None, num_prompts=4, disable_shuffle=False, seed=0, no_oversample=False,
        skip_chat_template=False, random_input_len=16, random_output_len=4, random_range_ratio=0.0,
        random_prefix_len=0, sharegpt_output_len=None, custom_output_len=256, hf_name=None, hf_split=None,
        hf_subset=None, hf_output_len=None, spec_bench_output_len=256, spec_bench_category=None,
        request_id_prefix="bench-test-",
    )  # fmt: skip
    base.update(kw)
    return SimpleNamespace(**base)


def test_datasets_custom_sharegpt_spec_bench(smol_tokenizer: Any, tmp_path: Path) -> None:
    from specserve.bench.datasets import get_samples

    custom = tmp_path / "custom.jsonl"
    custom.write_text(
        "\n".join(json.dumps({"prompt": f"Question number {i}?", "output_tokens": i + 1}) for i in range(3))
    )
    reqs = get_samples(_args(dataset_path=str(custom), num_prompts=5, custom_output_len=-1), smol_tokenizer)
    assert len(reqs) == 5  # oversampled from 3
    assert [r.request_id for r in reqs] == [f"bench-test-{i}" for i in range(5)]
    first = reqs[0]
    assert first.prompt.startswith("<|im_start|>") and first.prompt.endswith("<|im_start|>assistant\n")
    assert first.prompt_len == len(smol_tokenizer(first.prompt).input_ids)
    assert {r.expected_output_len for r in reqs} <= {1, 2, 3}
    raw = get_samples(
        _args(
            dataset_path=str(custom),
            num_prompts=5,
            no_oversample=True,
            skip_chat_template=True,
            disable_shuffle=True,
        ),
        smol_tokenizer,
    )
    assert [r.prompt for r in raw] == [f"Question number {i}?" for i in range(3)]
    assert all(r.expected_output_len == 256 for r in raw)

    sharegpt = tmp_path / "sharegpt.json"
    convs = [
        {"conversations": [{"from": "human", "value": "Tell me about the history of Rome in detail."},
                           {"from": "gpt", "value": "Rome was founded, legend says, in 753 BC by Romulus."}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]},
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there, friend!"}]},
    ]  # fmt: skip
    sharegpt.write_text(json.dumps(convs))
    reqs = get_samples(
        _args(dataset_name="sharegpt", dataset_path=str(sharegpt), num_prompts=1), smol_tokenizer
    )
    assert len(reqs) == 1 and reqs[0].prompt.startswith("Tell me about")  # 1-turn and too-short pairs dropped
    assert reqs[0].expected_output_len == len(
        smol_tokenizer("Rome was founded, legend says, in 753 BC by Romulus.").input_ids
    )

    if not (SHARED / "data" / "spec_bench_question.jsonl").is_file():
        pytest.skip("shared data not found (spec_bench_question.jsonl)")
    reqs = get_samples(
        _args(
            dataset_name="spec_bench",
            dataset_path=str(SHARED / "data" / "spec_bench_question.jsonl"),
            spec_bench_category="math_reasoning",
            skip_chat_template=True,
            num_prompts=3,
            spec_bench_output_len=32,
        ),
        smol_tokenizer,
    )
    rows = [
        json.loads(line) for line in (SHARED / "data" / "spec_bench_question.jsonl").read_text().splitlines()
    ]
    math = {r["turns"][0] for r in rows if r["category"] == "math_reasoning"}
    assert len(reqs) == 3 and all(r.prompt in math and r.expected_output_len == 32 for r in reqs)


def test_dataset_hf_local_and_random(smol_tokenizer: Any) -> None:
    from specserve.bench.datasets import get_samples

    if not MT_BENCH.is_file():
        pytest.skip(f"shared data not found at {MT_BENCH}")
    reqs = get_samples(
        _args(dataset_name="hf", hf_name="philschmid/mt-bench", dataset_path=str(MT_BENCH), num_prompts=80,
              disable_shuffle=True, skip_chat_template=True),
        smol_tokenizer,
    )  # fmt: skip
    first_turns = [json.loads(line)["turns"][0] for line in MT_BENCH.read_text().splitlines() if line.strip()]
    assert [r.prompt for r in reqs] == first_turns and all(r.expected_output_len == 256 for r in reqs)
    shuffled = get_samples(
        _args(
            dataset_name="hf",
            dataset_path=str(MT_BENCH),
            num_prompts=80,
            hf_output_len=8,
            skip_chat_template=True,
        ),
        smol_tokenizer,
    )
    assert [r.prompt for r in shuffled] != first_turns and sorted(r.prompt for r in shuffled) == sorted(
        first_turns
    )
    assert all(r.expected_output_len == 8 for r in shuffled)
    rnd = get_samples(
        _args(dataset_name="random", num_prompts=3, random_input_len=20, random_output_len=7), smol_tokenizer
    )
    assert len(rnd) == 3 and all(r.expected_output_len == 7 for r in rnd)
    assert all(10 <= r.prompt_len <= 20 for r in rnd)
