"""The speculative step's bookkeeping (:mod:`specserve.spec.step_inputs`) as one Triton kernel each, one program
per request, for the fused GPU path: the same integers as the torch specifications there (the tests' oracle).

Kernels run under ``TRITON_INTERPRET=1`` on CPU tensors, take grids from static shapes and never sync the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specserve.spec.step_inputs import check_step_into

__all__ = ["async_step_inputs", "dflash_query_inputs"]


# ------------------------------------------------------------------------------ DFlash fused step: query block


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
    """:func:`specserve.spec.step_inputs.dflash_query_inputs_ref` in one kernel launch (one program per request)."""
    b, q = packed.shape[0], k + 1
    if packed.shape[1] < q + 1 or pos.shape[0] != b * q or slots.shape[0] != b * q:
        raise ValueError(f"packed [b, >={q + 1}] and pos / slots [b*{q}] expected")
    if aux.stride(1) != 1 or bt.stride(1) != 1 or packed.stride(1) != 1:
        raise ValueError("packed, aux and bt must be contiguous in their last dimension")
    dev = packed.device
    ctx_slots, ids, qpos, qslots = (torch.empty(b * q, dtype=torch.int64, device=dev) for _ in range(4))
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
    aux_ptr,
    stride_prev,
    stride_bt,
    stride_aux,
    K: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    HAS_AUX: tl.constexpr = False,
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
    budget = prev_budget - n_acc - 1
    tl.store(budget_ptr + j, budget)
    tl.store(first_ptr + j, first)
    if HAS_AUX:  # the static buffer's int32 (num_draft, budget) columns
        tl.store(aux_ptr + j * stride_aux, num_draft.to(tl.int32))
        tl.store(aux_ptr + j * stride_aux + 1, budget.to(tl.int32))


def async_step_inputs(
    prev_packed: torch.Tensor,
    prev_num_draft: torch.Tensor,
    prev_budget: torch.Tensor,
    prev_first: torch.Tensor,
    bt: torch.Tensor,
    k: int,
    block_size: int,
    into: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, ...]:
    """:func:`specserve.spec.step_inputs.async_step_inputs_ref` in one kernel launch (one program per request);
    with ``into`` its ids / pos / slots / seq and (num_draft, budget) columns are stored straight into those
    buffers (the runner's static graph inputs: no copy kernels after it)."""
    n, q = prev_packed.shape[0], k + 1
    if prev_packed.shape[1] < q + 1 + k or prev_packed.stride(1) != 1 or bt.stride(1) != 1:
        raise ValueError(f"prev_packed [n, >={q + 1 + k}] and bt contiguous in their last dimension expected")
    for t in (prev_num_draft, prev_budget, prev_first):
        # is_contiguous, not stride 1: a one-request column view (stride q) is contiguous and read at index 0
        if t.shape != (n,) or t.dtype != torch.int64 or not t.is_contiguous():
            raise ValueError(f"num_draft, budget and first must be contiguous int64 [{n}]")
    dev = prev_packed.device
    if into is not None:
        ids, pos, slots, seq, aux = check_step_into(into, n, q)
    else:
        ids, pos, slots = (torch.empty(n * q, dtype=torch.int64, device=dev) for _ in range(3))
        seq = torch.empty(n, dtype=torch.int32, device=dev)
        aux = seq  # unused
    num_draft, budget, first = (torch.empty(n, dtype=torch.int64, device=dev) for _ in range(3))
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
        aux,
        prev_packed.stride(0),
        bt.stride(0),
        aux.stride(0),
        K=k,
        BLOCK_Q=triton.next_power_of_2(q),
        BLOCK_SIZE=block_size,
        MAX_BLOCKS=bt.shape[1],
        HAS_AUX=into is not None,
        num_warps=1,
    )
    return ids, pos, slots, seq, num_draft, budget, first
