"""Checkpoint loading: HF directories (safetensors / .bin), GGUF files, HF hub ids and the bundled demo model."""

from specserve.loading.checkpoint import (
    Checkpoint,
    apply_hf_overrides,
    config_only_checkpoint,
    load_tokenizer,
    resolve_checkpoint,
)
from specserve.loading.demo import demo_target_path, specserve_cache_dir

__all__ = [
    "Checkpoint",
    "apply_hf_overrides",
    "config_only_checkpoint",
    "resolve_checkpoint",
    "load_tokenizer",
    "specserve_cache_dir",
    "demo_target_path",
]
