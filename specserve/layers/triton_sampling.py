"""The graphs' random sampler (``sample_verify``) without sorting the vocabulary, in Triton launches over many
programs per row.

The torch form (:func:`specserve.spec.rejection.sample_verify`) sorts every logits row for top-k / top-p, scans it,
scatters it back and runs ~60-160 small kernels: 183 us of a 0.56 ms SmolLM2 decode step at batch 1, 0.3-2 ms at 8
requests x 8 rows (H100, session 36, ``benchmarks/sampling_profile.py``). Here, per logits row ``x = logits / T``,
split into chunks of ``SPECSERVE_SAMPLER_BLOCK`` entries (one program each):

* ``_max_kernel`` / ``_mass_kernel``: the chunks' maxima, then (every program reducing them to ``m = max x``) their
  mass ``exp(x - m)`` over the min-p set ``x >= m + log(min_p)``;
* top-k and top-p as thresholds on the row's values, found by a radix selection over order-preserving 32-bit keys
  (``_round_kernel``, 8 rounds of 4 bits each): each round the chunks histogram the count and mass of their kept
  values under the prefix chosen so far by the next 4 bits, and the next round picks the bin (top-k: where the count
  from the top reaches k; top-p: the lowest bin whose mass strictly above stays below ``top_p`` x the set's mass).
  Top-k keeps ``x >= t_k`` (the k-th largest value), top-p, within that set, every value whose mass strictly above
  is below ``top_p``: runs of tied values stay whole, as :func:`specserve.layers.sampler.apply_sampling_constraints`
  keeps them, so both forms keep the same sets;
* ``_finish_kernel`` (one program per row): ``m``, the lowest kept value, the kept set's mass ``Z`` and, for a row
  followed by a draft, the draft's probability ``exp(x_d - m) / Z`` (0 outside the set);
* ``_race_kernel`` (request x chunk): the leading drafts with ``p_d >= u`` are accepted, then each chunk's winner
  of the exponential race ``argmax exp(x - m) / E`` over the kept set of the row after them, without the rejected
  draft (the residual of a point-mass drafter); ``_pick_kernel`` (one program per request) takes the winner and
  packs the row as sample_verify does (greedy requests: the greedy tail's row).

The draws are sample_verify's: uniforms and ``E`` from torch's generator in the same order (``u`` [b, K], then ``E``
[b, V]), a seeded request's from its seed and positions (:mod:`specserve.layers.seeded_noise`, computed in the
kernel: ``-log`` of the race uniform by the kernel's log, which the host sampler uses on CUDA too). The tokens are
the torch form's but for fp32 rounding of the masses. No host syncs; grids from static shapes (graph-capturable);
deterministic (fixed reduction orders, no atomics); runs under ``TRITON_INTERPRET=1``. Batches without top-k /
top-p skip the 16 rounds (``searches=False``: 5 launches; the runner's sort-free graphs).

Measured (H100, session 37, the sampling graph alone, 1024-entry programs; another H100 ran the committed form's
sort-free path at 34 us where this one gave 23): without top-k / top-p 23-37 us at
SmolLM2's vocabulary and 29-53 us at Qwen3's for 1-64 rows (torch's form: 187-781 / 252-2177 us; session 36's
one-program-per-row form: 52-59 / 128-143 us); top_p 0.95 122-636 / 146-1770 us (torch's: 195-789 / 279-2195); top_k
20 + top_p 0.95 156-703 / 169-1988. The searches read every chunk each round (16 launches): faster than the sort
at every measured shape, by 1.2-2.3x; with one program per row (session 36) they were slower at few rows.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specserve.layers.triton_noise import accept_u, race_u

__all__ = ["sample_verify_triton"]

# vocabulary entries per program (SPECSERVE_SAMPLER_BLOCK overrides; a power of 2); H100, session 37: top_p 0.95 at
# batch 1 121 / 178 / 283 / 508 us with 1024 / 2048 / 4096 / 8192 (SmolLM2's vocabulary), the sort-free path 20-25 us
# with any of them; at 8 x 8 rows of Qwen3's vocabulary 2048 is 9% faster than 1024 with top_p (1623 vs 1779 us)
_BLOCK = 1024
_SUB = 256  # entries a histogram step reads (its one-hot tile is SUB x NB)
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
def _chunk(base, c, V, T, CHUNK: tl.constexpr):
    """Chunk ``c`` of a row: its vocabulary indices and scaled values (-inf past V)."""
    idx = c * CHUNK + tl.arange(0, CHUNK)
    return idx, _scaled(base, idx, V, T)


@triton.jit
def _temp(temp_ptr, j, s_temp):
    """A request's temperature (greedy requests' rows are scaled by 1) and whether it samples at random."""
    T = tl.load(temp_ptr + j * s_temp).to(tl.float32)
    return tl.where(T < GREEDY_EPS, 1.0, T), T >= GREEDY_EPS


@triton.jit
def _max_kernel(logits_ptr, temp_ptr, cm_ptr, V, stride_l, s_temp, C, Q: tl.constexpr, CHUNK: tl.constexpr):
    """Grid (rows, chunks): each chunk's maximum."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    T, rnd = _temp(temp_ptr, r // Q, s_temp)
    idx, x = _chunk(logits_ptr + r.to(tl.int64) * stride_l, c, V, T, CHUNK)
    tl.store(cm_ptr + r * C + c, tl.max(x, axis=0))


@triton.jit
def _row_max(cm_ptr, r, C, C_PAD: tl.constexpr):
    co = tl.arange(0, C_PAD)
    return tl.max(tl.load(cm_ptr + r * C + co, mask=co < C, other=float("-inf")), axis=0)


@triton.jit
def _min_p_key(minp_ptr, j, s_minp, m):
    """The min-p bound as a key: values below m + log(min_p) are dropped (min_p 0: nothing)."""
    mp = tl.load(minp_ptr + j * s_minp).to(tl.float32)
    return _key(tl.where(mp > 0, m + tl.log(mp), float("-inf")))


@triton.jit
def _mass_kernel(
    logits_ptr, temp_ptr, minp_ptr, cm_ptr, pm_ptr, V, stride_l, s_temp, s_minp, C,
    Q: tl.constexpr, C_PAD: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Grid (rows, chunks): each chunk's mass exp(x - m) over the values the min-p bound keeps."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    j = r // Q
    T, rnd = _temp(temp_ptr, j, s_temp)
    m = _row_max(cm_ptr, r, C, C_PAD)
    lo = _min_p_key(minp_ptr, j, s_minp, m)
    idx, x = _chunk(logits_ptr + r.to(tl.int64) * stride_l, c, V, T, CHUNK)
    tl.store(pm_ptr + r * C + c, tl.sum(tl.where((_key(x) >= lo) & (idx < V), tl.exp(x - m), 0.0), axis=0))


# The threshold searches: a radix selection over the 32-bit keys, RADIX bits (NB bins) a round, ROUNDS rounds for
# top-k, then ROUNDS for top-p.  Round g's chunks histogram the count and mass of their kept values whose keys
# match the row's prefix so far, by the next RADIX bits; round g + 1 (every program, redundantly: C x 2NB floats)
# chooses a bin from them.  A row's state before round g sits in slot g % 2 of two buffers [2, rows, 4]: ints
# (prefix, lower bound key, search active, count above the prefix) and floats (m, z = the kept set's mass, mass
# above the prefix, top-p's target mass), written by the row's chunk 0; the histograms in slot g % 2 of theirs.
RADIX = tl.constexpr(4)
NB = tl.constexpr(16)
ROUNDS = tl.constexpr(8)


@triton.jit
def _hist_sums(hist_ptr, r, C, C_PAD: tl.constexpr):
    """A row's [NB] counts and masses, summed over its chunks (in a fixed order)."""
    co = tl.arange(0, C_PAD)
    bins = tl.arange(0, NB)
    off = (r * C + co)[:, None] * (2 * NB) + bins[None, :]
    live = (co < C)[:, None]
    cnt = tl.sum(tl.load(hist_ptr + off, mask=live, other=0.0), axis=0)
    mass = tl.sum(tl.load(hist_ptr + off + NB, mask=live, other=0.0), axis=0)
    return cnt, mass


@triton.jit
def _choose(cnt, mass, P, ac, am, cp, kk, top_p):
    """One round's bin: top-k the highest whose count, with everything above it (``ac``), reaches k; top-p (when
    ``top_p``) the lowest non-empty one whose mass strictly above it (``am`` and the bins above) stays below ``cp``
    or is 0 (the top value always stays).  Returns the new prefix, count and mass above it, the bin's mass and
    whether a bin was found (top-k: not when fewer than k values are left)."""
    bins = tl.arange(0, NB)
    ge = bins[None, :] >= bins[:, None]  # [b, b']: bin b' at or above bin b
    suf_c = tl.sum(tl.where(ge, cnt[None, :], 0.0), axis=1)
    suf_m = tl.sum(tl.where(ge, mass[None, :], 0.0), axis=1)
    above = am + (suf_m - mass)
    ok_p = (cnt > 0) & ((above < cp) | (above == 0.0))
    ok_k = (ac.to(tl.float32) + suf_c) >= kk.to(tl.float32)
    bstar = tl.where(
        top_p, tl.min(tl.where(ok_p, bins, NB), axis=0), tl.max(tl.where(ok_k, bins, -1), axis=0)
    )
    found = (bstar >= 0) & (bstar < NB)
    pick = bins == bstar
    sel_c = tl.sum(tl.where(pick, cnt, 0.0), axis=0)
    sel_m = tl.sum(tl.where(pick, mass, 0.0), axis=0)
    ac2 = ac + (tl.sum(tl.where(pick, suf_c, 0.0), axis=0) - sel_c).to(tl.int32)
    am2 = am + (tl.sum(tl.where(pick, suf_m, 0.0), axis=0) - sel_m)
    P2 = (P << RADIX) | tl.minimum(tl.maximum(bstar, 0), NB - 1).to(tl.uint32)
    return P2, ac2, am2, sel_m, found


@triton.jit
def _state_before(
    G, r, j, temp_ptr, topk_ptr, topp_ptr, minp_ptr, cm_ptr, pm_ptr, hist_ptr, si_ptr, sf_ptr,
    V, R, C, s_temp, s_topk, s_topp, s_minp, C_PAD: tl.constexpr,
):  # fmt: skip
    """Row r's state before round G (G = 2 ROUNDS: after the last): at G = 0 from the chunks' maxima and masses
    (the min-p set), else from the state before round G - 1 and that round's histograms.  G is a runtime value:
    one compiled kernel serves every round."""
    kk = tl.load(topk_ptr + j * s_topk).to(tl.int32)
    tp = tl.load(topp_ptr + j * s_topp).to(tl.float32)
    _, rnd = _temp(temp_ptr, j, s_temp)
    if G == 0:
        m = _row_max(cm_ptr, r, C, C_PAD)
        lo = _min_p_key(minp_ptr, j, s_minp, m)
        co = tl.arange(0, C_PAD)
        z = tl.sum(tl.load(pm_ptr + r * C + co, mask=co < C, other=0.0), axis=0)
        act = ((kk > 0) & (kk < V) & rnd).to(tl.int32)
        P = tl.full((), 0, tl.uint32)
        ac = tl.full((), 0, tl.int32)
        am = tl.full((), 0.0, tl.float32)
        cp = tl.full((), 0.0, tl.float32)
    else:
        sb = (((G - 1) % 2) * R + r) * 4
        P = tl.load(si_ptr + sb + 0).to(tl.uint32, bitcast=True)
        lo = tl.load(si_ptr + sb + 1).to(tl.uint32, bitcast=True)
        act = tl.load(si_ptr + sb + 2)
        ac = tl.load(si_ptr + sb + 3)
        m = tl.load(sf_ptr + sb + 0)
        z = tl.load(sf_ptr + sb + 1)
        am = tl.load(sf_ptr + sb + 2)
        cp = tl.load(sf_ptr + sb + 3)
        sel_m = tl.full((), 0.0, tl.float32)
        if act != 0:
            cnt, mass = _hist_sums(hist_ptr + ((G - 1) % 2) * R * C * 2 * NB, r, C, C_PAD)
            # top-p's first histogram: the target mass top_p x the set's mass
            cp = tl.where(G - 1 == ROUNDS, tp * tl.sum(mass, axis=0), cp)
            P, ac, am, sel_m, found = _choose(cnt, mass, P, ac, am, cp, kk, G - 1 >= ROUNDS)
            act = tl.where(found, act, 0)  # top-k over fewer than k values: keep them all
        if (G == ROUNDS) | (G == 2 * ROUNDS):  # a search ends: its bound and the kept set's mass
            if act != 0:
                lo = tl.maximum(lo, P)
                z = am + sel_m
            if G == ROUNDS:  # top-p starts
                act = ((tp < 1.0) & rnd).to(tl.int32)
                P = tl.full((), 0, tl.uint32)
                ac = tl.full((), 0, tl.int32)
                am = tl.full((), 0.0, tl.float32)
    return P, lo, act, ac, m, z, am, cp


@triton.jit
def _hits(idx, x, V, lo, P, GR, SHIFT):
    """The values a round histograms: kept so far (key >= lo) and, after its first round, under the prefix."""
    ky = _key(x)
    under = (ky >> tl.minimum(SHIFT + RADIX, 31).to(tl.uint32)) == P  # (no prefix in a search's first round)
    return (ky >= lo) & (idx < V) & ((GR == 0) | under)


@triton.jit(do_not_specialize=["G", "R"])
def _round_kernel(
    logits_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr, cm_ptr, pm_ptr, hist_ptr, si_ptr, sf_ptr,
    V, R, C, stride_l, s_temp, s_topk, s_topp, s_minp, G,
    Q: tl.constexpr, C_PAD: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
):  # fmt: skip
    """Grid (rows, chunks): round G of the searches (see above)."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    j = r // Q
    P, lo, act, ac, m, z, am, cp = _state_before(
        G, r, j, temp_ptr, topk_ptr, topp_ptr, minp_ptr, cm_ptr, pm_ptr, hist_ptr, si_ptr, sf_ptr, V, R, C,
        s_temp, s_topk, s_topp, s_minp, C_PAD,
    )  # fmt: skip
    if c == 0:
        sb = ((G % 2) * R + r) * 4
        tl.store(si_ptr + sb + 0, P.to(tl.int32, bitcast=True))
        tl.store(si_ptr + sb + 1, lo.to(tl.int32, bitcast=True))
        tl.store(si_ptr + sb + 2, act)
        tl.store(si_ptr + sb + 3, ac)
        tl.store(sf_ptr + sb + 0, m)
        tl.store(sf_ptr + sb + 1, z)
        tl.store(sf_ptr + sb + 2, am)
        tl.store(sf_ptr + sb + 3, cp)
    if act != 0:
        T, rnd = _temp(temp_ptr, j, s_temp)
        base = logits_ptr + r.to(tl.int64) * stride_l
        GR = G % ROUNDS  # the round within its search
        SHIFT = 32 - RADIX * (GR + 1)
        bins = tl.arange(0, NB)
        cnt = tl.zeros([NB], tl.float32)
        mass = tl.zeros([NB], tl.float32)
        # a reduction per step, skipping the steps without a value under the prefix (most, after the first
        # rounds): faster than one-hot sums accumulated over the chunk and reduced once (H100, session 37)
        for s in range(0, CHUNK, SUB):
            idx = c * CHUNK + s + tl.arange(0, SUB)
            x = _scaled(base, idx, V, T)
            hit = _hits(idx, x, V, lo, P, GR, SHIFT)
            if tl.max(hit.to(tl.int32), axis=0) > 0:
                d = ((_key(x) >> SHIFT.to(tl.uint32)) & (NB - 1)).to(tl.int32)
                one = hit[:, None] & (d[:, None] == bins[None, :])
                cnt += tl.sum(one.to(tl.float32), axis=0)
                mass += tl.sum(tl.where(one, tl.exp(x - m)[:, None], 0.0), axis=0)
        hb = hist_ptr + (((G % 2) * R + r) * C + c) * 2 * NB
        tl.store(hb + bins, cnt)
        tl.store(hb + NB + bins, mass)


@triton.jit(do_not_specialize=["G", "R"])
def _finish_kernel(
    logits_ptr, ids_ptr, temp_ptr, topk_ptr, topp_ptr, minp_ptr, cm_ptr, pm_ptr, hist_ptr, si_ptr, sf_ptr,
    stats_ptr, V, R, C, stride_l, s_temp, s_topk, s_topp, s_minp, G,
    Q: tl.constexpr, C_PAD: tl.constexpr,
):  # fmt: skip
    """One program per row: the final state (G = 0: no searches ran, else after the last round) as the row's
    stats: m, the lowest kept value, the kept set's mass and the probability of the draft after this row."""
    r = tl.program_id(0)
    j = r // Q
    i = r % Q
    p_, lo, act_, ac_, m, z, am_, cp_ = _state_before(
        G, r, j, temp_ptr, topk_ptr, topp_ptr, minp_ptr, cm_ptr, pm_ptr, hist_ptr, si_ptr, sf_ptr, V, R, C,
        s_temp, s_topk, s_topp, s_minp, C_PAD,
    )  # fmt: skip
    pd = tl.full((), 0.0, tl.float32)
    if i < Q - 1:
        T, rnd = _temp(temp_ptr, j, s_temp)
        d = tl.minimum(tl.maximum(tl.load(ids_ptr + r + 1), 0), V - 1)
        xd = tl.math.div_rn(tl.load(logits_ptr + r.to(tl.int64) * stride_l + d).to(tl.float32), T)
        pd = tl.where(_key(xd) >= lo, tl.exp(xd - m) / z, 0.0)
    tl.store(stats_ptr + r * 4 + 0, m)
    tl.store(stats_ptr + r * 4 + 1, _unkey(lo))
    tl.store(stats_ptr + r * 4 + 2, z)
    tl.store(stats_ptr + r * 4 + 3, pd)


@triton.jit
def _accepted(j, nd_ptr, s_nd, stats_ptr, u_ptr, seed, first, SEEDED: tl.constexpr, Q: tl.constexpr,
              Q_PAD: tl.constexpr):  # fmt: skip
    """Request j's number of accepted drafts: the leading real drafts with p_d >= u."""
    K: tl.constexpr = Q - 1
    nd = tl.minimum(tl.maximum(tl.load(nd_ptr + j * s_nd).to(tl.int32), 0), K)
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
    return acc, nd


@triton.jit
def _seed_of(key_ptr, pos_ptr, j, s_key, SEEDED: tl.constexpr, Q: tl.constexpr):
    seed = tl.full((), 0, tl.uint32)
    first = tl.full((), 0, tl.uint32)
    if SEEDED:
        seed = tl.load(key_ptr + j * s_key).to(tl.uint32)
        first = (tl.load(pos_ptr + j * Q).to(tl.int64) + 1).to(tl.uint32)
    return seed, first


@triton.jit
def _race_kernel(
    logits_ptr, ids_ptr, temp_ptr, nd_ptr, stats_ptr, u_ptr, e_ptr, key_ptr, pos_ptr, cand_ptr, acc_ptr,
    V, C, stride_l, stride_e, s_temp, s_nd, s_key,
    Q: tl.constexpr, Q_PAD: tl.constexpr, SEEDED: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Grid (requests, chunks): the acceptance, then each chunk's winner of the exponential race argmax
    exp(x - m) / E over the kept values of the row after the accepted drafts, without the rejected draft (and,
    for an empty residual, with it): [score, index] x 2 per chunk."""
    j = tl.program_id(0)
    c = tl.program_id(1)
    T, rnd = _temp(temp_ptr, j, s_temp)
    if rnd:
        seed, first = _seed_of(key_ptr, pos_ptr, j, s_key, SEEDED, Q)
        acc, nd = _accepted(j, nd_ptr, s_nd, stats_ptr, u_ptr, seed, first, SEEDED, Q, Q_PAD)
        r = j * Q + acc
        m = tl.load(stats_ptr + r * 4 + 0)
        lo = tl.load(stats_ptr + r * 4 + 1)
        excl = tl.full((), -1, tl.int64)
        if acc < nd:  # rejected: the residual (p without the rejected draft)
            excl = tl.minimum(tl.maximum(tl.load(ids_ptr + r + 1), 0), V - 1)
        idx, x = _chunk(logits_ptr + r.to(tl.int64) * stride_l, c, V, T, CHUNK)
        if SEEDED and seed > 0:
            e = -tl.log(race_u(seed, first + acc.to(tl.uint32), idx))
        else:
            e = tl.load(e_ptr + j.to(tl.int64) * stride_e + idx, mask=idx < V, other=1.0)
        sc = tl.where((x >= lo) & (idx < V), tl.exp(x - m) / e, -1.0)
        atop = tl.max(sc, axis=0)
        atok = tl.min(tl.where(sc == atop, idx, 2147483647), axis=0)
        sc = tl.where(idx == excl, -1.0, sc)
        top = tl.max(sc, axis=0)
        tok = tl.min(tl.where(sc == top, idx, 2147483647), axis=0)
        cb = cand_ptr + (j * C + c) * 4
        tl.store(cb + 0, top)
        tl.store(cb + 1, tok.to(tl.float32, bitcast=False))
        tl.store(cb + 2, atop)
        tl.store(cb + 3, atok.to(tl.float32, bitcast=False))
        if c == 0:
            tl.store(acc_ptr + j, acc)


@triton.jit
def _pick_kernel(
    ids_ptr, temp_ptr, cand_ptr, acc_ptr, greedy_ptr, out_ptr, V, C, stride_g, s_temp,
    Q: tl.constexpr, Q_PAD: tl.constexpr, C_PAD: tl.constexpr,
):  # fmt: skip
    """One program per request: the race's winner over the chunks, and the packed row (greedy requests: the
    greedy tail's row)."""
    j = tl.program_id(0)
    K: tl.constexpr = Q - 1
    qo = tl.arange(0, Q_PAD)
    _, rnd = _temp(temp_ptr, j, s_temp)
    if rnd:
        co = tl.arange(0, C_PAD)
        cb = cand_ptr + (j * C + co) * 4
        live = co < C
        v = tl.load(cb + 0, mask=live, other=-2.0)
        ix = tl.load(cb + 1, mask=live, other=3.0e9)
        av = tl.load(cb + 2, mask=live, other=-2.0)
        aix = tl.load(cb + 3, mask=live, other=3.0e9)
        top = tl.max(v, axis=0)
        tok = tl.min(tl.where(v == top, ix, 3.0e9), axis=0)
        atop = tl.max(av, axis=0)
        atok = tl.min(tl.where(av == atop, aix, 3.0e9), axis=0)
        tok = tl.where(top > 0.0, tok, atok).to(tl.int64)
        acc = tl.load(acc_ptr + j)
        drafts = tl.minimum(tl.maximum(tl.load(ids_ptr + j * Q + 1 + qo, mask=qo < K, other=0), 0), V - 1)
        row = tl.where(qo < acc, drafts, -1)
        row = tl.where(qo == acc, tok, row)
        row = tl.where(qo == Q, acc, row)
        tl.store(out_ptr + j * (Q + 1) + qo, row.to(tl.int64), mask=qo < Q + 1)
    else:
        g = tl.load(greedy_ptr + j * stride_g + qo, mask=qo < Q + 1)
        tl.store(out_ptr + j * (Q + 1) + qo, g, mask=qo < Q + 1)


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
    searches: bool = True,
) -> torch.Tensor:
    """:func:`specserve.spec.rejection.sample_verify` without sorting (see the module docstring); ``logits`` in any
    float dtype (read as fp32).  ``searches=False`` leaves out the top-k / top-p rounds: only for batches whose
    random rows use neither (:func:`specserve.layers.sampler.sort_free`)."""
    vocab, k, dev = logits.shape[-1], q - 1, logits.device
    if vocab >= 1 << 24:
        raise ValueError(f"vocabulary of {vocab} entries: the sort-free sampler keeps indices in float32")
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
    chunk = sampler_block()
    rows, nc = b * q, triton.cdiv(vocab, chunk)
    c_pad, q_pad = triton.next_power_of_2(nc), triton.next_power_of_2(q + 1)
    warps = min(8, max(4, chunk // 512))
    f32 = dict(dtype=torch.float32, device=dev)
    cm, pm = torch.empty(rows, nc, **f32), torch.empty(rows, nc, **f32)
    rounds = 2 * ROUNDS.value if searches else 0
    # round g reads round g - 1's histograms and state and writes its own: two slots of each
    slots = 2 if searches else 1
    hist = torch.empty(slots, rows, nc, 2 * NB.value, **f32)
    si = torch.empty(slots, rows, 4, dtype=torch.int32, device=dev)
    sf = torch.empty(slots, rows, 4, **f32)
    stats = torch.empty(rows, 4, **f32)
    cand = torch.empty(b, nc, 4, **f32)
    acc = torch.empty(b, dtype=torch.int32, device=dev)
    out = torch.empty(b, q + 1, dtype=torch.int64, device=dev)
    st = (temperature.stride(0), top_k.stride(0), top_p.stride(0), min_p.stride(0))
    _max_kernel[(rows, nc)](
        logits, temperature, cm, vocab, logits.stride(0), st[0], nc, Q=q, CHUNK=chunk, num_warps=warps
    )
    _mass_kernel[(rows, nc)](
        logits, temperature, min_p, cm, pm, vocab, logits.stride(0), st[0], st[3], nc, Q=q, C_PAD=c_pad,
        CHUNK=chunk, num_warps=warps,
    )  # fmt: skip
    common = (temperature, top_k, top_p, min_p, cm, pm, hist, si, sf)
    for g in range(rounds):
        _round_kernel[(rows, nc)](
            logits, *common, vocab, rows, nc, logits.stride(0), *st, g, Q=q, C_PAD=c_pad, CHUNK=chunk,
            SUB=min(chunk, _SUB), num_warps=4,
        )  # fmt: skip
    _finish_kernel[(rows,)](
        logits, ids, *common, stats, vocab, rows, nc, logits.stride(0), *st, rounds, Q=q, C_PAD=c_pad,
        num_warps=4,
    )  # fmt: skip
    _race_kernel[(b, nc)](
        logits, ids, temperature, num_draft, stats, u, e, key, pos_t, cand, acc, vocab, nc, logits.stride(0),
        e.stride(0), st[0], num_draft.stride(0), key.stride(0), Q=q, Q_PAD=q_pad, SEEDED=seeded, CHUNK=chunk,
        num_warps=warps,
    )  # fmt: skip
    _pick_kernel[(b,)](
        ids, temperature, cand, acc, greedy_packed, out, vocab, nc, greedy_packed.stride(0), st[0], Q=q,
        Q_PAD=q_pad, C_PAD=c_pad, num_warps=1,
    )  # fmt: skip
    return out


def sampler_block() -> int:
    """Vocabulary entries per program (``SPECSERVE_SAMPLER_BLOCK``, a power of 2 >= 16; default 1024)."""
    block = int(os.environ.get("SPECSERVE_SAMPLER_BLOCK", "") or _BLOCK)
    if block < 16 or block & (block - 1):
        raise ValueError(f"SPECSERVE_SAMPLER_BLOCK must be a power of 2 >= 16, got {block}")
    return block
