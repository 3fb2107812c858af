"""Export trained drafters as ``config.json`` + ``model.safetensors`` (+ ``training.json``), in the formats
vLLM / SGLang / specserve load: z-lab ``DFlashDraftModel`` and ``LlamaForCausalLMEagle3``."""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from specserve.train.models import DFlashConfig, DFlashDrafter, Eagle3Config, Eagle3Drafter


def dflash_hf_config(cfg: DFlashConfig) -> dict[str, Any]:
    out: dict[str, Any] = dict(
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        block_size=cfg.block_size,
        num_target_layers=cfg.num_target_layers,
        dflash_config=dict(mask_token_id=cfg.mask_token_id, target_layer_ids=list(cfg.target_layer_ids)),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        rope_scaling=cfg.rope_scaling,
        max_position_embeddings=cfg.max_position_embeddings,
        layer_types=["full_attention"] * cfg.num_hidden_layers,
        sliding_window=None,
        use_sliding_window=False,
        attention_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        vocab_size=cfg.vocab_size,
        torch_dtype="bfloat16",
    )
    if cfg.target_hidden_size != cfg.hidden_size:
        out["target_hidden_size"] = cfg.target_hidden_size
    return out


def eagle3_hf_config(cfg: Eagle3Config, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = dict(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        num_hidden_layers=1,
        hidden_act="silu",
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        rope_scaling=cfg.rope_scaling,
        max_position_embeddings=cfg.max_position_embeddings,
        vocab_size=cfg.vocab_size,
        draft_vocab_size=int(cfg.draft_vocab_size or cfg.vocab_size),
        tie_word_embeddings=False,
        attention_bias=False,
        eagle_aux_hidden_state_layer_ids=list(cfg.target_layer_ids),
        eagle_config=dict(
            use_aux_hidden_state=True, eagle_aux_hidden_state_layer_ids=list(cfg.target_layer_ids)
        ),
        target_hidden_size=cfg.target_hidden_size,
        num_target_layers=cfg.num_target_layers,
        torch_dtype="bfloat16",
    )
    out.update(extra or {})
    return out


def drafter_state(drafter: DFlashDrafter | Eagle3Drafter) -> dict[str, torch.Tensor]:
    """Checkpoint tensors: floats in bf16, ``d2t`` int64, ``t2d`` bool; no embedding / shared LM head."""
    out = {}
    for name, t in drafter.state_dict().items():
        t = t.detach().cpu()
        out[name] = t.to(torch.bfloat16).contiguous() if t.is_floating_point() else t.contiguous()
    return out


WEIGHT_FORMATS = ("bfloat16", "int8")


def export_drafter(
    drafter: DFlashDrafter | Eagle3Drafter,
    output_dir: str,
    training_info: dict[str, Any] | None = None,
    extra_config: dict[str, Any] | None = None,
    weight_format: str = "bfloat16",
) -> dict[str, str]:
    """Write ``config.json``, ``model.safetensors`` and (if given) ``training.json`` to ``output_dir``.

    ``weight_format``: ``bfloat16`` (what vLLM / SGLang load) or ``int8`` (weight-only, a scale per output row:
    half the size, for specserve only; :mod:`specserve.loading.int8`)."""
    from safetensors.torch import save_file

    from specserve.loading import int8

    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format must be one of {WEIGHT_FORMATS}, got {weight_format!r}")
    os.makedirs(output_dir, exist_ok=True)
    if isinstance(drafter, DFlashDrafter):
        config = dflash_hf_config(drafter.config)
        config.update(extra_config or {})
    else:
        config = eagle3_hf_config(drafter.config, extra_config)
    state = drafter_state(drafter)
    if weight_format == "int8":
        state = int8.quantize_state(state)
        config["quantization_config"] = int8.quantization_config()
    paths = dict(
        config=os.path.join(output_dir, "config.json"), weights=os.path.join(output_dir, "model.safetensors")
    )
    with open(paths["config"], "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    save_file(state, paths["weights"], metadata={"format": "pt"})
    if training_info is not None:
        paths["training"] = os.path.join(output_dir, "training.json")
        with open(paths["training"], "w", encoding="utf-8") as f:
            json.dump(training_info, f, indent=2)
            f.write("\n")
    return paths


def load_drafter(path: str, dtype: torch.dtype = torch.float32) -> DFlashDrafter | Eagle3Drafter:
    """Rebuild a drafter from an exported directory (for tests, evaluation and fine-tuning)."""
    from safetensors.torch import load_file

    from specserve.loading import int8

    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    quant = (cfg.get("quantization_config") or {}).get("quant_method")
    if quant not in (None, int8.QUANT_METHOD):
        raise ValueError(f"unsupported quantization_config.quant_method {quant!r} in {path}")
    state = int8.dequantize_state(load_file(os.path.join(path, "model.safetensors")), torch.float32)
    common = dict(
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_key_value_heads"],
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
        vocab_size=cfg["vocab_size"],
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg.get("rope_theta", 10000.0),
        rope_scaling=cfg.get("rope_scaling"),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
    )
    arch = cfg["architectures"][0]
    drafter: DFlashDrafter | Eagle3Drafter
    if arch == "DFlashDraftModel":
        dc = cfg["dflash_config"]
        dcfg = DFlashConfig(
            **common,
            target_layer_ids=list(dc["target_layer_ids"]),
            num_target_layers=cfg["num_target_layers"],
            target_hidden_size=cfg.get("target_hidden_size", cfg["hidden_size"]),
            block_size=cfg["block_size"],
            mask_token_id=dc["mask_token_id"],
        )
        drafter = DFlashDrafter(dcfg)
    elif arch in ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"):
        ecfg = Eagle3Config(
            **common,
            target_layer_ids=list(cfg.get("eagle_aux_hidden_state_layer_ids") or []),
            num_target_layers=cfg.get("num_target_layers", 0),
            target_hidden_size=cfg.get("target_hidden_size", cfg["hidden_size"]),
            draft_vocab_size=cfg.get("draft_vocab_size"),
        )
        ids = None
        if "d2t" in state and not ecfg.shares_lm_head:
            ids = torch.arange(state["d2t"].numel()) + state["d2t"]
        drafter = Eagle3Drafter(ecfg, draft_token_ids=ids)
    else:
        raise ValueError(f"not a drafter checkpoint: architectures={cfg['architectures']}")
    drafter.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})
    return drafter.to(dtype)
