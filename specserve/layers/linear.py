"""A linear layer whose weight is stored transposed, for the decode GEMM layout experiment (issue #6).

``nn.Linear`` keeps W as [out, in] (K contiguous) and cuBLAS runs ``x @ W.T`` as a "TN" GEMM; on the H200 its
decode-shape kernels stream o_proj / qkv / down at only 64-80% of the DRAM rate (session 5,
``benchmarks/results/h200-2026-12-03-s5/decode_profile-b1.log``). :class:`TransposedLinear` stores ``W.T``
contiguous ([in, out]) so the product is an "NN" GEMM, which cuBLAS serves with other kernels.
``SPECSERVE_WEIGHT_LAYOUT=kn`` converts the target's decoder projections at load time
(:func:`transpose_decoder_linears`); off by default until ``benchmarks/gemm_layouts.py`` / ``step_latency.py``
measure it faster. Same values as ``nn.Linear`` up to the GEMM's accumulation order.
"""

from __future__ import annotations

import os

import torch
from torch import nn


def weight_layout() -> str:
    """``"nk"`` (nn.Linear's, the default) or ``"kn"`` (transposed), from ``SPECSERVE_WEIGHT_LAYOUT``."""
    v = os.environ.get("SPECSERVE_WEIGHT_LAYOUT", "nk").lower()
    if v not in ("nk", "kn"):
        raise ValueError(f"SPECSERVE_WEIGHT_LAYOUT must be 'nk' or 'kn', got {v!r}")
    return v


class TransposedLinear(nn.Module):
    """``y = x @ weight_t (+ bias)`` with ``weight_t`` = an ``nn.Linear``'s weight transposed, contiguous."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None and x.dim() == 2:
            return torch.addmm(self.bias, x, self.weight_t)
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def transpose_decoder_linears(layers: nn.ModuleList) -> int:
    """Replace each decoder layer's qkv / o / gate_up / down ``nn.Linear`` by a :class:`TransposedLinear` (the
    original weight is freed as it goes, so the peak is one layer's projections); returns how many."""
    n = 0
    for layer in layers:
        for parent_name, names in (
            ("self_attn", ("qkv_proj", "o_proj")),
            ("mlp", ("gate_up_proj", "down_proj")),
        ):
            parent = getattr(layer, parent_name)
            for name in names:
                lin = getattr(parent, name)
                if isinstance(lin, nn.Linear):
                    setattr(parent, name, TransposedLinear(lin))
                    del lin
                    n += 1
    return n
