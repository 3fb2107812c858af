"""``specserve bench latency`` / ``bench throughput`` (vLLM's offline benchmarks) in-process on tiny random
checkpoints: vLLM's report lines, the JSON keys, token counts that match the requested lengths, the acceptance of
a drafter that always agrees with the target (the target drafting for itself), and one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from specserve.cli import main


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_latency_report_and_json(
    tiny_llama_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lat.json"
    argv = ["bench", "latency", "--model", tiny_llama_dir, "--input-len", "8", "--output-len", "5"]
    argv += ["--batch-size", "3", "--num-iters-warmup", "1", "--num-iters", "4", "--disable-tqdm"]
    rc, out, err = _run(capsys, [*argv, "--output-json", str(path)])
    assert rc == 0, err
    avg = re.search(r"^Avg latency: ([0-9.e-]+) seconds$", out, re.M)
    assert avg is not None, out
    pct = re.findall(r"^(\d+)% percentile latency: ([0-9.e-]+) seconds$", out, re.M)
    assert [p for p, _ in pct] == ["10", "25", "50", "75", "90", "99"]
    res = json.loads(path.read_text())
    assert len(res["latencies"]) == 4 and all(t > 0 for t in res["latencies"])
    assert res["avg_latency"] == pytest.approx(float(np.mean(res["latencies"])))
    assert float(avg.group(1)) == pytest.approx(res["avg_latency"])
    assert res["percentiles"]["50"] == pytest.approx(float(np.percentile(res["latencies"], 50)))
    assert (
        min(res["latencies"]) <= res["percentiles"]["10"] <= res["percentiles"]["99"] <= max(res["latencies"])
    )
    assert "spec_decode" not in res and "Speculative decoding" not in out


def test_throughput_counts_and_self_drafting_acceptance(
    tiny_qwen3_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Greedy, the target as its own draft model: every draft token is accepted, and the reported acceptance
    says so; the token totals are the prompts' and n x --output-len."""
    path = tmp_path / "thr.json"
    argv = ["bench", "throughput", "--model", tiny_qwen3_dir, "--input-len", "12", "--output-len", "9"]
    argv += ["--num-prompts", "5", "--n", "2", "--temperature", "0", "--disable-tqdm", "--seed", "3"]
    # vLLM's dotted form of --speculative-config
    argv += ["--speculative-config.method", "draft_model", "--speculative-config.model", tiny_qwen3_dir]
    argv += ["--speculative-config.num_speculative_tokens", "3"]
    rc, out, err = _run(capsys, [*argv, "--output-json", str(path)])
    assert rc == 0, err
    m = re.search(
        r"^Throughput: ([0-9.]+) requests/s, ([0-9.]+) total tokens/s, ([0-9.]+) output tokens/s$", out, re.M
    )
    assert m is not None, out
    prompt_tokens = int(re.search(r"^Total num prompt tokens:  (\d+)$", out, re.M).group(1))  # type: ignore[union-attr]
    output_tokens = int(re.search(r"^Total num output tokens:  (\d+)$", out, re.M).group(1))  # type: ignore[union-attr]
    assert output_tokens == 5 * 2 * 9
    assert 5 * 10 <= prompt_tokens <= 5 * 13  # random prompts of ~12 tokens (re-tokenized text)
    res = json.loads(path.read_text())
    assert res["num_requests"] == 5 and res["total_output_tokens"] == output_tokens
    assert res["total_num_tokens"] == prompt_tokens + output_tokens
    assert res["tokens_per_second"] == pytest.approx(res["total_num_tokens"] / res["elapsed_time"])
    assert float(m.group(3)) == pytest.approx(res["output_tokens_per_second"], abs=0.01)
    spec = res["spec_decode"]
    assert spec["num_speculative_tokens"] == 3 and spec["num_drafts"] > 0
    assert spec["accepted_tokens"] == spec["draft_tokens"] and spec["acceptance_rate"] == 100.0
    assert 3.0 <= spec["acceptance_length"] <= 4.0
    assert "acceptance rate 100.00%" in out


def test_throughput_custom_dataset_without_speculation(
    tiny_llama_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"Tell me about the number {i}."}) + "\n" for i in range(4))
    )
    argv = ["bench", "throughput", "--model", tiny_llama_dir, "--dataset-name", "custom", "--dataset-path"]
    argv += [str(data), "--num-prompts", "4", "--custom-output-len", "6", "--disable-tqdm"]
    rc, out, err = _run(capsys, argv)
    assert rc == 0, err
    assert re.search(r"^Total num output tokens:  24$", out, re.M), out
    assert "Speculative decoding" not in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["bench", "latency", "--num-iters", "0"], "--num-iters must be at least 1, got 0"),
        (["bench", "latency", "--input-len", "8", "--max-model-len", "10"], "exceeds max_model_len=10"),
        (["bench", "throughput", "--num-prompts", "0"], "--num-prompts must be at least 1"),
        (["bench", "throughput", "--dataset-name", "sharegpt"], "needs --dataset-path"),
        (["bench", "throughput", "--tensor-parallel-size", "2"], "runs on one device"),
        (["bench", "throughput", "-sc", '{"method": "bogus"}'], "'method' must be one of"),
        (["bench", "latency", "--profile"], "unrecognized arguments: --profile"),
        (["bench", "nope"], "usage: specserve bench serve|latency|throughput"),
    ],
)
def test_bad_input_one_line_exit_2(
    tiny_llama_dir: str, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if argv[1] in ("latency", "throughput"):
        argv = [*argv, "--model", tiny_llama_dir]
    rc, _, err = _run(capsys, argv)
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1, err
