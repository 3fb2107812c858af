"""Speculative decoding: proposers (DFlash, EAGLE-3, a draft model, n-gram) and verification."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specserve.config import SpeculativeConfig
from specserve.spec.proposer import DraftInput, NgramProposer, Proposer

if TYPE_CHECKING:
    from specserve.runner.model_runner import ModelRunner

__all__ = ["DraftInput", "Proposer", "NgramProposer", "build_proposer"]


def build_proposer(spec: SpeculativeConfig, runner: ModelRunner) -> Proposer:
    if spec.method == "ngram":
        assert spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None
        return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "dflash":
        from specserve.spec.dflash import DFlashProposer

        return DFlashProposer(spec, runner)
    if spec.method in ("eagle3", "eagle"):
        from specserve.spec.eagle3 import Eagle3Proposer

        return Eagle3Proposer(spec, runner)
    if spec.method == "draft_model":
        from specserve.spec.draft_model import DraftModelProposer

        return DraftModelProposer(spec, runner)
    raise ValueError(f"Unsupported speculative method {spec.method!r}.")
