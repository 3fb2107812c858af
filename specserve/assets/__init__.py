"""Bundled drafters for the demo target (SmolLM2-135M-Instruct), trained with ``specserve train``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ASSETS = Path(__file__).resolve().parent
DEMO_DFLASH = ASSETS / "smollm2-135m-dflash"
DEMO_EAGLE3 = ASSETS / "smollm2-135m-eagle3"


def default_speculative_config() -> dict[str, Any] | None:
    """DFlash with the bundled drafter when it is present, else None (plain decoding)."""
    if (DEMO_DFLASH / "config.json").is_file():
        return {"method": "dflash", "model": str(DEMO_DFLASH), "num_speculative_tokens": 15}
    return None
