"""Trainable drafters: DFlash (z-lab ``DFlashDraftModel``) and EAGLE-3 (``LlamaForCausalLMEagle3``).

Parameter names equal the checkpoint names, so ``state_dict()`` is the exported weight set. Neither module
owns an embedding or (by default) an LM head: the target's frozen ``embed_tokens`` / ``lm_head`` weights
are passed in by the caller.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

# --------------------------------------------------------------------------------------------- configs


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_layer_ids: list[int]
    num_target_layers: int
    target_hidden_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class DFlashConfig(DrafterConfig):
    block_size: int = 16
    mask_token_id: int = 0


@dataclass
class Eagle3Config(DrafterConfig):
    draft_vocab_size: int | None = None  # None: = vocab_size, LM head shared with the target

    @property
    def shares_lm_head(self) -> bool:
        return self.draft_vocab_size is None or self.draft_vocab_size == self.vocab_size


def default_dflash_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab ``build_target_layer_ids``: ``[N//2]`` for one layer, else evenly spaced in ``[1, N-3]``."""
    n = num_target_layers
    if num_draft_layers == 1:
        return [n // 2]
    start, end = min(1, n - 1), max(min(1, n - 1), n - 3)
    ids = [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]
    return sorted(set(ids))


def default_eagle3_layer_ids(num_target_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 aux layers ``(2, L//2, L-3)`` (the residual stream *entering* those layers)."""
    n = num_target_layers
    return [min(2, n - 1), n // 2, max(n - 3, 0)]


# ---------------------------------------------------------------------------------------------- blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x).to(dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Rotary(nn.Module):
    """Neox-style (rotate_half) RoPE, as HF Llama/Qwen. ``inv_freq`` may be overridden by the target's.

    The frequencies are a plain fp32 attribute (not a buffer): never saved, never cast to bf16.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.scaling = 1.0

    def set_inv_freq(self, inv_freq: torch.Tensor, scaling: float = 1.0) -> None:
        if inv_freq.shape == self.inv_freq.shape:
            self.inv_freq = inv_freq.detach().float().cpu()
            self.scaling = scaling

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions ``[B, T]`` -> cos, sin ``[B, 1, T, head_dim]`` (fp32)."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling)[:, None], (emb.sin() * self.scaling)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[B, h, T, d]``."""
    d = x.shape[-1] // 2
    rot = torch.cat((-x[..., d:], x[..., :d]), dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def _heads(x: torch.Tensor, n: int, d: int) -> torch.Tensor:
    b, t, _ = x.shape
    return x.view(b, t, n, d).transpose(1, 2)


# ---------------------------------------------------------------------------------------------- DFlash


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.block_size = cfg.block_size

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = apply_rope(self.k_norm(_heads(self.k_proj(x), self.nkv, self.hd)), cos, sin)
        return k, _heads(self.v_proj(x), self.nkv, self.hd)

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        rope_q: tuple[torch.Tensor, torch.Tensor],
        rope_c: tuple[torch.Tensor, torch.Tensor],
        mask: BlockVisibility | torch.Tensor,
        backend: str,
    ) -> torch.Tensor:
        b, q_len, _ = x.shape
        q = apply_rope(self.q_norm(_heads(self.q_proj(x), self.nh, self.hd)), *rope_q)
        kb, vb = self.kv(x, *rope_q)
        kc, vc = self.kv(ctx, *rope_c)
        if backend == "flex":
            if not isinstance(mask, BlockVisibility):
                raise TypeError("the flex attention backend needs a BlockVisibility, not a dense ctx_mask")
            o = _flex_block_attention(q, kc, vc, kb, vb, mask.flex())
        else:
            ctx_mask = mask.ctx_mask() if isinstance(mask, BlockVisibility) else mask
            attend = _dense_block_attention if backend == "sdpa" else _split_block_attention
            o = attend(q, kc, vc, kb, vb, ctx_mask, self.block_size)
        return self.o_proj(o.transpose(1, 2).reshape(b, q_len, self.nh * self.hd))


def _block_ids(q_len: int, block: int, device: torch.device) -> torch.Tensor:
    return torch.arange(q_len, device=device) // block


def _dense_block_attention(q, kc, vc, kb, vb, ctx_mask, block):  # type: ignore[no-untyped-def]
    """Reference: one SDPA over keys ``[context ; all blocks]`` with a dense boolean mask."""
    q_len = q.shape[2]
    bid = _block_ids(q_len, block, q.device)
    blk = (bid[:, None] == bid[None, :]).expand(q.shape[0], q_len, q_len)
    mask = torch.cat([ctx_mask, blk], dim=-1)[:, None]  # [B, 1, Q, S+Q]
    k = torch.cat([kc, kb], dim=2)
    v = torch.cat([vc, vb], dim=2)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask)


def _split_block_attention(q, kc, vc, kb, vb, ctx_mask, block):  # type: ignore[no-untyped-def]
    """Same math, O(Q * (S + block)) instead of O(Q * (S + Q)): each query sees the context (masked) and
    only its own block's keys; one softmax over both parts."""
    b, nh, q_len, d = q.shape
    nkv = kc.shape[1]
    g = nh // nkv
    n_blk = q_len // block
    scale = d**-0.5
    qg = q.reshape(b, nkv, g, q_len, d)
    s_ctx = torch.matmul(qg.reshape(b, nkv, g * q_len, d), kc.transpose(-1, -2).to(q.dtype))
    s_ctx = s_ctx.view(b, nkv, g, q_len, -1)
    qb = qg.view(b, nkv, g, n_blk, block, d)
    kbb = kb.to(q.dtype).view(b, nkv, 1, n_blk, block, d)
    s_blk = torch.matmul(qb, kbb.transpose(-1, -2)).view(b, nkv, g, q_len, block)
    s = kc.shape[2]
    visible = torch.cat([ctx_mask, ctx_mask.new_ones(b, q_len, block)], dim=-1)[:, None, None]
    scores = (torch.cat([s_ctx, s_blk], dim=-1).float() * scale).masked_fill(~visible, float("-inf"))
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    o_ctx = torch.matmul(p[..., :s].reshape(b, nkv, g * q_len, s), vc.to(q.dtype)).view(b, nkv, g, q_len, d)
    pb = p[..., s:].reshape(b, nkv, g, n_blk, block, block)
    o_blk = torch.matmul(pb, vb.to(q.dtype).view(b, nkv, 1, n_blk, block, d)).view(b, nkv, g, q_len, d)
    return (o_ctx + o_blk).view(b, nh, q_len, d)


# DFlash attention backends: "split" (default on CPU), "sdpa" (dense-mask reference), "flex" (FlexAttention)
ATTN_BACKENDS = ("split", "sdpa", "flex")
FLEX_TILE = 128  # FlexAttention's sparse block size (the Triton kernels' BLOCK_M / BLOCK_N must divide it)
FLEX_RECOMPILE_LIMIT = 64  # distinct padded shapes the compiled flex_attention may see (dynamo's default: 8)


def flex_pad(n: int) -> int:
    """Padded length for FlexAttention: the next power of two, at least ``FLEX_TILE``.

    Few distinct shapes (few recompiles); the padding costs almost nothing since fully masked tiles are
    skipped by the block mask (padded context keys are never visible, padded queries only see their block).
    """
    return max(FLEX_TILE, 1 << max(0, n - 1).bit_length())


class FlexMask(NamedTuple):
    block_mask: BlockMask
    ctx_pad: int  # context keys padded to this length
    q_pad: int  # queries (and block keys) padded to this length


class BlockVisibility:
    """What each DFlash query sees: the queries of block ``j`` (rows ``j*block .. (j+1)*block-1``) see the
    context positions ``< ctx_len[b, j]`` and every key of their own block, nothing else.

    Built once per drafter forward and shared by its layers; the dense ctx_mask ("split"/"sdpa") and the
    FlexAttention block mask ("flex") are derived lazily and cached.
    """

    def __init__(self, ctx_len: torch.Tensor, block_size: int, ctx_size: int) -> None:
        self.ctx_len = ctx_len  # [B, N] long, <= ctx_size (0: the block sees no context)
        self.block_size = block_size
        self.ctx_size = ctx_size
        self._ctx_mask: torch.Tensor | None = None
        self._flex: FlexMask | None = None

    @property
    def q_len(self) -> int:
        return self.ctx_len.shape[1] * self.block_size

    def ctx_mask(self) -> torch.Tensor:
        """Dense ``[B, Q, S]`` bool: True where the query may attend to that context position."""
        if self._ctx_mask is None:
            b, n = self.ctx_len.shape
            pos = torch.arange(self.ctx_size, device=self.ctx_len.device)
            m = pos[None, None, :] < self.ctx_len[:, :, None]  # [B, N, S]
            self._ctx_mask = (
                m[:, :, None, :].expand(b, n, self.block_size, self.ctx_size).reshape(b, -1, self.ctx_size)
            )
        return self._ctx_mask

    def flex(self) -> FlexMask:
        if self._flex is None:
            self._flex = _flex_block_mask(self.ctx_len, self.block_size, self.ctx_size)
        return self._flex


def _flex_block_mask(ctx_len: torch.Tensor, block: int, ctx_size: int) -> FlexMask:
    """FlexAttention BlockMask over keys ``[context (padded to ctx_pad) ; block keys (padded to q_pad)]``.

    The tile structure is computed directly from the per-tile min / max visible context length (no dense
    ``[B, Q, KV]`` mask is materialised, unlike ``create_block_mask``): with anchors sorted ascending the
    context tiles of a query tile are full up to the smallest anchor, partial up to the largest, and skipped
    beyond, so the work is close to a lower triangle instead of all ``Q x S``.
    """
    b, n = ctx_len.shape
    dev = ctx_len.device
    t = FLEX_TILE
    q_len = n * block
    s_pad, q_pad = flex_pad(ctx_size), flex_pad(q_len)
    # per-query visible context length; padded queries see no context (only their own padded "block")
    c = F.pad(ctx_len.to(torch.int32).repeat_interleave(block, dim=1), (0, q_pad - q_len))  # [B, q_pad]

    def mask_mod(bi, hi, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        own = (kv_idx >= s_pad) & ((kv_idx - s_pad) // block == q_idx // block)
        return (kv_idx < c[bi, q_idx]) | own

    nq, ns = q_pad // t, s_pad // t
    tiles = c.view(b, nq, t)
    lo = tiles.amin(-1)[..., None]  # [B, nq, 1]
    hi = tiles.amax(-1)[..., None]
    kv_t = torch.arange(ns + nq, device=dev, dtype=torch.int32)  # kv tile index
    full = kv_t < lo // t  # every query of the tile sees the whole context tile
    partial = (kv_t >= lo // t) & (kv_t < (hi + t - 1) // t)
    # own-block keys of query tile i: key rows [first block start, last block end) of the tile's queries
    qi = torch.arange(nq, device=dev, dtype=torch.int32)
    first = (qi * t // block) * block // t
    last = (torch.clamp(((qi * t + t - 1) // block + 1) * block, max=q_pad) - 1) // t
    own = (kv_t[None, :] >= ns + first[:, None]) & (kv_t[None, :] <= ns + last[:, None])  # [nq, nkv]
    partial = partial | own[None]

    def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = dense[:, None].to(torch.int32)  # [B, 1, nq, nkv]
        idx = torch.argsort(d, dim=-1, descending=True, stable=True).to(torch.int32)
        return d.sum(-1, dtype=torch.int32), idx.contiguous()

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    bm = BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=t,
        mask_mod=mask_mod,
        seq_lengths=(q_pad, s_pad + q_pad),
    )
    return FlexMask(bm, s_pad, q_pad)


FLEX_COMPILE_DEVICES = ("cuda",)  # elsewhere: torch's eager path (unfused, materialises the scores)
_flex_compiled: Callable[..., torch.Tensor] | None = None


def flex_attention_fn(device: torch.device) -> Callable[..., torch.Tensor]:
    """``torch.compile(flex_attention)`` on CUDA (fused Triton kernels, compiled once per padded shape);
    elsewhere torch's eager path (unfused, materialises the scores; torch has no FlexAttention backward on
    CPU, compiled or not)."""
    global _flex_compiled
    if device.type not in FLEX_COMPILE_DEVICES:
        return flex_attention  # type: ignore[return-value]
    if _flex_compiled is None:
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    return _flex_compiled


def _flex_block_attention(q, kc, vc, kb, vb, fm: FlexMask):  # type: ignore[no-untyped-def]
    """Same math as the split backend through FlexAttention: keys ``[context ; blocks]`` (each zero-padded),
    GQA in the kernel; only the tiles the block mask lists are computed."""
    b, nh, q_len, d = q.shape
    dt = q.dtype

    def keys(c: torch.Tensor, blk: torch.Tensor) -> torch.Tensor:
        z = c.new_zeros(())
        parts = [c.to(dt), z.to(dt).expand(b, c.shape[1], fm.ctx_pad - c.shape[2], d)]
        parts += [blk.to(dt), z.to(dt).expand(b, c.shape[1], fm.q_pad - q_len, d)]
        return torch.cat(parts, dim=2)

    qp = q if fm.q_pad == q_len else F.pad(q, (0, 0, 0, fm.q_pad - q_len))
    fn = flex_attention_fn(q.device)
    limit = max(FLEX_RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)
    # inputs are already in one dtype; autocast must not touch the attention (kernel accumulates in fp32)
    with torch.autocast(q.device.type, enabled=False), torch._dynamo.config.patch(recompile_limit=limit):
        o = fn(qp, keys(kc, kb), keys(vc, vb), block_mask=fm.block_mask, enable_gqa=True)
    return o[:, :, :q_len]


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, ctx, rope_q, rope_c, mask, backend):  # type: ignore[no-untyped-def]
        h = h + self.self_attn(self.input_layernorm(h), ctx, rope_q, rope_c, mask, backend)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """Qwen3-style DFlash drafter. Keys/values = [context K/V from the fused target features ; block K/V]."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.config = cfg
        self.layers = nn.ModuleList([DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        init_weights(self)

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """Concatenated target taps ``[B, S, n_t*H_t]`` -> context feature ``c`` ``[B, S, H]``."""
        return self.hidden_norm(self.fc(taps))

    def forward(
        self,
        block_embeds: torch.Tensor,
        taps: torch.Tensor,
        block_positions: torch.Tensor,
        ctx_positions: torch.Tensor,
        mask: BlockVisibility | torch.Tensor,
        backend: str = "split",
    ) -> torch.Tensor:
        """One drafting pass over ``Q = n_blocks * block_size`` block tokens.

        block_embeds ``[B, Q, H]`` (target embeddings of ``[x_a, MASK, ...]``), taps ``[B, S, n_t*H_t]``,
        block_positions ``[B, Q]``, ctx_positions ``[B, S]``. ``mask``: a :class:`BlockVisibility` (any
        backend; built once and shared by all layers) or, for "split"/"sdpa" only, a dense ctx_mask
        ``[B, Q, S]`` (True: the query may attend to that context position). Every query also sees all keys
        of its own block (non-causal). ``backend``: "split", "sdpa" (dense-mask reference) or "flex".
        Returns the final-normed hidden ``[B, Q, H]`` (feed to the target's ``lm_head``).
        """
        if backend not in ATTN_BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r} ({', '.join(ATTN_BACKENDS)})")
        ctx = self.context(taps)
        rope_q = self.rotary(block_positions)
        rope_c = self.rotary(ctx_positions)
        h = block_embeds
        for layer in self.layers:
            h = layer(h, ctx, rope_q, rope_c, mask, backend)
        return self.norm(h)


@torch.no_grad()
def grow_dflash(
    drafter: DFlashDrafter,
    num_layers: int | None,
    intermediate_size: int | None,
    target_layer_ids: list[int] | None = None,
) -> bool:
    """Grow a trained DFlash drafter in place without changing what it computes (net2net-style), so more
    capacity can be trained on top of it: MLPs widened to ``intermediate_size`` (new gate/up rows initialised as
    usual, the matching down-projection columns zero), layers appended up to ``num_layers`` (o_proj and
    down_proj zero: each new layer adds nothing to the residual stream until trained) and more target layers
    tapped (``target_layer_ids``, a sorted superset of the drafter's: the fused-feature projection ``fc`` gets
    zero columns for the new taps). ``None`` keeps a size. Returns whether anything changed; shrinking or
    dropping a tap raises ValueError."""
    cfg = drafter.config
    n_old, i_old = cfg.num_hidden_layers, cfg.intermediate_size
    n_new, i_new = num_layers or n_old, intermediate_size or i_old
    ids_old = list(cfg.target_layer_ids)
    ids_new = list(target_layer_ids) if target_layer_ids is not None else ids_old
    if n_new < n_old or i_new < i_old:
        raise ValueError(
            f"cannot shrink a drafter ({n_old} layers x intermediate {i_old} -> {n_new} x {i_new})"
        )
    if ids_new != sorted(set(ids_new)) or not set(ids_old) <= set(ids_new):
        raise ValueError(
            f"target layer ids {ids_new} must be sorted, without repeats, and keep the drafter's taps {ids_old}"
        )
    if (n_new, i_new, ids_new) == (n_old, i_old, ids_old):
        return False
    ref = next(drafter.parameters())
    new_cfg = dataclasses.replace(
        cfg, num_hidden_layers=n_new, intermediate_size=i_new, target_layer_ids=ids_new
    )
    if ids_new != ids_old:
        ht, fc = cfg.target_hidden_size, drafter.fc
        wide_fc = nn.Linear(len(ids_new) * ht, cfg.hidden_size, bias=False).to(
            device=ref.device, dtype=ref.dtype
        )
        wide_fc.weight.zero_()
        for j, i in enumerate(ids_old):
            k = ids_new.index(i)
            wide_fc.weight[:, k * ht : (k + 1) * ht] = fc.weight[:, j * ht : (j + 1) * ht]
        drafter.fc = wide_fc
    for layer in cast(list[DFlashLayer], list(drafter.layers) if i_new != i_old else []):
        mlp, wide = layer.mlp, MLP(cfg.hidden_size, i_new).to(device=ref.device, dtype=ref.dtype)
        init_weights(wide)
        wide.gate_proj.weight[:i_old] = mlp.gate_proj.weight
        wide.up_proj.weight[:i_old] = mlp.up_proj.weight
        wide.down_proj.weight.zero_()
        wide.down_proj.weight[:, :i_old] = mlp.down_proj.weight
        layer.mlp = wide
    for _ in range(n_new - n_old):
        layer = DFlashLayer(new_cfg).to(device=ref.device, dtype=ref.dtype)
        init_weights(layer)
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        drafter.layers.append(layer)
    drafter.config = new_cfg
    return True


# ---------------------------------------------------------------------------------------------- EAGLE-3


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(2 * h, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(2 * h, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(2 * h, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """Training-time-test attention. ``cache`` holds the K/V of the previous unrolled steps (appended to).

        Step 0 is causal over step-0 keys; a step-j query at index t also sees the step-1..j keys at the same
        index t (the drafter's own earlier predictions for that draft chain), as at inference.
        """
        b, s, _ = x.shape
        q = apply_rope(_heads(self.q_proj(x), self.nh, self.hd), *rope)
        k = apply_rope(_heads(self.k_proj(x), self.nkv, self.hd), *rope)
        v = _heads(self.v_proj(x), self.nkv, self.hd)
        cache.append((k, v))
        g = self.nh // self.nkv
        scale = self.hd**-0.5
        qg = q.reshape(b, self.nkv, g * s, self.hd)
        k0, v0 = cache[0]
        s0 = torch.matmul(qg, k0.transpose(-1, -2)).view(b, self.nkv, g, s, s)
        parts = [s0]
        q5 = q.view(b, self.nkv, g, s, self.hd)
        for kj, _ in cache[1:]:
            parts.append((q5 * kj[:, :, None]).sum(-1, keepdim=True))
        visible = torch.ones(s, s + len(cache) - 1, dtype=torch.bool, device=x.device)
        visible[:, :s] = visible[:, :s].tril()
        scores = (torch.cat(parts, dim=-1).float() * scale).masked_fill(~visible, float("-inf"))
        p = torch.softmax(scores, dim=-1).to(q.dtype)
        o = torch.matmul(p[..., :s].reshape(b, self.nkv, g * s, s), v0).view(b, self.nkv, g, s, self.hd)
        for j, (_, vj) in enumerate(cache[1:]):
            o = o + p[..., s + j : s + j + 1] * vj[:, :, None]
        return self.o_proj(o.reshape(b, self.nh, s, self.hd).transpose(1, 2).reshape(b, s, self.nh * self.hd))


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, embeds, hidden, rope, cache):  # type: ignore[no-untyped-def]
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        h = hidden + self.self_attn(x, rope, cache)  # residual = the un-normed incoming hidden
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Drafter(nn.Module):
    """One-layer EAGLE-3 head (``LlamaForCausalLMEagle3``)."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    def __init__(self, cfg: Eagle3Config, draft_token_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        v = cfg.vocab_size
        if cfg.shares_lm_head:
            self.lm_head = None
            self.register_buffer("d2t", torch.zeros(v, dtype=torch.long))
            self.register_buffer("t2d", torch.ones(v, dtype=torch.bool))
        else:
            dv = int(cfg.draft_vocab_size or v)
            ids = (
                torch.arange(dv)
                if draft_token_ids is None
                else torch.as_tensor(draft_token_ids).long().sort()[0]
            )
            if ids.numel() != dv:
                raise ValueError(f"draft_token_ids has {ids.numel()} entries, expected {dv}")
            self.lm_head = nn.Linear(cfg.hidden_size, dv, bias=False)
            self.register_buffer("d2t", ids - torch.arange(dv))
            t2d = torch.zeros(v, dtype=torch.bool)
            t2d[ids] = True
            self.register_buffer("t2d", t2d)
        init_weights(self)

    @property
    def draft_token_ids(self) -> torch.Tensor:
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def target_to_draft(self) -> torch.Tensor:
        """``[V]`` long: draft id of each target id, -1 where the target token is not in the draft vocab."""
        m = torch.full((self.t2d.numel(),), -1, dtype=torch.long, device=self.d2t.device)
        m[self.draft_token_ids] = torch.arange(self.d2t.numel(), device=self.d2t.device)
        return m

    def combine(self, taps: torch.Tensor) -> torch.Tensor:
        return self.fc(taps)

    def step(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """One unrolled step. Returns the pre-norm output (next step's hidden); logits = lm_head(norm(out))."""
        return self.midlayer(embeds, hidden, self.rotary(positions), cache)

    def lm_head_weight(self, target_lm_head: torch.Tensor) -> torch.Tensor:
        return target_lm_head if self.lm_head is None else self.lm_head.weight


# ---------------------------------------------------------------------------------------------- init


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
        elif isinstance(m, RMSNorm):
            nn.init.ones_(m.weight)
    for name, p in module.named_parameters():
        if name.endswith(("o_proj.weight", "down_proj.weight")):  # GPT-2 style residual scaling
            nn.init.normal_(p, std=std / math.sqrt(2 * max(1, _n_layers(module))))


def _n_layers(module: nn.Module) -> int:
    cfg = getattr(module, "config", None)
    return int(getattr(cfg, "num_hidden_layers", 1) or 1)
