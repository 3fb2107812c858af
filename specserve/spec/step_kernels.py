"""The device-resident speculative step's bookkeeping as one Triton kernel each (GPU fused path).

A fused DFlash step derives, per request, from the verify graph's packed output: the slots of the context K/V
to store (the accepted rows), the drafter's query block [bonus, MASK x K] with its positions, slots and seq_len,
and whether the request drafts at all. An asynchronous speculative step (``ModelRunner.launch_spec``) derives its
inputs (ids, positions, slots, seq_len, number of drafts and draft budget) from the previous step's output in the
same way. As torch ops each is ~20-25 tiny kernels (in the drafter graph) or ~25 eager launches (the async
step's host time); here one program per request does it. The torch versions (``*_ref``) are the specification,
run where the fused kernels are off, and the tests' oracle: the kernels compute the same integers.

Kernels run under ``TRITON_INTERPRET=1`` on CPU tensors, take grids from static shapes and never sync the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["async_step_inputs", "async_step_inputs_ref", "dflash_query_inputs", "dflash_query_inputs_ref"]


# ------------------------------------------------------------------------------ DFlash fused step: query block


def dflash_query_inputs_ref(
    packed: torch.Tensor,
    aux: torch.Tensor,
    pos: torch.Tensor,
    slots: torch.Tensor,
    bt: torch.Tensor,
    seq: torch.Tensor,
    k: int,
    mask_token_id: int,
    block_size: int,
) -> tuple[torch.Tensor, ...]:
    """packed [b, q+1] (q verified tokens, n_match), aux [b, >=2] int32 (num_draft, budget), the verify step's pos
    / slots [b*q] int64, bt [b, max_blocks] int32, seq [b] int32 (0: padding) ->

    ctx_slots [b*q] (the verify slots of rows 0..n_acc, -1 elsewhere), query ids [b*q] ([bonus, MASK x K]),
    query positions [b*q] (bonus position first; 0 when inactive), query slots [b*q] (-1 when inactive), query
    seq_len [b] int32 (0 when inactive), active [b] bool: a real request with draft budget left whose block
    table covers the query block."""
    b, q, mb = packed.shape[0], k + 1, bt.shape[1]
    cols = torch.arange(q, device=packed.device)
    num_draft = aux[:, 0].long().clamp(0, k)
    budget = aux[:, 1].long()
    n_acc = torch.minimum(packed[:, q].clamp(0, k), num_draft)
    ctx_slots = torch.where(cols[None, :] <= n_acc[:, None], slots.view(b, q), -1).view(-1)
    bonus = packed.gather(1, n_acc[:, None])
    first = pos.view(b, q)[:, 0] + n_acc + 1
    qpos = first[:, None] + cols[None, :]
    blk = qpos // block_size
    bid = bt.gather(1, blk.clamp(0, mb - 1)).long()
    covered = ((bid >= 0) & (blk < mb)).all(1)
    active = (seq > 0) & covered & (budget > n_acc)
    qpos = torch.where(active[:, None], qpos, 0)
    qslots = torch.where(active[:, None], bid * block_size + qpos % block_size, -1).view(-1)
    qseq = torch.where(active, first + q, 0).to(torch.int32)
    ids = torch.cat([bonus, torch.full((b, k), mask_token_id, dtype=packed.dtype, device=packed.device)], 1)
    return ctx_slots, ids.view(-1), qpos.view(-1), qslots, qseq, active


@triton.jit
def _dflash_query_kernel(
    packed_ptr,
    aux_ptr,
    pos_ptr,
    slots_ptr,
    bt_ptr,
    seq_ptr,
    ctx_slots_ptr,
    ids_ptr,
    qpos_ptr,
    qslots_ptr,
    qseq_ptr,
    active_ptr,
    stride_packed,
    stride_aux,
    stride_bt,
    mask_token_id,
    K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
):
    j = tl.program_id(0).to(tl.int64)
    Q: tl.constexpr = K + 1
    cols = tl.arange(0, BLOCK_Q)
    cm = cols < Q
    num_draft = tl.minimum(tl.maximum(tl.load(aux_ptr + j * stride_aux).to(tl.int64), 0), K)
    budget = tl.load(aux_ptr + j * stride_aux + 1).to(tl.int64)
    n_match = tl.minimum(tl.maximum(tl.load(packed_ptr + j * stride_packed + Q), 0), K)
    n_acc = tl.minimum(n_match, num_draft)
    row = j * Q + cols
    slots = tl.load(slots_ptr + row, mask=cm, other=-1)
    tl.store(ctx_slots_ptr + row, tl.where(cols <= n_acc, slots, -1), mask=cm)
    bonus = tl.load(packed_ptr + j * stride_packed + n_acc)
    first = tl.load(pos_ptr + j * Q) + n_acc + 1
    qpos = first + cols
    blk = qpos // BLOCK_SIZE
    bid = tl.load(bt_ptr + j * stride_bt + tl.minimum(tl.maximum(blk, 0), MAX_BLOCKS - 1), mask=cm, other=0)
    bid = bid.to(tl.int64)
    ok = ((bid >= 0) & (blk < MAX_BLOCKS)) | (cols >= Q)
    covered = tl.min(ok.to(tl.int32), 0) > 0
    seq = tl.load(seq_ptr + j)
    active = (seq > 0) & covered & (budget > n_acc)
    qpos = tl.where(active, qpos, 0)
    tl.store(qpos_ptr + row, qpos, mask=cm)
    tl.store(qslots_ptr + row, tl.where(active, bid * BLOCK_SIZE + qpos % BLOCK_SIZE, -1), mask=cm)
    tl.store(qseq_ptr + j, tl.where(active, first + Q, 0).to(tl.int32))
    tl.store(active_ptr + j, active.to(tl.int8))
    tl.store(ids_ptr + row, tl.where(cols == 0, bonus, mask_token_id), mask=cm)


def dflash_query_inputs(
    packed: torch.Tensor,
    aux: torch.Tensor,
    pos: torch.Tensor,
    slots: torch.Tensor,
    bt: torch.Tensor,
    seq: torch.Tensor,
    k: int,
    mask_token_id: int,
    block_size: int,
) -> tuple[torch.Tensor, ...]:
    """:func:`dflash_query_inputs_ref` in one kernel launch (one program per request)."""
    b, q = packed.shape[0], k + 1
    if packed.shape[1] < q + 1 or pos.shape[0] != b * q or slots.shape[0] != b * q:
        raise ValueError(f"packed [b, >={q + 1}] and pos / slots [b*{q}] expected")
    if aux.stride(1) != 1 or bt.stride(1) != 1 or packed.stride(1) != 1:
        raise ValueError("packed, aux and bt must be contiguous in their last dimension")
    dev = packed.device
    ctx_slots = torch.empty(b * q, dtype=torch.int64, device=dev)
    ids = torch.empty(b * q, dtype=torch.int64, device=dev)
    qpos = torch.empty(b * q, dtype=torch.int64, device=dev)
    qslots = torch.empty(b * q, dtype=torch.int64, device=dev)
    qseq = torch.empty(b, dtype=torch.int32, device=dev)
    active = torch.empty(b, dtype=torch.int8, device=dev)
    _dflash_query_kernel[(b,)](
        packed,
        aux,
        pos,
        slots,
        bt,
        seq,
        ctx_slots,
        ids,
        qpos,
        qslots,
        qseq,
        active,
        packed.stride(0),
        aux.stride(0),
        bt.stride(0),
        int(mask_token_id),
        K=k,
        BLOCK_Q=triton.next_power_of_2(q),
        BLOCK_SIZE=block_size,
        MAX_BLOCKS=bt.shape[1],
        num_warps=1,
    )
    return ctx_slots, ids, qpos, qslots, qseq, active.view(torch.bool)


# ------------------------------------------------------------------------- async step: inputs from step N-1


def async_step_inputs_ref(
    prev_packed: torch.Tensor,
    prev_num_draft: torch.Tensor,
    prev_budget: torch.Tensor,
    prev_first: torch.Tensor,
    bt: torch.Tensor,
    k: int,
    block_size: int,
) -> tuple[torch.Tensor, ...]:
    """Step N+1's inputs from step N's device output, per request (rows in the same order): prev_packed [n,
    q+1+K] (q verified tokens, n_match, K drafts or -1), its num_draft / budget / first position [n] int64, this
    step's bt [n, max_blocks] int32 ->

    ids, pos, slots [n*q] int64, seq [n] int32, and num_draft, budget, first [n] int64: n_acc = min(n_match,
    num_draft); the block is [bonus, the drafts] at first + n_acc + 1; num_draft = the real drafts capped by
    budget - n_acc (0 when none); budget - n_acc - 1; slots -1 past the drafts or where the table has no block."""
    q, mb = k + 1, bt.shape[1]
    cols = torch.arange(q, device=prev_packed.device)
    n_acc = torch.minimum(prev_packed[:, q].clamp(0, k), prev_num_draft)
    bonus = prev_packed.gather(1, n_acc[:, None])
    drafts = prev_packed[:, q + 1 : q + 1 + k]
    num_draft = torch.where(drafts[:, 0] >= 0, (prev_budget - n_acc).clamp(0, k), 0)
    budget = prev_budget - n_acc - 1
    first = prev_first + n_acc + 1
    pos = first[:, None] + cols[None, :]
    ids = torch.cat([bonus, torch.where(cols[None, 1:] <= num_draft[:, None], drafts, 0)], 1)
    blk = pos // block_size
    bid = bt.gather(1, blk.clamp(0, mb - 1)).long()
    valid = (cols[None, :] <= num_draft[:, None]) & (bid >= 0) & (blk < mb)
    slots = torch.where(valid, bid * block_size + pos % block_size, -1)
    seq = (first + q).to(torch.int32)
    return ids.view(-1), pos.view(-1), slots.view(-1), seq, num_draft, budget, first


@triton.jit
def _async_step_kernel(
    prev_ptr,
    prev_nd_ptr,
    prev_budget_ptr,
    prev_first_ptr,
    bt_ptr,
    ids_ptr,
    pos_ptr,
    slots_ptr,
    seq_ptr,
    nd_ptr,
    budget_ptr,
    first_ptr,
    stride_prev,
    stride_bt,
    K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
):
    j = tl.program_id(0).to(tl.int64)
    Q: tl.constexpr = K + 1
    cols = tl.arange(0, BLOCK_Q)
    cm = cols < Q
    base = prev_ptr + j * stride_prev
    n_match = tl.minimum(tl.maximum(tl.load(base + Q), 0), K)
    n_acc = tl.minimum(n_match, tl.load(prev_nd_ptr + j))
    bonus = tl.load(base + n_acc)
    prev_budget = tl.load(prev_budget_ptr + j)
    has_drafts = tl.load(base + Q + 1) >= 0
    num_draft = tl.where(has_drafts, tl.minimum(tl.maximum(prev_budget - n_acc, 0), K), 0)
    first = tl.load(prev_first_ptr + j) + n_acc + 1
    # column c >= 1 holds draft c-1 (at packed column Q + c)
    drafts = tl.load(base + Q + cols, mask=cm & (cols >= 1), other=0)
    ids = tl.where(cols == 0, bonus, tl.where(cols <= num_draft, drafts, 0))
    pos = first + cols
    blk = pos // BLOCK_SIZE
    bid = tl.load(bt_ptr + j * stride_bt + tl.minimum(tl.maximum(blk, 0), MAX_BLOCKS - 1), mask=cm, other=0)
    bid = bid.to(tl.int64)
    valid = (cols <= num_draft) & (bid >= 0) & (blk < MAX_BLOCKS)
    row = j * Q + cols
    tl.store(ids_ptr + row, ids, mask=cm)
    tl.store(pos_ptr + row, pos, mask=cm)
    tl.store(slots_ptr + row, tl.where(valid, bid * BLOCK_SIZE + pos % BLOCK_SIZE, -1), mask=cm)
    tl.store(seq_ptr + j, (first + Q).to(tl.int32))
    tl.store(nd_ptr + j, num_draft)
    tl.store(budget_ptr + j, prev_budget - n_acc - 1)
    tl.store(first_ptr + j, first)


def async_step_inputs(
    prev_packed: torch.Tensor,
    prev_num_draft: torch.Tensor,
    prev_budget: torch.Tensor,
    prev_first: torch.Tensor,
    bt: torch.Tensor,
    k: int,
    block_size: int,
) -> tuple[torch.Tensor, ...]:
    """:func:`async_step_inputs_ref` in one kernel launch (one program per request)."""
    n, q = prev_packed.shape[0], k + 1
    if prev_packed.shape[1] < q + 1 + k or prev_packed.stride(1) != 1 or bt.stride(1) != 1:
        raise ValueError(f"prev_packed [n, >={q + 1 + k}] and bt contiguous in their last dimension expected")
    for t in (prev_num_draft, prev_budget, prev_first):
        # is_contiguous, not stride 1: a one-request column view (stride q) is contiguous and read at index 0
        if t.shape != (n,) or t.dtype != torch.int64 or not t.is_contiguous():
            raise ValueError(f"num_draft, budget and first must be contiguous int64 [{n}]")
    dev = prev_packed.device
    ids = torch.empty(n * q, dtype=torch.int64, device=dev)
    pos = torch.empty(n * q, dtype=torch.int64, device=dev)
    slots = torch.empty(n * q, dtype=torch.int64, device=dev)
    seq = torch.empty(n, dtype=torch.int32, device=dev)
    num_draft = torch.empty(n, dtype=torch.int64, device=dev)
    budget = torch.empty(n, dtype=torch.int64, device=dev)
    first = torch.empty(n, dtype=torch.int64, device=dev)
    _async_step_kernel[(n,)](
        prev_packed,
        prev_num_draft,
        prev_budget,
        prev_first,
        bt,
        ids,
        pos,
        slots,
        seq,
        num_draft,
        budget,
        first,
        prev_packed.stride(0),
        bt.stride(0),
        K=k,
        BLOCK_Q=triton.next_power_of_2(q),
        BLOCK_SIZE=block_size,
        MAX_BLOCKS=bt.shape[1],
        num_warps=1,
    )
    return ids, pos, slots, seq, num_draft, budget, first
