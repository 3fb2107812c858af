"""Lossless verification of draft tokens (vLLM's rejection sampler semantics).

For request b with ``num_draft[b] = n`` drafts ``d_0..d_{n-1}`` the target produced n + 1 rows of
logits: one per draft position, then the bonus position.  Output: the accepted prefix of the drafts
followed by one token sampled by the target (the *recovered* token at the first rejection, or the
*bonus* token when every draft was accepted), so ``num_emitted = accepted + 1``.

* Greedy rows: accept while ``d_i == argmax(target_i)``; the emitted token after the accepted prefix
  is the target argmax at that position (recovered at a mismatch, bonus when all matched).
* Random rows: ``p_i = softmax(apply_sampling_constraints(target_i))``; accept ``d_i`` iff
  ``u_i <= p_i(d_i) / q_i(d_i)`` with ``u_i ~ U(0, 1]`` in float64 (never 0, so a draft with
  ``p_i(d_i) = 0`` is never accepted).  Without ``draft_probs`` the drafter is a point mass
  (``q_i(d_i) = 1``).  At the first rejection the recovered token is drawn from
  ``normalize(max(0, p_i - q_i))`` (point mass: ``p_i`` with ``d_i`` zeroed); if all drafts are
  accepted the bonus token is drawn from ``p_bonus`` exactly as the normal sampler would.  Both draws
  use one exponential race ``argmax(dist / E)``: only one of them is ever emitted, so they can share E.

Random draws: rows of seeded requests use the counter-based noise of :mod:`specserve.layers.seeded_noise`:
the uniform of the draft that would become position ``n`` and the race deciding the token emitted at
position ``n`` are functions of (seed, n) alone, so a seeded request's tokens do not depend on its batch, on
the graphs or on the step pipelining (``positions`` in the sampling tensors: each request's first sampled
position).  Other rows draw from ``fallback`` (or torch's default generator).

No host syncs, no Python loops over tokens (only over seeded rows for their draws).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specserve.layers.sampler import (
    SamplingTensors,
    apply_sampling_constraints,
    argmax_last,
    draw_exponential,
    greedy_tail_on,
    seeded_rows,
    static_sampling_tensors,
    triton_sampler_on,
)
from specserve.layers.seeded_noise import accept_uniform, race_exponential

PLACEHOLDER = -1


def _draw_uniform(
    num_rows: int,
    k: int,
    seed_keys: Sequence[int],
    positions: Sequence[int] | None,
    fallback: torch.Generator | None,
    device: torch.device,
) -> torch.Tensor:
    """[num_rows, k] float64 uniforms in (0, 1]; seeded row i: the acceptance uniforms of positions[i] + j."""
    u = torch.zeros(num_rows, k, dtype=torch.float64, device=device)
    rows = seeded_rows(seed_keys, positions, device)
    if rows is None or len(rows[0]) < num_rows:
        u.uniform_(generator=fallback)
        u = 1.0 - u  # uniform_ draws from [0, 1); 1 - x lies in (0, 1]
    if rows is not None and k > 0:
        idx, keys, pos = rows
        u.index_copy_(0, idx, accept_uniform(keys, pos, k))
    return u


def _per_token_tensors(st: SamplingTensors, req_of_row: torch.Tensor) -> SamplingTensors:
    """Row-expanded parameters for apply_sampling_constraints (seeds are not needed there)."""
    return SamplingTensors(
        temperature=st.temperature[req_of_row],
        top_k=st.top_k[req_of_row],
        top_p=st.top_p[req_of_row],
        min_p=st.min_p[req_of_row],
        greedy=st.greedy[req_of_row],
        seed_keys=[0] * int(req_of_row.shape[0]),
        positions=None,
        all_greedy=st.all_greedy,
        all_random=st.all_random,
        no_top_k=st.no_top_k,
        no_top_p=st.no_top_p,
        no_min_p=st.no_min_p,
    )


def _residual(p: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """Unnormalized recovery distribution max(0, p - q) [B, V]; point-mass q when ``q`` is None."""
    if q is None:
        res = p.scatter(-1, draft.unsqueeze(-1), 0.0)
    else:
        res = (p - q.to(p.dtype)).clamp_min_(0.0)
    # rounding can leave nothing (p == q numerically); fall back to p rather than an arbitrary id
    empty = res.sum(dim=-1, keepdim=True) <= 0
    return torch.where(empty, p, res)


def rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft: torch.Tensor,
    st: SamplingTensors,
    draft_probs: torch.Tensor | None = None,
    fallback: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify drafts against the target.

    Args:
        target_logits: [T, V], T = sum_b (num_draft[b] + 1), request-major; for each request its
            num_draft[b] draft positions, then its bonus position.
        draft_token_ids: [B, K] int64, padded with -1 beyond num_draft[b].
        num_draft: [B] int64 in 0..K (0: plain decode, just sample the bonus).
        st: sampling parameters per request (B rows); ``st.positions``: the position of each request's first
            sampled token (its first draft's; needed for seeded rows).
        draft_probs: [B, K, V] drafter probabilities, or None for an argmax drafter (point mass).
        fallback: generator for the rows of unseeded requests.

    Returns:
        (output_token_ids [B, K + 1] int64 with PLACEHOLDER after the emitted tokens,
         num_emitted [B] int64 = accepted + 1).
    """
    num_reqs, k = draft_token_ids.shape
    num_rows, vocab = target_logits.shape
    device = target_logits.device
    draft = draft_token_ids.to(device=device, dtype=torch.int64)
    num_draft = num_draft.to(device=device, dtype=torch.int64)

    # index of each request's rows in the flat [T, V] logits; positions past num_draft map to the bonus
    rows_per_req = num_draft + 1
    start = rows_per_req.cumsum(0) - rows_per_req
    col = torch.arange(k + 1, device=device)
    row_idx = start.unsqueeze(1) + torch.minimum(col.unsqueeze(0), num_draft.unsqueeze(1))  # [B, K+1]
    bonus_idx = start + num_draft  # [B]
    valid = col[:k].unsqueeze(0) < num_draft.unsqueeze(1)  # [B, K]
    safe_draft = draft.clamp(0, vocab - 1)

    # greedy: every emitted token is the target argmax at its position
    if not st.all_random:
        target_argmax = argmax_last(target_logits)[row_idx]  # [B, K+1]
        match = (draft == target_argmax[:, :k]) & valid
        accepted_g = match.to(torch.int64).cumprod(dim=1).sum(dim=1)
        final_g = target_argmax.gather(1, accepted_g.unsqueeze(1)).squeeze(1)
        if st.all_greedy:
            return _assemble(draft, accepted_g, final_g, k), accepted_g + 1

    # random: ratio test on the constrained target distribution
    req_of_row = torch.repeat_interleave(
        torch.arange(num_reqs, device=device), rows_per_req, output_size=num_rows
    )
    probs = apply_sampling_constraints(target_logits, _per_token_tensors(st, req_of_row)).softmax(dim=-1)
    u = _draw_uniform(num_reqs, k, st.seed_keys, st.positions, fallback, device)
    if k > 0:
        draft_rows = row_idx[:, :k]  # [B, K]
        p_d = probs[draft_rows, safe_draft].to(torch.float64)  # [B, K]
        if draft_probs is None:
            accept = p_d >= u
        else:
            q_all = draft_probs.to(device)
            q_d = q_all.gather(-1, safe_draft.unsqueeze(-1)).squeeze(-1).to(torch.float64)
            accept = (q_d > 0) & (p_d >= u * q_d)
        accepted_r = (accept & valid).to(torch.int64).cumprod(dim=1).sum(dim=1)
        # recovery distribution at the first rejected position (unused when all were accepted)
        rej = accepted_r.clamp(max=k - 1)
        ar = torch.arange(num_reqs, device=device)
        p_rej = probs[row_idx[ar, rej]]  # [B, V]
        q_rej = None if draft_probs is None else q_all[ar, rej]
        recover = _residual(p_rej, safe_draft[ar, rej], q_rej)
        rejected = (accepted_r < num_draft).unsqueeze(1)
        dist = torch.where(rejected, recover, probs[bonus_idx])
    else:
        accepted_r = torch.zeros(num_reqs, dtype=torch.int64, device=device)
        dist = probs[bonus_idx]
    # the emitted token's position: the first sampled one + the accepted drafts
    final_pos = None
    if st.positions is not None:
        final_pos = torch.tensor(st.positions, dtype=torch.int64, device=device) + accepted_r
    e = draw_exponential(num_reqs, vocab, st.seed_keys, final_pos, fallback, device)
    final_r = argmax_last(dist / e)

    if st.all_random:
        return _assemble(draft, accepted_r, final_r, k), accepted_r + 1
    accepted = torch.where(st.greedy, accepted_g, accepted_r)
    final = torch.where(st.greedy, final_g, final_r)
    return _assemble(draft, accepted, final, k), accepted + 1


def _assemble(draft: torch.Tensor, accepted: torch.Tensor, final: torch.Tensor, k: int) -> torch.Tensor:
    """[B, K+1]: drafts[:accepted], then ``final``, then PLACEHOLDER."""
    num_reqs = draft.shape[0]
    out = torch.full((num_reqs, k + 1), PLACEHOLDER, dtype=torch.int64, device=draft.device)
    if k > 0:
        keep = torch.arange(k, device=draft.device).unsqueeze(0) < accepted.unsqueeze(1)
        out[:, :k] = torch.where(keep, draft, out[:, :k])
    out.scatter_(1, accepted.unsqueeze(1), final.unsqueeze(1))
    return out


# ---------------------------------------------------------------------------------------------- in-graph verify
def greedy_verify(logits: torch.Tensor, ids: torch.Tensor, b: int, q: int) -> torch.Tensor:
    """Greedy verification of a padded batch, for the graphs (no host syncs).

    ``logits`` [b*q, V] and ``ids`` [b*q] are request-major: request j's committed token, then its q-1 drafts.
    Returns int64 [b, q+1]: the argmax of each of request j's q rows, then ``n_match``, the number of leading
    drafts equal to the argmax of the row before them (0 when q == 1).  With num_draft real drafts, request j
    emits ``argmax[j, : min(n_match, num_draft) + 1]``, which is what rejection_sample gives a greedy request.
    """
    if greedy_tail_on(logits.device):  # the same integers in one launch
        from specserve.layers.triton_argmax import greedy_verify_triton

        return greedy_verify_triton(logits, ids, b, q)
    am = argmax_last(logits).view(b, q)
    if q > 1:
        match = ids.view(b, q)[:, 1:] == am[:, :-1]
        n_match = match.to(torch.int64).cumprod(dim=1).sum(dim=1, keepdim=True)
    else:
        n_match = torch.zeros_like(am)
    return torch.cat([am, n_match], dim=1)


def sample_verify(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    num_draft: torch.Tensor,
    b: int,
    q: int,
    greedy_packed: torch.Tensor | None = None,
    seed_key: torch.Tensor | None = None,
    pos: torch.Tensor | None = None,
    use_triton: bool | None = None,
    searches: bool = True,
) -> torch.Tensor:
    """rejection_sample for a padded batch, for the graphs: static shapes, no host syncs, no Python branches on
    values (except on CPU tensors, where nothing is captured), random draws from torch's default generator or,
    for seeded requests, the counter-based noise of their positions.

    ``logits`` [b*q, V] and ``ids`` [b*q] as in greedy_verify; per request (all [b]): its sampling parameters
    as ``param_row`` gives them (temperature 0: greedy) and its number of real drafts (the drafts past it are
    padding: never accepted, and the bonus is drawn at row num_draft).  ``greedy_packed``: greedy_verify's
    output for these logits, when already computed.  ``logits`` in any float dtype (read as fp32).  Under
    ``use_triton`` (default: :func:`specserve.layers.sampler.triton_sampler_on`) the launches of
    :mod:`specserve.layers.triton_sampling` compute the same draws and tokens without sorting (``searches=False``
    leaves out their top-k / top-p rounds: only for batches that use neither).

    Returns int64 [b, q+1] in greedy_verify's layout, so that request j emits
    ``packed[j, : min(packed[j, q], num_draft[j]) + 1]``: greedy rows are exactly greedy_verify's; for a random
    row, ``packed[j, q]`` is the number of accepted drafts (at most num_draft), the row starts with them and
    the next entry is the recovered token (drawn from p with the rejected draft removed) or, when all were
    accepted, the bonus token (drawn from p at row num_draft).  Draws: [b, q-1] uniforms, then [b, V] Exp(1).
    """
    vocab, k, device = logits.shape[-1], q - 1, logits.device
    if greedy_packed is None:
        greedy_packed = greedy_verify(logits, ids, b, q)
    if triton_sampler_on(device) if use_triton is None else use_triton:  # the same draws and tokens, no sort
        from specserve.layers.triton_sampling import sample_verify_triton

        return sample_verify_triton(
            logits, ids, temperature, top_k, top_p, min_p, num_draft, b, q, greedy_packed, seed_key, pos,
            searches=searches,
        )  # fmt: skip
    logits = logits.float()

    def per_row(t: torch.Tensor) -> torch.Tensor:
        return t[:b, None].expand(b, q).reshape(-1)

    st = static_sampling_tensors(per_row(temperature), per_row(top_k), per_row(top_p), per_row(min_p))
    probs = apply_sampling_constraints(logits, st).softmax(dim=-1).view(b, q, vocab)
    nd = num_draft[:b].to(torch.int64).clamp(0, k)
    draft = ids.view(b, q)[:, 1:].clamp(0, vocab - 1)  # [b, k]
    seeded: torch.Tensor | None = None  # [b, 1] bool: the seeded requests, when any row may be one
    key = first = torch.empty(0)
    if seed_key is not None and pos is not None:
        key = seed_key[:b].to(torch.int64)
        if device.type == "cuda" or bool((key > 0).any()):  # CPU: skip the hash when no row needs it
            seeded = (key > 0).unsqueeze(1)
            first = pos.view(b, q)[:, 0].to(torch.int64) + 1  # each request's first sampled position
    if k > 0:
        u = 1.0 - torch.rand(b, k, dtype=torch.float64, device=device)  # (0, 1]
        if seeded is not None:
            u = torch.where(seeded, accept_uniform(key, first, k), u)
        p_d = probs[:, :k].gather(2, draft.unsqueeze(-1)).squeeze(-1).to(torch.float64)
        valid = torch.arange(k, device=device).unsqueeze(0) < nd.unsqueeze(1)
        accepted = ((p_d >= u) & valid).to(torch.int64).cumprod(dim=1).sum(dim=1)
    else:
        accepted = torch.zeros(b, dtype=torch.int64, device=device)
    # p at the first rejected position, or at the bonus position (row num_draft) when every draft was accepted
    p_at = probs.gather(1, accepted.view(b, 1, 1).expand(b, 1, vocab)).squeeze(1)  # [b, V]
    if k > 0:
        d_at = draft.gather(1, accepted.clamp(max=k - 1).unsqueeze(1)).squeeze(1)
        dist = torch.where((accepted < nd).unsqueeze(1), _residual(p_at, d_at, None), p_at)
    else:
        dist = p_at
    e = draw_exponential(b, vocab, [0] * b, None, None, device)
    if seeded is not None:
        e = torch.where(seeded, race_exponential(key, first + accepted, vocab), e)
    final = argmax_last(dist / e)
    sampled = torch.cat([_assemble(draft, accepted, final, k), accepted.unsqueeze(1)], dim=1)
    greedy = st.greedy.view(b, q)[:, :1]
    return torch.where(greedy, greedy_packed, sampled)
