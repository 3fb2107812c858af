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
  the engine uses it from :data:`GATE_UP_MIN_ROWS` rows); split over K slices too (``gate_up=S`` in
  ``SPECSERVE_SPLIT_GEMM``), the last program of each column block to finish sums the fp32 partials in split order
  (an arrival counter, as :func:`splitk_add`) before the SiLU-mul: a one-row step's I / BLOCK_N programs alone
  leave SMs idle (session 29). One row runs on the CUDA cores (a [BLOCK_K, BLOCK_N]
  weight tile against a broadcast row); 2-16 rows on the tensor cores (``tl.dot`` with the rows padded to 16).

Two more forms fold the add + RMSNorms in (session 19, ``SPECSERVE_FUSED_NORM``, models/llama.py): :func:`splitk_add`
ends o_proj / down_proj with the residual add (the last program of each output block to arrive, by an int32 arrival
counter, sums the partials, adds the residual and writes the block's sums of squares), and a :class:`NormIn` prologue
lets qkv / gate_up normalise their input from those sums. H200, Qwen3-8B shape: the epilogue saves ~1.5% of a one-row
decode step (on by default there) and costs at 16 rows; the prologue measured slower (benchmarks/README.md).

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

import functools
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specserve.layers.linear import gpu_family
from specserve.layers.triton_fused import _mode, _pdl_wait, _round, pdl_launch

__all__ = [
    "GemmTile",
    "fits",
    "gate_up_min_rows",
    "AddOut",
    "NormIn",
    "gate_up_silu",
    "layout_of",
    "splitk_add",
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
# Per GPU (a substring of its name): the entries where that GPU's own sweep found other tiles faster, used where
# they fit the shape. H100 SXM (session 29, benchmarks/results/h100-2026-12-05-s29: triton_gemm.py --lean on the
# Qwen3-8B shape, then the engine A/B): gate_up at 16 rows 68.2 vs 71.4 us (the DFlash K=15 step 7.84 -> 7.72 ms),
# qkv at one row 18.9 vs 19.7 us (the decode step 5.90 -> 5.89). Session 46 (h100-2026-12-07-s46): qkv at one row
# over 4 K slices (linear.py ``DEVICE_SPLIT_GEMM_TRITON``) with 128:32:4:4, 18.69 us (512:32:3:8 there: 23.22); the
# decode step 5.754 -> 5.724 ms, DFlash K=15 7.485 -> 7.379. Session 47 (h100-2026-12-07-s47): that tile reads its
# first BLOCK_K weight rows before the PDL wait (``pre`` 32, the same summation order: outputs bit-equal), while the
# norm kernel before it runs: qkv's advance of the step's chain 18.12 -> 17.44 us a layer (pre 64), the step
# 5.731-5.735 -> 5.718-5.719 ms on one H100, within the spread on another (5.727-5.730 -> 5.724-5.728); pre 64 the
# same time with other tokens, o_proj and down_proj nothing gained from it.
_DEVICE_TILES = {
    "H100": {
        ("qkv", 1): GemmTile(128, 32, 4, 4, 32),
        ("gate_up", 16): GemmTile(128, 64, 3, 4),
    },
}
_NAMES = ("qkv", "o", "gate_up", "down")


@functools.lru_cache(maxsize=8)
def _device_family(index: int) -> str | None:
    """The :data:`_DEVICE_TILES` key whose name is part of CUDA device ``index``'s name, if any."""
    return gpu_family(torch.device("cuda", index), _DEVICE_TILES)


def tile_for(
    name: str,
    rows: int,
    layout: str = "kn",
    device: torch.device | None = None,
    shape: tuple[int, int, int] | None = None,
) -> GemmTile:
    """The tile of projection ``name`` (qkv, o, gate_up, down) at ``rows`` rows for weights stored ``layout``
    (``kn``: [K, N], ``nk``: nn.Linear's [N, K]); ``SPECSERVE_TRITON_GEMM_TILES`` overrides entries:
    ``name@R=BN:BK:stages:warps[:pre],...`` with R = 1 or 16 (the row class), ``name@Rnk=...`` for the nk layout;
    ``pre``: the K rows of its slice each program loads before it waits for its predecessor (a power of 2, a
    multiple of BK). On a CUDA ``device`` the GPU's own entries (:data:`_DEVICE_TILES`, ``kn``) come next, where
    they fit ``shape`` = (K, N, splits) (without a shape: always)."""
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
    if device is not None and device.type == "cuda" and layout == "kn":
        family = _device_family(device.index if device.index is not None else torch.cuda.current_device())
        tile = _DEVICE_TILES.get(family or "", {}).get((name, cls))
        if tile is not None and (shape is None or _tile_fits(*shape, tile)):
            return tile
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
def _rstd(ssq_ptr, offs_m, mask_m, stride_qm, eps, K_TOTAL: tl.constexpr, NB_IN: tl.constexpr,
          NB_IN_BLOCK: tl.constexpr):  # fmt: skip
    """1 / rms of each row from the ``NB_IN`` block sums of squares the producing GEMM's epilogue wrote."""
    offs_b = tl.arange(0, NB_IN_BLOCK)
    parts = tl.load(
        ssq_ptr + offs_m[:, None] * stride_qm + offs_b[None, :],
        mask=mask_m[:, None] & (offs_b[None, :] < NB_IN),
        other=0.0,
    )
    return tl.math.rsqrt(tl.sum(parts, axis=1) / K_TOTAL + eps)


@triton.jit
def _norm_prologue(
    x_ptr,
    scratch_ptr,
    ssq_ptr,
    norm_ptr,
    eps,
    offs_m,
    mask_m,
    k_begin,
    stride_xm,
    stride_sm,
    stride_qm,
    K_SPLIT: tl.constexpr,
    K_TOTAL: tl.constexpr,
    NB_IN: tl.constexpr,
    NB_IN_BLOCK: tl.constexpr,
    PRO_K: tl.constexpr,
    MODE: tl.constexpr,
):
    """RMSNorm of the residual-stream rows ``x`` [M, K] over this program's K slice, into ``scratch`` [M, K]: the
    row's sum of squares is the sum of the ``NB_IN`` block sums the producing GEMM's epilogue wrote (``ssq``), then
    ``round(w * round(x * rsqrt(ssq / K + eps)))`` as ``_rms_norm_kernel`` rounds it. Every program of the slice
    writes the same values (programs of one K slice differ only in their N block), and a CTA barrier orders this
    program's stores before its own loads of them in the GEMM loop."""
    rstd = _rstd(ssq_ptr, offs_m, mask_m, stride_qm, eps, K_TOTAL, NB_IN, NB_IN_BLOCK)
    # wide chunks (the whole slice at one row): few L2 round trips before the GEMM loop starts
    for k0 in tl.static_range(0, K_SPLIT, PRO_K):
        offs_k = k_begin + k0 + tl.arange(0, PRO_K)
        h = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
            mask=mask_m[:, None],
            other=0.0,
        )
        w = tl.load(norm_ptr + offs_k).to(tl.float32)
        y = _round(w[None, :] * _round(h.to(tl.float32) * rstd[:, None], MODE), MODE)
        tl.store(
            scratch_ptr + offs_m[:, None].to(tl.int64) * stride_sm + offs_k[None, :],
            y.to(scratch_ptr.dtype.element_ty),
            mask=mask_m[:, None],
        )
    tl.debug_barrier()


@triton.jit
def _add_epilogue(
    acc,
    out_ptr,
    res_ptr,
    res_out_ptr,
    ssq_out_ptr,
    counter_ptr,
    offs_m,
    mask_m,
    offs_n,
    pid_n,
    stride_os,
    stride_om,
    stride_rm,
    stride_ro,
    stride_qo,
    SPLITS: tl.constexpr,
    MODE: tl.constexpr,
):
    """After the program stored its partial: the last program of this N block to arrive (an int32 arrival counter,
    acq_rel after a CTA barrier, reset to 0 for the next launch) sums the ``SPLITS`` partials in split order,
    rounds them as the GEMM output, adds the residual (``h = h + x`` in the model dtype), stores h and the block's
    sum of squares of h per row (the next GEMM's RMSNorm prologue adds the blocks in a fixed order: no atomics on
    values, so results are deterministic)."""
    if SPLITS == 1:
        _finish_add(acc, res_ptr, res_out_ptr, ssq_out_ptr, offs_m, mask_m, offs_n, pid_n, stride_rm, stride_ro,
                    stride_qo, MODE)  # fmt: skip
    else:
        tl.debug_barrier()  # every thread's partial stores before the (gpu-scope) release of the atomic
        cnt = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel")
        if cnt == SPLITS - 1:
            tl.atomic_xchg(counter_ptr + pid_n, 0, sem="relaxed")
            p_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
            x = tl.load(p_ptrs, mask=mask_m[:, None], other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SPLITS):
                x += tl.load(p_ptrs + s * stride_os, mask=mask_m[:, None], other=0.0, cache_modifier=".cg")
            _finish_add(x, res_ptr, res_out_ptr, ssq_out_ptr, offs_m, mask_m, offs_n, pid_n, stride_rm, stride_ro,
                        stride_qo, MODE)  # fmt: skip


@triton.jit
def _finish_add(x, res_ptr, res_out_ptr, ssq_out_ptr, offs_m, mask_m, offs_n, pid_n, stride_rm, stride_ro, stride_qo,
                MODE: tl.constexpr):  # fmt: skip
    x = _round(x, MODE)  # the GEMM output in the model dtype
    r = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask_m[:, None], other=0.0)
    h = _round(x + r.to(tl.float32), MODE)  # h = h + x in the model dtype
    tl.store(
        res_out_ptr + offs_m[:, None] * stride_ro + offs_n[None, :],
        h.to(res_out_ptr.dtype.element_ty),
        mask=mask_m[:, None],
    )
    tl.store(ssq_out_ptr + offs_m * stride_qo + pid_n, tl.sum(h * h, axis=1), mask=mask_m)


@triton.jit
def _finish_gate_up(acc, acc_u, out_ptr, offs_m, mask_m, offs_n, stride_om, MODE: tl.constexpr):
    """The gate / up GEMM outputs in the model dtype, then F.silu(gate) * up as ``silu_mul`` rounds it."""
    g = _round(acc, MODE)
    u = _round(acc_u, MODE)
    s = _round(g / (1.0 + tl.exp(-g)), MODE)
    y = _round(s * u, MODE)
    o_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask_m[:, None])


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
    scratch_ptr,
    ssq_ptr,
    norm_ptr,
    eps,
    stride_sm,
    stride_qm,
    res_ptr,
    res_out_ptr,
    ssq_out_ptr,
    counter_ptr,
    stride_rm,
    stride_ro,
    stride_qo,
    part_ptr,
    stride_ps,
    stride_pm,
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
    NORM_IN: tl.constexpr = False,
    PRO_K: tl.constexpr = 16,
    K_TOTAL: tl.constexpr = 1,
    NB_IN: tl.constexpr = 1,
    NB_IN_BLOCK: tl.constexpr = 1,
    EPI_ADD: tl.constexpr = False,
    SPLITS: tl.constexpr = 1,
):
    """Program (n block, k split): acc = x[:, slice] @ w[slice, n block]. GATE_UP: w holds [gate | up] (2N columns)
    and the program also accumulates the up columns, storing round(silu(round(g)) * round(u)) (with SPLITS > 1:
    the last program of the N block to arrive does, from the fp32 partials in ``part``); else acc is stored as fp32
    partial ``pid_s``. NORM_IN: x is the residual stream and the GEMM's input its RMSNorm
    (:func:`_norm_prologue`, written to ``scratch`` first); EPI_ADD: the last program of each N block also stores
    residual + the product and its per-row sums of squares (:func:`_add_epilogue`)."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    k_begin = pid_s * K_SPLIT
    if NORM_IN:
        x_rows = scratch_ptr + offs_m[:, None].to(tl.int64) * stride_sm
    else:
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
        if NORM_IN:
            _norm_prologue(x_ptr, scratch_ptr, ssq_ptr, norm_ptr, eps, offs_m, mask_m, k_begin, stride_xm,
                           stride_sm, stride_qm, K_SPLIT, K_TOTAL, NB_IN, NB_IN_BLOCK, PRO_K, MODE)  # fmt: skip
        xp = tl.load(x_rows + offs_p[None, :], mask=mask_m[:, None], other=0.0)
        acc = _mac(acc, xp, wp, USE_DOT, PRECISION, UPCAST)
        if GATE_UP:
            acc_u = _mac(acc_u, xp, wpu, USE_DOT, PRECISION, UPCAST)
    else:
        _pdl_wait(PDL)
        if NORM_IN:
            _norm_prologue(x_ptr, scratch_ptr, ssq_ptr, norm_ptr, eps, offs_m, mask_m, k_begin, stride_xm,
                           stride_sm, stride_qm, K_SPLIT, K_TOTAL, NB_IN, NB_IN_BLOCK, PRO_K, MODE)  # fmt: skip
    for k0 in tl.range(k_begin + PRE_K, k_begin + K_SPLIT, BLOCK_K, num_stages=NUM_STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None], other=0.0)
        w_ptrs = w_ptr + offs_k[:, None].to(tl.int64) * stride_wk + offs_n[None, :].to(tl.int64) * stride_wn
        w = tl.load(w_ptrs)
        acc = _mac(acc, x, w, USE_DOT, PRECISION, UPCAST)
        if GATE_UP:
            wu = tl.load(w_ptrs + N * stride_wn)
            acc_u = _mac(acc_u, x, wu, USE_DOT, PRECISION, UPCAST)
    if GATE_UP:
        if SPLITS == 1:
            _finish_gate_up(acc, acc_u, out_ptr, offs_m, mask_m, offs_n, stride_om, MODE)
        else:  # fp32 partials [S, M, 2N]; the last program of this N block to arrive sums them in split order
            p_ptrs = part_ptr + offs_m[:, None] * stride_pm + offs_n[None, :]
            tl.store(p_ptrs + pid_s * stride_ps, acc, mask=mask_m[:, None])
            tl.store(p_ptrs + pid_s * stride_ps + N, acc_u, mask=mask_m[:, None])
            tl.debug_barrier()  # every thread's partial stores before the (gpu-scope) release of the atomic
            cnt = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel")
            if cnt == SPLITS - 1:
                tl.atomic_xchg(counter_ptr + pid_n, 0, sem="relaxed")
                g = tl.load(p_ptrs, mask=mask_m[:, None], other=0.0, cache_modifier=".cg")
                u = tl.load(p_ptrs + N, mask=mask_m[:, None], other=0.0, cache_modifier=".cg")
                for si in tl.static_range(1, SPLITS):
                    g += tl.load(
                        p_ptrs + si * stride_ps, mask=mask_m[:, None], other=0.0, cache_modifier=".cg"
                    )
                    u += tl.load(
                        p_ptrs + si * stride_ps + N, mask=mask_m[:, None], other=0.0, cache_modifier=".cg"
                    )
                _finish_gate_up(g, u, out_ptr, offs_m, mask_m, offs_n, stride_om, MODE)
    else:
        o_ptrs = out_ptr + pid_s * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(o_ptrs, acc, mask=mask_m[:, None])
        if EPI_ADD:
            _add_epilogue(acc, out_ptr, res_ptr, res_out_ptr, ssq_out_ptr, counter_ptr, offs_m, mask_m, offs_n,
                          pid_n, stride_os, stride_om, stride_rm, stride_ro, stride_qo, SPLITS, MODE)  # fmt: skip


class NormIn(NamedTuple):
    """The RMSNorm a GEMM applies to its input rows (the residual stream) in its prologue: ``ssq`` [M, NB] fp32,
    the per-block sums of squares of the rows that :func:`splitk_add` wrote beside them, and the norm's
    ``weight`` [K] (the rows' dtype) and ``eps``."""

    ssq: torch.Tensor
    weight: torch.Tensor
    eps: float


class AddOut(NamedTuple):
    """:func:`splitk_add`'s result: ``h`` = residual + x @ W [M, N] (the model dtype) and ``ssq`` [M, N / BLOCK_N]
    fp32, the sums of squares of h per row and N block (what a following :class:`NormIn` takes)."""

    h: torch.Tensor
    ssq: torch.Tensor


def _launch(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    out: torch.Tensor,
    n: int,
    splits: int,
    tile: GemmTile,
    gate_up: bool,
    norm: NormIn | None = None,
    add: tuple[torch.Tensor, AddOut] | None = None,
) -> None:
    """``norm``: the RMSNorm prologue; ``add``: (residual, outputs) of the residual-add epilogue; ``gate_up`` with
    ``splits`` > 1: the SiLU-mul after the last program of each N block sums the partials."""
    m, k = x.shape
    if not _tile_fits(k, n, splits, tile):
        raise ValueError(
            f"Triton GEMM: K={k} must split {splits} ways into multiples of {tile.block_k} (of at least "
            f"{tile.pre} rows) and N={n} be a multiple of {tile.block_n}"
        )
    k_split = k // splits
    use_dot = m > 1  # one row on the CUDA cores (the tensor-core form measured slower there: session 19)
    scratch = ssq = norm_w = res = res_out = ssq_out = counters = x  # unused pointer arguments
    eps, nb_in, stride_sm, stride_qm, stride_rm, stride_ro, stride_qo = 0.0, 1, 0, 0, 0, 0, 0
    if norm is not None:
        ssq, norm_w, eps, nb_in = norm.ssq, norm.weight, float(norm.eps), norm.ssq.shape[1]
        scratch = torch.empty_like(x, memory_format=torch.contiguous_format)
        stride_sm, stride_qm = scratch.stride(0), ssq.stride(0)
    if add is not None:
        res, outs = add
        res_out, ssq_out = outs
        counters = _arrival_counters(x.device, n // tile.block_n)
        stride_rm, stride_ro, stride_qo = res.stride(0), res_out.stride(0), ssq_out.stride(0)
    part, stride_ps, stride_pm = x, 0, 0  # (unused)
    if gate_up and splits > 1:
        part = torch.empty((splits, m, 2 * n), dtype=torch.float32, device=x.device)
        stride_ps, stride_pm = part.stride(0), part.stride(1)
        counters = _arrival_counters(x.device, n // tile.block_n)
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
        scratch,
        ssq,
        norm_w,
        eps,
        stride_sm,
        stride_qm,
        res,
        res_out,
        ssq_out,
        counters,
        stride_rm,
        stride_ro,
        stride_qo,
        part,
        stride_ps,
        stride_pm,
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
        NORM_IN=norm is not None,
        PRO_K=_prologue_chunk(k_split, 4096 // (16 if use_dot else 1)),
        K_TOTAL=k,
        NB_IN=nb_in,
        NB_IN_BLOCK=triton.next_power_of_2(nb_in),
        EPI_ADD=add is not None,
        SPLITS=splits,
        num_warps=tile.warps,
        **pdl_kw,
    )


def _prologue_chunk(k_split: int, cap: int) -> int:
    """The norm prologue's chunk: the largest power of 2 dividing ``k_split`` and at most ``cap`` elements a row
    (the whole slice of a one-row step in one load)."""
    chunk = k_split & -k_split  # largest power-of-2 divisor
    while chunk > cap:
        chunk //= 2
    return chunk


def _arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters for the residual-add epilogue: the persistent per-device buffer of the
    attention's fused split merge (:func:`specserve.layers.triton_attention._merge_counters`), which every launch
    leaves at 0 again; the kernels that use it run one after another on one stream (each waits for its predecessor
    before touching it)."""
    from specserve.layers.triton_attention import _merge_counters

    return _merge_counters(device, n)


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


def _check_norm(x: torch.Tensor, norm: NormIn | None) -> None:
    if norm is None:
        return
    if norm.weight.shape != (x.shape[1],) or norm.weight.dtype != x.dtype:
        raise ValueError(
            f"RMSNorm prologue: weight must be [{x.shape[1]}] in {x.dtype}; got {tuple(norm.weight.shape)} "
            f"{norm.weight.dtype}"
        )
    if norm.ssq.dim() != 2 or norm.ssq.shape[0] != x.shape[0] or norm.ssq.dtype != torch.float32:
        raise ValueError(
            f"RMSNorm prologue: ssq must be fp32 [{x.shape[0]}, NB]; got {tuple(norm.ssq.shape)}"
        )
    if x.stride(1) != 1 or norm.ssq.stride(1) != 1:
        raise ValueError("RMSNorm prologue: rows and ssq must be contiguous in their last dimension")


def splitk_partials(
    x: torch.Tensor, weight_t: torch.Tensor, splits: int, name: str, norm: NormIn | None = None
) -> torch.Tensor:
    """``x`` [M, K] @ ``weight_t`` [K, N] as ``splits`` fp32 partials [S, M, N] over equal K slices (their sum,
    rounded to x's dtype, is the product up to the accumulation order); ``name`` picks the tile (:func:`tile_for`,
    by the weight's layout: a TransposedLinear's ``weight_t`` or an nn.Linear's ``weight.t()``). ``norm``: x is the
    residual stream and the product is RMSNorm(x) @ W (:class:`NormIn`)."""
    _check(x, weight_t)
    _check_norm(x, norm)
    n = weight_t.shape[1]
    out = torch.empty((splits, x.shape[0], n), dtype=torch.float32, device=x.device)
    tile = tile_for(name, x.shape[0], layout_of(weight_t), x.device, (x.shape[1], n, splits))
    _launch(x, weight_t, out, n, splits, tile, False, norm)
    return out


def splitk_add(
    x: torch.Tensor, weight_t: torch.Tensor, splits: int, name: str, residual: torch.Tensor
) -> AddOut:
    """``h = residual + x @ weight_t`` (the product rounded to x's dtype, then the add in it: the torch path's
    ``h = h + proj(x)``) in one kernel: the split-K partials are summed by the last program of each N block to
    finish, which also writes h's per-row sums of squares per block (the next RMSNorm's statistics, for a
    :class:`NormIn` prologue). No add + RMSNorm kernel."""
    _check(x, weight_t)
    n = weight_t.shape[1]
    if residual.shape != (x.shape[0], n) or residual.dtype != x.dtype or residual.stride(1) != 1:
        raise ValueError(
            f"residual must be [{x.shape[0]}, {n}] in {x.dtype}, rows contiguous; got {tuple(residual.shape)} "
            f"{residual.dtype}"
        )
    tile = tile_for(name, x.shape[0], layout_of(weight_t), x.device, (x.shape[1], n, splits))
    out = torch.empty((splits, x.shape[0], n), dtype=torch.float32, device=x.device)
    res = AddOut(
        torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device),
        torch.empty((x.shape[0], n // tile.block_n), dtype=torch.float32, device=x.device),
    )
    _launch(x, weight_t, out, n, splits, tile, False, None, (residual, res))
    return res


def gate_up_silu(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    intermediate: int,
    norm: NormIn | None = None,
    splits: int = 1,
) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate, up = (x @ weight_t).split(intermediate, -1)`` in one kernel: [M, I] in x's
    dtype (the fused gate_up GEMM followed by ``silu_mul``, up to the accumulation order). ``norm``: of
    RMSNorm(x) (:class:`NormIn`). ``splits`` > 1: over that many K slices (more programs: a one-row step's
    I / BLOCK_N programs alone leave SMs idle), whose fp32 partials the last program of each N block to finish sums
    (in split order: deterministic) before the SiLU-mul."""
    _check(x, weight_t)
    _check_norm(x, norm)
    if weight_t.shape[1] != 2 * intermediate:
        raise ValueError(f"gate_up weight must be [K, {2 * intermediate}]; got {tuple(weight_t.shape)}")
    out = torch.empty((x.shape[0], intermediate), dtype=x.dtype, device=x.device)
    tile = tile_for("gate_up", x.shape[0], layout_of(weight_t), x.device, (x.shape[1], intermediate, splits))
    _launch(x, weight_t, out, intermediate, splits, tile, True, norm)
    return out
