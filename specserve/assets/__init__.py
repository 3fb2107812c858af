"""Bundled drafters for the demo target (SmolLM2-135M-Instruct), trained with ``specserve train``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ASSETS = Path(__file__).resolve().parent
DEMO_DFLASH = ASSETS / "smollm2-135m-dflash"
DEMO_EAGLE3 = ASSETS / "smollm2-135m-eagle3"


def default_speculative_config(device: str | None = "auto") -> dict[str, Any] | None:
    """DFlash with the bundled drafter when it is present, else None (plain decoding).

    K=15 (the whole block) on a GPU, where verifying 16 tokens costs about what one does; K=3 on the CPU, where a
    verify grows with its tokens (2-core VM, bf16, session 3: K=15 3.3 / 3.2 tok/s at batch 1 / 8 vs K=4 5.9 / 8.9,
    at about the same acceptance; float32 with the ``W @ x.T`` GEMMs, session 22: K=3 vs K=4 1.76x / 1.00x / 1.41x vs
    1.68x / 0.89x / 1.41x plain decoding on gsm8k_test / mt_bench / math500 at batch 1, 47.1 vs 43.1 tok/s at batch
    8 on chat prompts). ``device``: the engine's device argument ("auto": CUDA when available).
    """
    if not (DEMO_DFLASH / "config.json").is_file():
        return None
    dev = device or "auto"
    if dev == "auto":
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
    k = 15 if str(dev).startswith("cuda") else 3
    return {"method": "dflash", "model": str(DEMO_DFLASH), "num_speculative_tokens": k}
