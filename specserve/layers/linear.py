"""A linear layer whose weight is stored transposed: the decode GEMM layout of large targets on CUDA (issue #6).

``nn.Linear`` keeps W as [out, in] (K contiguous) and cuBLAS runs ``x @ W.T`` as a "TN" GEMM; on the H200 its
decode-shape kernels stream o_proj / qkv / down at only 59-79% of the DRAM rate. :class:`TransposedLinear` stores
``W.T`` contiguous ([in, out]) so the product is an "NN" GEMM, which cuBLAS serves with other kernels: session 6
(``benchmarks/results/h200-2026-12-03-s6/gemm_layouts.log``) measured every Qwen3-8B decode GEMM at least as fast
that way (gate_up 95.8 -> 99.9%, down 78.9 -> 85.5%, LM head 98.3 -> 104.6% of the copy rate at 1 row) and the
8B-shaped plain decode step 5.309 -> 5.061 ms (``step_latency-{nk,kn}-b1.log``), while SmolLM2-135M's
launch-bound batch-1 decode did not gain (1006 vs 985 tok/s, within run-to-run noise). Hence the default
(:func:`weight_layout`): transposed on CUDA for hidden sizes from 2048 up, nn.Linear's elsewhere;
``SPECSERVE_WEIGHT_LAYOUT=nk|kn`` overrides it. Same values as ``nn.Linear`` up to the GEMM's accumulation order.

At decode steps the transposed qkv / o / down projections also run as split-K batched GEMMs
(:meth:`TransposedLinear.partials`, :func:`split_gemm_config`) whose fp32 partials the kernel after them sums; on
CUDA as the Triton kernels of :mod:`specserve.layers.triton_splitk`, which also serve nn.Linear's layout (small
targets' 2-16-row steps).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

KN_MIN_HIDDEN = 2048  # between the two measured shapes: SmolLM2's 576 (no gain) and Qwen3-8B's 4096 (-4.7%)


def weight_layout(device: torch.device | str | None = None, hidden_size: int | None = None) -> str:
    """``"kn"`` (projections stored transposed) or ``"nk"`` (nn.Linear's): ``SPECSERVE_WEIGHT_LAYOUT`` if set,
    else ``"kn"`` for a CUDA target whose hidden size is at least :data:`KN_MIN_HIDDEN`, else ``"nk"``."""
    v = os.environ.get("SPECSERVE_WEIGHT_LAYOUT", "").lower()
    if v:
        if v not in ("nk", "kn"):
            raise ValueError(f"SPECSERVE_WEIGHT_LAYOUT must be 'nk' or 'kn', got {v!r}")
        return v
    on_cuda = device is not None and torch.device(device).type == "cuda"
    return "kn" if on_cuda and hidden_size is not None and hidden_size >= KN_MIN_HIDDEN else "nk"


class TransposedLinear(nn.Module):
    """``y = x @ weight_t (+ bias)`` with ``weight_t`` = an ``nn.Linear``'s weight transposed, contiguous."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = linear.bias

    def partials(self, x: torch.Tensor, splits: int) -> torch.Tensor:
        """The product as ``splits`` fp32 partial outputs [S, *x.shape[:-1], out] over equal slices of the inputs
        (a batched GEMM over views of the stored weight: S x the CTAs of one GEMM at a decode step's few rows);
        their sum, rounded to x's dtype, is ``forward(x)`` up to the accumulation order. No bias."""
        k, n = self.in_features, self.out_features
        if self.bias is not None or k % splits:
            raise ValueError(f"partials: no bias and {k} inputs divisible by {splits} splits")
        lead = x.shape[:-1]
        xs = x.reshape(-1, splits, k // splits).transpose(0, 1)  # [S, T, K/S]
        w3 = self.weight_t.view(splits, k // splits, n)
        if x.dtype == torch.float32:
            out = torch.bmm(xs, w3)
        elif x.is_cuda:  # bf16 / fp16 products accumulated and returned in fp32
            out = torch.bmm(xs, w3, out_dtype=torch.float32)
        else:  # CPU has no bf16 -> fp32 bmm
            out = torch.bmm(xs.float(), w3.float())
        return out.view(splits, *lead, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None and x.dim() == 2:
            return torch.addmm(self.bias, x, self.weight_t)
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


# CPU, float32, 1-64 rows (decode, speculative verify, the drafters' blocks): ``torch.mm(W, x.T)`` instead of
# nn.Linear's ``x @ W.T``. On the 2-core AMD EPYC VM (session 22, torch 2.13 CPU) decode steps are weight-read bound,
# and the BLAS call behind ``x @ W.T`` gets slower per row from 2 rows on: SmolLM2-135M's 425 MB of float32 layer
# weights took 43.0 / 65.2 / 61.7 / 99.4 / 186.7 ms for 1 / 2 / 5 / 16 / 64 rows, ``W @ x.T`` 34.2 (one row padded to
# two) / 33.5 / 40.6 / 60.5 / 137.5 ms, the LM head 11.85 -> 7.31 ms at 1 row and 26.4 -> 10.0 at 5
# (benchmarks/cpu_gemm_orders.py, results/cpu-2core-s22/). From 128 rows nn.Linear's order is as fast or faster.
# ``SPECSERVE_CPU_GEMM=linear`` turns it off, ``=mm`` forces it on (bf16 too: not measured to pay).
CPU_MM_MAX_ROWS = 64


def cpu_mm_enabled(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether float32 CPU projections run as :func:`linear_rows`' ``W @ x.T`` (``SPECSERVE_CPU_GEMM`` = ``mm`` /
    ``linear``; default: on for float32 on CPU, the only case measured; bf16 CPU GEMMs keep nn.Linear's order)."""
    v = os.environ.get("SPECSERVE_CPU_GEMM", "").strip().lower()
    if v and v not in ("mm", "linear"):
        raise ValueError(f"SPECSERVE_CPU_GEMM must be 'mm' or 'linear', got {v!r}")
    if torch.device(device).type != "cpu" or v == "linear":
        return False
    return v == "mm" or dtype == torch.float32


def linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``weight @ x.T`` for 1..:data:`CPU_MM_MAX_ROWS` rows of a CPU
    tensor (one row padded to two: the BLAS's two-row GEMM reads the weight faster than its one-row product), else
    ``F.linear``. Same values up to the accumulation order."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type != "cpu" or not 0 < rows <= CPU_MM_MAX_ROWS or x.requires_grad or weight.requires_grad:
        return F.linear(x, weight, bias)
    x2 = x.reshape(rows, x.shape[-1])
    x2 = torch.cat([x2, x2]) if rows == 1 else x2.contiguous()
    y = torch.mm(weight, x2.t())[:, :rows].t()
    y = y.contiguous()
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], y.shape[-1])


class CpuRowsLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters, so checkpoints, tied weights and ``isinstance`` checks are unchanged) whose
    forward is :func:`linear_rows`. Installed by :func:`use_cpu_mm` on float32 CPU models."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_rows(x, self.weight, self.bias)


def use_cpu_mm(module: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` under ``module`` into a :class:`CpuRowsLinear` in place; returns how many."""
    n = 0
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = CpuRowsLinear
            n += 1
    return n


SPLIT_MAX_ROWS = 16  # split-K partials only for decode / verify steps of at most this many rows
# Session 12 on the H200, Qwen3-8B shape (benchmarks/results/h200-2026-12-03-s12/c4-split-gemm, c5-split-qkv): cuBLAS
# runs these one-row GEMMs with too few CTAs (o_proj: 64, ~60% of the DRAM rate); as 4-way batched GEMMs over K
# slices o_proj 13.1 -> 10.6 us, down 28.7 -> 25.9, qkv 16.1 -> 14.3 (and no split-K reduce kernels); plain decode
# step 4.85 -> 4.62 ms at batch 1, 5.18 -> 5.02 at 8; gate_up (97% of the DRAM rate already) gains nothing.
DEFAULT_SPLIT_GEMM = "qkv=4,o=4,down=4"
# Session 13 (h200-2026-12-03-s13/c1): the Triton split-K kernels (layers/triton_splitk.py) stream best at 8 splits
DEFAULT_SPLIT_GEMM_TRITON = "qkv=8,o=8,down=8"
# Per GPU (a substring of its name): the Triton splits where that GPU's own engine A/B found others faster. H100 SXM
# (session 46, benchmarks/results/h100-2026-12-07-s46, Qwen3-8B shape, with its 128:32:4:4 one-row qkv tile):
# qkv over 4 K slices, the plain step at batch 1 5.754 -> 5.724 ms, DFlash K=15 7.485 -> 7.379, EAGLE-3 K=7 10.963
# -> 10.872 (likely: the attention sums 4 qkv partials instead of 8 on its critical path; not profiled).
DEVICE_SPLIT_GEMM_TRITON = {"H100": "qkv=4,o=8,down=8"}
# Small targets (nn.Linear's layout): their 2-16-row steps (speculative verify, the DFlash drafter's block) take the
# Triton split-K kernels too, with fewer splits (a few-MB weight: K 576 / 1536 for SmolLM2-135M)
DEFAULT_SPLIT_GEMM_TRITON_NK = "qkv=3,o=3,down=4"


def triton_gemm_enabled(device: torch.device | str) -> bool:
    """Whether the split-K decode GEMMs run as the Triton kernels of :mod:`specserve.layers.triton_splitk`
    (``SPECSERVE_TRITON_GEMM`` = ``1``/``0``; default on for CUDA) instead of cuBLAS batched GEMMs
    (:meth:`TransposedLinear.partials`) + ``silu_mul``. Defined here (no Triton import): the runner asks on CPU
    installs without Triton too."""
    v = os.environ.get("SPECSERVE_TRITON_GEMM", "").strip()
    if v:
        if v not in ("0", "1"):
            raise ValueError(f"SPECSERVE_TRITON_GEMM must be 0 or 1, got {v!r}")
        return v == "1"
    return torch.device(device).type == "cuda"


def gpu_name(device: torch.device | str) -> str:
    """The CUDA device's name ("" for other devices, or where no GPU is visible)."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return ""
    return torch.cuda.get_device_name(dev.index if dev.index is not None else torch.cuda.current_device())


def gpu_family(device: torch.device | str, families: Iterable[str]) -> str | None:
    """The first of ``families`` (substrings of GPU names, e.g. "H100": the keys of a per-GPU table) in the CUDA
    device's name, if any."""
    name = gpu_name(device)
    return next((k for k in families if k in name), None)


def split_gemm_config(device: torch.device | str, layout: str, triton_gemm: bool = False) -> dict[str, int]:
    """Splits per projection (``qkv``, ``o``, ``down``) for the split-K decode GEMMs: on transposed weights those of
    :meth:`TransposedLinear.partials` or, when ``triton_gemm``, of the Triton kernels; on nn.Linear's layout
    (``nk``) only with ``triton_gemm``. ``SPECSERVE_SPLIT_GEMM`` = ``qkv=S,o=S,down=S`` (``0``: none; with
    ``triton_gemm`` also ``gate_up=S``: the Triton gate_up + SiLU-mul over S K slices); default
    :data:`DEFAULT_SPLIT_GEMM` (Triton: :data:`DEFAULT_SPLIT_GEMM_TRITON` or the GPU's own entry of
    :data:`DEVICE_SPLIT_GEMM_TRITON`, nk: :data:`DEFAULT_SPLIT_GEMM_TRITON_NK`) on CUDA, none elsewhere (measured on
    H200 / H100 GPUs only). A split of 1 keeps the projection in the Triton kernel
    (one partial) where ``triton_gemm``; without it, out of the split path."""
    if layout == "nk" and not triton_gemm:
        return {}
    raw = os.environ.get("SPECSERVE_SPLIT_GEMM")
    if raw is None:
        if triton_gemm and layout == "kn":
            family = gpu_family(device, DEVICE_SPLIT_GEMM_TRITON)
            default = DEVICE_SPLIT_GEMM_TRITON[family] if family else DEFAULT_SPLIT_GEMM_TRITON
        elif triton_gemm:
            default = DEFAULT_SPLIT_GEMM_TRITON_NK
        else:
            default = DEFAULT_SPLIT_GEMM
        raw = default if torch.device(device).type == "cuda" else ""
    raw = raw.strip()
    out: dict[str, int] = {}
    if raw in ("", "0") or layout not in ("kn", "nk"):
        return out
    for part in raw.split(","):
        name, _, val = part.strip().partition("=")
        if name not in ("qkv", "o", "down", "gate_up") or not val.isdigit() or int(val) < 1:
            raise ValueError(
                f"SPECSERVE_SPLIT_GEMM: expected qkv=S,o=S,down=S[,gate_up=S] (S >= 1), got {raw!r}"
            )
        if name == "gate_up" and not triton_gemm:  # only the Triton gate_up + SiLU-mul splits
            continue
        if int(val) > 1 or triton_gemm:
            out[name] = int(val)
    return out


def transpose_decoder_linears(layers: Iterable[nn.Module]) -> int:
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
