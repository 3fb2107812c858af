"""Greedy argmax and greedy verification of a padded batch in one Triton kernel (issue #6: count the kernels).

In a CUDA graph the torch form of a greedy step's tail is four to seven small kernels after the LM head: the
argmax reduction over the vocabulary, then (verify) ``==``, ``cumprod``, ``sum``, and a ``cat`` / ``zeros_like``
to pack ``[argmax..., n_match]``. Each is a few microseconds of latency on a step that, for a small target, is a
few hundred microseconds long (SmolLM2-135M: ~18 us of a 0.58 ms decode step). Here one launch does all of it:

* up to 64 programs per logits row (:func:`_programs`) each take every P-th 4096-entry chunk of the vocabulary,
  keeping the running maximum and its first index (``torch.argmax``'s tie rule; NaN counts as the maximum, as in
  torch); the row's last program to arrive (an int32 arrival counter, acq_rel after a CTA barrier) reduces their
  (maximum, index) pairs and stores the row's argmax into ``packed[j, i]`` (row ``j * q + i``). One program
  walking Qwen3's 151936 entries alone added 32.9 us to every step after the LM head on the H100, 38 programs
  4.4 us (session 47, ``benchmarks/chain_profile.py``: the Qwen3-8B-shaped plain step 5.710 -> 5.690 ms, DFlash
  K=15 7.385 -> 7.327, which has two such tails);
* with ``q > 1`` the row programs of request ``j`` then bump an int32 arrival counter (acq_rel, after a CTA
  barrier); the last of its ``q`` rows resets it to 0 (for the next launch or graph replay) and writes
  ``n_match`` = the number of leading drafts equal to the argmax of the row before them into ``packed[j, q]``;
  with ``q == 1`` each program writes ``n_match = 0`` itself.

The output equals :func:`specserve.spec.rejection.greedy_verify` exactly (integers). The counters (requests',
then rows') are the attention's persistent zeroed buffer (``triton_attention._merge_counters``, shared as the
split-K GEMMs' epilogue shares it): every launch leaves them at 0, and launches are stream-ordered (one stream, as
the engine runs). The kernel runs under ``TRITON_INTERPRET=1`` on CPU tensors (the tests), has no host syncs and a
grid from static shapes only (graph-capturable).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from specserve.layers.triton_attention import _merge_counters
from specserve.layers.triton_fused import _pdl_wait, pdl_launch

__all__ = ["argmax_rows", "greedy_verify_triton"]

_CHUNK = 4096  # vocabulary entries per loop step (8 KB of bf16 logits)
_MAX_PROGRAMS = 64  # programs per logits row (Qwen3's 151936 entries: 38, SmolLM2's 49152: 12)
PROGRAMS_ENV = "SPECSERVE_GREEDY_TAIL_PROGRAMS"


@triton.jit
def _pack(am, row, ids_ptr, packed_ptr, counter_ptr, stride_p, Q: tl.constexpr, Q_PAD: tl.constexpr,
          PACK: tl.constexpr):  # fmt: skip
    """Store row ``row``'s argmax ``am``; with PACK, the request's ``n_match`` once its last row is stored."""
    if PACK:
        j = row // Q
        i = row % Q
        tl.store(packed_ptr + j * stride_p + i, am.to(tl.int64))
        if Q == 1:
            tl.store(packed_ptr + j * stride_p + 1, (am * 0).to(tl.int64))
        else:
            tl.debug_barrier()  # the store above before the (gpu-scope) release of the atomic
            cnt = tl.atomic_add(counter_ptr + j, 1, sem="acq_rel")
            if cnt == Q - 1:  # the request's last row: every argmax of its rows is visible
                tl.atomic_xchg(counter_ptr + j, 0, sem="relaxed")
                offs_q = tl.arange(0, Q_PAD)
                inner = offs_q < Q - 1
                am_q = tl.load(packed_ptr + j * stride_p + offs_q, mask=inner, other=0, cache_modifier=".cg")
                nxt = tl.load(ids_ptr + j * Q + 1 + offs_q, mask=inner, other=0)
                miss = inner & (nxt != am_q)
                n_match = tl.min(tl.where(miss, offs_q, Q - 1), axis=0)
                tl.store(packed_ptr + j * stride_p + Q, n_match.to(tl.int64))
    else:
        tl.store(packed_ptr + row, am.to(tl.int64))


@triton.jit
def _greedy_tail_kernel(
    logits_ptr,
    ids_ptr,
    packed_ptr,
    counter_ptr,  # [n_req] request counters (PACK, Q > 1), then [rows] row counters (P > 1)
    part_v_ptr,  # P > 1: fp32 [rows, P] each program's maximum
    part_i_ptr,  # P > 1: int32 [rows, P] its first index
    V,
    stride_l,
    stride_p,
    n_req,
    Q: tl.constexpr,
    Q_PAD: tl.constexpr,
    PACK: tl.constexpr,
    CHUNK: tl.constexpr,
    P: tl.constexpr,  # programs per row, each taking every P-th chunk of the vocabulary
    P_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    _pdl_wait(PDL)
    row = tl.program_id(0)
    pid = tl.program_id(1)
    offs = tl.arange(0, CHUNK)
    base = logits_ptr + row.to(tl.int64) * stride_l
    best_v = tl.full([CHUNK], float("-inf"), dtype=tl.float32)
    best_i = tl.full([CHUNK], 2147483647, dtype=tl.int32)
    # per lane: the first maximum of its entries (strictly greater replaces: earlier indices win ties); NaN wins
    # as in torch.argmax (mapped to +inf, a real +inf to the largest float)
    for start in range(pid * CHUNK, V, P * CHUNK):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        x = tl.where(x == float("inf"), 3.4028234663852886e38, x)
        x = tl.where(x != x, float("inf"), x)
        better = x > best_v
        best_i = tl.where(better, idx, best_i)
        best_v = tl.where(better, x, best_v)
    top = tl.max(best_v, axis=0)
    am = tl.min(tl.where(best_v == top, best_i, 2147483647), axis=0)  # the first index holding the maximum
    if P == 1:
        am = tl.where(am == 2147483647, 0, am)  # a row of -inf only: index 0, as torch
        _pack(am, row, ids_ptr, packed_ptr, counter_ptr, stride_p, Q, Q_PAD, PACK)
    else:
        # each program's (maximum, first index); the row's last program to arrive reduces them: the largest
        # maximum, the smallest index among the programs holding it (all indices of an earlier chunk come first)
        tl.store(part_v_ptr + row * P + pid, top)
        tl.store(part_i_ptr + row * P + pid, am)
        tl.debug_barrier()  # the stores above before the (gpu-scope) release of the atomic
        cnt = tl.atomic_add(counter_ptr + n_req + row, 1, sem="acq_rel")
        if cnt == P - 1:
            tl.atomic_xchg(counter_ptr + n_req + row, 0, sem="relaxed")
            offs_p = tl.arange(0, P_PAD)
            m = offs_p < P
            pv = tl.load(part_v_ptr + row * P + offs_p, mask=m, other=float("-inf"), cache_modifier=".cg")
            pi = tl.load(part_i_ptr + row * P + offs_p, mask=m, other=2147483647, cache_modifier=".cg")
            top = tl.max(pv, axis=0)
            am = tl.min(tl.where(pv == top, pi, 2147483647), axis=0)
            am = tl.where(am == 2147483647, 0, am)
            _pack(am, row, ids_ptr, packed_ptr, counter_ptr, stride_p, Q, Q_PAD, PACK)


def _check(logits: torch.Tensor) -> None:
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be [R, V] with a contiguous last dimension, got {tuple(logits.shape)}")


def _programs(v: int, chunk: int) -> int:
    """Programs per logits row: one per ``chunk`` of the vocabulary, at most ``SPECSERVE_GREEDY_TAIL_PROGRAMS``
    (default 64; 1 = one program walks the whole row, the form before session 47)."""
    raw = os.environ.get(PROGRAMS_ENV, "").strip()
    if raw and (not raw.isdigit() or int(raw) < 1):
        raise ValueError(f"{PROGRAMS_ENV} must be a positive integer, got {raw!r}")
    return max(1, min(triton.cdiv(v, chunk), int(raw) if raw else _MAX_PROGRAMS))


def _launch(
    logits: torch.Tensor, ids: torch.Tensor, packed: torch.Tensor, q: int, n_req: int, pack: bool
) -> None:
    r, v = logits.shape
    chunk = min(_CHUNK, triton.next_power_of_2(v))
    p = _programs(v, chunk)
    req = n_req if pack and q > 1 else 0  # request counters first, then the rows'
    n_counters = req + (r if p > 1 else 0)
    counters = _merge_counters(logits.device, n_counters) if n_counters else packed  # shared zeroed counters
    part_v = torch.empty((r, p), dtype=torch.float32, device=logits.device) if p > 1 else packed
    part_i = torch.empty((r, p), dtype=torch.int32, device=logits.device) if p > 1 else packed
    pdl, kw = pdl_launch(logits.device)
    _greedy_tail_kernel[(r, p)](
        logits, ids, packed, counters, part_v, part_i, v, logits.stride(0), packed.stride(0) if pack else 0,
        req, Q=q, Q_PAD=max(2, triton.next_power_of_2(q)), PACK=pack, CHUNK=chunk, P=p,
        P_PAD=max(2, triton.next_power_of_2(p)), PDL=pdl, num_warps=8, **kw,
    )  # fmt: skip


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` of [R, V] logits as int64 [R], one launch."""
    _check(logits)
    r = logits.shape[0]
    out = torch.empty(r, dtype=torch.int64, device=logits.device)
    if r == 0:
        return out
    _launch(logits, out, out, 1, 0, pack=False)
    return out


def greedy_verify_triton(logits: torch.Tensor, ids: torch.Tensor, b: int, q: int) -> torch.Tensor:
    """:func:`specserve.spec.rejection.greedy_verify` in one launch: int64 [b, q+1] = each of request j's q rows'
    argmax, then ``n_match``. ``logits`` [b*q, V], ``ids`` [b*q] (int64, request-major)."""
    _check(logits)
    if logits.shape[0] != b * q or ids.shape != (b * q,):
        raise ValueError(
            f"expected {b * q} logits rows and ids, got {tuple(logits.shape)} / {tuple(ids.shape)}"
        )
    packed = torch.empty((b, q + 1), dtype=torch.int64, device=logits.device)
    if b == 0:
        return packed
    _launch(logits, ids, packed, q, b, pack=True)
    return packed
