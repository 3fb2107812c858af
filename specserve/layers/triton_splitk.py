"""Triton split-K GEMMs for decode / verify steps, launched with programmatic dependent launch (issue #6, sessions
13-14).

At a decode step of a large target (hidden >= 2048, weights stored [K, N], :mod:`specserve.layers.linear`) every
projection reads megabytes of weights for a few rows of activations, and between the GEMMs sit small kernels
(add + RMSNorm, ``rope_store``, attention, the merge of its splits) whose launch and ramp leave the DRAM idle. Two
things here attack that gap:

* **PDL** (``SPECSERVE_PDL``, :func:`~specserve.layers.triton_fused.pdl_enabled`): our Triton kernels (these GEMMs
  and the small ones) are launched with the programmatic stream serialization attribute; each waits for its
  predecessor inside the kernel (``griddepcontrol.wait``) before touching any activation, then lets its successor
  launch (``griddepcontrol.launch_dependents``), so the next kernel's CTAs are resident when the current one ends.
  Kernels captured in a CUDA graph keep these programmatic edges. (Streaming the first weight rows into L2 before
  the wait, and letting the small kernels release their successor before their own wait, measured slower: session
  13, benchmarks/README.md.) Two settings for sweeps, off by default: ``GemmTile.pre`` (the tile's fifth field)
  reads each program's first ``pre`` weight rows into registers before the wait, and ``SPECSERVE_PDL_EARLY``
  (:func:`~specserve.layers.triton_fused.pdl_launch`) lets the tagged small kernels release the GEMM after them
  early, so that read overlaps them. Session 15 (Qwen3-8B shape, H200): ``pre`` 64-128 at one row -0.03 ms of a
  4.53 ms step (within 1%), larger ``pre`` and the early releases slower (up to +0.4 ms) except the attention
  merge's at batch 1 (-0.02 ms, +0.25 ms at batch 8): the register file holds ~2 us of the weight stream, not the
  ~18 us of small kernels a layer has.
* **One kernel per projection, no reduce kernel**: :func:`splitk_partials` writes S fp32 partial products over K
  slices, like :meth:`TransposedLinear.partials` (the consumer kernel sums them); :func:`gate_up_silu` computes the
  gate and up columns of the same outputs in one program and writes ``silu(gate) * up`` (no ``silu_mul`` kernel;
  the engine uses it from :data:`GATE_UP_MIN_ROWS` rows). One row runs on the CUDA cores (a [BLOCK_K, BLOCK_N]
  weight tile against a broadcast row); 2-16 rows on the tensor cores (``tl.dot`` with the rows padded to 16).

Weights: a large target's transposed [K, N] ``weight_t`` (TransposedLinear), or a small target's nn.Linear weight
passed as the view ``weight.t()`` (K contiguous; :func:`layout_of`, own default tiles). Small targets run their
2-16-row steps here (speculative verify, the DFlash drafter's block, batched decode); their one-row decode stays on
the six-kernel GEMV layer (:mod:`specserve.layers.triton_gemv`). A DFlash drafter's layers take the target's splits
and kernels where their shapes fit the tiles (``spec/drafter_utils.py`` ``drafter_split_gemm``).

Measured on the H200 (session 13, Qwen3-8B shape, benchmarks/README.md): per GEMM at one row within -1..-5% of
cuBLAS's 4-way batched GEMMs (gate_up + SiLU-mul 7% slower: not used there; at 16 rows 5% faster); a plain decode
step 4.622 -> 4.590 ms at batch 1 and 5.042 -> 4.935 at batch 8 with PDL, where cuBLAS with PDL on the small kernels
alone gained nothing. Session 14, SmolLM2-135M shape (random weights, cuBLAS -> these kernels on nn.Linear's
weights): DFlash K=15 step 1.287 -> 1.094-1.122 ms at batch 1, plain decode 0.985 / 1.001 / 1.200 -> 0.803 / 0.826 /
1.035 ms at batch 2 / 4 / 8, EAGLE-3 K=7 2.351 -> 2.192; real weights, chat: DFlash K=15 1155 -> 1420 tok/s.

Numerics: fp32 accumulation; the gate/up outputs are rounded to the model dtype before the SiLU and the product
rounds as the eager ``silu_mul`` does, so results equal the cuBLAS path's up to the accumulation order. The kernel
runs under ``TRITON_INTERPRET=1`` on CPU tensors (without PDL), which is how the tests check it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specserve.layers.triton_fused import _mode, _pdl_wait, _round, pdl_launch

__all__ = [
    "GemmTile",
    "fits",
    "gate_up_min_rows",
    "gate_up_silu",
    "layout_of",
    "splitk_partials",
    "tile_for",
]

# gate_up + SiLU-mul as one Triton kernel from this many rows: at one row cuBLAS's GEMM + silu_mul is faster
# (Qwen3-8B shape, H200, session 13: 49.1 vs 52.5 us; at 16 rows 50.1 vs 47.7)
GATE_UP_MIN_ROWS = 2
MAX_ROWS = 16  # rows the tensor-core tile covers (padded); more rows take the cuBLAS path


def gate_up_min_rows() -> int:
    """Rows from which gate_up + SiLU-mul runs as one Triton kernel: :data:`GATE_UP_MIN_ROWS`, or
    ``SPECSERVE_TRITON_GATE_UP_MIN_ROWS`` (read per call, i.e. per graph capture; 1 puts one-row decode on it)."""
    raw = os.environ.get("SPECSERVE_TRITON_GATE_UP_MIN_ROWS", "").strip()
    if not raw:
        return GATE_UP_MIN_ROWS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"SPECSERVE_TRITON_GATE_UP_MIN_ROWS must be a positive integer, got {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class GemmTile:
    block_n: int
    block_k: int
    stages: int
    warps: int
    # K rows of each program's slice read before the PDL wait (0, or a power of 2 multiple of block_k)
    pre: int = 0


# One row (CUDA cores) / 2-16 rows (tensor cores): the fastest tiles of the Qwen3-8B projections on the H200 at
# 8-way splits (session 13, benchmarks/results/h200-2026-12-03-s13/c1: benchmarks/triton_gemm.py).
_DEFAULT_TILES = {
    ("qkv", 1): GemmTile(256, 32, 4, 4),
    ("o", 1): GemmTile(128, 32, 4, 4),
    ("down", 1): GemmTile(128, 32, 4, 4),
    ("gate_up", 1): GemmTile(128, 32, 4, 4),
    ("qkv", 16): GemmTile(128, 64, 3, 4),
    ("o", 16): GemmTile(128, 64, 3, 4),
    ("down", 16): GemmTile(128, 64, 3, 4),
    ("gate_up", 16): GemmTile(64, 64, 4, 4),
}
# Small targets keep nn.Linear's [N, K] weights (layers/linear.py ``weight_layout``; the kernel reads them through
# ``weight.t()``); their projections are a few MB (SmolLM2-135M: K 576 / 1536, N 576-1536), so the tiles are small
# and the grids short. 2-16 rows: the best of an in-engine sweep of the SmolLM2-135M DFlash K=15 step (session 14,
# benchmarks/results/h200-2026-12-03-s14/c1: 64:64:3:4 with 3 / 3 / 4 splits, gate_up 32 columns wide). One row
# takes the six-kernel GEMV layer there (layers/triton_gemv.py): the ``1`` entries only run with it off.
_DEFAULT_TILES_NK = {
    ("qkv", 1): GemmTile(64, 64, 2, 4),
    ("o", 1): GemmTile(64, 64, 2, 4),
    ("down", 1): GemmTile(64, 64, 2, 4),
    ("gate_up", 1): GemmTile(64, 64, 2, 4),
    ("qkv", 16): GemmTile(64, 64, 3, 4),
    ("o", 16): GemmTile(64, 64, 3, 4),
    ("down", 16): GemmTile(64, 64, 3, 4),
    ("gate_up", 16): GemmTile(32, 64, 3, 4),
}
_NAMES = ("qkv", "o", "gate_up", "down")


def tile_for(name: str, rows: int, layout: str = "kn") -> GemmTile:
    """The tile of projection ``name`` (qkv, o, gate_up, down) at ``rows`` rows for weights stored ``layout``
    (``kn``: [K, N], ``nk``: nn.Linear's [N, K]); ``SPECSERVE_TRITON_GEMM_TILES`` overrides entries:
    ``name@R=BN:BK:stages:warps[:pre],...`` with R = 1 or 16 (the row class), ``name@Rnk=...`` for the nk layout;
    ``pre``: the K rows of its slice each program loads before it waits for its predecessor (a power of 2, a
    multiple of BK)."""
    if layout not in ("kn", "nk"):
        raise ValueError(f"layout must be 'kn' or 'nk', got {layout!r}")
    cls = 1 if rows <= 1 else 16
    raw = os.environ.get("SPECSERVE_TRITON_GEMM_TILES", "").strip()
    if raw:
        for part in raw.split(","):
            key, _, val = part.strip().partition("=")
            nm, _, r = key.partition("@")
            lay = "nk" if r.endswith("nk") else "kn"
            r = r.removesuffix("nk")
            vals = val.split(":")
            if (
                nm not in _NAMES
                or r not in ("1", "16")
                or len(vals) not in (4, 5)
                or not all(v.isdigit() for v in vals)
                or (len(vals) == 5 and int(vals[4]) & (int(vals[4]) - 1))
            ):
                raise ValueError(
                    "SPECSERVE_TRITON_GEMM_TILES: expected name@R[nk]=BN:BK:stages:warps[:pre] (pre a power of 2 "
                    f"or 0), got {part!r}"
                )
            if nm == name and int(r) == cls and lay == layout:
                return GemmTile(*(int(v) for v in vals))
    return (_DEFAULT_TILES if layout == "kn" else _DEFAULT_TILES_NK)[(name, cls)]


def layout_of(weight_t: torch.Tensor) -> str:
    """``kn`` for a [K, N] weight stored row-major (TransposedLinear), ``nk`` for nn.Linear's weight viewed as
    ``weight.t()``."""
    return "kn" if weight_t.stride(-1) == 1 else "nk"


@triton.jit
def _mac(acc, x, w, USE_DOT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc += x [BLOCK_M, k] @ w [k, BLOCK_N]: tensor cores (rows padded to 16) or a broadcast row (one row)."""
    if USE_DOT:
        if UPCAST:  # the interpreter has no bf16 arithmetic; bf16 products are exact in fp32
            return tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(x, w, acc, input_precision=PRECISION)
    return acc + tl.sum(x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1)


@triton.jit
def _splitk_gemm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    stride_xm,
    stride_wk,
    stride_wn,
    stride_os,
    stride_om,
    N: tl.constexpr,
    K_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRE_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    GATE_UP: tl.constexpr,
    MODE: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (n block, k split): acc = x[:, slice] @ w[slice, n block]. GATE_UP: w holds [gate | up] (2N columns)
    and the program also accumulates the up columns, storing round(silu(round(g)) * round(u)); else acc is stored
    as fp32 partial ``pid_s``."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    k_begin = pid_s * K_SPLIT
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PRE_K > 0:  # the first PRE_K weight rows of the slice into registers while the predecessor still runs
        offs_p = k_begin + tl.arange(0, PRE_K)
        wp_ptrs = w_ptr + offs_p[:, None].to(tl.int64) * stride_wk + offs_n[None, :].to(tl.int64) * stride_wn
        wp = tl.load(wp_ptrs)
        if GATE_UP:
            wpu = tl.load(wp_ptrs + N * stride_wn)
        _pdl_wait(PDL)
        xp = tl.load(x_rows + offs_p[None, :], mask=mask_m[:, None], other=0.0)
        acc = _mac(acc, xp, wp, USE_DOT, PRECISION, UPCAST)
        if GATE_UP:
            acc_u = _mac(acc_u, xp, wpu, USE_DOT, PRECISION, UPCAST)
    else:
        _pdl_wait(PDL)
    for k0 in tl.range(k_begin + PRE_K, k_begin + K_SPLIT, BLOCK_K, num_stages=NUM_STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None], other=0.0)
        w_ptrs = w_ptr + offs_k[:, None].to(tl.int64) * stride_wk + offs_n[None, :].to(tl.int64) * stride_wn
        w = tl.load(w_ptrs)
        acc = _mac(acc, x, w, USE_DOT, PRECISION, UPCAST)
        if GATE_UP:
            wu = tl.load(w_ptrs + N * stride_wn)
            acc_u = _mac(acc_u, x, wu, USE_DOT, PRECISION, UPCAST)
    if GATE_UP:  # the GEMM's outputs in the model dtype, then F.silu(gate) * up as silu_mul rounds it
        g = _round(acc, MODE)
        u = _round(acc_u, MODE)
        s = _round(g / (1.0 + tl.exp(-g)), MODE)
        y = _round(s * u, MODE)
        o_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask_m[:, None])
    else:
        o_ptrs = out_ptr + pid_s * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(o_ptrs, acc, mask=mask_m[:, None])


def _launch(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    out: torch.Tensor,
    n: int,
    splits: int,
    tile: GemmTile,
    gate_up: bool,
) -> None:
    m, k = x.shape
    if not _tile_fits(k, n, splits, tile):
        raise ValueError(
            f"Triton GEMM: K={k} must split {splits} ways into multiples of {tile.block_k} (of at least "
            f"{tile.pre} rows) and N={n} be a multiple of {tile.block_n}"
        )
    k_split = k // splits
    use_dot = m > 1
    pdl, pdl_kw = pdl_launch(x.device)
    _splitk_gemm_kernel[(n // tile.block_n, splits)](
        x,
        weight_t,
        out,
        m,
        x.stride(0),
        weight_t.stride(0),
        weight_t.stride(1),
        out.stride(0) if not gate_up else 0,
        out.stride(-2),
        N=n,
        K_SPLIT=k_split,
        BLOCK_M=16 if use_dot else 1,
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        PRE_K=tile.pre,
        NUM_STAGES=tile.stages,
        USE_DOT=use_dot,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST=x.device.type == "cpu" and x.dtype != torch.float32,
        GATE_UP=gate_up,
        MODE=_mode(x.dtype),
        PDL=pdl,
        num_warps=tile.warps,
        **pdl_kw,
    )


def fits(name: str, k: int, n: int, splits: int, layout: str = "kn") -> bool:
    """Whether a [K, N] projection stored ``layout`` split ``splits`` ways fits the tiles of ``name`` at every row
    count."""
    return all(_tile_fits(k, n, splits, tile_for(name, rows, layout)) for rows in (1, MAX_ROWS))


def _tile_fits(k: int, n: int, splits: int, tile: GemmTile) -> bool:
    return (
        k % splits == 0
        and (k // splits) % tile.block_k == 0
        and n % tile.block_n == 0
        and tile.pre % tile.block_k == 0
        and tile.pre <= k // splits
    )


def _check(x: torch.Tensor, weight_t: torch.Tensor) -> None:
    if x.dim() != 2 or weight_t.dim() != 2 or x.shape[1] != weight_t.shape[0]:
        raise ValueError(
            f"Triton GEMM: x [M, K] and weight_t [K, N] expected; got {tuple(x.shape)}, {tuple(weight_t.shape)}"
        )
    if x.stride(1) != 1 or 1 not in weight_t.stride():
        raise ValueError(
            "Triton GEMM: x must be contiguous in its last dimension and weight_t [K, N] in one of its two "
            "(a TransposedLinear's weight_t, or an nn.Linear's weight.t())"
        )
    if x.dtype != weight_t.dtype:
        raise ValueError(f"Triton GEMM: x and weight_t must share a dtype; got {x.dtype}, {weight_t.dtype}")
    if not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"Triton GEMM: 1-{MAX_ROWS} rows, got {x.shape[0]}")


def splitk_partials(x: torch.Tensor, weight_t: torch.Tensor, splits: int, name: str) -> torch.Tensor:
    """``x`` [M, K] @ ``weight_t`` [K, N] as ``splits`` fp32 partials [S, M, N] over equal K slices (their sum,
    rounded to x's dtype, is the product up to the accumulation order); ``name`` picks the tile (:func:`tile_for`,
    by the weight's layout: a TransposedLinear's ``weight_t`` or an nn.Linear's ``weight.t()``)."""
    _check(x, weight_t)
    n = weight_t.shape[1]
    out = torch.empty((splits, x.shape[0], n), dtype=torch.float32, device=x.device)
    _launch(x, weight_t, out, n, splits, tile_for(name, x.shape[0], layout_of(weight_t)), gate_up=False)
    return out


def gate_up_silu(x: torch.Tensor, weight_t: torch.Tensor, intermediate: int) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate, up = (x @ weight_t).split(intermediate, -1)`` in one kernel: [M, I] in x's
    dtype (the fused gate_up GEMM followed by ``silu_mul``, up to the accumulation order)."""
    _check(x, weight_t)
    if weight_t.shape[1] != 2 * intermediate:
        raise ValueError(f"gate_up weight must be [K, {2 * intermediate}]; got {tuple(weight_t.shape)}")
    out = torch.empty((x.shape[0], intermediate), dtype=x.dtype, device=x.device)
    tile = tile_for("gate_up", x.shape[0], layout_of(weight_t))
    _launch(x, weight_t, out, intermediate, 1, tile, gate_up=True)
    return out
