"""The graphs' random sampler (``sample_verify``) in two Triton launches, without sorting the vocabulary.

The torch form (:func:`specserve.spec.rejection.sample_verify`) sorts every logits row for top-k / top-p, scans it,
scatters it back and runs ~60-160 small kernels: 183 us of a 0.56 ms SmolLM2 decode step at batch 1, 0.3-2 ms at 8
requests x 8 rows (H100, session 36, ``benchmarks/sampling_profile.py``). Here, per logits row ``x = logits / T``:

* ``_row_stats_kernel`` (one program per row) finds the kept set as a threshold on the row's values, so nothing is
  sorted: ``m = max x``; min-p keeps ``x >= m + log(min_p)``; top-k keeps ``x >= t_k``, the k-th largest value,
  found by a bitwise binary search over order-preserving 32-bit keys (32 counting passes); top-p keeps ``x >= t_p``,
  the smallest value whose mass above it (within the min-p / top-k set, in units of that set's total ``Z``) is below
  ``top_p``, found the same way over masses. It stores ``m``, the threshold, the kept set's total ``Z_S`` and, for a
  row followed by a draft, the draft's probability ``exp(x_d - m) / Z_S`` (0 outside the set);
* ``_verify_sample_kernel`` (one program per request) counts the leading drafts with ``p_d >= u``, then draws the
  emitted token by the exponential race ``argmax exp(x - m) / E`` over the kept set of the row after the accepted
  drafts, without the rejected draft (the residual of a point-mass drafter), and packs the row as sample_verify does
  (greedy requests: the greedy tail's row).

The draws are sample_verify's: uniforms and ``E`` from torch's generator in the same order (``u`` [b, K], then ``E``
[b, V]), a seeded request's from its seed and positions (:mod:`specserve.layers.seeded_noise`, computed in the
kernel: ``-log`` of the race uniform by the kernel's log, which the host sampler uses on CUDA too). Differences from
the sorting form: tied values at a threshold are all kept (the sort keeps an arbitrary k of them), and fp32 rounding
of the sums. No host syncs; grids from static shapes (graph-capturable); runs under ``TRITON_INTERPRET=1``.

Measured (H100, session 36, the sampling graph alone): without top-k / top-p 52-59 us at SmolLM2's vocabulary and
128-143 us at Qwen3's for 1-64 rows (torch's form: 192-716 / 272-1928 us); with top-p, one program per row runs
its 32 search passes in 336-341 / 1087-1103 us, slower than the sort at a few rows. So ``SPECSERVE_SAMPLER=auto``
replays this form only for batches without top-k / top-p (:func:`specserve.layers.sampler.sort_free`); splitting a
row's search over several programs is the next step.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specserve.layers.triton_noise import accept_u, race_u

__all__ = ["sample_verify_triton"]

# vocabulary entries a program reads per loop step (SPECSERVE_SAMPLER_BLOCK overrides; a power of 2); H100, session
# 36: the temperature-only sampler 70 -> 52 us at SmolLM2's vocabulary and 196 -> 128 us at Qwen3's with 8192 vs 2048
_BLOCK = 8192
GREEDY_EPS = tl.constexpr(1e-5)


@triton.jit
def _key(x):
    """Order-preserving uint32 key of fp32 values (a < b <=> key(a) < key(b), NaN aside)."""
    b = x.to(tl.uint32, bitcast=True)
    return tl.where((b >> 31) == 1, ~b, b | 0x80000000)


@triton.jit
def _unkey(k):
    b = tl.where((k >> 31) == 1, k & 0x7FFFFFFF, ~k)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _scaled(base, idx, V, T):
    x = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
    return tl.math.div_rn(x, T)


@triton.jit
def _mass(base, V, T, m, lo, BLOCK: tl.constexpr):
    """sum of exp(x - m) over the row's values x whose key is at least ``lo``."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(0, V, BLOCK):
        idx = s + offs
        x = _scaled(base, idx, V, T)
        acc += tl.where((_key(x) >= lo) & (idx < V), tl.exp(x - m), 0.0)
    return tl.sum(acc, axis=0)


@triton.jit
def _row_stats_kernel(
    logits_ptr,
    ids_ptr,
    temp_ptr,
    topk_ptr,
    topp_ptr,
    minp_ptr,
    stats_ptr,
    V,
    stride_l,
    s_temp,
    s_topk,
    s_topp,
    s_minp,
    Q: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    j = r // Q
    i = r % Q
    T = tl.load(temp_ptr + j * s_temp).to(tl.float32)
    T = tl.where(T < GREEDY_EPS, 1.0, T)
    kk = tl.load(topk_ptr + j * s_topk).to(tl.int64)
    tp = tl.load(topp_ptr + j * s_topp).to(tl.float32)
    mp = tl.load(minp_ptr + j * s_minp).to(tl.float32)
    base = logits_ptr + r.to(tl.int64) * stride_l
    offs = tl.arange(0, BLOCK)
    # the maximum
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    for s in range(0, V, BLOCK):
        mx = tl.maximum(mx, _scaled(base, s + offs, V, T))
    m = tl.max(mx, axis=0)
    # min-p, then top-k: a lower bound on the kept keys
    lo = _key(tl.where(mp > 0, m + tl.log(mp), float("-inf")))
    if (kk > 0) & (kk < V):
        t = tl.full((), 0, tl.uint32)
        for bit in tl.static_range(31, -1, -1):
            cand = t | tl.full((), 1 << bit, tl.uint32)
            cnt = tl.zeros([BLOCK], tl.int32)
            for s in range(0, V, BLOCK):
                idx = s + offs
                ky = _key(_scaled(base, idx, V, T))
                cnt += ((ky >= cand) & (idx < V)).to(tl.int32)
            t = tl.where(tl.sum(cnt, axis=0) >= kk, cand, t)
        lo = tl.maximum(lo, t)
    z = _mass(base, V, T, m, lo, BLOCK)  # the min-p / top-k set's total
    if tp < 1.0:
        # top-p: the smallest key whose mass above it is below top_p * z (or nothing above it: the maximum)
        c = tp * z
        a = tl.full((), 0, tl.uint32)
        for bit in tl.static_range(31, -1, -1):
            cand = a | tl.full((), (1 << bit) - 1, tl.uint32)
            acc = tl.zeros([BLOCK], tl.float32)
            for s in range(0, V, BLOCK):
                idx = s + offs
                x = _scaled(base, idx, V, T)
                ky = _key(x)
                acc += tl.where((ky > cand) & (ky >= lo) & (idx < V), tl.exp(x - m), 0.0)
            f = tl.sum(acc, axis=0)
            ok = (f < c) | (f == 0.0)
            a = tl.where(ok, a, a | tl.full((), 1 << bit, tl.uint32))
        lo = tl.maximum(lo, a)
        z = _mass(base, V, T, m, lo, BLOCK)
    # the probability of the draft that follows this row (none after a request's last row)
    pd = tl.full((), 0.0, tl.float32)
    if i < Q - 1:
        d = tl.minimum(tl.maximum(tl.load(ids_ptr + r + 1), 0), V - 1)
        xd = tl.math.div_rn(tl.load(base + d).to(tl.float32), T)
        pd = tl.where(_key(xd) >= lo, tl.exp(xd - m) / z, 0.0)
    tl.store(stats_ptr + r * 4 + 0, m)
    tl.store(stats_ptr + r * 4 + 1, _unkey(lo))
    tl.store(stats_ptr + r * 4 + 2, z)
    tl.store(stats_ptr + r * 4 + 3, pd)


@triton.jit
def _verify_sample_kernel(
    logits_ptr,
    ids_ptr,
    temp_ptr,
    nd_ptr,
    stats_ptr,
    u_ptr,
    e_ptr,
    key_ptr,
    pos_ptr,
    greedy_ptr,
    out_ptr,
    V,
    stride_l,
    stride_e,
    stride_g,
    s_temp,
    s_nd,
    s_key,
    Q: tl.constexpr,
    Q_PAD: tl.constexpr,
    SEEDED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    j = tl.program_id(0)
    K: tl.constexpr = Q - 1
    qo = tl.arange(0, Q_PAD)
    T = tl.load(temp_ptr + j * s_temp).to(tl.float32)
    if T < GREEDY_EPS:  # a greedy request: the greedy tail's row
        g = tl.load(greedy_ptr + j * stride_g + qo, mask=qo < Q + 1)
        tl.store(out_ptr + j * (Q + 1) + qo, g, mask=qo < Q + 1)
    else:
        nd = tl.minimum(tl.maximum(tl.load(nd_ptr + j * s_nd).to(tl.int32), 0), K)
        seed = tl.full((), 0, tl.uint32)
        first = tl.full((), 0, tl.uint32)
        if SEEDED:
            seed = tl.load(key_ptr + j * s_key).to(tl.uint32)
            first = (tl.load(pos_ptr + j * Q).to(tl.int64) + 1).to(tl.uint32)
        # accepted = the number of leading real drafts with p_d >= u
        acc = tl.full((), 0, tl.int32)
        if K > 0:
            ko = tl.arange(0, Q_PAD)
            pd = tl.load(stats_ptr + (j * Q + ko) * 4 + 3, mask=ko < K, other=0.0).to(tl.float64)
            u = tl.load(u_ptr + j * K + ko, mask=ko < K, other=1.0)
            if SEEDED:
                u = tl.where(seed > 0, accept_u(seed, first + ko.to(tl.uint32)), u)
            ok = (pd >= u) & (ko < nd)
            acc = tl.min(tl.where(ok, Q_PAD, ko), axis=0)
            acc = tl.minimum(acc, nd)
        r = j * Q + acc
        m = tl.load(stats_ptr + r * 4 + 0)
        lo = tl.load(stats_ptr + r * 4 + 1)
        excl = tl.full((), -1, tl.int64)
        if acc < nd:  # rejected: the residual (p without the rejected draft)
            excl = tl.minimum(tl.maximum(tl.load(ids_ptr + r + 1), 0), V - 1)
        base = logits_ptr + r.to(tl.int64) * stride_l
        ebase = e_ptr + j.to(tl.int64) * stride_e
        offs = tl.arange(0, BLOCK)
        best_v = tl.full([BLOCK], -1.0, tl.float32)
        best_i = tl.full([BLOCK], 2147483647, tl.int32)
        alt_v = tl.full(
            [BLOCK], -1.0, tl.float32
        )  # the same race with the excluded draft (an empty residual)
        alt_i = tl.full([BLOCK], 2147483647, tl.int32)
        for s in range(0, V, BLOCK):
            idx = s + offs
            x = _scaled(base, idx, V, T)
            if SEEDED and seed > 0:
                e = -tl.log(race_u(seed, first + acc.to(tl.uint32), idx))
            else:
                e = tl.load(ebase + idx, mask=idx < V, other=1.0)
            keep = (x >= lo) & (idx < V)
            sc = tl.where(keep, tl.exp(x - m) / e, -1.0)
            better = sc > alt_v
            alt_i = tl.where(better, idx, alt_i)
            alt_v = tl.where(better, sc, alt_v)
            sc = tl.where(idx == excl, -1.0, sc)
            better = sc > best_v
            best_i = tl.where(better, idx, best_i)
            best_v = tl.where(better, sc, best_v)
        top = tl.max(best_v, axis=0)
        tok = tl.min(tl.where(best_v == top, best_i, 2147483647), axis=0)
        atop = tl.max(alt_v, axis=0)
        atok = tl.min(tl.where(alt_v == atop, alt_i, 2147483647), axis=0)
        tok = tl.where(top > 0.0, tok, atok)
        drafts = tl.minimum(tl.maximum(tl.load(ids_ptr + j * Q + 1 + qo, mask=qo < K, other=0), 0), V - 1)
        row = tl.where(qo < acc, drafts, -1)
        row = tl.where(qo == acc, tok, row)
        row = tl.where(qo == Q, acc, row)
        tl.store(out_ptr + j * (Q + 1) + qo, row.to(tl.int64), mask=qo < Q + 1)


def sample_verify_triton(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    num_draft: torch.Tensor,
    b: int,
    q: int,
    greedy_packed: torch.Tensor,
    seed_key: torch.Tensor | None = None,
    pos: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`specserve.spec.rejection.sample_verify` in two launches (see the module docstring); ``logits`` in any
    float dtype (read as fp32)."""
    vocab, k, dev = logits.shape[-1], q - 1, logits.device
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    ids = ids.contiguous()
    # the draws, in sample_verify's order
    u = (
        (1.0 - torch.rand(b, k, dtype=torch.float64, device=dev))
        if k > 0
        else torch.ones(b, 1, dtype=torch.float64, device=dev)
    )
    e = torch.empty(b, vocab, dtype=torch.float32, device=dev).exponential_()
    e.clamp_(min=torch.finfo(torch.float32).tiny)
    seeded = seed_key is not None and pos is not None
    key = seed_key if seed_key is not None and pos is not None else e  # unused without seeds
    pos_t = pos.contiguous() if pos is not None and seeded else e
    stats = torch.empty(b * q, 4, dtype=torch.float32, device=dev)
    block = int(os.environ.get("SPECSERVE_SAMPLER_BLOCK", "") or _BLOCK)
    if block < 16 or block & (block - 1):
        raise ValueError(f"SPECSERVE_SAMPLER_BLOCK must be a power of 2 >= 16, got {block}")
    warps = min(16, max(4, block // 256))
    out = torch.empty(b, q + 1, dtype=torch.int64, device=dev)
    _row_stats_kernel[(b * q,)](
        logits, ids, temperature, top_k, top_p, min_p, stats, vocab, logits.stride(0), temperature.stride(0),
        top_k.stride(0), top_p.stride(0), min_p.stride(0), Q=q, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    _verify_sample_kernel[(b,)](
        logits, ids, temperature, num_draft, stats, u, e, key, pos_t, greedy_packed, out, vocab, logits.stride(0),
        e.stride(0), greedy_packed.stride(0), temperature.stride(0), num_draft.stride(0), key.stride(0), Q=q,
        Q_PAD=triton.next_power_of_2(q + 1), SEEDED=seeded, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return out
