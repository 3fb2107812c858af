"""The device-resident speculative step's per-request bookkeeping, as torch ops (the specification).

A fused DFlash step derives, per request, from the verify graph's packed output: the slots of the context K/V
to store (the accepted rows), the drafter's query block [bonus, MASK x K] with its positions, slots and seq_len,
and whether the request drafts at all. An asynchronous speculative step (``ModelRunner.launch_spec``) derives its
inputs (ids, positions, slots, seq_len, number of drafts and draft budget) from the previous step's output in the
same way. As torch ops each is ~20-25 tiny kernels (in the drafter graph) or ~25 eager launches (the async
step's host time): on the fused GPU path :mod:`specserve.spec.step_kernels` does each in one Triton kernel
(:func:`step_input_fns` picks); these versions run elsewhere (no triton needed) and are the kernels' oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["async_step_inputs_ref", "check_step_into", "dflash_query_inputs_ref", "step_input_fns"]


def step_input_fns(fused: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(dflash_query_inputs, async_step_inputs): the Triton kernels on the fused path, else the torch versions."""
    if fused:
        from specserve.spec import step_kernels

        return step_kernels.dflash_query_inputs, step_kernels.async_step_inputs
    return dflash_query_inputs_ref, async_step_inputs_ref


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


def check_step_into(into: tuple[torch.Tensor, ...], n: int, q: int) -> tuple[torch.Tensor, ...]:
    """``into`` of the async step inputs: (ids, pos, slots [n*q] int64, seq [n] int32, aux [n, >= 2] int32 whose
    columns 0 / 1 take num_draft / budget), each contiguous in its last dimension; returned as given."""
    if len(into) != 5:
        raise ValueError("into must be (ids, pos, slots, seq, aux)")
    ids, pos, slots, seq, aux = into
    ok = all(t.shape == (n * q,) and t.dtype == torch.int64 and t.is_contiguous() for t in (ids, pos, slots))
    ok = ok and seq.shape == (n,) and seq.dtype == torch.int32 and seq.is_contiguous()
    ok = ok and aux.dim() == 2 and aux.shape[0] == n and aux.shape[1] >= 2 and aux.dtype == torch.int32
    if not ok or aux.stride(1) != 1:
        raise ValueError(
            f"into: ids / pos / slots int64 [{n * q}], seq int32 [{n}] and aux int32 [{n}, >=2], contiguous rows"
        )
    return ids, pos, slots, seq, aux


def async_step_inputs_ref(
    prev_packed: torch.Tensor,
    prev_num_draft: torch.Tensor,
    prev_budget: torch.Tensor,
    prev_first: torch.Tensor,
    bt: torch.Tensor,
    k: int,
    block_size: int,
    into: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Step N+1's inputs from step N's device output, per request (rows in the same order): prev_packed [n,
    q+1+K] (q verified tokens, n_match, K drafts or -1), its num_draft / budget / first position [n] int64, this
    step's bt [n, max_blocks] int32 ->

    ids, pos, slots [n*q] int64, seq [n] int32, and num_draft, budget, first [n] int64: n_acc = min(n_match,
    num_draft); the block is [bonus, the drafts] at first + n_acc + 1; num_draft = the real drafts capped by
    budget - n_acc (0 when none); budget - n_acc - 1; slots -1 past the drafts or where the table has no block.
    ``into`` (:func:`check_step_into`): ids / pos / slots / seq and the (num_draft, budget) columns are written
    there too, and the returned ids / pos / slots / seq are those buffers."""
    q, mb, n = k + 1, bt.shape[1], prev_packed.shape[0]
    if any(t.shape != (n,) for t in (prev_num_draft, prev_budget, prev_first)) or bt.shape[0] != n:
        raise ValueError(f"num_draft, budget, first and bt must have one row per request [{n}]")
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
    out: tuple[torch.Tensor, ...] = (ids.view(-1), pos.view(-1), slots.view(-1), seq)
    if into is not None:
        dst = check_step_into(into, n, q)
        for d, v in zip(dst, out):
            d.copy_(v)
        dst[4][:, 0].copy_(num_draft)
        dst[4][:, 1].copy_(budget)
        out = dst[:4]
    return (*out, num_draft, budget, first)
