"""Compact drafter storage: weight-only int8 with one scale per output row (symmetric).

A 2-D weight ``W [rows, cols]`` is stored as ``name`` = ``round(W / s)`` in int8 and ``name + "_scale"`` = ``s``
(``[rows, 1]`` float32, ``s = max|W_row| / 127``); readers multiply back (:func:`dequantize_state`) and compute in
their own dtype. It halves a bf16 drafter (the demo assets' 25 MB budget) at no measurable acceptance cost: the
demo DFlash drafter stored this way validated at chain_tau 3.5412 vs 3.5419 in bf16 (64 held-out gsm8k_train
prompts, CPU fp32, benchmarks/README.md session 7). The config records it as ``quantization_config`` with
``quant_method`` :data:`QUANT_METHOD`; vLLM does not know that method (it refuses the checkpoint rather than
misreading it): export bf16 for vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

QUANT_METHOD = "specserve_int8_rows"
SCALE_SUFFIX = "_scale"


def quantization_config() -> dict[str, str]:
    return {
        "quant_method": QUANT_METHOD,
        "format": "weight-only int8, symmetric, one float32 scale per output row in '<name>_scale'",
    }


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [rows, cols]`` -> (int8 ``q``, float32 ``scale [rows, 1]``) with ``w ~= q * scale``."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"int8 row quantization needs a 2-D float tensor, got {tuple(w.shape)} {w.dtype}")
    wf = w.detach().float()
    scale = wf.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 127.0
    q = torch.round(wf / scale).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if q.dtype != torch.int8 or q.dim() != 2 or scale.numel() != q.shape[0]:
        raise ValueError(
            f"bad int8 weight / scale pair: {tuple(q.shape)} {q.dtype}, scale {tuple(scale.shape)}"
        )
    return (q.float() * scale.float().reshape(-1, 1)).to(dtype)


def quantize_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every 2-D float tensor -> int8 + ``_scale``; the rest (norm vectors, index maps) unchanged."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if t.is_floating_point() and t.dim() == 2:
            if name + SCALE_SUFFIX in state:
                raise ValueError(f"tensor name clash: {name + SCALE_SUFFIX}")
            out[name], out[name + SCALE_SUFFIX] = quantize_rows(t)
        else:
            out[name] = t
    return out


def quantized_names(names: Iterable[str], is_int8: Callable[[str], bool]) -> set[str]:
    """The weights stored int8 (each has a ``_scale`` companion) among ``names``; ``is_int8(name)`` tells a
    tensor's dtype without loading it where the reader can (safetensors slices)."""
    names = set(names)
    return {n for n in names if n + SCALE_SUFFIX in names and is_int8(n)}


def dequantize_state(state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Inverse of :func:`quantize_state` (a state without int8 weights comes back unchanged)."""
    q = quantized_names(state, lambda n: state[n].dtype == torch.int8)
    scales = {n + SCALE_SUFFIX for n in q}
    return {
        name: dequantize(t, state[name + SCALE_SUFFIX], dtype) if name in q else t
        for name, t in state.items()
        if name not in scales
    }
