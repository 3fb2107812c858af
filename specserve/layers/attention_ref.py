"""Pure-torch paged attention and KV-cache store: the CPU backend and the oracle for the Triton kernels.

KV cache layout (shared with the model runner), per layer::

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]

A token's slot is ``block_id * block_size + offset``. Attention metadata is varlen, request-major:
``query_start_loc`` [B+1] int32, ``seq_lens`` [B] int32 (KV length including the new tokens, whose K/V
were already stored), ``block_tables`` [B, max_blocks] int32 (a negative block id is read as block 0, like the Triton kernel
does: only keys no real query can see lie there). Query ``j`` of request ``b`` sits at absolute
position ``seq_lens[b] - q_len_b + j``; key ``kp`` is visible iff ``kp < seq_len``, ``kp <= pos`` (causal)
and ``kp > pos - sliding_window`` (when a window is set). Queries with no visible key output zeros.

GQA is handled the way the Triton kernel does it: the ``group = num_heads // num_kv_heads`` query heads of
one KV head are packed into the row dimension, so K/V are never repeated.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["paged_attention_ref", "store_kv_ref"]

# "batched" / "per_request" forces one strategy of paged_attention_ref (tests exercise both); None = heuristic.
_FORCE_MODE: str | None = None
# padded attention elements (query x key x head x head_dim) one SDPA call's overhead is worth (see _build_plan)
_PADDING_BUDGET = 3_000_000


def store_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k``/``v`` [T, n_kv, hd] into the paged caches at ``slot_mapping`` [T]; slot -1 is skipped."""
    if k.shape != v.shape or k.dim() != 3:
        raise ValueError(f"k and v must both be [T, n_kv, hd]; got {tuple(k.shape)} and {tuple(v.shape)}")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [T={k.shape[0]}]; got {tuple(slot_mapping.shape)}")
    slots = slot_mapping.to(device=k.device, dtype=torch.long)
    valid = slots >= 0
    if not bool(valid.all()):
        slots, k, v = slots[valid], k[valid], v[valid]
    if k_cache.is_contiguous() and v_cache.is_contiguous():  # one index_copy_ per cache on the flat slot view
        n_kv, hd = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, n_kv, hd).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(-1, n_kv, hd).index_copy_(0, slots, v.to(v_cache.dtype))
        return
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    # Index on (block, offset) rather than a flat view so that caches with any strides are written in place.
    k_cache[blocks, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, offsets] = v.to(v_cache.dtype)


def _visibility_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, seq_len: torch.Tensor, causal: bool, sliding_window: int | None
) -> torch.Tensor:
    """Boolean mask [..., Q, S] from query positions [..., Q], key positions [S] and seq_len [..., 1]."""
    kp = k_pos[None, :]
    qp = q_pos[..., :, None]
    mask = kp < seq_len[..., None]
    if causal:
        mask = mask & (kp <= qp)
    if sliding_window is not None:
        mask = mask & (kp > qp - sliding_window)
    return mask


class _Mask:
    """A visibility mask [A, Q, S] prepared for SDPA once and reused by every layer of a forward."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.has_any = mask.any(-1)  # [A, Q]
        self.all_any = bool(self.has_any.all())
        # Fully masked rows would give NaN; let them see everything, then zero them.
        self.safe = mask | ~self.has_any[..., None]
        self._rows: dict[int, torch.Tensor] = {}

    def rows(self, g: int) -> torch.Tensor:
        """The mask with the ``g`` query heads of a KV head packed into the rows: [A, 1, Q*g, S]."""
        r = self._rows.get(g)
        if r is None:
            a, nq, s = self.safe.shape
            r = self._rows[g] = self.safe[:, None, :, None, :].expand(a, 1, nq, g, s).reshape(a, 1, nq * g, s)
        return r


def _gqa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: _Mask | None, scale: float
) -> torch.Tensor:
    """q [A, Q, H, D], k/v [A, S, Hk, D] (finite), mask [A, Q, S] or None (all visible) -> [A, Q, H, D].

    Rows with no visible key produce zeros.
    """
    a, nq, h, d = q.shape
    hk = k.shape[2]
    g = h // hk
    # Pack the g query heads of each kv head into the row dimension: [A, Hk, Q*g, D].
    qg = q.view(a, nq, hk, g, d).permute(0, 2, 1, 3, 4).reshape(a, hk, nq * g, d)
    kt = k.permute(0, 2, 1, 3)
    vt = v.permute(0, 2, 1, 3)
    o = F.scaled_dot_product_attention(
        qg, kt, vt, attn_mask=None if mask is None else mask.rows(g), scale=scale
    )
    o = o.view(a, hk, nq, g, d).permute(0, 2, 1, 3, 4).reshape(a, nq, h, d)
    if mask is not None and not mask.all_any:
        o = o.masked_fill(~mask.has_any[..., None, None], 0.0)
    return o


class _Request(NamedTuple):
    q0: int
    ql: int
    slots: torch.Tensor  # long [seq_len]: the cache slot of each key position
    mask: _Mask | None  # None: every key visible to every query


class _Batched(NamedTuple):
    """One padded SDPA call for all requests: (request, j) query rows, (request, key position) slots. Padded query
    rows read row 0; padded keys read the request's first key (finite, masked out)."""

    tok: torch.Tensor  # long [A * max_q]: the q row of each (request, j)
    shape: tuple[int, int, int]  # A, max_q, max_s
    slots: torch.Tensor  # long [A * max_s]
    mask: _Mask
    rows: torch.Tensor | None  # long: output rows of the valid (request, j); None: all, in order from row 0
    sel: torch.Tensor | None  # long: where those valid (request, j) sit in the [A * max_q] result


class _Plan(NamedTuple):
    """What :func:`paged_attention_ref` derives from the metadata alone (host lists, gather indices, masks): built
    once per forward and shared by its layers when the caller passes a ``plan_cache``."""

    inputs: tuple[torch.Tensor, ...]  # the metadata tensors it was built from (identity and version checked)
    versions: tuple[int, ...]  # their in-place modification counters (-1: an inference tensor, not tracked)
    requests: list[_Request]
    batched: _Batched | None
    # rows of q the requests cover from row 0 in order (-1: not so); when that is all of q, the result is returned
    covered_rows: int


def _versions(tensors: tuple[torch.Tensor, ...]) -> tuple[int, ...]:
    """In-place modification counters (inference-mode tensors keep none: -1)."""
    return tuple(-1 if x.is_inference() else x._version for x in tensors)


def _slots(block_tables_row: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slots of key positions ``pos`` through one block-table row (a negative block id reads block 0)."""
    blocks = block_tables_row.long().gather(-1, pos // block_size).clamp_min(0)
    return blocks * block_size + pos % block_size


def _build_plan(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    causal: bool,
    sliding_window: int | None,
    dev: torch.device,
    head_elems: int,
) -> _Plan:
    inputs = (query_start_loc, seq_lens, block_tables)
    versions = _versions(inputs)
    qsl = query_start_loc.tolist()
    sls = seq_lens.tolist()
    q_lens = [qsl[i + 1] - qsl[i] for i in range(len(sls))]
    active = [b for b in range(len(sls)) if q_lens[b] > 0 and sls[b] > 0]
    if not active:
        return _Plan(inputs, versions, [], None, -1)
    bt = block_tables.to(dev)
    work = sum(q_lens[b] * sls[b] for b in active)
    max_q = max(q_lens[b] for b in active)
    max_s = max(sls[b] for b in active)
    padded = len(active) * max_q * max_s
    covered = q_lens[active[0]] if len(active) == 1 and qsl[active[0]] == 0 else -1

    # Per request: exact slices, and no mask at all for decode / non-causal rows; batched: one gather and one masked
    # SDPA call over the requests padded to (max_q, max_s). Batched saves a call's overhead per extra request and
    # pays for the padded attention it computes: ~100 us a call against ~3.5e-5 us per padded (query, key, head,
    # dim) element (2-core VM, session 30, SmolLM2 heads, float32, with the plan built once per forward: 8 decode
    # rows over 50-400 keys 0.47 vs 0.90 ms, 4 x 4 verify rows 0.32 vs 0.61, 2 x 150 keys 0.14 vs 0.23; a 64-row
    # prefill chunk beside 3 decodes 1.52 vs 0.81, 512 + 1 rows 10.9 vs 5.2: per request), hence the budget.
    batched = len(active) >= 2 and (padded - work) * head_elems < (len(active) - 1) * _PADDING_BUDGET
    if _FORCE_MODE == "batched" or (_FORCE_MODE is None and batched):
        a = len(active)
        idx = torch.tensor(active, device=dev)
        sl_t = torch.tensor([sls[b] for b in active], device=dev)
        ql_t = torch.tensor([q_lens[b] for b in active], device=dev)
        k_pos = torch.arange(max_s, device=dev)
        # keys past a request's seq_len read its first key (finite, masked out): no garbage slot is ever read
        pos = torch.where(k_pos[None, :] < sl_t[:, None], k_pos[None, :], 0)
        slots = _slots(bt[idx], pos, block_size)
        j = torch.arange(max_q, device=dev)
        q_valid = j[None, :] < ql_t[:, None]
        starts = torch.tensor([qsl[b] for b in active], device=dev)
        tok = torch.where(q_valid, starts[:, None] + j[None, :], 0)
        q_pos = sl_t[:, None] - ql_t[:, None] + j[None, :]
        mask = _visibility_mask(q_pos, k_pos, sl_t[:, None], causal, sliding_window) & q_valid[..., None]
        rows, sel = tok[q_valid], q_valid.reshape(-1).nonzero().squeeze(1)
        in_order = sel.numel() == a * max_q and bool((rows == torch.arange(rows.numel(), device=dev)).all())
        plan = _Batched(
            tok.reshape(-1), (a, max_q, max_s), slots.reshape(-1), _Mask(mask),
            None if in_order else rows, None if in_order else sel,
        )  # fmt: skip
        return _Plan(inputs, versions, [], plan, rows.numel() if in_order else -1)

    requests = []
    for b in active:
        ql, sl = q_lens[b], sls[b]
        pos = torch.arange(sl, device=dev)
        everything_visible = (not causal or ql == 1) and (sliding_window is None or sliding_window >= sl)
        req_mask = None
        if not everything_visible:
            q_pos = torch.arange(sl - ql, sl, device=dev)
            m = _visibility_mask(q_pos, pos, torch.tensor([sl], device=dev), causal, sliding_window)
            req_mask = _Mask(m[None])
        requests.append(_Request(qsl[b], ql, _slots(bt[b], pos, block_size), req_mask))
    return _Plan(inputs, versions, requests, None, covered)


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows of a paged cache [blocks, block_size, Hk, D] at ``slots``: [len(slots), Hk, D]."""
    hk, d = cache.shape[2], cache.shape[3]
    if cache.is_contiguous():
        return cache.view(-1, hk, d).index_select(0, slots)
    bs = cache.shape[1]
    return cache[slots // bs, slots % bs]


def paged_attention_ref(
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
    max_seq_len: int | None = None,
    plan_cache: dict[Any, Any] | None = None,
) -> torch.Tensor:
    """Varlen paged attention over the block table; returns [T, num_heads, head_dim] in ``q``'s dtype.

    Reads the metadata on the host. Runs one SDPA call per request over its gathered K/V (one gather per request,
    no per-token loop), or one padded SDPA call for large batches of similar requests. Computation is in fp32.
    ``max_seq_len`` is accepted for signature parity with the Triton kernel; the true maximum is read from
    ``seq_lens``. Rows of ``q`` not covered by ``query_start_loc`` output zeros. ``plan_cache``: a dict that lives
    as long as the metadata (the torch backend keeps one per :class:`AttnMetadata`): the host lists, gather indices
    and masks derived from the metadata are built by the first layer and reused by the others (rebuilt if a
    metadata tensor was modified in place since).
    """
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("expected q [T, H, D] and k_cache == v_cache shape [num_blocks, block_size, Hk, D]")
    t, h, d = q.shape
    _, block_size, hk, dk = k_cache.shape
    if dk != d or h % hk != 0:
        raise ValueError(f"incompatible shapes: q heads {h}, head_dim {d}; cache heads {hk}, head_dim {dk}")
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be positive or None, got {sliding_window}")
    scale = d**-0.5 if scale is None else float(scale)

    key = (block_size, causal, sliding_window, _FORCE_MODE, q.device, h * d)
    plan = None if plan_cache is None else plan_cache.get(key)
    inputs = (query_start_loc, seq_lens, block_tables)
    if (
        plan is None
        or any(a is not b for a, b in zip(plan.inputs, inputs))
        or plan.versions != _versions(inputs)
    ):
        plan = _build_plan(
            query_start_loc, seq_lens, block_tables, block_size, causal, sliding_window, q.device, h * d
        )
        if plan_cache is not None:
            plan_cache[key] = plan

    if plan.batched is not None:
        p = plan.batched
        a, max_q, max_s = p.shape
        kb = _gather(k_cache, p.slots).view(a, max_s, hk, d).float()
        vb = _gather(v_cache, p.slots).view(a, max_s, hk, d).float()
        qb = q.index_select(0, p.tok).view(a, max_q, h, d).float()
        o = _gqa_attention(qb, kb, vb, p.mask, scale).reshape(a * max_q, h, d).to(q.dtype)
        if p.rows is None and plan.covered_rows == t:
            return o
        out = torch.zeros_like(q)
        if p.rows is None or p.sel is None:
            out[: o.shape[0]] = o
        else:
            out.index_copy_(0, p.rows, o.index_select(0, p.sel))
        return out

    def attend(r: _Request) -> torch.Tensor:  # one request's rows of the result
        kb, vb = _gather(k_cache, r.slots).float(), _gather(v_cache, r.slots).float()
        qb = q[r.q0 : r.q0 + r.ql].float()[None]
        return _gqa_attention(qb, kb[None], vb[None], r.mask, scale)[0].to(q.dtype)

    if len(plan.requests) == 1 and plan.covered_rows == t:  # one request, every row (decode / verify at b1)
        return attend(plan.requests[0])
    out = torch.zeros_like(q)
    for r in plan.requests:
        out[r.q0 : r.q0 + r.ql] = attend(r)
    return out
