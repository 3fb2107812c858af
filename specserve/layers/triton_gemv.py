"""Skinny GEMMs (at most 16 rows: decode at batch <= 16) with the decoder layer's small ops fused in front.

With it the fused decoder layer is six kernels instead of nine (see :func:`specserve.models.llama.run_layers_fused`).
``SPECSERVE_TRITON_GEMV`` picks where: ``auto`` (default) on CUDA for steps of at most :data:`AUTO_MAX_ROWS` rows
of a model whose hidden size is at most :data:`AUTO_MAX_HIDDEN` (small, launch-bound models: plain decode at batch
1); ``1`` for every step of at most :data:`MAX_ROWS` rows (any device: the tests, tuning); ``0`` never.
Measured on the H200 (``benchmarks/results/h200-2026-12-03-s8/decode_profile-smollm2-b1-gemv*.log``): the
SmolLM2-135M decode step at batch 1 takes 0.710 ms as a graph with the six-kernel layer (CUDA-core tiles, one
pass over K) vs 0.931 ms with cuBLAS's GEMVs (304 kernels); on the Qwen3-8B shape (session 5) cuBLAS's split-K
GEMVs keep far more CTAs streaming weights (7.5 vs 5.1 ms), and at 16 rows the CUDA-core tile spills (DFlash's
verify and query steps collapsed to 160 tok/s on SmolLM2; at 16 rows the best config, a ``tl.dot`` tile, took 2.16
ms vs cuBLAS's 1.06) and already at 4 rows the default tile loses (1.13 vs 0.94 ms), hence the bounds of ``auto``.
The persistent form (``pP`` in ``SPECSERVE_GEMV_CFG``: a fixed grid, the prologue once per program, each tile's
weights prefetched a tile ahead) did not change that (session 10, ``benchmarks/results/h200-2026-12-03-s10/``): on the
Qwen3-8B shape at batch 1 its best config took 5.03 ms per step vs 4.81 for the nine-kernel layer on cuBLAS (10 configs
5.03-9.92 ms), on SmolLM2 at one row 0.69 vs the default tile's 0.68 ms and at 16 rows 2.16 vs cuBLAS's 1.07 ms; it
stays a tuning option.

    qkv      = W_qkv  @ RMSNorm(residual + x)      (add + norm prologue; program 0 writes the new residual)
    rope_store, attention                          (unchanged)
    o        = W_o    @ attn
    gate_up  = W_gu   @ RMSNorm(residual + o)      (add + norm prologue)
    down     = W_down @ (SiLU(gate) * up)          (SiLU-mul prologue)

The prologues round exactly where :mod:`specserve.layers.triton_fused` rounds (each torch op of the eager path
rounds its result to the model dtype), so the GEMM inputs are those of the nine-kernel path bit for bit; only
the GEMMs' fp32 accumulation order differs from cuBLAS. Each program owns ``BLOCK_N`` output columns for all rows
(one pass over its weight rows: the weights are read once per step) and recomputes the row statistics of its
prologue from the (tiny, L2-resident) activations. ``SPECSERVE_GEMV_CFG="BLOCK_N,BLOCK_K,num_warps,num_stages[,fma]"``
overrides the launch configuration (:func:`_config`) for tuning. Runs under ``TRITON_INTERPRET=1`` on CPU (the tests); no host syncs,
static grids: CUDA-graph capturable.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specserve.layers.triton_fused import _mode, _pdl_wait, _round, pdl_launch

__all__ = ["AUTO_MAX_HIDDEN", "AUTO_MAX_ROWS", "MAX_ROWS", "gemv", "max_rows"]

MAX_ROWS = 16
AUTO_MAX_ROWS = 1
AUTO_MAX_HIDDEN = 1024
_NONE, _NORM, _ADD_NORM, _SILU = 0, 1, 2, 3
_TILE = 8192  # fp32 products per program and K step on the CUDA-core path: 64 registers a thread at 4 warps


def max_rows(x: torch.Tensor, hidden_size: int) -> int:
    """The most rows a step over activations ``x`` may have to take the six-kernel layer (0: never), from
    ``SPECSERVE_TRITON_GEMV`` (``auto`` default, ``1``, ``0``)."""
    v = os.environ.get("SPECSERVE_TRITON_GEMV", "auto").strip().lower() or "auto"
    if v == "1":
        return MAX_ROWS
    if v == "auto":
        return AUTO_MAX_ROWS if x.is_cuda and hidden_size <= AUTO_MAX_HIDDEN else 0
    if v == "0":
        return 0
    raise ValueError(f"SPECSERVE_TRITON_GEMV must be auto, 1 or 0, got {v!r}")


Config = tuple[int, int, int, int, bool, bool, int]


def _config(m: int, k: int) -> Config:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages, use tl.dot, one pass, programs per SM) for ``m`` rows and ``k``
    inputs.

    ``SPECSERVE_GEMV_CFG="BN,BK,W,S[,fma][,1pass][,pP]"`` if set (``fma``: CUDA-core multiply-and-reduce over a tile
    of next_pow2(m) rows; without it a 16-row ``tl.dot``; ``1pass``: where K <= BLOCK_K, one round of loads with the
    norm statistics taken from the GEMM's own input tile instead of a statistics loop first; ``pP``: persistent,
    P programs per SM, each doing its prologue once and looping over its output tiles; same values); two
    configs ``"A;B"``: A for the GEMMs whose K fits one A tile, B for the others (tuning: a tile that fits K = 576
    in one pass may spill at K = 1536). Default: the CUDA-core tile with one pass over K up to 1024 inputs (the K
    loop's dependent loads are what a launch-bound step waits on: at SmolLM2's K = 576, BLOCK_K 1024 took 0.78 ms
    per step vs 0.92 at 512 and 1.89 at 128) and as many output columns as keep the tile at :data:`_TILE` products
    (8 at one row: the best of the session-8 sweep; fewer as rows grow, then a shorter K step: it never spills),
    ``1pass`` on (session 9, H200, SmolLM2 decode step at one row, graph replay: 0.673 ms vs 0.708 without).
    """
    raw = os.environ.get("SPECSERVE_GEMV_CFG")
    if raw:
        cfgs = [_parse_config(c, raw) for c in raw.split(";")]
        if len(cfgs) > 2:
            raise ValueError(f"SPECSERVE_GEMV_CFG: at most two configs ('A;B'), got {raw!r}")
        return cfgs[0] if k <= cfgs[0][1] or len(cfgs) == 1 else cfgs[1]
    mp = triton.next_power_of_2(max(m, 1))
    bk = min(triton.next_power_of_2(max(k, 16)), 1024, _TILE // mp)
    bn = max(1, min(16, _TILE // (bk * mp)))
    return bn, bk, 4, 1, False, True, 0


def _parse_config(text: str, raw: str) -> Config:
    parts = [p.strip() for p in text.split(",")]
    try:
        bn, bk, nw, ns = (int(v) for v in parts[:4])
    except ValueError:
        raise ValueError(
            f"SPECSERVE_GEMV_CFG: expected 'BN,BK,W,S[,fma][,1pass][,pP]', got {raw!r}"
        ) from None
    flags = set(parts[4:])
    per_sm = [f for f in flags if len(f) > 1 and f[0] == "p" and f[1:].isdigit() and int(f[1:]) > 0]
    unknown = flags - {"fma", "1pass"} - set(per_sm)
    if unknown or len(per_sm) > 1:
        raise ValueError(f"SPECSERVE_GEMV_CFG: unknown flags {sorted(unknown or per_sm)} in {raw!r}")
    return bn, bk, nw, ns, "fma" not in flags, "1pass" in flags, int(per_sm[0][1:]) if per_sm else 0


def _num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (2 elsewhere: the interpreter, where it only sets the grid)."""
    if device.type != "cuda":
        return 2
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


_SMS: dict[int, int] = {}


@triton.jit
def _stream_in(x_ptr, r_ptr, res_out_ptr, rows, offs_k, mask2, stride_x, stride_r, stride_ro, pid, PRO: tl.constexpr, MODE: tl.constexpr, STORE: tl.constexpr):  # fmt: skip
    """The residual-stream tile in fp32: ``x``, or ``h = residual + x`` rounded to the model dtype (add prologue),
    which program 0 also writes out as the new residual when ``STORE``."""
    x = tl.load(x_ptr + rows * stride_x + offs_k[None, :], mask=mask2, other=0.0).to(tl.float32)
    if PRO == 2:
        r = tl.load(r_ptr + rows * stride_r + offs_k[None, :], mask=mask2, other=0.0).to(tl.float32)
        x = _round(x + r, MODE)  # h = h + x in the model dtype
        if STORE and pid == 0:
            tl.store(res_out_ptr + rows * stride_ro + offs_k[None, :], x.to(res_out_ptr.dtype.element_ty), mask=mask2)  # fmt: skip
    return x


@triton.jit
def _normed(x, nw_ptr, offs_k, K, rstd, MODE: tl.constexpr):
    """RMSNorm of a stream tile given its rows' 1/rms, rounded as the eager path rounds."""
    w = tl.load(nw_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    return _round(w[None, :] * _round(x * rstd[:, None], MODE), MODE)


@triton.jit
def _prologue(x_ptr, r_ptr, nw_ptr, rows, offs_k, mask2, stride_x, stride_r, K, rstd, PRO: tl.constexpr, MODE: tl.constexpr):  # fmt: skip
    """The GEMM input tile [BLOCK_M, BLOCK_K] in fp32, holding model-dtype values (rounded as the eager path)."""
    if PRO == 3:
        g = tl.load(x_ptr + rows * stride_x + offs_k[None, :], mask=mask2, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + rows * stride_x + K + offs_k[None, :], mask=mask2, other=0.0).to(tl.float32)
        s = _round(g / (1.0 + tl.exp(-g)), MODE)
        return _round(s * u, MODE)
    x = _stream_in(x_ptr, r_ptr, x_ptr, rows, offs_k, mask2, stride_x, stride_r, 0, 0, PRO, MODE, False)
    if PRO >= 1:
        x = _normed(x, nw_ptr, offs_k, K, rstd, MODE)
    return x


@triton.jit
def _mac(acc, x, w, USE_DOT: tl.constexpr, MODE: tl.constexpr, EXACT_DOT: tl.constexpr):
    """acc += x @ w.T for an input tile x [BLOCK_M, BLOCK_K] (model-dtype values, in fp32 or the model dtype), w
    [BLOCK_N, BLOCK_K]."""
    if not USE_DOT:  # [BLOCK_M, 1, BLOCK_K] * [1, BLOCK_N, BLOCK_K], reduced over K on the CUDA cores
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    elif MODE == 0 or EXACT_DOT:  # fp32 models; the interpreter (its bf16 dot is not reliable)
        acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
    else:  # tensor cores: bf16/fp16 operands (x holds model-dtype values: exact), fp32 accumulation
        acc += tl.dot(x.to(w.dtype), tl.trans(w))
    return acc


@triton.jit
def _gemv_kernel(
    x_ptr,
    r_ptr,
    nw_ptr,
    w_ptr,
    y_ptr,
    res_out_ptr,
    M,
    N,
    K,
    stride_x,
    stride_r,
    stride_w,
    stride_y,
    stride_ro,
    eps,
    PRO: tl.constexpr,
    MODE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    EXACT_DOT: tl.constexpr,
    USE_DOT: tl.constexpr,
    ONE_PASS: tl.constexpr,  # K <= BLOCK_K: one K tile, whose norm statistics come from the GEMM's own input tile
    PERSIST: tl.constexpr,  # a fixed grid of programs looping over the output tiles (see _gemv_tiles)
    PDL: tl.constexpr,  # programmatic dependent launch (triton_fused.pdl_enabled)
):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    rows = offs_m[:, None].to(tl.int64)
    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PERSIST:  # a fixed grid; each program takes every nprog-th BLOCK_N tile and does its prologue once
        _pdl_wait(PDL)
        _gemv_tiles(x_ptr, r_ptr, nw_ptr, w_ptr, y_ptr, res_out_ptr, M, N, K, stride_x, stride_r, stride_w, stride_y, stride_ro, eps, pid, rows, mask_m, rstd, PRO, MODE, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES, EXACT_DOT, USE_DOT, ONE_PASS)  # fmt: skip
        return
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    wrows = offs_n[:, None].to(tl.int64) * stride_w
    if ONE_PASS:  # one round of loads (weights, activations, residual, norm weights), no statistics loop
        offs_k = tl.arange(0, BLOCK_K)
        mk = offs_k < K
        mask2 = mask_m[:, None] & mk[None, :]
        w = tl.load(w_ptr + wrows + offs_k[None, :], mask=mask_n[:, None] & mk[None, :], other=0.0)
        _pdl_wait(PDL)  # after the weight loads are issued: no kernel of the step writes weights
        x = _one_pass_input(x_ptr, r_ptr, nw_ptr, res_out_ptr, rows, offs_k, mask2, stride_x, stride_r, stride_ro, K, eps, pid, rstd, PRO, MODE)  # fmt: skip
        acc = _mac(acc, x, w, USE_DOT, MODE, EXACT_DOT)
    else:
        _pdl_wait(PDL)
        rstd = _row_rstd(x_ptr, r_ptr, res_out_ptr, rows, mask_m, K, stride_x, stride_r, stride_ro, eps, pid, rstd, PRO, MODE, BLOCK_K)  # fmt: skip
        acc = _k_loop(acc, x_ptr, r_ptr, nw_ptr, w_ptr, rows, mask_m, wrows, mask_n, K, stride_x, stride_r, rstd, PRO, MODE, BLOCK_K, NUM_STAGES, EXACT_DOT, USE_DOT)  # fmt: skip
    tl.store(
        y_ptr + rows * stride_y + offs_n[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_n[None, :],
    )


@triton.jit
def _one_pass_input(x_ptr, r_ptr, nw_ptr, res_out_ptr, rows, offs_k, mask2, stride_x, stride_r, stride_ro, K, eps, pid, rstd, PRO: tl.constexpr, MODE: tl.constexpr):  # fmt: skip
    """The whole GEMM input tile (K within one tile), the norm statistics taken from the tile itself; program 0
    writes the new residual (add prologue)."""
    if PRO == 1 or PRO == 2:
        x = _stream_in(x_ptr, r_ptr, res_out_ptr, rows, offs_k, mask2, stride_x, stride_r, stride_ro, pid, PRO, MODE, True)  # fmt: skip
        rstd = tl.math.rsqrt(tl.sum(x * x, 1) / K + eps)
        return _normed(x, nw_ptr, offs_k, K, rstd, MODE)
    return _prologue(x_ptr, r_ptr, nw_ptr, rows, offs_k, mask2, stride_x, stride_r, K, rstd, PRO, MODE)


@triton.jit
def _k_loop(acc, x_ptr, r_ptr, nw_ptr, w_ptr, rows, mask_m, wrows, mask_n, K, stride_x, stride_r, rstd, PRO: tl.constexpr, MODE: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, EXACT_DOT: tl.constexpr, USE_DOT: tl.constexpr):  # fmt: skip
    """acc += prologue(x) @ W[rows of wrows].T over K in BLOCK_K steps (loads pipelined by NUM_STAGES)."""
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mk = offs_k < K
        x = _prologue(x_ptr, r_ptr, nw_ptr, rows, offs_k, mask_m[:, None] & mk[None, :], stride_x, stride_r, K, rstd, PRO, MODE)  # fmt: skip
        w = tl.load(w_ptr + wrows + offs_k[None, :], mask=mask_n[:, None] & mk[None, :], other=0.0)
        acc = _mac(acc, x, w, USE_DOT, MODE, EXACT_DOT)
    return acc


@triton.jit
def _row_rstd(x_ptr, r_ptr, res_out_ptr, rows, mask_m, K, stride_x, stride_r, stride_ro, eps, pid, rstd, PRO: tl.constexpr, MODE: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """1/rms of each row of the residual stream (norm prologues; else ``rstd`` unchanged), in a statistics loop over
    K; program 0 also writes the new residual (add prologue)."""
    if PRO == 1 or PRO == 2:
        ss = tl.zeros_like(rstd)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask2 = mask_m[:, None] & (offs_k[None, :] < K)
            x = _stream_in(x_ptr, r_ptr, res_out_ptr, rows, offs_k, mask2, stride_x, stride_r, stride_ro, pid, PRO, MODE, True)  # fmt: skip
            ss += tl.sum(x * x, 1)
        rstd = tl.math.rsqrt(ss / K + eps)
    return rstd


@triton.jit
def _gemv_tiles(x_ptr, r_ptr, nw_ptr, w_ptr, y_ptr, res_out_ptr, M, N, K, stride_x, stride_r, stride_w, stride_y, stride_ro, eps, pid, rows, mask_m, rstd, PRO: tl.constexpr, MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, EXACT_DOT: tl.constexpr, USE_DOT: tl.constexpr, ONE_PASS: tl.constexpr):  # fmt: skip
    """The persistent form: the prologue (one-pass input tile, or the norm statistics) once per program, then the
    program's output tiles pid, pid + nprog, ...: one pass, each tile's weights prefetched a tile ahead (the first
    during the prologue); else a K loop per tile (its loads pipelined over K by NUM_STAGES). Same products and
    roundings as the one-tile-per-program form."""
    nprog = tl.num_programs(0)
    num_tiles = tl.cdiv(N, BLOCK_N)
    # one pass: the next tile's weights are loaded while this one is reduced (the first: during the prologue)
    if ONE_PASS:
        offs_k = tl.arange(0, BLOCK_K)
        mk = offs_k < K
        mask2 = mask_m[:, None] & mk[None, :]
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * stride_w + offs_k[None, :], mask=(offs_n < N)[:, None] & mk[None, :], other=0.0)  # fmt: skip
        x = _one_pass_input(x_ptr, r_ptr, nw_ptr, res_out_ptr, rows, offs_k, mask2, stride_x, stride_r, stride_ro, K, eps, pid, rstd, PRO, MODE)  # fmt: skip
        x = x.to(w.dtype)  # exact (model-dtype values): half the registers the tile holds over the loop
        for tile in range(pid, num_tiles, nprog):
            offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            nxt = offs_n + nprog * BLOCK_N
            w_next = tl.load(w_ptr + nxt[:, None].to(tl.int64) * stride_w + offs_k[None, :], mask=(nxt < N)[:, None] & mk[None, :], other=0.0)  # fmt: skip
            acc = _mac(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), x, w, USE_DOT, MODE, EXACT_DOT)
            tl.store(y_ptr + rows * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & (offs_n < N)[None, :])  # fmt: skip
            w = w_next
    else:
        rstd = _row_rstd(x_ptr, r_ptr, res_out_ptr, rows, mask_m, K, stride_x, stride_r, stride_ro, eps, pid, rstd, PRO, MODE, BLOCK_K)  # fmt: skip
        for tile in range(pid, num_tiles, nprog):
            offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            mask_n = offs_n < N
            wrows = offs_n[:, None].to(tl.int64) * stride_w
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc = _k_loop(acc, x_ptr, r_ptr, nw_ptr, w_ptr, rows, mask_m, wrows, mask_n, K, stride_x, stride_r, rstd, PRO, MODE, BLOCK_K, NUM_STAGES, EXACT_DOT, USE_DOT)  # fmt: skip
            tl.store(y_ptr + rows * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])  # fmt: skip


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    residual: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_mul: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``y = prologue(x) @ weight.T`` for at most 16 rows. Returns ``(y, new_residual)``.

    * plain: ``x @ W.T``;
    * ``norm_weight`` (+ optional ``residual``): ``h = residual + x`` (rounded), ``RMSNorm(h) @ W.T``; returns
      ``h`` as the new residual (``x`` itself without ``residual``);
    * ``silu_mul``: ``x`` is ``[M, 2K]`` = gate | up: ``(SiLU(gate) * up) @ W.T``.

    ``weight`` must be a model weight, not written by the kernels before this one: under programmatic dependent
    launch (``SPECSERVE_PDL``) the one-pass tile reads it before waiting for its predecessor.
    """
    if x.dim() != 2 or x.stride(1) != 1 or weight.dim() != 2 or weight.stride(1) != 1:
        raise ValueError("gemv: x [M, K] and weight [N, K] need contiguous rows")
    m = x.shape[0]
    n, k = weight.shape
    if m > MAX_ROWS:
        raise ValueError(f"gemv takes at most {MAX_ROWS} rows, got {m}")
    if x.shape[1] != (2 * k if silu_mul else k):
        raise ValueError(f"gemv: x has {x.shape[1]} columns for a weight of {k} inputs (silu_mul={silu_mul})")
    pro = (
        _SILU
        if silu_mul
        else (_NONE if norm_weight is None else (_ADD_NORM if residual is not None else _NORM))
    )
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(x) if pro == _ADD_NORM else None
    if residual is not None and (residual.shape != x.shape or residual.stride(1) != 1):
        raise ValueError("gemv: residual must match x")
    if m == 0:
        return y, (res_out if pro == _ADD_NORM else (x if pro == _NORM else None))
    bn, bk, nw, ns, use_dot, one_pass, per_sm = _config(m, k)
    block_m = MAX_ROWS if use_dot else max(1, triton.next_power_of_2(m))
    r = residual if residual is not None else x
    ro = res_out if res_out is not None else x
    tiles = triton.cdiv(n, bn)
    grid = min(tiles, per_sm * _num_sms(x.device)) if per_sm else tiles
    pdl, pdl_kw = pdl_launch(x.device)
    _gemv_kernel[(grid,)](
        x,
        r,
        norm_weight if norm_weight is not None else x,
        weight,
        y,
        ro,
        m,
        n,
        k,
        x.stride(0),
        r.stride(0),
        weight.stride(0),
        y.stride(0),
        ro.stride(0),
        float(eps),
        PRO=pro,
        MODE=_mode(x.dtype),
        BLOCK_M=block_m,
        BLOCK_N=bn,
        BLOCK_K=bk,
        NUM_STAGES=ns,
        EXACT_DOT=os.environ.get("TRITON_INTERPRET", "0") == "1",
        USE_DOT=use_dot,
        ONE_PASS=one_pass and k <= bk,
        PERSIST=per_sm > 0,
        PDL=pdl,
        num_warps=nw,
        **pdl_kw,
    )
    if pro == _ADD_NORM:
        return y, res_out
    return y, (x if pro == _NORM else None)
