"""The "speculators" checkpoint format (vLLM's ``SpeculatorsConfig``; RedHatAI ``*-speculator.eagle3`` heads such as
``RedHatAI/Qwen3-8B-speculator.eagle3``, the EAGLE-3 baseline of the DFlash paper).

Its ``config.json`` nests the decoder layer's config under ``transformer_layer_config`` and carries
``speculators_model_type`` ("eagle3"), ``draft_vocab_size``, ``norm_before_residual``, ``target_hidden_size``,
``eagle_aux_hidden_state_layer_ids`` and ``speculators_config`` (``proposal_methods[*].speculative_tokens``,
``default_proposal_method``, ``verifier.name_or_path``); its weights are the EAGLE-3 head's with the layer under
``layers.0.`` (``embed_tokens``, ``fc``, ``layers.0.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``), which the EAGLE-3
loader already reads. As in vLLM, such a checkpoint can be given as the drafter (its method and K are read from it)
or served directly: the verifier it names becomes the target and the head its EAGLE-3 drafter.
"""

from __future__ import annotations

import json
import os
from typing import Any

SUPPORTED = {"eagle3": "eagle3"}  # speculators_model_type -> our method


def read_config(path: str) -> dict[str, Any] | None:
    """``path``'s config.json when ``path`` is a local speculators-format checkpoint, else None (nothing fetched)."""
    cfg = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(cfg):
        return None
    try:
        with open(cfg) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) and "speculators_model_type" in raw else None


def method_of(raw: dict[str, Any]) -> str:
    kind = raw.get("speculators_model_type")
    if kind not in SUPPORTED:
        raise ValueError(
            f"speculators checkpoint of type {kind!r} is not supported (supported: {', '.join(SUPPORTED)})."
        )
    return SUPPORTED[kind]


def num_speculative_tokens(raw: dict[str, Any]) -> int | None:
    """K of the proposal method the checkpoint names as its default (else its first), as vLLM reads it."""
    sc = raw.get("speculators_config") or {}
    methods = sc.get("proposal_methods") or []
    if not methods:
        return None
    default = sc.get("default_proposal_method")
    chosen = next((m for m in methods if default and m.get("proposal_type") == default), methods[0])
    k = chosen.get("speculative_tokens")
    return int(k) if isinstance(k, int) and not isinstance(k, bool) else None


def verifier_of(raw: dict[str, Any]) -> str | None:
    name = ((raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return str(name) if name else None


def flatten(raw: dict[str, Any]) -> dict[str, Any]:
    """The flat EAGLE-3 head config our loader reads: the layer config plus the head's own keys."""
    method_of(raw)
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict) or "hidden_size" not in layer:
        raise ValueError(
            "speculators checkpoint: config.json has no transformer_layer_config with hidden_size."
        )
    out = dict(layer)
    for key in (
        "draft_vocab_size",
        "norm_before_residual",
        "target_hidden_size",
        "eagle_aux_hidden_state_layer_ids",
    ):
        if raw.get(key) is not None:
            out[key] = raw[key]
    out["architectures"] = raw.get("architectures") or ["Eagle3Speculator"]
    out["num_hidden_layers"] = 1
    return out
