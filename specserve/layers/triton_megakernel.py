"""A persistent one-launch decode step for a Qwen3-shaped target at batch 1 (issue #6, sessions 51-52). The engine
runs its batch-1 plain decode steps with it under ``SPECSERVE_MEGAKERNEL=1`` (:func:`use_megakernel`,
:func:`bind_model`; off by default: 1-1.7% faster than the engine's tuned kernels on the H100, not yet run on an H200,
its nn.Linear layout slows the engine's batched steps, and its spin waits need every program resident, which a GPU
shared through MPS may not grant).

Why: a one-row decode step of the 8B shape spends ~22 us a layer over its weights' read time on the H200 (session
49's chain profile): the ramps of the split-K GEMMs and the small kernels between them (attention, merge, norms,
SiLU-mul), during which the DRAM idles. Sessions 12-48 measured every way of keeping the weight stream going across
those kernel boundaries from separate kernels (L2 prefetch from side streams / the attention / a persistent
prefetcher, register read-ahead before the PDL wait, TMA staging) as slower or neutral. What remained untried is one
persistent kernel for the whole step: one program per SM walks a static list of work units, layer by layer,

* GEMV units of ``RB`` weight rows x ``H`` read in place from the engine's nn.Linear-layout tensors through a
  per-layer pointer table (fused qkv, o_proj, gate_up with a unit's gate rows and their up rows so that it ends in
  its own SiLU-mul, down_proj in ``I / H`` K chunks, the LM head), each program taking units ``pid, pid + G, ...`` of
  a phase; the units after the first stream through Triton's software pipeliner (``stages`` > 1: cp.async into
  shared memory, ``stages`` units deep; the default) or a register double buffer (``stages`` 1), and the first unit
  of the next phase is loaded (and ``l2_prefetch`` more prefetched into L2) before the program waits for that
  phase's input, so every program keeps its share of the weight stream in flight across the dependency;
* attention units per (KV head, context chunk of ``CH`` tokens) over the paged KV cache (the request's block
  table): the chunk's K / V (past rows, which no unit of this step writes) are loaded before the wait for qkv; after
  it the unit normalises q / k (Qwen3's q_norm / k_norm), applies RoPE (the engine's tables), stores the new row's
  K / V and writes a partial output and its log-sum-exp; the last unit of each KV head to finish (a counter per
  head) merges that head's chunks into one row that o_proj loads (``attn_merge``; with 0 every o_proj program
  merges all chunks itself, in a loop or with ``merge_splits`` in one load: slow at long contexts);
* dependencies as arrival counters (one int32 per layer and phase, zeroed before the launch): a program adds its
  unit count with release semantics after a CTA barrier; a consumer spins with acquire semantics until the phase's
  total arrived, then reads activations through L2 (``.cg``). The position comes from a device tensor: the launch
  can be captured in a CUDA graph.

The residual stream stays fp32 and is never materialised between layers: down_proj writes its ``I / H`` K-chunk
partials and each consumer sums ``h_mid + partials`` for the rows it needs. Every program of the grid must be
resident at once (the spin waits), so the grid is the SM count with one CTA per SM.

Numerics: bf16 weights and KV cache, fp32 activations and accumulation; q and the softmax weights enter the
attention's dots in bf16. :func:`reference_step` computes the same in torch (the test oracle; the engine's own
layers round activations to bf16 where HF does, so its tokens may differ from this kernel's at near-ties in bf16).

Measured (H100 80GB HBM3, benchmarks/megakernel_decode.py, 8B shape, random weights, batch 1; benchmarks/README.md
sessions 51-52): 5.813 ms a greedy step in the first form (session 51); with the paged cache, o_proj's residual rows
preloaded, one unit prefetched into L2 a phase and the attention chunks' merge unrolled 5.651 ms = 1.122x the floor
(session 52); inside the engine's decode graph 5.673-5.680 ms against the engine's default step 5.771-5.772 on the
same card (-1.7%, both orders); session 53, another H100, with the attention's own merge: 5.652 vs 5.708 ms at a
128-token context, 6.325 vs 6.384 at 1800 (o_proj's merge of every chunk had made it 6.844). gate_up and down_proj
stream at their floor; the attention (~5-7 us a layer) and the phases' hand-overs (~1-2.5 us each) are what
remains.

Runs under ``TRITON_INTERPRET=1`` with a grid of one program (which walks every unit in order, so no wait ever
spins); on the GPU with the SM count.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from specserve.config import ModelConfig

__all__ = ["MegaConfig", "MegaDecoder", "reference_step"]

# arrival counters per layer (``counters + layer * (5 + kv_heads) + k``): k = 0 qkv, 1 attention, 2 o_proj, 3 gate_up,
# 4 down units; 5 + h: KV head h's attention chunks done (``attn_merge``: the last one merges them)
NUM_PHASES = 5


@triton.jit
def _wait(ptr, target):
    c = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    while c < target:
        c = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _mm(a, b, UPCAST: tl.constexpr):
    # the interpreter keeps bf16 as uint16 bits and has no bf16 dot: the same (bf16-valued) operands in fp32
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _stamp(stamps, pid, layer, k, L: tl.constexpr, STAMP: tl.constexpr):
    # the global timer (ns) when this program's wait for phase k of ``layer`` returned (k < 5), the LM head ended
    # (k 5) or its units of phase k - 6 were done (k 6..10): where the step's time goes
    if STAMP:
        t = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False, pack=1
        )
        tl.store(stamps + (pid * (L + 1) + layer) * 12 + k, t)


@triton.jit
def _signal(ptr, n):
    tl.debug_barrier()
    tl.atomic_add(ptr, n, sem="release", scope="gpu")


# the pointer table's columns (one row per layer): the engine's own tensors, read in place
T_QKV, T_O, T_GU, T_DOWN, T_IN_NORM, T_POST_NORM, T_Q_NORM, T_K_NORM, T_K_CACHE, T_V_CACHE = range(10)
TABLE_COLS = 10


@triton.jit
def _ptr(table, layer, col: tl.constexpr):
    # torch's allocations are 256-byte aligned: the hint keeps the weight loads vectorised (16 bytes a thread)
    return tl.multiple_of(tl.load(table + layer * 10 + col).to(tl.pointer_type(tl.bfloat16)), 16)


@triton.jit
def _unit_rows(base, u, rows, H: tl.constexpr, I: tl.constexpr, RB: tl.constexpr, KIND: tl.constexpr):
    """Pointers to the starts of GEMV unit u's RB weight rows (each H elements long) in an nn.Linear [N, K] weight:
    KIND 0 rows u * RB.. of [N, H] (qkv, o_proj, LM head); 1 gate_up [2I, H]: gate rows u * RB/2.. then the up rows
    I + u * RB/2.. (the unit ends in its own SiLU-mul); 2 down_proj [H, I]: K chunk c = u * RB // H of rows
    u * RB % H.."""
    if KIND == 0:
        return base + (u * RB + rows) * H
    elif KIND == 1:
        RB2: tl.constexpr = RB // 2
        return base + tl.where(rows < RB2, u * RB2 + rows, I + u * RB2 + rows - RB2) * H
    else:
        c = (u * RB) // H
        return base + (u * RB - c * H + rows) * I + c * H


@triton.jit
def _load_unit(rowp, u, rows, cols, RB: tl.constexpr, N):
    # unit u's [RB, H] weights; rows past the phase's N (unit rows x units; the LM head's vocabulary) read as zero
    return tl.load(rowp[:, None] + cols[None, :], mask=(u * RB + rows < N)[:, None], other=0.0)


@triton.jit
def _gemv_phase(base, w, x, out, pid, G, n_units, rows, cols, H: tl.constexpr, I: tl.constexpr, RB: tl.constexpr,
                N: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    # out[:N] = W @ x over a plain [N, H] weight (qkv, the LM head): this program's units pid, pid + G, ..., its
    # first (``w``) loaded ahead; the rest streamed by the software pipeliner (STAGES > 1) or a register double
    # buffer. Rows are masked only where N is not a multiple of RB (a partial last unit)
    EXACT: tl.constexpr = N % RB == 0
    if STAGES > 1:
        if n_units > 0:
            acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            tl.store(out + pid * RB + rows, acc, mask=EXACT or pid * RB + rows < N)
        for i in tl.range(1, n_units, num_stages=STAGES):
            u = pid + i * G
            if EXACT:
                wi = tl.load(_unit_rows(base, u, rows, H, I, RB, 0)[:, None] + cols[None, :])
            else:
                wi = _load_unit(_unit_rows(base, u, rows, H, I, RB, 0), u, rows, cols, RB, N)
            acc = tl.sum(wi.to(tl.float32) * x[None, :], axis=1)
            tl.store(out + u * RB + rows, acc, mask=EXACT or u * RB + rows < N)
    else:
        for i in range(n_units):
            u = pid + i * G
            un = u + G
            wn = _load_unit(_unit_rows(base, un, rows, H, I, RB, 0), un, rows, cols, RB, N)
            acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            tl.store(out + u * RB + rows, acc, mask=EXACT or u * RB + rows < N)
            w = wn


@triton.jit
def _l2_prefetch(rowp, cols64):
    # one prefetch per 128-byte line of a unit's rows (64 bf16 a line)
    lines = rowp[:, None] + cols64[None, :] * 64
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;",
        "=r,l",
        [lines],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _prefetch_units(base, pid, G, U, rows, cols64, H: tl.constexpr, I: tl.constexpr, RB: tl.constexpr,
                    KIND: tl.constexpr, PF: tl.constexpr):  # fmt: skip
    # units 1..PF of this program's share of a phase into L2 (unit 0 is in registers already)
    for j in tl.static_range(PF):
        u = pid + (j + 1) * G
        if u < U:
            _l2_prefetch(_unit_rows(base, u, rows, H, I, RB, KIND), cols64)


@triton.jit
def _silu_unit(w, x, r2, RB2: tl.constexpr):
    # a gate_up unit [RB, H] (RB/2 gate rows, then their RB/2 up rows) against x: silu(gate) * up, [RB/2]
    acc = tl.reshape(tl.sum(w.to(tl.float32) * x[None, :], axis=1), [2, RB2])
    gate = tl.sum(tl.where(r2[:, None] == 0, acc, 0.0), axis=0)
    up = tl.sum(tl.where(r2[:, None] == 1, acc, 0.0), axis=0)
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _residual(h_mid, dpart, x0, layer, offs, H: tl.constexpr, C: tl.constexpr, mask):
    """Rows ``offs`` of layer ``layer``'s input residual: the embedding at layer 0, else the previous layer's
    h_mid plus its C down_proj partials."""
    if layer == 0:
        r = tl.load(x0 + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        pl = layer - 1
        r = tl.load(h_mid + pl * H + offs, mask=mask, other=0.0, cache_modifier=".cg")
        for c in tl.static_range(C):
            r += tl.load(dpart + (pl * C + c) * H + offs, mask=mask, other=0.0, cache_modifier=".cg")
    return r


@triton.jit
def _kv_rows(cache, block_table, tpos, kvh, valid, NKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr):
    # row starts of positions ``tpos`` of KV head ``kvh`` in a paged cache [blocks, BS, NKV, D]
    blk = tl.load(block_table + tpos // BS, mask=valid, other=0)
    return cache + ((blk * BS + tpos % BS) * NKV + kvh) * D  # int32 offsets: a layer's cache < 2**31 elements


@triton.jit
def _load_kv(k_cache, v_cache, block_table, tpos, kvh, past, d_h, NKV: tl.constexpr, D: tl.constexpr,
             BS: tl.constexpr):  # fmt: skip
    # a chunk's past K / V rows of one KV head, each split in its two rotary halves: [CH, D/2] x 4 (zero elsewhere)
    krow = _kv_rows(k_cache, block_table, tpos, kvh, past, NKV, D, BS)
    vrow = _kv_rows(v_cache, block_table, tpos, kvh, past, NKV, D, BS)
    HD: tl.constexpr = D // 2
    m = past[:, None]
    ka = tl.load(krow[:, None] + d_h[None, :], mask=m, other=0.0)
    kb = tl.load(krow[:, None] + HD + d_h[None, :], mask=m, other=0.0)
    va = tl.load(vrow[:, None] + d_h[None, :], mask=m, other=0.0)
    vb = tl.load(vrow[:, None] + HD + d_h[None, :], mask=m, other=0.0)
    return ka, kb, va, vb


@triton.jit
def _merge_heads(
    att_o, att_lse, kvh, S, NH: tl.constexpr, GQ: tl.constexpr, D: tl.constexpr, AM: tl.constexpr
):
    # query heads kvh * GQ .. + GQ: their S chunk partials (att_o [S, NH, D], att_lse [S, NH]) merged by log-sum-exp,
    # [GQ, D]; AM chunks a round (every load of a round issued before its math: one L2 round trip)
    r = tl.arange(0, AM * GQ)
    g = r % GQ
    dd = tl.arange(0, D)
    mx = tl.full([GQ], float("-inf"), tl.float32)
    den = tl.zeros([GQ], tl.float32)
    num = tl.zeros([GQ, D], tl.float32)
    for s0 in range(0, S, AM):
        sp = s0 + r // GQ
        row = sp * NH + kvh * GQ + g
        ok = sp < S
        lse = tl.reshape(tl.load(att_lse + row, mask=ok, other=float("-inf"), cache_modifier=".cg"), [AM, GQ])
        o = tl.load(att_o + row[:, None] * D + dd[None, :], mask=ok[:, None], other=0.0, cache_modifier=".cg")
        mn = tl.maximum(mx, tl.max(lse, axis=0))  # finite: chunk 0 is in the first round
        a = tl.exp(mx - mn)
        w = tl.exp(lse - mn[None, :])  # [AM, GQ], 0 past S
        num = num * a[:, None] + tl.sum(tl.reshape(o, [AM, GQ, D]) * w[:, :, None], axis=0)
        den = den * a + tl.sum(w, axis=0)
        mx = mn
    return num / den[:, None]


@triton.jit(do_not_specialize=["eps", "scale"])
def _mega_decode_kernel(
    table,  # int64 [L, 10]: per layer the addresses of qkv [NQKV,H], o [H,H], gate_up [2I,H], down [H,I] (bf16,
    # nn.Linear layout), input / post-attention norms [H], q / k norms [D], K / V caches [blocks, BS, NKV, D]
    wlm,  # [V, H] bf16 (HAS_LM)
    final_norm,  # [H] bf16
    block_table,  # int32: the request's blocks
    pos_ptr,  # int64 [1]: the new token's position (its K / V land there; it attends to 0..pos)
    cos_tab,
    sin_tab,  # fp32 [max_position, D] (rotate-half layout: the first D/2 columns are used)
    x0,  # [H]: the new token's embedding (bf16 or fp32)
    qkv_buf,
    att_o,
    att_lse,
    att_x,  # fp32 [NH, D]: the merged attention output (AM)
    h_mid,
    act,
    dpart,
    out,  # HAS_LM: fp32 logits [V]; else the final-normed hidden state [H] (its dtype)
    counters,
    stamps,
    eps,
    scale,
    L: tl.constexpr,
    H: tl.constexpr,
    NH: tl.constexpr,
    NKV: tl.constexpr,
    D: tl.constexpr,
    I: tl.constexpr,
    V: tl.constexpr,
    CH: tl.constexpr,
    RB: tl.constexpr,
    BS: tl.constexpr,
    PF: tl.constexpr,
    UPCAST: tl.constexpr,
    STAMP: tl.constexpr,
    STAGES: tl.constexpr,
    SP: tl.constexpr,
    PFO: tl.constexpr,
    HAS_LM: tl.constexpr,
    OPAD: tl.constexpr,  # > 0: o_proj's residual rows preloaded, for up to this many units a program (a power of 2)
    AM: tl.constexpr,  # > 0: each KV head's last attention unit merges its chunks, AM a round (o_proj loads one row)
):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    C: tl.constexpr = I // H
    NCNT: tl.constexpr = 5 + NKV  # arrival counters a layer: one a phase, one a KV head
    GQ: tl.constexpr = NH // NKV
    HD: tl.constexpr = D // 2
    NQKV: tl.constexpr = (NH + 2 * NKV) * D
    U_QKV: tl.constexpr = NQKV // RB
    U_O: tl.constexpr = H // RB
    U_GU: tl.constexpr = 2 * I // RB
    U_DN: tl.constexpr = C * (H // RB)
    U_LM: tl.constexpr = (V + RB - 1) // RB
    RB2: tl.constexpr = RB // 2
    rows = tl.arange(0, RB)
    cols = tl.arange(0, H)
    pf_cols = tl.arange(0, H // 64)
    r2 = tl.arange(0, 2)
    r4 = tl.arange(0, RB2)
    pos = tl.load(pos_ptr).to(tl.int32)
    S = pos // CH + 1  # attention chunks
    NT = NKV * S  # attention units

    # the first qkv unit of layer 0 (the prefetch that every later phase does at the end of the one before)
    w = _load_unit(_unit_rows(_ptr(table, 0, 0), pid, rows, H, I, RB, 0), pid, rows, cols, RB, NQKV)
    for layer in range(L):
        p_qkv = _ptr(table, layer, 0)
        p_o = _ptr(table, layer, 1)
        p_gu = _ptr(table, layer, 2)
        p_dn = _ptr(table, layer, 3)
        k_cache = _ptr(table, layer, 8)
        v_cache = _ptr(table, layer, 9)
        # ---------------- qkv: x = rmsnorm(residual) ----------------
        n_units = (U_QKV - pid + G - 1) // G
        _prefetch_units(p_qkv, pid, G, U_QKV, rows, pf_cols, H, I, RB, 0, PF)
        if layer > 0:
            _wait(counters + (layer - 1) * NCNT + 4, U_DN)
        _stamp(stamps, pid, layer, 0, L, STAMP)
        r = _residual(h_mid, dpart, x0, layer, cols, H, C, cols < H)
        inv = 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / H + eps)
        x = r * inv * tl.load(_ptr(table, layer, 4) + cols).to(tl.float32)
        _gemv_phase(p_qkv, w, x, qkv_buf + layer * NQKV, pid, G, n_units, rows, cols, H, I, RB, NQKV, STAGES)
        _stamp(stamps, pid, layer, 6, L, STAMP)
        # ---------------- attention units: (kv head, chunk) ----------------
        d_h = tl.arange(0, HD)
        tok = tl.arange(0, CH)
        g16 = tl.arange(0, 16)
        t = pid
        kvh = t % NKV
        ch = t // NKV
        tpos = ch * CH + tok
        past = (tpos < pos) & (tok * 0 + t < NT)
        ka, kb, va, vb = _load_kv(k_cache, v_cache, block_table, tpos, kvh, past, d_h, NKV, D, BS)
        _signal(counters + layer * NCNT + 0, n_units)
        if pid < NT:
            _wait(counters + layer * NCNT + 0, U_QKV)
            _stamp(stamps, pid, layer, 1, L, STAMP)
            for tt in range(pid, NT, G):
                kvh = tt % NKV
                ch = tt // NKV
                tpos = ch * CH + tok
                if tt != pid:  # more attention units than programs (the interpreter's grid of one): load here
                    past = tpos < pos
                    ka, kb, va, vb = _load_kv(k_cache, v_cache, block_table, tpos, kvh, past, d_h, NKV, D, BS)
                qb = qkv_buf + layer * NQKV
                qrow = (kvh * GQ + g16)[:, None] * D
                qmask = (g16 < GQ)[:, None]
                qa = tl.load(qb + qrow + d_h[None, :], mask=qmask, other=0.0, cache_modifier=".cg")
                qbb = tl.load(qb + qrow + HD + d_h[None, :], mask=qmask, other=0.0, cache_modifier=".cg")
                ko = qb + NH * D + kvh * D
                vo = qb + (NH + NKV) * D + kvh * D
                kna = tl.load(ko + d_h, cache_modifier=".cg")
                knb = tl.load(ko + HD + d_h, cache_modifier=".cg")
                vna = tl.load(vo + d_h, cache_modifier=".cg")
                vnb = tl.load(vo + HD + d_h, cache_modifier=".cg")
                # q / k RMSNorm over the head, then RoPE (rotate-half form)
                p_qn = _ptr(table, layer, 6)
                p_kn = _ptr(table, layer, 7)
                qn_a = tl.load(p_qn + d_h).to(tl.float32)
                qn_b = tl.load(p_qn + HD + d_h).to(tl.float32)
                kn_a = tl.load(p_kn + d_h).to(tl.float32)
                kn_b = tl.load(p_kn + HD + d_h).to(tl.float32)
                qi = 1.0 / tl.sqrt((tl.sum(qa * qa, axis=1) + tl.sum(qbb * qbb, axis=1)) / D + eps)
                qa = qa * qi[:, None] * qn_a[None, :]
                qbb = qbb * qi[:, None] * qn_b[None, :]
                ki = 1.0 / tl.sqrt((tl.sum(kna * kna, axis=0) + tl.sum(knb * knb, axis=0)) / D + eps)
                kna = kna * ki * kn_a
                knb = knb * ki * kn_b
                cs = tl.load(cos_tab + pos * D + d_h)
                sn = tl.load(sin_tab + pos * D + d_h)
                qra = qa * cs[None, :] - qbb * sn[None, :]
                qrb = qbb * cs[None, :] + qa * sn[None, :]
                kra = kna * cs - knb * sn
                krb = knb * cs + kna * sn
                own = (pos >= ch * CH) & (pos < ch * CH + CH)
                if own:
                    blk = tl.load(block_table + pos // BS)
                    noff = ((blk * BS + pos % BS) * NKV + kvh) * D
                    tl.store(k_cache + noff + d_h, kra.to(tl.bfloat16))
                    tl.store(k_cache + noff + HD + d_h, krb.to(tl.bfloat16))
                    tl.store(v_cache + noff + d_h, vna.to(tl.bfloat16))
                    tl.store(v_cache + noff + HD + d_h, vnb.to(tl.bfloat16))
                q16a = qra.to(tl.bfloat16)
                q16b = qrb.to(tl.bfloat16)
                s = _mm(q16a, tl.trans(ka), UPCAST) + _mm(q16b, tl.trans(kb), UPCAST)  # [16, CH]
                s = tl.where((tpos < pos)[None, :], s * scale, float("-inf"))
                kra16 = kra.to(tl.bfloat16).to(tl.float32)
                krb16 = krb.to(tl.bfloat16).to(tl.float32)
                s_new = (
                    tl.sum(q16a.to(tl.float32) * kra16[None, :], axis=1)
                    + tl.sum(q16b.to(tl.float32) * krb16[None, :], axis=1)
                ) * scale
                s_new = tl.where(own, s_new, float("-inf"))
                m = tl.maximum(tl.max(s, axis=1), s_new)
                p = tl.exp(s - m[:, None])
                p_new = tl.exp(s_new - m)
                lsum = tl.sum(p, axis=1) + p_new
                p16 = p.to(tl.bfloat16)
                vna16 = vna.to(tl.bfloat16).to(tl.float32)
                vnb16 = vnb.to(tl.bfloat16).to(tl.float32)
                oa = _mm(p16, va, UPCAST) + p_new[:, None] * vna16[None, :]
                ob = _mm(p16, vb, UPCAST) + p_new[:, None] * vnb16[None, :]
                oa = oa / lsum[:, None]
                ob = ob / lsum[:, None]
                heads = kvh * GQ + g16
                hmask = g16 < GQ
                # one attention buffer for all layers: layer l + 1's attention starts after layer l's o_proj
                if AM > 0 and S == 1:  # the only chunk: the merged output
                    obase = att_x + heads[:, None] * D
                else:
                    obase = att_o + (ch * NH + heads)[:, None] * D
                tl.store(obase + d_h[None, :], oa, mask=hmask[:, None])
                tl.store(obase + HD + d_h[None, :], ob, mask=hmask[:, None])
                tl.store(att_lse + ch * NH + heads, m + tl.log(lsum), mask=hmask)
                # the head's last chunk to finish merges all of them (acq_rel: it sees the others' partials)
                if AM > 0 and S > 1:
                    tl.debug_barrier()
                    done = tl.atomic_add(counters + layer * NCNT + 5 + kvh, 1, sem="acq_rel", scope="gpu")
                    tl.debug_barrier()
                    if done == S - 1:
                        gq = tl.arange(0, GQ)
                        tl.store(
                            att_x + (kvh * GQ + gq)[:, None] * D + tl.arange(0, D)[None, :],
                            _merge_heads(att_o, att_lse, kvh, S, NH, GQ, D, AM),
                        )
            _stamp(stamps, pid, layer, 7, L, STAMP)
            _signal(counters + layer * NCNT + 1, (NT - pid + G - 1) // G)
        # o_proj's weights into L2 while the attention runs (the DRAM would idle through it); after the qkv signal
        # (issued before it, the prefetches held the signal back ~8 us a layer: session 52)
        _prefetch_units(p_o, pid, G, U_O, rows, pf_cols, H, I, RB, 0, PFO)
        # the first o_proj unit (for the attention's programs after it: its registers were the K / V tiles')
        w = _load_unit(_unit_rows(p_o, pid, rows, H, I, RB, 0), pid, rows, cols, RB, H)
        # ---------------- o_proj: x = merged attention; out + residual -> h_mid ----------------
        n_units = (U_O - pid + G - 1) // G
        _prefetch_units(p_o, pid, G, U_O, rows, pf_cols, H, I, RB, 0, PF)
        if OPAD > 0:  # the residual rows of all this program's units in registers (no L2 round trip a unit)
            iv = tl.arange(0, OPAD)
            roffs = (pid + iv * G)[:, None] * RB + rows[None, :]
            res_all = _residual(h_mid, dpart, x0, layer, roffs, H, C, roffs < H)
            rres = tl.sum(tl.where(iv[:, None] == 0, res_all, 0.0), axis=0)
        else:
            rres = _residual(h_mid, dpart, x0, layer, pid * RB + rows, H, C, pid * RB + rows < H)
        _wait(counters + layer * NCNT + 1, NT)
        _stamp(stamps, pid, layer, 2, L, STAMP)
        hh = tl.arange(0, NH)
        dd = tl.arange(0, D)
        if AM > 0:  # merged by the attention's last units
            x = tl.load(att_x + cols, cache_modifier=".cg")
        elif S <= SP:  # the splits unrolled: every partial's load issued before the math (one L2 round trip)
            sp = tl.arange(0, SP)
            lse = tl.load(
                att_lse + sp[:, None] * NH + hh[None, :],
                mask=(sp < S)[:, None],
                other=float("-inf"),
                cache_modifier=".cg",
            )
            mx = tl.max(lse, axis=0)
            wgt = tl.exp(lse - mx[None, :])  # [SP, NH], 0 past S
            den = tl.sum(wgt, axis=0)
            num = tl.zeros([NH, D], tl.float32)
            for j in tl.static_range(SP):
                oj = tl.load(
                    att_o + (j * NH + hh)[:, None] * D + dd[None, :],
                    mask=hh[:, None] * 0 + dd[None, :] * 0 + j < S,
                    other=0.0,
                    cache_modifier=".cg",
                )
                wj = tl.sum(tl.where(sp[:, None] == j, wgt, 0.0), axis=0)
                num += oj * wj[:, None]
            x = tl.reshape(num / den[:, None], [H])
        else:  # one chunk a round, every head
            x = tl.reshape(_merge_heads(att_o, att_lse, 0, S, NH, NH, D, 1), [H])
        if STAGES > 1:
            if n_units > 0:
                acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
                tl.store(h_mid + layer * H + pid * RB + rows, acc + rres)
            for i in tl.range(1, n_units, num_stages=STAGES):
                u = pid + i * G
                wi = tl.load(_unit_rows(p_o, u, rows, H, I, RB, 0)[:, None] + cols[None, :])
                if OPAD > 0:
                    ri = tl.sum(tl.where(iv[:, None] == i, res_all, 0.0), axis=0)
                else:
                    ri = _residual(h_mid, dpart, x0, layer, u * RB + rows, H, C, u * RB + rows < H)
                acc = tl.sum(wi.to(tl.float32) * x[None, :], axis=1)
                tl.store(h_mid + layer * H + u * RB + rows, acc + ri)
        else:
            for i in range(n_units):
                u = pid + i * G
                un = u + G
                wn = _load_unit(_unit_rows(p_o, un, rows, H, I, RB, 0), un, rows, cols, RB, H)
                if OPAD > 0:
                    rn = tl.sum(tl.where(iv[:, None] == i + 1, res_all, 0.0), axis=0)
                else:
                    rn = _residual(h_mid, dpart, x0, layer, un * RB + rows, H, C, un * RB + rows < H)
                acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
                tl.store(h_mid + layer * H + u * RB + rows, acc + rres)
                w = wn
                rres = rn
        # the first gate_up unit
        w = _load_unit(_unit_rows(p_gu, pid, rows, H, I, RB, 1), pid, rows, cols, RB, 2 * I)
        _stamp(stamps, pid, layer, 8, L, STAMP)
        _signal(counters + layer * NCNT + 2, n_units)
        # ---------------- gate_up + SiLU-mul: x = rmsnorm(h_mid) ----------------
        n_units = (U_GU - pid + G - 1) // G
        _prefetch_units(p_gu, pid, G, U_GU, rows, pf_cols, H, I, RB, 1, PF)
        _wait(counters + layer * NCNT + 2, U_O)
        _stamp(stamps, pid, layer, 3, L, STAMP)
        hm = tl.load(h_mid + layer * H + cols, cache_modifier=".cg")
        inv = 1.0 / tl.sqrt(tl.sum(hm * hm, axis=0) / H + eps)
        x = hm * inv * tl.load(_ptr(table, layer, 5) + cols).to(tl.float32)
        if STAGES > 1:
            if n_units > 0:
                tl.store(act + layer * I + pid * RB2 + r4, _silu_unit(w, x, r2, RB2))
            for i in tl.range(1, n_units, num_stages=STAGES):
                u = pid + i * G
                wi = tl.load(_unit_rows(p_gu, u, rows, H, I, RB, 1)[:, None] + cols[None, :])
                tl.store(act + layer * I + u * RB2 + r4, _silu_unit(wi, x, r2, RB2))
        else:
            for i in range(n_units):
                u = pid + i * G
                un = u + G
                wn = _load_unit(_unit_rows(p_gu, un, rows, H, I, RB, 1), un, rows, cols, RB, 2 * I)
                tl.store(act + layer * I + u * RB2 + r4, _silu_unit(w, x, r2, RB2))
                w = wn
        # the first down unit: K chunk c = u * RB // H, rows u * RB % H..
        w = _load_unit(_unit_rows(p_dn, pid, rows, H, I, RB, 2), pid, rows, cols, RB, C * H)
        _stamp(stamps, pid, layer, 9, L, STAMP)
        _signal(counters + layer * NCNT + 3, n_units)
        # ---------------- down_proj: K chunks of H, partials to dpart[layer, c] ----------------
        n_units = (U_DN - pid + G - 1) // G
        _prefetch_units(p_dn, pid, G, U_DN, rows, pf_cols, H, I, RB, 2, PF)
        _wait(counters + layer * NCNT + 3, U_GU)
        _stamp(stamps, pid, layer, 4, L, STAMP)
        c0 = (pid * RB) // H
        xa = tl.load(act + layer * I + c0 * H + cols, mask=c0 * H + cols < I, other=0.0, cache_modifier=".cg")
        if STAGES > 1:
            if n_units > 0:
                acc = tl.sum(w.to(tl.float32) * xa[None, :], axis=1)
                tl.store(dpart + layer * C * H + pid * RB + rows, acc)
            for i in tl.range(1, n_units, num_stages=STAGES):
                u = pid + i * G
                wi = tl.load(_unit_rows(p_dn, u, rows, H, I, RB, 2)[:, None] + cols[None, :])
                xi = tl.load(act + layer * I + ((u * RB) // H) * H + cols, cache_modifier=".cg")
                acc = tl.sum(wi.to(tl.float32) * xi[None, :], axis=1)
                tl.store(dpart + layer * C * H + u * RB + rows, acc)
        else:
            for i in range(n_units):
                u = pid + i * G
                un = u + G
                wn = _load_unit(_unit_rows(p_dn, un, rows, H, I, RB, 2), un, rows, cols, RB, C * H)
                cn = (un * RB) // H
                xn = tl.load(
                    act + layer * I + cn * H + cols, mask=cn * H + cols < I, other=0.0, cache_modifier=".cg"
                )
                acc = tl.sum(w.to(tl.float32) * xa[None, :], axis=1)
                # u * RB = c * H + row: dpart[layer, c, row] sits at layer * C * H + u * RB
                tl.store(dpart + layer * C * H + u * RB + rows, acc)
                w = wn
                xa = xn
        # the first unit of the next layer's qkv (or the LM head)
        if layer + 1 < L:
            w = _load_unit(
                _unit_rows(_ptr(table, layer + 1, 0), pid, rows, H, I, RB, 0), pid, rows, cols, RB, NQKV
            )
        elif HAS_LM:
            w = _load_unit(_unit_rows(wlm, pid, rows, H, I, RB, 0), pid, rows, cols, RB, V)
        _stamp(stamps, pid, layer, 10, L, STAMP)
        _signal(counters + layer * NCNT + 4, n_units)
    # ---------------- final norm (+ LM head) ----------------
    _wait(counters + (L - 1) * NCNT + 4, U_DN)
    _stamp(stamps, pid, L, 0, L, STAMP)
    r = _residual(h_mid, dpart, x0, L, cols, H, C, cols < H)
    inv = 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / H + eps)
    x = r * inv * tl.load(final_norm + cols).to(tl.float32)
    if HAS_LM:
        _gemv_phase(wlm, w, x, out, pid, G, (U_LM - pid + G - 1) // G, rows, cols, H, I, RB, V, STAGES)
    elif pid == 0:
        tl.store(out + cols, x.to(out.dtype.element_ty))
    _stamp(stamps, pid, L, 5, L, STAMP)


@dataclass(frozen=True)
class MegaConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_tokens: int = 2048
    chunk: int = 128  # context tokens an attention unit covers
    rows: int = 4  # weight rows a GEMV unit covers (session 51, H100: 4 beat 8 and 2)
    warps: int = 8
    # > 1: the units after each phase's first streamed by Triton's software pipeliner (cp.async), this many deep;
    # 1: a register double buffer (session 51, H100: 3 stages 5.81 ms a step, 4 stages 5.84, 1 stage 7.11)
    stages: int = 3
    # with ``attn_merge`` 0: o_proj merges up to this many attention chunks unrolled, every load issued up front (a
    # power of 2; 0: a loop over them, one L2 round trip each; longer contexts take the loop). Session 52, H100:
    # o_proj 18.7 -> 14.6 us a layer at 2-3 chunks, 5.724 -> 5.651 ms a step (a single 3-D load of 4 had been
    # slower, 6.428 vs 5.839)
    merge_splits: int = 4
    # units beyond the first that a program prefetches into L2 at each phase's start (session 52, H100, with
    # res_preload: 1 5.667 ms a step, 0 5.748, 2 5.766, 4 6.018)
    l2_prefetch: int = 1
    # o_proj units beyond the first that a program prefetches into L2 once its qkv units are done, so that the
    # DRAM streams o_proj's weights through the attention (session 52, H100: o_proj -3 us a layer, the attention's
    # start +5..8 us: slower in both placements, before and after the qkv signal)
    o_prefetch: int = 0
    # o_proj's residual rows for all of a program's units loaded before its wait, not one L2 round trip a unit
    # (session 52, H100: o_proj 22.3 -> 19.5 us a layer, 5.834 -> 5.749 ms a step)
    res_preload: int = 1
    # > 0: each KV head's last attention unit to finish merges its chunks' partials (this many a round, a power of
    # 2) and o_proj loads the merged row, instead of every o_proj program merging all chunks itself (0; then
    # ``merge_splits`` applies). Session 53, H100, in the engine: 1800-token context 6.844 -> 6.325 ms a step (the
    # engine's own kernels 6.384), 128 tokens 5.650 -> 5.652
    attn_merge: int = 8

    @staticmethod
    def from_hf(cfg, **kw) -> MegaConfig:  # type: ignore[no-untyped-def]
        """From an HF config, for :class:`MegaDecoder`, whose RoPE tables are the default ones (the engine's
        :func:`bind_model` passes its own tables, any scaling)."""
        mc = ModelConfig.from_hf(cfg)
        if mc.rope_scaling is not None:
            raise ValueError(f"the megakernel computes the default RoPE only, not {mc.rope_scaling}")
        return config_for(mc, **kw)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_shapes(cfg: MegaConfig) -> None:
    """Raise ValueError where the kernel cannot run ``cfg``'s shapes."""
    h, i = cfg.hidden, cfg.intermediate
    if i % h:
        raise ValueError(f"the megakernel needs intermediate_size % hidden_size == 0, got {i} / {h}")
    if cfg.heads * cfg.head_dim != h:
        raise ValueError("the megakernel needs heads * head_dim == hidden_size")
    if not all(_pow2(n) for n in (h, cfg.head_dim, cfg.heads, cfg.chunk)) or h < 64:
        raise ValueError("the megakernel needs power-of-2 hidden size (>= 64), head_dim, heads and chunk")
    if cfg.attn_merge and not _pow2(cfg.attn_merge):
        raise ValueError("attn_merge: a power of 2 (chunks merged a round) or 0")
    if cfg.heads % cfg.kv_heads or cfg.heads // cfg.kv_heads > 16:
        raise ValueError("at most 16 query heads per KV head")
    if cfg.rows % 2 or (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim % cfg.rows or h % cfg.rows:
        raise ValueError("an even unit row count that divides every projection's rows")


class MegaKernel:
    """One batch-1 decode stream's launch state over given tensors (the engine's parameters and paged KV caches, or
    :class:`MegaDecoder`'s): the pointer table, the scratch buffers and the arrival counters. The tensors must
    outlive it and stay where they are (the table holds their addresses).

    ``layers[i]``: ``qkv`` [(heads + 2 kv_heads) * head_dim, H], ``o`` [H, H], ``gate_up`` [2I, H] (gate rows then up
    rows), ``down`` [H, I] (bf16, nn.Linear's layout, contiguous), ``in_norm`` / ``post_norm`` [H], ``q_norm`` /
    ``k_norm`` [head_dim]; ``k_caches[i]`` / ``v_caches[i]`` [blocks, block_size, kv_heads, head_dim] bf16;
    ``cos`` / ``sin`` fp32 [max_position, head_dim] (rotate-half layout; the first head_dim / 2 columns are read);
    ``lm_head`` [V, H] or None (then :meth:`launch` writes the final-normed hidden state instead of logits)."""

    def __init__(
        self,
        cfg: MegaConfig,
        layers: list[dict[str, torch.Tensor]],
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        final_norm: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lm_head: torch.Tensor | None,
        max_tokens: int,
    ) -> None:
        check_shapes(cfg)
        h, i, d = cfg.hidden, cfg.intermediate, cfg.head_dim
        nqkv = (cfg.heads + 2 * cfg.kv_heads) * d
        shapes = {
            "qkv": (nqkv, h),
            "o": (h, h),
            "gate_up": (2 * i, h),
            "down": (h, i),
            "in_norm": (h,),
            "post_norm": (h,),
            "q_norm": (d,),
            "k_norm": (d,),
        }
        if len(layers) != cfg.layers or len(k_caches) != cfg.layers or len(v_caches) != cfg.layers:
            raise ValueError(f"{cfg.layers} layers and caches expected")
        if lm_head is not None and tuple(lm_head.shape) != (cfg.vocab, h):
            raise ValueError(f"lm_head {tuple(lm_head.shape)}, want {(cfg.vocab, h)}")
        block_size = k_caches[0].shape[1]
        rows = []
        for n, ly in enumerate(layers):
            for name, shape in shapes.items():
                t = ly[name]
                if tuple(t.shape) != shape or t.dtype != torch.bfloat16 or not t.is_contiguous():
                    raise ValueError(
                        f"layer {n} {name}: {tuple(t.shape)} {t.dtype}, want {shape} bf16 contiguous"
                    )
            for c in (k_caches[n], v_caches[n]):
                if (
                    c.dim() != 4
                    or tuple(c.shape[1:]) != (block_size, cfg.kv_heads, d)
                    or c.dtype != torch.bfloat16
                    or not c.is_contiguous()
                ):
                    raise ValueError(f"layer {n}: a KV cache of {tuple(c.shape)} {c.dtype}")
                if c.numel() >= 2**31:  # the attention's offsets within a layer's cache are int32
                    raise ValueError(
                        f"layer {n}: a KV cache of {c.numel()} elements (the kernel's limit: 2**31)"
                    )
            rows.append([ly[k].data_ptr() for k in shapes] + [k_caches[n].data_ptr(), v_caches[n].data_ptr()])
        self.cfg = cfg
        self.device = device = final_norm.device
        self.block_size = block_size
        self.table = torch.tensor(rows, dtype=torch.int64, device=device)
        self.keep = (layers, k_caches, v_caches)  # the table's tensors
        self.final_norm, self.cos, self.sin, self.lm_head = final_norm, cos, sin, lm_head
        self.max_tokens = max_tokens
        smax = -(-max_tokens // cfg.chunk)
        L = cfg.layers
        f32 = dict(dtype=torch.float32, device=device)
        self.qkv = torch.zeros(L, nqkv, **f32)
        self.att_o = torch.zeros(smax, cfg.heads, d, **f32)
        self.att_lse = torch.zeros(smax, cfg.heads, **f32)
        self.h_mid = torch.zeros(L, h, **f32)
        self.act = torch.zeros(L, i, **f32)
        self.dpart = torch.zeros(L, i // h, h, **f32)
        self.att_x = torch.zeros(cfg.heads, d, **f32)
        self.counters = torch.zeros(L, NUM_PHASES + cfg.kv_heads, dtype=torch.int32, device=device)
        if device.type == "cuda":
            self.grid = torch.cuda.get_device_properties(device).multi_processor_count
        else:
            self.grid = 1
        self.stamps = torch.zeros(self.grid, L + 1, 12, dtype=torch.int64, device=device)
        on_cuda = device.type == "cuda"
        self.scale = 1.0 / math.sqrt(d)
        # the launch's compile-time arguments, fixed by the config and the device (the prefetches: CUDA only)
        self.constants = dict(
            L=L,
            H=h,
            NH=cfg.heads,
            NKV=cfg.kv_heads,
            D=d,
            I=i,
            V=cfg.vocab,
            CH=cfg.chunk,
            RB=cfg.rows,
            BS=block_size,
            PF=cfg.l2_prefetch if on_cuda else 0,
            UPCAST=not on_cuda,
            STAGES=cfg.stages,
            SP=max(1, cfg.merge_splits),
            PFO=cfg.o_prefetch if on_cuda else 0,
            HAS_LM=lm_head is not None,
            OPAD=triton.next_power_of_2(-(-(h // cfg.rows) // self.grid)) if cfg.res_preload else 0,
            AM=cfg.attn_merge,
            num_warps=cfg.warps,
            num_stages=1,
        )

    def launch(
        self,
        x0: torch.Tensor,
        position: torch.Tensor,
        block_table: torch.Tensor,
        out: torch.Tensor,
        stamp: bool = False,
    ) -> torch.Tensor:
        """One decode step of the token embedded as ``x0`` [H] at ``position`` (a device int64 tensor: its first
        element, below ``max_tokens``), the request's blocks ``block_table`` (int32). ``out``: fp32 logits [V] with
        an LM head, else the final-normed hidden state [H]. Asynchronous and graph-capturable (no host reads).
        ``stamp`` (CUDA only) records in :attr:`stamps` [grid, layers + 1, 12] the global timer when each program's
        wait for each phase returned (0-4), the LM head ended (5) and its units of each phase were done (6-10)."""
        self.counters.zero_()
        _mega_decode_kernel[(self.grid,)](
            self.table,
            self.lm_head if self.lm_head is not None else self.final_norm,
            self.final_norm,
            block_table,
            position,
            self.cos,
            self.sin,
            x0,
            self.qkv,
            self.att_o,
            self.att_lse,
            self.att_x,
            self.h_mid,
            self.act,
            self.dpart,
            out,
            self.counters,
            self.stamps,
            self.cfg.eps,
            self.scale,
            STAMP=stamp,
            **self.constants,
        )
        return out


class MegaDecoder:
    """A self-contained batch-1 decode stream for tests and benchmarks: weights from :meth:`pack`, its own paged
    KV caches (``block_table``: the blocks in the order positions use them; default 0, 1, 2, ...), RoPE tables and
    the LM head in the kernel; :meth:`launch` runs one token and returns its logits."""

    def __init__(
        self,
        cfg: MegaConfig,
        weights: dict,  # type: ignore[type-arg]
        device: torch.device,
        block_size: int = 16,
        block_table: list[int] | None = None,
    ) -> None:
        check_shapes(cfg)
        self.cfg = cfg
        self.device = device
        self.w = weights
        L, d = cfg.layers, cfg.head_dim
        nblocks = -(-cfg.max_tokens // block_size)
        order = list(range(nblocks)) if block_table is None else list(block_table)
        if sorted(order) != list(range(nblocks)):
            raise ValueError(f"block_table must be a permutation of 0..{nblocks - 1}")
        self.block_size = block_size
        self.block_table = torch.tensor(order, dtype=torch.int32, device=device)
        shape = (nblocks, block_size, cfg.kv_heads, d)
        self.k_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(L)]
        self.v_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(L)]
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d // 2, dtype=torch.float64) * 2 / d))
        ang = torch.arange(cfg.max_tokens, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], 1)
        f32 = dict(dtype=torch.float32, device=device)
        self.kernel = MegaKernel(
            cfg,
            weights["layers"],
            self.k_caches,
            self.v_caches,
            weights["final_norm"],
            ang.cos().to(**f32).contiguous(),
            ang.sin().to(**f32).contiguous(),
            weights["lm_head"],
            cfg.max_tokens,
        )
        self.x0 = torch.zeros(cfg.hidden, dtype=torch.bfloat16, device=device)
        self.position = torch.zeros(1, dtype=torch.int64, device=device)
        self.logits = torch.zeros(cfg.vocab, **f32)

    @property
    def stamps(self) -> torch.Tensor:
        return self.kernel.stamps

    def cache_rows(self, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ``pos``'s K and V rows of every layer: [L, kv_heads, head_dim] each."""
        blk = int(self.block_table[pos // self.block_size])
        off = pos % self.block_size
        return (
            torch.stack([c[blk, off] for c in self.k_caches]),
            torch.stack([c[blk, off] for c in self.v_caches]),
        )

    @staticmethod
    def pack(
        cfg: MegaConfig,
        layers: list[dict[str, torch.Tensor]],
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        final_norm: torch.Tensor,
    ) -> dict:  # type: ignore[type-arg]
        """HF-named per-layer weights ([out, in] nn.Linear layout) fused as the engine fuses them (q/k/v, gate/up)."""
        return {
            "layers": [
                {
                    "qkv": torch.cat([ly["q_proj"], ly["k_proj"], ly["v_proj"]], 0).contiguous(),
                    "o": ly["o_proj"].contiguous(),
                    "gate_up": torch.cat([ly["gate_proj"], ly["up_proj"]], 0).contiguous(),
                    "down": ly["down_proj"].contiguous(),
                    "in_norm": ly["input_layernorm"].contiguous(),
                    "post_norm": ly["post_attention_layernorm"].contiguous(),
                    "q_norm": ly["q_norm"].contiguous(),
                    "k_norm": ly["k_norm"].contiguous(),
                }
                for ly in layers
            ],
            "embed": embed,
            "lm_head": lm_head.contiguous(),
            "final_norm": final_norm.contiguous(),
        }

    def launch(self, token: torch.Tensor, pos: int, stamp: bool = False) -> torch.Tensor:
        """One decode step of ``token`` (a 0-d or 1-element int tensor on the device) at position ``pos``;
        returns the fp32 logits (a buffer reused by the next step)."""
        if pos >= self.cfg.max_tokens:
            raise ValueError(f"position {pos} beyond the cache's {self.cfg.max_tokens} tokens")
        self.x0.view(1, -1).copy_(torch.index_select(self.w["embed"], 0, token.reshape(1).long()))
        self.position.fill_(pos)
        return self.kernel.launch(self.x0, self.position, self.block_table, self.logits, stamp)


def reference_step(
    cfg: MegaConfig,
    w: dict[str, torch.Tensor],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    token: int,
    pos: int,
    trace: dict[str, list[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """The kernel's math in torch (fp32 activations, bf16 weights / KV cache, bf16 q and softmax weights in the
    attention's dots); updates ``k_cache`` / ``v_cache`` at ``pos``; returns fp32 logits. ``trace`` (a dict) collects
    each layer's qkv, h_mid and act vectors, to find the first that differs from the kernel's buffers."""
    nh, nkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    hd = d // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, dtype=torch.float64) * 2 / d))
    ang = float(pos) * inv
    cs, sn = ang.cos().float().to(k_cache.device), ang.sin().float().to(k_cache.device)

    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.eps) * g.float()

    def rope(x: torch.Tensor) -> torch.Tensor:
        a, b = x[..., :hd], x[..., hd:]
        return torch.cat([a * cs - b * sn, b * cs + a * sn], -1)

    r = w["embed"][token].float()
    gq = nh // nkv
    for layer in range(cfg.layers):
        ly = w["layers"][layer]
        x = rms(r, ly["in_norm"])
        qkv = ly["qkv"].float() @ x
        if trace is not None:
            trace.setdefault("qkv", []).append(qkv)
        q = qkv[: nh * d].view(nh, d)
        k = qkv[nh * d : (nh + nkv) * d].view(nkv, d)
        v = qkv[(nh + nkv) * d :].view(nkv, d)
        q = rope(rms(q, ly["q_norm"]))
        k = rope(rms(k, ly["k_norm"]))
        k_cache[layer, :, pos] = k.to(torch.bfloat16)
        v_cache[layer, :, pos] = v.to(torch.bfloat16)
        kk = k_cache[layer, :, : pos + 1].float()  # [nkv, T, d]
        vv = v_cache[layer, :, : pos + 1].float()
        qh = q.to(torch.bfloat16).float().view(nkv, gq, d)
        s = torch.einsum("kgd,ktd->kgt", qh, kk) / math.sqrt(d)
        p = torch.softmax(s, -1)
        # the kernel rounds the (unnormalised) softmax weights to bf16 per chunk; close enough for a tolerance
        o = torch.einsum("kgt,ktd->kgd", p, vv).reshape(nh * d)
        hm = ly["o"].float() @ o + r
        if trace is not None:
            trace.setdefault("h_mid", []).append(hm)
        xx = rms(hm, ly["post_norm"])
        gu = ly["gate_up"].float() @ xx
        a = torch.nn.functional.silu(gu[: cfg.intermediate]) * gu[cfg.intermediate :]
        if trace is not None:
            trace.setdefault("act", []).append(a)
        r = hm + ly["down"].float() @ a
    x = rms(r, w["final_norm"])
    return w["lm_head"].float() @ x


# ---------------------------------------------------------------------------------------------- the engine's use
MEGAKERNEL_ENV = "SPECSERVE_MEGAKERNEL"
# the kernel's knobs for the engine, ``rb=4,st=3,po=7,mg=4`` (benchmarks/megakernel_decode.py's variant keys)
MEGAKERNEL_OPTS_ENV = "SPECSERVE_MEGAKERNEL_OPTS"
OPT_KEYS = {
    "rb": "rows",
    "pf": "l2_prefetch",
    "ch": "chunk",
    "warps": "warps",
    "st": "stages",
    "mg": "merge_splits",
    "po": "o_prefetch",
    "rp": "res_preload",
    "am": "attn_merge",
}


def parse_opts(text: str) -> dict[str, int]:
    """``rb=4,po=7`` -> MegaConfig keyword arguments."""
    kw = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, _, v = part.partition("=")
        if k not in OPT_KEYS or not v.isdigit():
            raise ValueError(
                f"{MEGAKERNEL_OPTS_ENV}: expected key=N with keys {', '.join(OPT_KEYS)}, got {part!r}"
            )
        kw[OPT_KEYS[k]] = int(v)
    return kw


# ``auto``: on for CUDA targets the kernel supports (set from the GPU measurements, benchmarks/README.md)
AUTO_ON = False


def megakernel_mode() -> str:
    """``SPECSERVE_MEGAKERNEL``: ``0`` off, ``1`` on wherever the target's shapes allow (CUDA, or the Triton
    interpreter on CPU: tests; never with speculative decoding), ``auto`` (default) as :data:`AUTO_ON` says on
    CUDA."""
    v = os.environ.get(MEGAKERNEL_ENV, "").strip().lower() or "auto"
    if v not in ("0", "1", "auto"):
        raise ValueError(f"{MEGAKERNEL_ENV} must be 0, 1 or auto, got {v!r}")
    return v


def config_for(mc: ModelConfig, **kw: Any) -> MegaConfig:
    """The kernel's shapes for an engine target (RoPE comes from the engine's tables: any scaling)."""
    return MegaConfig(
        hidden=mc.hidden_size,
        heads=mc.num_attention_heads,
        kv_heads=mc.num_key_value_heads,
        head_dim=mc.head_dim,
        intermediate=mc.intermediate_size,
        layers=mc.num_hidden_layers,
        vocab=mc.vocab_size,
        eps=mc.rms_norm_eps,
        rope_theta=mc.rope_theta,
        **kw,
    )


def unsupported(mc: ModelConfig, dtype: torch.dtype) -> str | None:
    """Why the kernel cannot run this target's decode steps (None: it can)."""
    if dtype != torch.bfloat16:
        return f"bf16 weights only, not {dtype}"
    if mc.attention_bias or not mc.qk_norm:
        return "Qwen3-style layers only (q/k norms, no q/k/v bias)"
    try:
        check_shapes(config_for(mc))
    except ValueError as e:
        return str(e)
    return None


def shared_gpu() -> str | None:
    """Why this process may not get every SM at once (None: nothing says so): an MPS client (its thread percentage
    may cap the SMs; the kernel's spin waits then never finish)."""
    for var in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        if os.environ.get(var):
            return f"{var} is set (MPS)"
    return None


def use_megakernel(
    device: torch.device | str,
    mc: ModelConfig,
    dtype: torch.dtype,
    speculative: bool = False,
    max_num_seqs: int = 1,
) -> bool:
    """Whether the runner should run this target's batch-1 decode steps as the megakernel (it then keeps the
    projections in nn.Linear's layout, which the kernel reads in place). Never for a speculative target: the kernel
    writes no hidden-state taps for a drafter, and that layout makes the verify GEMMs slower (session 52, H100: the
    DFlash K=15 step 7.33 -> 8.05 ms). ``auto`` also needs ``max_num_seqs`` 1 (every decode step a batch-1 step):
    the layout slows the engine's steps of 4 and 8 rows by ~8% (session 53, H100) and no MPS client."""
    mode = megakernel_mode()
    on_cuda = torch.device(device).type == "cuda"
    if mode == "0" or speculative:
        return False
    if mode == "auto" and not (AUTO_ON and on_cuda and max_num_seqs == 1 and shared_gpu() is None):
        return False
    if not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    if os.environ.get("SPECSERVE_WEIGHT_LAYOUT", "").lower() == "kn":
        return False
    return unsupported(mc, dtype) is None


def bind_model(model: Any, **kw: Any) -> MegaKernel:
    """A :class:`MegaKernel` over a :class:`specserve.models.llama.DecoderLM`'s own parameters and its current
    KV caches (``model.kv_caches``), writing the final-normed hidden state (the engine's LM head follows)."""
    layers = [
        {
            "qkv": ly.self_attn.qkv_proj.weight,
            "o": ly.self_attn.o_proj.weight,
            "gate_up": ly.mlp.gate_up_proj.weight,
            "down": ly.mlp.down_proj.weight,
            "in_norm": ly.input_layernorm.weight,
            "post_norm": ly.post_attention_layernorm.weight,
            "q_norm": ly.self_attn.q_norm.weight,
            "k_norm": ly.self_attn.k_norm.weight,
        }
        for ly in model.layers
    ]
    rope = model.rope
    kw = {**parse_opts(os.environ.get(MEGAKERNEL_OPTS_ENV, "")), **kw}
    return MegaKernel(
        config_for(model.config, **kw),
        layers,
        [c[0] for c in model.kv_caches],
        [c[1] for c in model.kv_caches],
        model.norm.weight,
        rope.cos,
        rope.sin,
        None,
        rope.cos.shape[0],
    )
