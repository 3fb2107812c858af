"""Training objectives: DFlash (anchored blocks, decayed CE) and EAGLE-3 (training-time test, CE).

Everything is batched: one drafter forward covers all blocks of a batch (DFlash) or all positions of one
unrolled step (EAGLE-3); there are no per-token Python loops. The LM-head cross-entropy runs in
checkpointed row chunks so the ``[rows, vocab]`` logits never all live at once.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from specserve.train.models import ATTN_BACKENDS, BlockVisibility, DFlashDrafter, Eagle3Drafter

# ------------------------------------------------------------------------------------------ shared


def _ce_chunk(
    h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits = F.linear(h, w.to(h.dtype)).float()
    ce = F.cross_entropy(logits, labels, reduction="none")
    top = logits.max(-1)
    gap = (top.values - logits.gather(1, labels[:, None])[:, 0]).detach()
    return ce, top.indices == labels, gap


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int = 8192
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row CE of ``hidden @ weight.T`` against ``labels``, top-1 correctness and the (detached) gap between
    the top logit and the label's (0 where the label is the top pick), in row chunks.

    With grad enabled each chunk is recomputed in backward (activation checkpointing), so peak memory is
    one chunk's fp32 logits regardless of the number of rows.
    """
    ces, oks, gaps = [], [], []
    use_ckpt = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    for i in range(0, hidden.shape[0], chunk):
        h, lab = hidden[i : i + chunk], labels[i : i + chunk]
        if use_ckpt:
            ce, ok, gap = checkpoint(_ce_chunk, h, weight, lab, use_reentrant=False)
        else:
            ce, ok, gap = _ce_chunk(h, weight, lab)
        ces.append(ce)
        oks.append(ok)
        gaps.append(gap)
    if not ces:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, torch.zeros(0, dtype=torch.bool, device=hidden.device), empty
    return torch.cat(ces), torch.cat(oks), torch.cat(gaps)


def _accept_length(correct: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """correct ``[R, P]`` bool per chain and position -> sum over chains of the leading run of correct ones."""
    run = torch.cumprod((correct & valid).long(), dim=-1)
    return run.sum().float()


def chain_acceptance(runs: dict[int, int], start: int, end: int) -> tuple[int, int]:
    """Acceptance in inference order from per-anchor runs: ``(tokens, steps)``.

    ``runs[a]`` is the number of leading drafted tokens that match the sequence when drafting from anchor ``a``
    (the last known token). Decoding starts at ``start`` (the first response token, which the target's prefill
    produced) and produces the tokens up to ``end - 1``. A step from anchor ``a`` drafts at most
    ``end - 2 - a`` tokens (as the engine and vLLM do: no drafts past max_tokens; the last token comes from a
    plain step, which has no drafts and does not count), commits the accepted drafts plus the target's bonus
    token and moves past them. So ``tokens / steps`` is the mean acceptance length (vLLM's
    ``1 + accepted / drafts``) that greedy decoding of this sequence with this drafter reports, unlike the
    all-anchor average, which also counts anchors that decoding jumps over (those right after a rejection
    are harder on average).
    """
    a, tokens, steps = start, 0, 0
    while a < end - 2:
        if a not in runs:  # a gap in the loss mask (another turn): resume at the next anchor
            nxt = [x for x in runs if x > a]
            if not nxt:
                break
            a = min(nxt)
            continue
        n = min(runs[a], end - 2 - a) + 1
        tokens += n
        steps += 1
        a += n
    return tokens, steps


# ------------------------------------------------------------------------------------------ DFlash


def default_gamma(block_size: int) -> float:
    """Loss-decay gamma: 7 for block 16 (z-lab / SpecForge), scaled with the block size."""
    return 7.0 * block_size / 16.0


def sample_anchors(
    loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``num_anchors`` random anchors per sequence with ``a`` and ``a+1`` inside the loss mask.

    Returns anchors ``[B, N]`` (long) and valid ``[B, N]`` (bool), N = min(num_anchors, most valid in batch).
    Per sequence the valid anchors come first, in ascending order (the objective does not depend on the
    order; ascending anchors make the FlexAttention block mask close to lower-triangular), then the invalid
    ones (anchor 0). Random numbers come from ``generator`` on the CPU (device independent, checkpointable).
    """
    lm = loss_mask.bool()
    b, s = lm.shape
    ok = torch.zeros_like(lm)
    ok[:, :-1] = lm[:, :-1] & lm[:, 1:]
    n = int(min(num_anchors, max(1, int(ok.sum(1).max()))))
    scores = torch.rand(b, s, generator=generator).to(lm.device)
    scores = scores.masked_fill(~ok, -1.0)
    vals, idx = scores.topk(n, dim=1)
    valid = vals >= 0
    order = torch.where(valid, idx, torch.full_like(idx, s)).argsort(dim=1)
    idx, valid = idx.gather(1, order), valid.gather(1, order)
    idx = torch.where(valid, idx, torch.zeros_like(idx))
    return idx, valid


def build_dflash_blocks(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    anchors: torch.Tensor,
    valid: torch.Tensor,
    block_size: int,
    mask_token_id: int,
    label_ids: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Block inputs for anchored training. Shapes: ``Q = N * block_size``.

    block_ids ``[B, Q]`` = ``[x_a, MASK x (B-1)]`` per anchor, positions ``[B, Q]`` = ``a..a+B-1``,
    labels ``[B, N, K]`` (label k is ``x_{a+k}``, or ``label_ids[a+k]`` when given), label_ok ``[B, N, K]``
    (k >= 1, inside the sequence and the loss mask, anchor valid), mask: a :class:`BlockVisibility` (a block
    sees the context positions < a, none for an invalid anchor, and its own block; ``mask.ctx_mask()`` is the
    dense ``[B, Q, S]`` form).
    """
    b, s = input_ids.shape
    n = anchors.shape[1]
    k = block_size
    offs = torch.arange(k, device=input_ids.device)
    pos = anchors[:, :, None] + offs  # [B, N, K]
    inside = pos < s
    pos_c = pos.clamp(max=s - 1).view(b, n * k)
    labels = (input_ids if label_ids is None else label_ids).gather(1, pos_c).view(b, n, k)
    label_ok = inside & loss_mask.bool().gather(1, pos_c).view(b, n, k) & valid[:, :, None]
    label_ok[:, :, 0] = False
    block_ids = torch.full((b, n, k), mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
    block_ids[:, :, 0] = input_ids.gather(1, anchors)
    ctx_len = torch.where(valid.bool(), anchors, torch.zeros_like(anchors))
    return dict(
        block_ids=block_ids.view(b, n * k),
        positions=pos.view(b, n * k),
        labels=labels,
        label_ok=label_ok,
        mask=BlockVisibility(ctx_len, k, s),
    )


POSITION_WEIGHTS = ("decay", "prefix")


def prefix_products(p: torch.Tensor) -> torch.Tensor:
    """``p`` ``[R, K]`` -> ``[R, K]``: at column k the product of ``p[:, :k]`` (1 at column 0)."""
    ones = torch.ones_like(p[:, :1])
    return torch.cat([ones, torch.cumprod(p[:, :-1], dim=1)], dim=1)


def reach_weights(gap: torch.Tensor, flat_ok: torch.Tensor, k: int) -> torch.Tensor:
    """Per labelled row (``gap`` over the rows ``flat_ok`` selects from ``[blocks * k]``: top logit - the label's
    logit): the detached product over its block's earlier offsets of ``exp(-gap_j)``, which is 1 where the
    drafter's greedy pick is the label and falls smoothly as the label drops behind it, a stand-in for "greedy
    verification reaches this offset"; offsets without a label (the anchor, past the sequence end or the loss
    mask) count as reached."""
    r = torch.ones(flat_ok.numel(), device=gap.device)
    r[flat_ok] = torch.exp(-gap.detach().float())
    return prefix_products(r.view(-1, k)).view(-1)[flat_ok]


class DFlashObjective(nn.Module):
    """``forward(taps, input_ids, loss_mask, anchors, valid) -> (loss, stats)``; wrap this in DDP.

    The target's embedding and LM head are plain (unregistered) tensors: frozen and never synced.

    ``position_weight``: ``"decay"`` weights block offset k by ``exp(-(k-1)/gamma)`` (z-lab / SpecForge);
    ``"prefix"`` (in the spirit of SpecForge's D-PACE) also multiplies it by :func:`reach_weights`, a detached,
    smooth measure of whether the drafter gets every earlier offset of the same block right (the product of
    ``exp(label logit - top logit)``): an accepted run only reaches offset k if offsets 1..k-1 were accepted, so
    this spends the gradient where it can lengthen accepted runs instead of on offsets the block rarely reaches.
    """

    def __init__(
        self,
        drafter: DFlashDrafter,
        embed_weight: torch.Tensor,
        lm_head_weight: torch.Tensor,
        gamma: float | None = None,
        backend: str = "split",
        ce_chunk: int = 8192,
        position_weight: str = "decay",
    ) -> None:
        super().__init__()
        if position_weight not in POSITION_WEIGHTS:
            raise ValueError(f"unknown position weight {position_weight!r} ({', '.join(POSITION_WEIGHTS)})")
        self.position_weight = position_weight
        self.drafter = drafter
        self.embed_weight = embed_weight
        self.lm_head_weight = lm_head_weight
        self.block_size = drafter.config.block_size
        self.mask_token_id = drafter.config.mask_token_id
        self.gamma = gamma if gamma is not None else default_gamma(self.block_size)
        if backend not in ATTN_BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r} ({', '.join(ATTN_BACKENDS)})")
        self.backend = backend  # may be switched between steps (trainer: auto flex -> split fallback)
        self.ce_chunk = ce_chunk

    def position_weights(self, device: torch.device) -> torch.Tensor:
        k = torch.arange(self.block_size, device=device, dtype=torch.float32)
        w = torch.exp(-(k - 1) / self.gamma)
        w[0] = 0.0
        return w

    def forward(
        self,
        taps: torch.Tensor,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        anchors: torch.Tensor,
        valid: torch.Tensor,
        label_ids: torch.Tensor | None = None,
        return_runs: bool = False,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``label_ids`` ``[B, S]``: the token to predict at each position (default ``input_ids``; the target's
        greedy choices with ``--labels target``). ``return_runs``: also ``stats["runs"]`` ``[B, N]``, each
        anchor's leading run of correct drafts."""
        b, s = input_ids.shape
        k = self.block_size
        blk = build_dflash_blocks(input_ids, loss_mask, anchors, valid, k, self.mask_token_id, label_ids)
        embeds = F.embedding(blk["block_ids"], self.embed_weight)
        ctx_pos = torch.arange(s, device=input_ids.device).expand(b, s)
        hidden = self.drafter(embeds, taps, blk["positions"], ctx_pos, blk["mask"], self.backend)
        n = anchors.shape[1]
        label_ok = blk["label_ok"]
        flat_ok = label_ok.view(-1)
        rows = hidden.view(b * n * k, -1)[flat_ok]
        labels = blk["labels"].view(-1)[flat_ok]
        ce, correct, gap = chunked_cross_entropy(rows, self.lm_head_weight, labels, self.ce_chunk)
        kidx = torch.arange(k, device=input_ids.device).expand(b, n, k).reshape(-1)[flat_ok]
        w = self.position_weights(input_ids.device)[kidx]
        if self.position_weight == "prefix":
            w = w * reach_weights(gap, flat_ok, k)
        if ce.numel() == 0:
            loss = hidden.sum() * 0.0
        else:
            loss = (w * ce).sum() / w.sum()
        with torch.no_grad():
            pos_correct = torch.zeros(k, device=input_ids.device).index_add_(0, kidx, correct.float())[1:]
            pos_total = torch.zeros(k, device=input_ids.device).index_add_(0, kidx, torch.ones_like(w))[1:]
            corr_full = torch.zeros(b * n * k, dtype=torch.bool, device=input_ids.device)
            corr_full[flat_ok] = correct
            corr_full = corr_full.view(b * n, k)[:, 1:]
            ok_full = label_ok.view(b * n, k)[:, 1:]
            chains = valid.view(-1) & ok_full[:, 0]
            accept = _accept_length(corr_full[chains], ok_full[chains])
        stats = dict(
            loss=loss.detach().float(),
            pos_correct=pos_correct,
            pos_total=pos_total,
            accept_sum=accept,
            chains=chains.sum().float(),
        )
        if return_runs:
            with torch.no_grad():
                stats["runs"] = torch.cumprod((corr_full & ok_full).long(), -1).sum(-1).view(b, n)
        return loss, stats


# ------------------------------------------------------------------------------------------ EAGLE-3


class Eagle3Objective(nn.Module):
    """Training-time test (TTT) unrolled for ``ttt_steps``; CE on the target-generated tokens.

    At step j the drafter at index t reads token ``x_{t+1+j}`` and (j=0) ``fc(taps_t)`` or (j>0) its own
    previous pre-norm output at index t, sits at position ``t+j`` and predicts ``x_{t+2+j}``. Step losses are
    weighted ``0.8**j`` (EAGLE-3 / SpecForge) and normalised.
    """

    def __init__(
        self,
        drafter: Eagle3Drafter,
        embed_weight: torch.Tensor,
        lm_head_weight: torch.Tensor,
        ttt_steps: int = 7,
        step_decay: float = 0.8,
        ce_chunk: int = 8192,
    ) -> None:
        super().__init__()
        self.drafter = drafter
        self.embed_weight = embed_weight
        self.target_lm_head = lm_head_weight
        self.ttt_steps = ttt_steps
        self.step_decay = step_decay
        self.ce_chunk = ce_chunk

    def forward(
        self,
        taps: torch.Tensor,
        input_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        label_ids: torch.Tensor | None = None,
        return_runs: bool = False,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``label_ids`` ``[B, S]``: the token to predict at each position (default ``input_ids``).
        ``return_runs``: also ``stats["runs"]`` ``[B, S]``: at index t, the leading run of correct drafts from
        anchor ``t + 1`` (the drafter at t reads token ``x_{t+1}`` and drafts ``x_{t+2}``, ...)."""
        if label_ids is None:
            label_ids = input_ids
        d = self.drafter
        b, s = input_ids.shape
        dev = input_ids.device
        t = torch.arange(s, device=dev)
        lm = loss_mask.bool()
        t2d = None if d.lm_head is None else d.target_to_draft()
        head_w = d.lm_head_weight(self.target_lm_head)
        hidden = d.combine(taps)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        total = hidden.new_zeros((), dtype=torch.float32)
        wsum = 0.0
        steps = self.ttt_steps
        correct_all = torch.zeros(steps, b, s, dtype=torch.bool, device=dev)
        ok_all = torch.zeros(steps, b, s, dtype=torch.bool, device=dev)
        for j in range(steps):
            tok_pos = t + 1 + j
            tok = torch.where(
                tok_pos < s, input_ids[:, tok_pos.clamp(max=s - 1)], torch.zeros_like(input_ids)
            )
            embeds = F.embedding(tok, self.embed_weight)
            out = d.step(embeds, hidden, (t + j).expand(b, s), cache)
            lab_pos = t + 2 + j
            lab_ok = (lab_pos < s)[None, :] & lm[:, lab_pos.clamp(max=s - 1)]
            labels = label_ids[:, lab_pos.clamp(max=s - 1)]
            if t2d is not None:
                dl = t2d[labels]
                lab_ok = lab_ok & (dl >= 0)
                labels = dl.clamp(min=0)
            rows = d.norm(out)[lab_ok]
            ce, correct, _ = chunked_cross_entropy(rows, head_w, labels[lab_ok], self.ce_chunk)
            w = self.step_decay**j
            if ce.numel():
                total = total + w * ce.mean()
            else:
                total = total + out.sum() * 0.0
            wsum += w
            correct_all[j][lab_ok] = correct
            ok_all[j] = lab_ok
            hidden = out
        loss = total / wsum
        with torch.no_grad():
            step_correct = correct_all.flatten(1).float().sum(1)
            step_total = ok_all.flatten(1).float().sum(1)
            chains = ok_all[0].reshape(-1)
            c = correct_all.flatten(1).T[chains]
            o = ok_all.flatten(1).T[chains]
            accept = _accept_length(c, o)
        stats = dict(
            loss=loss.detach().float(),
            pos_correct=step_correct,
            pos_total=step_total,
            accept_sum=accept,
            chains=chains.sum().float(),
        )
        if return_runs:
            with torch.no_grad():
                run = torch.cumprod((correct_all & ok_all).long(), 0).sum(0)  # [B, S]
                stats["runs"] = run
        return loss, stats


def summarize(stats: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Accumulated stats -> loss, per-position accuracy and the training acceptance-length proxy."""
    total = stats["pos_total"].clamp(min=1)
    acc = (stats["pos_correct"] / total).tolist()
    chains = float(stats["chains"])
    return dict(
        acc=[round(a, 4) for a in acc],
        tau=round(1.0 + float(stats["accept_sum"]) / max(chains, 1.0), 4),
        loss=round(float(stats["loss"]), 5) if not math.isnan(float(stats["loss"])) else float("nan"),
    )
