"""GGUF checkpoints (llama.cpp): dequantized weights under HF names/layout, plus cached HF config and tokenizer.

Supported GGUF architectures: llama / mistral (Q/K rows un-permuted back to HF's rotate-half order), qwen2, qwen3.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
_PERMUTED_QK = ("llama", "mistral")  # llama.cpp's convert_hf_to_gguf permute()s q/k for these only
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_IGNORED = ("rope_freqs",)  # llama-3 rope factors; HF recomputes them from the config


def gguf_hf_name(name: str) -> str | None:
    """HF parameter name for a llama.cpp tensor name (``None`` for tensors HF does not store)."""
    parts = name.split(".")
    if parts[0] in _IGNORED:
        return None
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ValueError(
        f"Unsupported tensor {name!r} in GGUF file (specserve reads llama/mistral/qwen2/qwen3 GGUFs)."
    )


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute()`` (interleaved rotary pairs -> HF rotate-half rows); works on bias too."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _reader(file: str) -> Any:
    """A ``gguf.GGUFReader`` over a plain ndarray view of its memmap (field parsing is ~2x faster than on np.memmap)."""
    import gguf

    class _Reader(gguf.GGUFReader):
        @property  # type: ignore[override]
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return _Reader(file)


def iter_gguf_weights(file: str, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(HF name, tensor)`` for every tensor of a GGUF file, dequantized with ``gguf`` (numpy)."""
    from gguf.quants import dequantize

    reader = _reader(file)
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} in {file} is not supported; supported: {', '.join(GGUF_ARCHITECTURES)}."
        )
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    n_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_head))
    for t in reader.tensors:
        hf_name = gguf_hf_name(t.name)
        if hf_name is None:
            continue
        a = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape.tolist())])
        a = a.astype(np.float32, copy=False)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if arch in _PERMUTED_QK and kind in ("attn_q", "attn_k"):
            a = unpermute_qk(a, n_head if kind == "attn_q" else n_kv)
        if not a.flags.writeable:
            a = a.copy()
        yield hf_name, torch.from_numpy(a).to(dtype)


def _cached(cache_dir: Path, build: Callable[[str], None], load: Callable[[str], Any]) -> Any:
    """Load from ``cache_dir`` if present, else ``build(tmp)`` into a temp dir, move it into place and load it."""
    if cache_dir.is_dir():
        try:
            return load(str(cache_dir))
        except Exception as e:  # stale/corrupt cache: rebuild it
            logger.warning("Ignoring unreadable cache %s (%s)", cache_dir, e)
            shutil.rmtree(cache_dir, ignore_errors=True)
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=cache_dir.parent, prefix=f".{cache_dir.name}-")
    try:
        build(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            cache_dir.parent.rmdir()  # leave no empty entry behind for a file that cannot be read
        raise
    try:
        os.replace(tmp, cache_dir)
    except OSError:  # another process won the race (target exists and is not empty)
        shutil.rmtree(tmp, ignore_errors=True)
        if not cache_dir.is_dir():
            raise
    return load(str(cache_dir))


def gguf_cache_dir(file: str, cache_root: Path) -> Path:
    """Per-file cache dir keyed by the GGUF's name, size and mtime (and the transformers version)."""
    import transformers

    st = os.stat(file)
    return cache_root / f"{os.path.basename(file)}-{st.st_size}-{st.st_mtime_ns}-tf{transformers.__version__}"


def load_gguf_config(file: str, cache_root: Path) -> Any:
    """``AutoConfig.from_pretrained(dir, gguf_file=...)`` (~6 s of GGUF parsing), cached as a config.json."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    def build(out: str) -> None:
        cfg = AutoConfig.from_pretrained(os.path.dirname(file), gguf_file=os.path.basename(file))
        if not getattr(cfg, "architectures", None) and cfg.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            cfg.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg.model_type]]
        cfg.save_pretrained(out)

    cfg = _cached(gguf_cache_dir(file, cache_root) / "config", build, AutoConfig.from_pretrained)
    cfg._name_or_path = file
    return cfg


def load_gguf_tokenizer(file: str, cache_root: Path) -> Any:
    """``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` (~6 s), cached with ``save_pretrained``."""
    from transformers import AutoTokenizer

    def build(out: str) -> None:
        tok = AutoTokenizer.from_pretrained(os.path.dirname(file), gguf_file=os.path.basename(file))
        tok.save_pretrained(out)

    tok = _cached(gguf_cache_dir(file, cache_root) / "tokenizer", build, AutoTokenizer.from_pretrained)
    tok.name_or_path = file
    return tok
