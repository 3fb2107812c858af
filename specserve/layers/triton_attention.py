"""Triton kernels for the paged KV cache: ``store_kv`` and varlen ``paged_attention`` (GPU backend).

Same layouts and semantics as :mod:`specserve.layers.attention_ref` (the oracle these are tested against)::

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]   slot = block_id * block_size + offset
    q: [T, num_heads, head_dim]; query_start_loc int32 [B+1]; seq_lens int32 [B]; block_tables int32 [B, max_blocks]

Design (DESIGN.md §4: batch 1-8 decode and spec verify are bound by bytes read and by launches):

* One program per (request, KV head, tile of queries[, KV split]). The ``group = num_heads // num_kv_heads``
  query heads sharing a KV head are packed with the tile's queries into the M dimension of ``tl.dot``
  (row r = query r // group, head r % group), so each K/V tile is loaded once per KV head.
* No host syncs: the grid depends only on ``(B, num_kv_heads, cdiv(max_query_len, queries_per_tile),
  num_splits)`` which are static per CUDA-graph bucket. Each program reads its request's ``q_len`` and
  ``seq_len`` from device memory, exits early when its query tile is empty and walks only the visible KV range
  (up to the tile's last query position when causal; from the window start with a sliding window), gathering
  K/V rows through the block table in tiles of ``BLOCK_N`` keys (independent of the page size).
* Online softmax in fp32 (exp2 with the scale folded in). Queries with no visible key output zeros.
* Split-KV (flash decoding) for small grids: the visible range of each query tile is cut into ``num_splits``
  equal runs of KV tiles at run time; each split writes a normalised partial output and its log-sum-exp (fp32
  scratch). ``num_splits`` is picked on the host from static arguments only (B, heads, max_query_len,
  ``max_seq_len`` hint, SM count), so it is CUDA-graph safe; at run time only the first ``used`` splits of a
  query tile have KV tiles (in a graph ``max_seq_len`` is the model's maximum, so most splits of a short context
  are empty).
* Merge of the splits (``SPECSERVE_ATTN_MERGE``, read per call): ``kernel`` (default) launches a second kernel that
  merges all ``num_splits`` partials (empty splits wrote lse -inf), one small CTA (:func:`merge_warps`) per (token,
  head). ``fused`` needs no second launch: empty splits exit at once; each used split stores its partials, then
  bumps an int32 arrival counter of its (request, KV head, query tile) group (``atomic_add``, acq_rel, after a CTA
  barrier so every thread's stores precede the release); the split that arrives last resets the counter to 0 (for
  the next launch / graph replay) and merges the ``used`` partials (read through L2, ``.cg``) into ``out``. The
  counters live in a persistent zeroed buffer per device (:func:`_merge_counters`); launches that share it must be
  stream-ordered (one stream, as the engine runs). Measured on the H200 (session 7, benchmarks/README.md) the fused
  merge is correct (200 graph replays with new metadata per shape) but slower: the last split's serial merge after
  the atomic costs more than the launch it saves (Qwen3-8B batch-1 decode: 9.2 us per layer vs 5.6 + 2.6; a DFlash
  K=15 step 7.19 vs 6.60 ms), so it is opt-in.

* ``rope_store_paged_attention``: ``rope_store`` (q / k RMSNorm, RoPE, K/V store from the qkv GEMM's output or its
  split-K partials) folded into the attention kernel where each request's queries fit one query tile. Each program
  computes its own q rows and writes the new K/V rows inside its own KV range before reading them (a CTA barrier
  orders the two): no program reads another's stores. One launch less per layer; default at one-query steps and
  where a program's q prologue is small (``SPECSERVE_FUSED_ROPE_ATTN``, :func:`fused_rope_wanted`).

Both kernels also run under ``TRITON_INTERPRET=1`` on CPU tensors (that is how the tests exercise them).
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specserve.layers.triton_fused import (
    _load_qkv,
    _mode,
    _norm_rope,
    _pdl_wait,
    _round,
    pdl_launch,
    warps_setting,
)

__all__ = [
    "AttentionConfig",
    "RopeStoreInputs",
    "paged_attention",
    "rope_store_paged_attention",
    "select_attention_config",
    "store_kv",
]


# --------------------------------------------------------------------------------------------- store_kv


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    num_kv_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    _pdl_wait(PDL)
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot < 0:  # padding token (e.g. a CUDA-graph row that belongs to no request)
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (heads < num_kv_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(k_ptr + tok * stride_kt + heads[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + heads[:, None] * stride_vh + offs_d[None, :], mask=mask)
    kc = k_cache_ptr + blk * stride_kcb + off * stride_kcs + heads[:, None] * stride_kch + offs_d[None, :]
    vc = v_cache_ptr + blk * stride_vcb + off * stride_vcs + heads[:, None] * stride_vch + offs_d[None, :]
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k``/``v`` [T, n_kv, hd] into the paged caches at ``slot_mapping`` [T] (int32/int64).

    One launch for K and V; a slot of -1 writes nothing. ``k``/``v`` may be strided views (e.g. slices of a
    fused qkv output) as long as their last dimension is contiguous.
    """
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [T, n_kv, hd]; got {tuple(k.shape)} and {tuple(v.shape)}")
    t, hk, d = k.shape
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != (hk, d):
        raise ValueError(
            f"caches must be [num_blocks, block_size, {hk}, {d}]; got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if slot_mapping.shape != (t,):
        raise ValueError(f"slot_mapping must be [T={t}]; got {tuple(slot_mapping.shape)}")
    for name, x in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if t == 0:
        return
    block_d = max(triton.next_power_of_2(d), 16)
    block_h = max(1, min(triton.next_power_of_2(hk), 4096 // block_d))
    grid = (t, triton.cdiv(hk, block_h))
    pdl, pdl_kw = pdl_launch(k.device)
    _store_kv_kernel[grid](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        hk,
        HEAD_DIM=d,
        BLOCK_D=block_d,
        BLOCK_H=block_h,
        BLOCK_SIZE=k_cache.shape[1],
        PDL=pdl,
        num_warps=4 if block_h * block_d >= 1024 else 2,
        **pdl_kw,
    )


# ---------------------------------------------------------------------------------------- attention


@triton.jit
def _mm(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # The Triton interpreter stores bf16 as uint16 and has no bf16 arithmetic (tl.dot would multiply the bit
    # patterns), so on CPU the operands are widened; bf16 products are exact in fp32, so results match the GPU.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _rope_q_halves(
    base,
    row_valid,
    pos_ptrs,
    cos_ptr,
    sin_ptr,
    w_ptr,
    stride_cos,
    stride_sin,
    eps,
    stride_split,
    HEAD_DIM: tl.constexpr,
    QK_NORM: tl.constexpr,
    MODE: tl.constexpr,
    NSPLIT: tl.constexpr,
):
    """rope_store's ``_norm_rope`` for q rows (``base`` [M, 1] row pointers) as the two rotate-half halves, joined
    into [M, HEAD_DIM]: the same roundings; the RMS sum adds the halves' sums (an order that may differ from one
    sum over the row in the last bit of rstd)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_h = tl.arange(0, HALF)
    mask = row_valid[:, None]
    x1 = _load_qkv(base + offs_h[None, :], mask, stride_split, NSPLIT, MODE)
    x2 = _load_qkv(base + HALF + offs_h[None, :], mask, stride_split, NSPLIT, MODE)
    if QK_NORM:
        rstd = tl.math.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM + eps)[:, None]
        w1 = tl.load(w_ptr + offs_h).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + offs_h).to(tl.float32)[None, :]
        x1 = _round(w1 * _round(x1 * rstd, MODE), MODE)
        x2 = _round(w2 * _round(x2 * rstd, MODE), MODE)
    p = tl.load(pos_ptrs, mask=row_valid, other=0).to(tl.int64)[:, None]
    c1 = _round(tl.load(cos_ptr + p * stride_cos + offs_h[None, :], mask=mask, other=0.0), MODE)
    s1 = _round(tl.load(sin_ptr + p * stride_sin + offs_h[None, :], mask=mask, other=0.0), MODE)
    q1 = _round(_round(x1 * c1, MODE) + _round(-x2 * s1, MODE), MODE)
    c2 = _round(tl.load(cos_ptr + p * stride_cos + HALF + offs_h[None, :], mask=mask, other=0.0), MODE)
    s2 = _round(tl.load(sin_ptr + p * stride_sin + HALF + offs_h[None, :], mask=mask, other=0.0), MODE)
    q2 = _round(_round(x2 * c2, MODE) + _round(x1 * s2, MODE), MODE)
    q = tl.permute(tl.join(q1, q2), (0, 2, 1))  # [M, 2, HALF]
    return tl.reshape(q, (q.shape[0], HEAD_DIM))


@triton.jit
def _paged_attn_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    counter_ptr,
    qsl_ptr,
    seq_lens_ptr,
    bt_ptr,
    qk_scale,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_ps,
    stride_pt,
    stride_ph,
    stride_ls,
    stride_lt,
    qkv_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    qw_ptr,
    kw_ptr,
    slot_ptr,
    stride_qkv,
    stride_split,
    stride_cos,
    stride_sin,
    eps,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,
    QT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
    ROPE: tl.constexpr = False,
    NUM_HEADS: tl.constexpr = 1,
    NUM_KV_HEADS: tl.constexpr = 1,
    R_PAD: tl.constexpr = 1,
    QK_NORM: tl.constexpr = False,
    MODE: tl.constexpr = 0,
    NSPLIT: tl.constexpr = 0,
):
    _pdl_wait(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    pid2 = tl.program_id(2)
    q_tile = pid2 // NUM_SPLITS
    split = pid2 % NUM_SPLITS

    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    tile_lo = q_tile * QT
    if tile_lo >= q_len:  # this tile has no queries (short request, or a q_len 0 / padded request)
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx = seq_len - q_len  # absolute position of the request's first query
    tile_hi = tl.minimum(tile_lo + QT, q_len)

    # Visible KV range of the whole tile: [kv_lo, kv_hi).
    if CAUSAL:
        kv_hi = tl.minimum(seq_len, ctx + tile_hi)
    else:
        kv_hi = seq_len
    if WINDOW > 0:
        kv_lo = tl.maximum(ctx + tile_lo - WINDOW + 1, 0)
        kv_lo = (kv_lo // BLOCK_N) * BLOCK_N
    else:
        kv_lo = 0
    n_tiles = tl.maximum(tl.cdiv(kv_hi - kv_lo, BLOCK_N), 0)
    if NUM_SPLITS > 1:
        # The first `used` splits get runs of `per_split` KV tiles (the last maybe fewer), the rest none. Every
        # program of this (b, kvh, q_tile) group computes the same `used` (it depends only on metadata).
        per_split = tl.maximum(tl.cdiv(n_tiles, NUM_SPLITS), 1)
        used = tl.maximum(tl.cdiv(n_tiles, per_split), 1)
        if FUSED_MERGE:
            if split >= used:  # no KV tile: nothing to write, not counted by the merge
                return
        t_begin = split * per_split
        t_end = tl.minimum(t_begin + per_split, n_tiles)
    else:
        t_begin = 0
        t_end = n_tiles

    # Rows of the tile: (query, head-in-group) pairs.
    offs_m = tl.arange(0, BLOCK_M)
    qi = offs_m // GROUP
    q_idx = tile_lo + qi
    row_valid = (qi < QT) & (q_idx < q_len)
    tok = (q_start + q_idx).to(tl.int64)
    head = kvh * GROUP + offs_m % GROUP
    pos = ctx + q_idx
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    if BLOCK_D == HEAD_DIM:
        q_mask = row_valid[:, None]
    else:
        q_mask = row_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
    if ROPE:
        # q / k RMSNorm + RoPE + KV store in this kernel (rope_store_paged_attention): from the qkv GEMM's output
        # (or its split-K partials), with rope_store's arithmetic. The new tokens' K/V rows that fall in this
        # program's KV range are written by this program and read back after a CTA barrier; every program reads
        # only its own range and every new row lies in some program's range (one query tile per request), so no
        # program depends on another's stores (rows in two ranges are never: the ranges are disjoint).
        d_mask = offs_d < HEAD_DIM
        half = HEAD_DIM // 2
        partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
        sign = tl.where(offs_d < half, -1.0, 1.0)[None, :]
        range_lo = kv_lo + t_begin * BLOCK_N
        range_hi = tl.minimum(kv_lo + t_end * BLOCK_N, kv_hi)
        offs_r = tl.arange(0, R_PAD)
        r_tok = (q_start + offs_r).to(tl.int64)
        r_ok = (offs_r < q_len) & (ctx + offs_r >= range_lo) & (ctx + offs_r < range_hi)
        r_slot = tl.load(slot_ptr + r_tok, mask=r_ok, other=-1).to(tl.int64)
        r_ok = r_ok & (r_slot >= 0)  # slot -1: padding, no KV write
        if tl.sum(r_ok.to(tl.int32), 0) > 0:
            r_mask = r_ok[:, None] & d_mask[None, :]
            r_p = tl.load(pos_ptr + r_tok, mask=r_ok, other=0).to(tl.int64)
            # cos/sin tables are fp32; the torch path casts them to the model dtype first
            cos_r = _round(
                tl.load(cos_ptr + r_p[:, None] * stride_cos + offs_d[None, :], mask=r_mask, other=0.0), MODE
            )
            sin_r = _round(
                tl.load(sin_ptr + r_p[:, None] * stride_sin + offs_d[None, :], mask=r_mask, other=0.0), MODE
            )
            k_base = qkv_ptr + r_tok[:, None] * stride_qkv + (NUM_HEADS + kvh) * HEAD_DIM
            k_new = _norm_rope(k_base + offs_d[None, :], k_base + partner[None, :], r_mask, kw_ptr, offs_d, partner,
                               cos_r, sin_r, sign, eps, stride_split, HEAD_DIM, QK_NORM, MODE, NSPLIT)  # fmt: skip
            v_new = _load_qkv(
                k_base + NUM_KV_HEADS * HEAD_DIM + offs_d[None, :], r_mask, stride_split, NSPLIT, MODE
            )
            r_blk = r_slot // BLOCK_SIZE
            r_off = r_slot % BLOCK_SIZE
            k_dst = (
                k_cache_ptr
                + (r_blk * stride_kb + r_off * stride_ks + kvh * stride_kh)[:, None]
                + offs_d[None, :]
            )
            v_dst = (
                v_cache_ptr
                + (r_blk * stride_vb + r_off * stride_vs + kvh * stride_vh)[:, None]
                + offs_d[None, :]
            )
            tl.store(k_dst, k_new.to(k_cache_ptr.dtype.element_ty), mask=r_mask)
            tl.store(v_dst, v_new.to(v_cache_ptr.dtype.element_ty), mask=r_mask)
            tl.debug_barrier()  # this CTA's stores before its reads of the same rows below
        # q in two [BLOCK_M, HEAD_DIM / 2] halves (the rotate-half pairs; HEAD_DIM a power of 2 here): half the
        # registers of rope_store's [rows, D] tile and its partner tile, which spill at 64 rows x 128 on sm_90
        # (a program with no KV tile needs no q: in a CUDA graph sized for the model's max length most splits of a
        # short context are empty, and their q reads of the qkv partials cost L2 bandwidth the others wait for)
        if t_end > t_begin:
            q = _rope_q_halves(qkv_ptr + tok[:, None] * stride_qkv + head[:, None] * HEAD_DIM, row_valid,
                               pos_ptr + tok, cos_ptr, sin_ptr, qw_ptr, stride_cos, stride_sin, eps, stride_split,
                               HEAD_DIM, QK_NORM, MODE, NSPLIT)  # fmt: skip
            q = q.to(k_cache_ptr.dtype.element_ty)  # what rope_store would store
        else:
            q = tl.zeros([BLOCK_M, BLOCK_D], dtype=k_cache_ptr.dtype.element_ty)
    else:
        q = tl.load(
            q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
            mask=q_mask,
            other=0.0,
        )

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite, so fully masked rows never give inf - inf
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for t in range(t_begin, t_end):
        kp = kv_lo + t * BLOCK_N + offs_n
        kv_valid = kp < kv_hi
        # a negative block id (past a padded request's table: only its padding rows can see those keys) reads
        # block 0, never memory outside the cache
        blk = tl.maximum(tl.load(bt_row + kp // BLOCK_SIZE, mask=kv_valid, other=0).to(tl.int64), 0)
        in_blk = kp % BLOCK_SIZE
        k_off = blk * stride_kb + in_blk * stride_ks + kvh * stride_kh
        v_off = blk * stride_vb + in_blk * stride_vs + kvh * stride_vh
        if BLOCK_D == HEAD_DIM:
            k_mask = kv_valid[None, :]
            v_mask = kv_valid[:, None]
        else:
            k_mask = kv_valid[None, :] & (offs_d < HEAD_DIM)[:, None]
            v_mask = kv_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
        k = tl.load(k_cache_ptr + k_off[None, :] + offs_d[:, None], mask=k_mask, other=0.0)  # [D, N]
        s = _mm(q, k, PRECISION, UPCAST) * qk_scale  # [M, N], log2 domain
        vis = row_valid[:, None] & kv_valid[None, :]
        if CAUSAL:
            vis = vis & (kp[None, :] <= pos[:, None])
        if WINDOW > 0:
            vis = vis & (kp[None, :] > pos[:, None] - WINDOW)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + v_off[:, None] + offs_d[None, :], mask=v_mask, other=0.0)  # [N, D]
        acc = acc * alpha[:, None] + _mm(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new

    has = l_i > 0.0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    o_mask = q_mask
    if NUM_SPLITS == 1:
        o_ptrs = out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        p_ptrs = (
            part_out_ptr
            + split.to(tl.int64) * stride_ps
            + tok[:, None] * stride_pt
            + head[:, None] * stride_ph
        )
        tl.store(p_ptrs + offs_d[None, :], o, mask=o_mask)
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + split.to(tl.int64) * stride_ls + tok * stride_lt + head, lse, mask=row_valid)
        if FUSED_MERGE:
            # Arrival counter of this (b, kvh, q_tile) group. The CTA barrier orders every thread's partial
            # stores before the (single-thread, gpu-scope) release of the atomic; the last arrival's acquire
            # (its result reaches the other threads through shared memory and a barrier) then makes all `used`
            # splits' partials visible to the whole CTA.
            tl.debug_barrier()
            grp = (b * tl.num_programs(1) + kvh) * (tl.num_programs(2) // NUM_SPLITS) + q_tile
            cnt = tl.atomic_add(counter_ptr + grp, 1, sem="acq_rel")
            if cnt == used - 1:
                # Last split of the group: every other used split has arrived and nothing else touches the
                # counter in this launch; reset it for the next launch / graph replay, then merge.
                tl.atomic_xchg(counter_ptr + grp, 0, sem="relaxed")
                # Online log-sum-exp combine (log2 domain) with a finite start, so rows whose splits are all
                # empty (lse -inf) get weight 0 everywhere and output zeros, never NaN.
                m_c = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
                l_c = tl.zeros([BLOCK_M], dtype=tl.float32)
                acc_c = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
                po_ptrs = (
                    part_out_ptr + tok[:, None] * stride_pt + head[:, None] * stride_ph + offs_d[None, :]
                )
                pl_ptrs = part_lse_ptr + tok * stride_lt + head
                for _ in range(used):  # pointers step by a split (64-bit pointer arithmetic)
                    lse_s = tl.load(pl_ptrs, mask=row_valid, other=float("-inf"), cache_modifier=".cg")
                    o_s = tl.load(po_ptrs, mask=o_mask, other=0.0, cache_modifier=".cg")
                    pl_ptrs += stride_ls
                    po_ptrs += stride_ps
                    m_n = tl.maximum(m_c, lse_s)
                    alpha_c = tl.exp2(m_c - m_n)
                    w = tl.exp2(lse_s - m_n)
                    l_c = l_c * alpha_c + w
                    acc_c = acc_c * alpha_c[:, None] + o_s * w[:, None]
                    m_c = m_n
                o_c = acc_c / tl.where(l_c > 0.0, l_c, 1.0)[:, None]
                o_ptrs = out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
                tl.store(o_ptrs, o_c.to(out_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def _merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_ps,
    stride_pt,
    stride_ph,
    stride_ls,
    stride_lt,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    _pdl_wait(PDL)
    # One program per (token, head): all splits are loaded at once as a [SPLITS_PAD, BLOCK_D] tile.
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    s_valid = offs_s < NUM_SPLITS
    lse = tl.load(
        part_lse_ptr + offs_s * stride_ls + tok * stride_lt + head, mask=s_valid, other=float("-inf")
    )
    m = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # all splits empty -> all weights 0
    mask = s_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
    part = tl.load(
        part_out_ptr + offs_s[:, None] * stride_ps + tok * stride_pt + head * stride_ph + offs_d[None, :],
        mask=mask,
        other=0.0,
    )
    den = tl.sum(w, 0)
    o = tl.sum(part * w[:, None], 0) / tl.where(den > 0.0, den, 1.0)
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + offs_d,
        o.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


class AttentionConfig:
    """Static launch parameters of :func:`paged_attention` for one (shape, bucket)."""

    __slots__ = ("block_m", "block_n", "queries_per_tile", "num_warps", "num_stages")

    def __init__(
        self, block_m: int, block_n: int, queries_per_tile: int, num_warps: int, num_stages: int
    ) -> None:
        self.block_m = block_m
        self.block_n = block_n
        self.queries_per_tile = queries_per_tile
        self.num_warps = num_warps
        self.num_stages = num_stages

    def __repr__(self) -> str:
        return (
            f"AttentionConfig(block_m={self.block_m}, block_n={self.block_n}, "
            f"queries_per_tile={self.queries_per_tile}, num_warps={self.num_warps}, num_stages={self.num_stages})"
        )


def select_attention_config(
    num_heads: int, num_kv_heads: int, head_dim: int, max_query_len: int
) -> AttentionConfig:
    """Tile sizes from static shapes only. M packs (queries x group heads); N is keys per KV tile. One-query steps
    of heads 128 wide or wider (padded) take 8 warps (``SPECSERVE_ATTN_WARPS`` overrides every launch's): H100, s48
    (benchmarks/results/h100-2026-12-07-s48/c4-c6), the Qwen3-8B-shaped plain step 5.685-5.697 -> 5.657-5.660 ms at
    batch 1 in two calls (4 warps before; 16 warps 5.681, 2 warps 5.787), 5.778-5.785 -> 5.764-5.768 at batch 4;
    DFlash's 16-query blocks gained nothing from 8 (7.327 -> 7.328 ms a K=15 step)."""
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    max_m = 128 if block_d <= 128 else 64
    block_m = min(max(16, triton.next_power_of_2(max(1, max_query_len) * group)), max_m)
    block_m = max(block_m, triton.next_power_of_2(group))
    block_n = 64 if block_d <= 128 else 32
    num_warps = 8 if block_m >= 128 or (max_query_len == 1 and block_d >= 128) else 4
    return AttentionConfig(
        block_m, block_n, block_m // group, num_warps, num_stages=3 if block_m <= 64 else 2
    )


@functools.lru_cache(maxsize=16)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# the split-KV heuristic leaves steps of more query rows than this unsplit
SPLIT_MAX_QUERY_LEN = 64


def _pick_num_splits(
    device: torch.device, num_programs: int, block_n: int, max_seq_len: int | None, max_query_len: int
) -> int:
    """Flash-decoding split count from static arguments: fill ~2 waves of SMs, each split >= 2 KV tiles."""
    if device.type != "cuda" or max_query_len > SPLIT_MAX_QUERY_LEN:
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    if num_programs >= sms:
        return 1
    target = triton.cdiv(2 * sms, num_programs)
    if max_seq_len is not None:
        target = min(target, max(1, max_seq_len // (2 * block_n)))
    target = min(target, 64, max_splits())
    return 1 << (target.bit_length() - 1)  # round down to a power of two (fewer compiled variants)


def max_splits() -> int:
    """Upper bound on the split-KV count (``SPECSERVE_ATTN_MAX_SPLITS``, read per call, i.e. per graph capture;
    default 64). Session 15 (H200, benchmarks/results/h200-2026-12-03-s15/c6): at 128-192-token contexts a cap of
    1, 2 or 4 changes a batch-1 decode or DFlash step by -3.2% to +5.9% and slows the SmolLM2 shape's batch 8 by
    5-16% (the merge kernel is no bottleneck in graph replay); at 1.5k tokens no split costs +83% (SmolLM2 shape)
    / +21% (Qwen3-8B shape) per decode step."""
    raw = os.environ.get("SPECSERVE_ATTN_MAX_SPLITS", "").strip()
    if not raw:
        return 64
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"SPECSERVE_ATTN_MAX_SPLITS must be a positive integer, got {raw!r}")
    return int(raw)


MERGE_WARPS_ENV = "SPECSERVE_ATTN_MERGE_WARPS"


def merge_warps(tile: int) -> int:
    """Warps of the split merge kernel, whose program holds a [splits, head_dim] fp32 tile of ``tile`` values:
    one warp per 4096 values (128 registers a thread; at most 4), or ``SPECSERVE_ATTN_MERGE_WARPS`` (read per call,
    i.e. per graph capture). H100, session 35 (benchmarks/results/h100-2026-12-06-s35/c4-merge-warps): one warp
    instead of four for the Qwen3-8B shape's [32, 128] tile took the batch-1 decode step from 5.785 to 5.729 ms
    (1.154 -> 1.143x the weight-read floor; 5.870 -> 5.832 at 1.5k tokens of context), SmolLM2's plain step 0.561
    -> 0.555 ms: the merge is latency, and a CTA of fewer warps starts and reduces sooner."""
    return warps_setting(MERGE_WARPS_ENV, min(4, max(1, tile // 4096)))


MERGE_ENV = "SPECSERVE_ATTN_MERGE"
_MERGE_MODES = ("fused", "kernel")
_MIN_COUNTERS = 1 << 16
_counters: dict[tuple[str, int], torch.Tensor] = {}  # current arrival-counter buffer per device
_counters_alive: list[torch.Tensor] = []  # every buffer ever handed out (captured graphs hold raw pointers)


def _split_scratch(
    num_splits: int, t_pad: int, h: int, d: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised fp32 scratch of the split-KV partials: outputs [S, T, H, D] and log-sum-exps [S, T, H] (in a
    CUDA graph, memory of the graph pool that earlier steps and other layers left their values in)."""
    part_out = torch.empty((num_splits, t_pad, h, d), dtype=torch.float32, device=device)
    part_lse = torch.empty((num_splits, t_pad, h), dtype=torch.float32, device=device)
    return part_out, part_lse


def _merge_mode() -> str:
    mode = os.environ.get(MERGE_ENV, "kernel") or "kernel"
    if mode not in _MERGE_MODES:
        raise ValueError(f"{MERGE_ENV} must be one of {_MERGE_MODES}, got {mode!r}")
    return mode


def _merge_counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters (>= ``n``) for the fused split merge on ``device``.

    Each launch leaves the counters it used at 0 again, so one persistent buffer per device serves every layer,
    call and CUDA-graph replay; launches sharing it must be ordered (one stream). Allocated once, outside graph
    capture in practice (the first eager / warm-up call); a larger one replaces it when ``n`` grows, and no
    buffer is ever freed because captured graphs keep its address. Growth during stream capture (only with
    an explicit huge ``num_splits`` grid: the heuristic splits only grids smaller than the SM count) gets a
    buffer for this call alone whose zero-fill is captured into the graph, so it is re-zeroed before every
    replay; it is kept alive but not cached, since eager calls cannot rely on a captured memset having run.
    """
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    key = (device.type, -1 if index is None else index)
    buf = _counters.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    size = max(_MIN_COUNTERS, triton.next_power_of_2(n))
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    buf = torch.zeros(size, dtype=torch.int32, device=device)
    _counters_alive.append(buf)
    if not capturing:
        _counters[key] = buf
    return buf


class RopeStoreInputs(NamedTuple):
    """What :func:`rope_store_paged_attention` computes q and the new K/V from (``rope_store``'s arguments)."""

    qkv: torch.Tensor  # [T, (Hq + 2 Hk) D], or only the shape / dtype template when ``partials`` is given
    partials: torch.Tensor | None  # [S, T, (Hq + 2 Hk) D] fp32 split-K partials of the qkv GEMM
    positions: torch.Tensor  # [T]
    cos: torch.Tensor  # [max_position, D] fp32
    sin: torch.Tensor
    q_norm_weight: torch.Tensor | None  # [D] (Qwen3) or None
    k_norm_weight: torch.Tensor | None
    eps: float
    slot_mapping: torch.Tensor  # [T], -1 writes nothing


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    *,
    causal: bool = True,
    sliding_window: int | None = None,
    scale: float | None = None,
    max_query_len: int,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    config: AttentionConfig | None = None,
) -> torch.Tensor:
    """Varlen paged attention; returns ``out`` [T, num_heads, head_dim] in ``q``'s dtype.

    ``max_query_len`` (host int, >= every request's q_len; static per CUDA-graph bucket) and ``max_seq_len``
    (optional host upper bound on seq_lens, used only to choose the KV split count) are the only sizes read on
    the host. ``num_splits`` overrides the split-KV heuristic (1 disables it) and ``config`` the tile sizes
    (both for tuning; each distinct value compiles a kernel variant). Queries with no visible key (e.g. of a
    padded request with seq_len 0) get zeros; rows of ``out`` not covered by ``query_start_loc`` (or beyond a
    request's first ``max_query_len`` queries) are unspecified. With ``num_splits > 1`` the environment variable
    ``SPECSERVE_ATTN_MERGE`` (read per call, so per graph capture) picks the merge: ``kernel`` (default, a second
    launch) or ``fused`` (in the attention kernel through per-group arrival counters; slower on the H200).
    """
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("expected q [T, H, D] and k_cache == v_cache shape [num_blocks, block_size, Hk, D]")
    if q.stride(-1) != 1:
        raise ValueError("q, k_cache and v_cache must be contiguous in their last dimension")
    return _attention(
        q, None, q.shape[0], q.shape[1], q.shape[2], q.dtype, k_cache, v_cache, query_start_loc, seq_lens,
        block_tables, causal=causal, sliding_window=sliding_window, scale=scale, max_query_len=max_query_len,
        max_seq_len=max_seq_len, out=out, num_splits=num_splits, config=config,
    )  # fmt: skip


def rope_store_paged_attention(
    rope: RopeStoreInputs,
    num_heads: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    *,
    causal: bool = True,
    sliding_window: int | None = None,
    scale: float | None = None,
    max_query_len: int,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    config: AttentionConfig | None = None,
) -> torch.Tensor:
    """``rope_store`` (split of the qkv GEMM output, q / k RMSNorm, RoPE, K/V store by slot) followed by
    :func:`paged_attention`, as one kernel where every request's queries fit one query tile (decode, speculative
    verify, a DFlash block: ``max_query_len`` <= the tile's queries); otherwise the two launches. Returns ``out``
    [T, num_heads, head_dim]; the caches hold the new K/V afterwards either way, bit for bit as ``rope_store``
    writes them, and the output equals ``paged_attention`` of ``rope_store``'s q.

    Each program (request, KV head, KV split) computes its query rows' q from the qkv rows (summing the split-K
    partials as ``rope_store`` does) and the new tokens' K/V rows in its own KV range, stores those, and attends
    after a CTA barrier: saves ``rope_store``'s launch and its q round trip (DESIGN.md §4: a decode step's small
    kernels are latency chains).
    """
    from specserve.layers.triton_fused import check_rope_store_args, rope_store

    hk, d = k_cache.shape[2], k_cache.shape[3]
    if num_heads < 1 or num_heads % hk:
        raise ValueError(
            f"num_heads must be a positive multiple of the cache's {hk} KV heads, got {num_heads}"
        )
    cfg = config or select_attention_config(num_heads, hk, d, max_query_len)
    if (
        max_query_len > cfg.queries_per_tile
        or d < 16
        or d & (d - 1)  # q's rotate-half halves fill the tile only for power-of-2 head dims
        or not fused_rope_wanted(
            max_query_len, num_heads // hk, d, 1 if rope.partials is None else rope.partials.shape[0]
        )
    ):
        q = rope_store(
            rope.qkv, rope.positions, rope.cos, rope.sin, rope.q_norm_weight, rope.k_norm_weight, rope.eps,
            k_cache, v_cache, rope.slot_mapping, num_heads, hk, d, rope.partials,
        )  # fmt: skip
        return paged_attention(
            q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, causal=causal,
            sliding_window=sliding_window, scale=scale, max_query_len=max_query_len, max_seq_len=max_seq_len,
            out=out, num_splits=num_splits, config=config,
        )  # fmt: skip
    check_rope_store_args(
        rope.qkv, rope.partials, rope.positions, rope.cos, rope.sin, rope.q_norm_weight, rope.k_norm_weight,
        k_cache, v_cache, rope.slot_mapping, num_heads, hk, d,
    )  # fmt: skip
    qkv, t = rope.qkv, rope.qkv.shape[0]
    return _attention(
        None, rope, t, num_heads, d, qkv.dtype, k_cache, v_cache, query_start_loc, seq_lens, block_tables,
        causal=causal, sliding_window=sliding_window, scale=scale, max_query_len=max_query_len,
        max_seq_len=max_seq_len, out=out, num_splits=num_splits, config=cfg,
    )  # fmt: skip


FUSED_ROPE_ENV = "SPECSERVE_FUSED_ROPE_ATTN"
_FUSED_ROPE_MODES = ("auto", "1", "decode", "0")
# auto: the one kernel where a program's q prologue reads at most this many qkv values (query rows x GQA group x
# head_dim x split-K partials). H200 (session 17, benchmarks/results/h200-2026-12-04-s17): Qwen3-8B-shaped decode
# (1 x 4 x 128 x 8 = 4096) 4.54-4.61 -> 4.49-4.53 ms a step in three calls; its 16-row verify (65536) 4.84-4.99 ->
# 5.55 ms (the one program holding the new rows reads ~0.4 MB of fp32 partials serially); SmolLM2's DFlash K=15 step
# (16 x 3 x 64 x 3 = 9216, verify and drafter) within the run-to-run spread (1.16-1.28 vs 1.15-1.34 ms).
FUSED_ROPE_MAX_LOAD = 16384


def fused_rope_wanted(max_query_len: int, group: int, head_dim: int, nsplit: int) -> bool:
    """Whether :func:`rope_store_paged_attention` runs as one kernel (given that each request's queries fit one
    tile): ``SPECSERVE_FUSED_ROPE_ATTN`` (read per call, i.e. per graph capture) ``auto`` (default: one-query steps,
    and steps whose q prologue reads at most :data:`FUSED_ROPE_MAX_LOAD` values), ``1`` always, ``decode``
    one-query steps only, ``0`` never (``rope_store`` + ``paged_attention``)."""
    mode = os.environ.get(FUSED_ROPE_ENV, "auto").strip() or "auto"
    if mode not in _FUSED_ROPE_MODES:
        raise ValueError(f"{FUSED_ROPE_ENV} must be one of {', '.join(_FUSED_ROPE_MODES)}; got {mode!r}")
    if mode == "auto":
        return max_query_len == 1 or max_query_len * group * head_dim * nsplit <= FUSED_ROPE_MAX_LOAD
    return mode == "1" or (mode == "decode" and max_query_len == 1)


def _attention(
    q: torch.Tensor | None,
    rope: RopeStoreInputs | None,
    t: int,
    h: int,
    d: int,
    dtype: torch.dtype,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    *,
    causal: bool,
    sliding_window: int | None,
    scale: float | None,
    max_query_len: int,
    max_seq_len: int | None,
    out: torch.Tensor | None,
    num_splits: int | None,
    config: AttentionConfig | None,
) -> torch.Tensor:
    """The launch shared by :func:`paged_attention` (``q`` given) and :func:`rope_store_paged_attention` (``rope``
    given: q and the new K/V computed in the kernel; the caller checked that one query tile holds each request)."""
    _, block_size, hk, dk = k_cache.shape
    device = k_cache.device
    if dk != d or h % hk != 0:
        raise ValueError(f"incompatible shapes: q heads {h}, head_dim {d}; cache heads {hk}, head_dim {dk}")
    if h // hk > 128:
        raise ValueError(f"GQA group size {h // hk} > 128 is not supported")
    if d > 256:
        raise ValueError(f"head_dim {d} > 256 is not supported by the Triton kernel")
    if dtype != k_cache.dtype or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"q, k_cache and v_cache must share a dtype; got {dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("q, k_cache and v_cache must be contiguous in their last dimension")
    b = seq_lens.shape[0]
    if query_start_loc.shape != (b + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != b:
        raise ValueError(
            f"metadata shapes disagree: query_start_loc {tuple(query_start_loc.shape)}, seq_lens "
            f"{tuple(seq_lens.shape)}, block_tables {tuple(block_tables.shape)}"
        )
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be positive or None, got {sliding_window}")
    if out is None:
        out = torch.empty((t, h, d), dtype=dtype, device=device)
    elif tuple(out.shape) != (t, h, d) or out.stride(-1) != 1:
        raise ValueError(f"out must be [T, H, D] = {(t, h, d)} with a contiguous last dimension")
    if t == 0 or b == 0 or max_query_len <= 0:
        return out
    if block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()

    cfg = config or select_attention_config(h, hk, d, max_query_len)
    if cfg.queries_per_tile < 1 or cfg.queries_per_tile * (h // hk) > cfg.block_m:
        raise ValueError(f"{cfg} cannot hold {h // hk} heads per query")
    q_tiles = triton.cdiv(max_query_len, cfg.queries_per_tile)
    if num_splits is None:
        num_splits = _pick_num_splits(device, b * hk * q_tiles, cfg.block_n, max_seq_len, max_query_len)
    num_splits = max(1, int(num_splits))
    block_d = max(16, triton.next_power_of_2(d))
    scale = d**-0.5 if scale is None else float(scale)
    precision = "ieee" if dtype == torch.float32 else "tf32"

    fused = num_splits > 1 and _merge_mode() == "fused"
    counters = _merge_counters(device, b * hk * q_tiles) if fused else seq_lens  # seq_lens: unused
    if num_splits > 1:
        # rows padded to a multiple of 16: the split strides (kernel arguments) then do not depend on the row count
        # (Triton compiles a form per integer argument's class: 1, a multiple of 16, other)
        part_out, part_lse = _split_scratch(num_splits, -(-t // 16) * 16, h, d, device)
        p_strides = (
            part_out.stride(0),
            part_out.stride(1),
            part_out.stride(2),
            part_lse.stride(0),
            part_lse.stride(1),
        )
    else:
        part_out = part_lse = out  # unused
        p_strides = (0, 0, 0, 0, 0)
    if rope is None:
        assert q is not None
        q_arg, q_strides = q, (q.stride(0), q.stride(1))
        rope_args: tuple = (out, seq_lens, out, out, out, out, seq_lens, 0, 0, 0, 0, 0.0)  # unused
        rope_const: dict = {}
    else:
        src = rope.partials if rope.partials is not None else rope.qkv
        qk_norm = rope.q_norm_weight is not None
        q_arg, q_strides = out, (0, 0)  # unused
        rope_args = (
            src, rope.positions, rope.cos, rope.sin,
            rope.q_norm_weight if qk_norm else rope.cos, rope.k_norm_weight if qk_norm else rope.cos,
            rope.slot_mapping, src.stride(-2), src.stride(0) if rope.partials is not None else 0,
            rope.cos.stride(0), rope.sin.stride(0), float(rope.eps),
        )  # fmt: skip
        rope_const = dict(
            ROPE=True, NUM_HEADS=h, NUM_KV_HEADS=hk, R_PAD=max(2, triton.next_power_of_2(cfg.queries_per_tile)),
            QK_NORM=qk_norm, MODE=_mode(dtype), NSPLIT=rope.partials.shape[0] if rope.partials is not None else 0,
        )  # fmt: skip

    grid = (b, hk, q_tiles * num_splits)
    pdl, pdl_kw = pdl_launch(device, "attn" if num_splits == 1 or fused else None)
    _paged_attn_kernel[grid](
        q_arg,
        k_cache,
        v_cache,
        out,
        part_out,
        part_lse,
        counters,
        query_start_loc,
        seq_lens,
        block_tables,
        scale * math.log2(math.e),
        *q_strides,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        *p_strides,
        *rope_args,
        HEAD_DIM=d,
        BLOCK_D=block_d,
        GROUP=h // hk,
        QT=cfg.queries_per_tile,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_SIZE=block_size,
        CAUSAL=bool(causal),
        WINDOW=int(sliding_window or 0),
        NUM_SPLITS=num_splits,
        FUSED_MERGE=fused,
        PRECISION=precision,
        UPCAST=device.type == "cpu" and dtype != torch.float32,  # CPU only runs under TRITON_INTERPRET=1
        PDL=pdl,
        num_warps=warps_setting("SPECSERVE_ATTN_WARPS", cfg.num_warps),
        num_stages=cfg.num_stages,
        **rope_const,
        **pdl_kw,
    )
    if num_splits > 1 and not fused:
        splits_pad = max(2, triton.next_power_of_2(num_splits))
        _merge_splits_kernel[(t, h)](
            part_out,
            part_lse,
            out,
            *p_strides,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=d,
            BLOCK_D=block_d,
            NUM_SPLITS=num_splits,
            SPLITS_PAD=splits_pad,
            PDL=pdl_launch(device, "merge")[0],
            num_warps=merge_warps(splits_pad * block_d),
            **pdl_kw,
        )
    return out
