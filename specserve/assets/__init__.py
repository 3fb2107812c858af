"""Bundled drafters for the demo target (SmolLM2-135M-Instruct), trained with ``specserve train``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ASSETS = Path(__file__).resolve().parent
DEMO_DFLASH = ASSETS / "smollm2-135m-dflash"
DEMO_EAGLE3 = ASSETS / "smollm2-135m-eagle3"


def default_speculative_config(device: str | None = "auto") -> dict[str, Any] | None:
    """DFlash with the bundled drafter when it is present, else None (plain decoding).

    K=7 on a GPU: a step of SmolLM2 is bound by kernel latency rather than by its rows, and drafts past the 8th are
    seldom accepted, so K=7 keeps about K=15's acceptance at ~6-7% less per step (~1.0 vs ~1.07 ms; H100, session 33,
    ``benchmarks/results/h100-2026-12-06-s33/``: batch 1, medians of 5 passes, K=7 vs K=15 1.04x / 1.16x / 1.05x on
    chat / gsm8k_test / mt_bench prompts; ``bench serve`` mt-bench 1.04-1.08x at concurrency 1, 1.26x at 2,
    1.05-1.18x at 4). K=3 on the CPU, where a verify grows with its tokens (2-core VM, bf16, session 3: K=15 3.3 / 3.2
    tok/s at batch 1 / 8 vs K=4 5.9 / 8.9, at about the same acceptance; float32 with the ``W @ x.T`` GEMMs, session
    22: K=3 vs K=4 1.76x / 1.00x / 1.41x vs 1.68x / 0.89x / 1.41x plain decoding on gsm8k_test / mt_bench / math500 at
    batch 1, 47.1 vs 43.1 tok/s at batch 8 on chat prompts). ``device``: the engine's device argument ("auto": CUDA
    when available).
    """
    if not (DEMO_DFLASH / "config.json").is_file():
        return None
    dev = device or "auto"
    if dev == "auto":
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
    k = 7 if str(dev).startswith("cuda") else 3
    return {"method": "dflash", "model": str(DEMO_DFLASH), "num_speculative_tokens": k}
