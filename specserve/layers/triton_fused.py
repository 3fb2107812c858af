"""Fused Triton kernels for the decoder layer's small ops (GPU fused path; see ``DecoderLM.forward``).

At batch 1-8 decode a layer's weights read in microseconds, so the ~40-55 tiny eager kernels of RMSNorm (7-8
ops), RoPE (~14), Qwen3's q/k norm (16), SiLU-mul and the residual adds dominate. These kernels cut a layer to
nine launches: add+RMSNorm, qkv GEMM, ``rope_store``, attention, o_proj GEMM, add+RMSNorm, gate_up GEMM,
``silu_mul``, down GEMM.

Numerics: every kernel computes in fp32 and rounds to the model dtype exactly where the torch ops of
:mod:`specserve.layers.norm`, :mod:`specserve.layers.rotary` and :mod:`specserve.models.llama` round (each
bf16/fp16 torch op computes in fp32 and rounds its result), so outputs equal the torch path's bit for bit up to
fp32 reduction order (at most 1 ulp of the model dtype, in rare elements). Rounding to bf16 is done on the bits
(round to nearest even) because the Triton interpreter truncates in ``.to(tl.bfloat16)``; on the GPU the two
agree.

On Hopper (compute capability 9.0+) every kernel here launches with programmatic dependent launch
(:func:`pdl_enabled`, ``SPECSERVE_PDL``): it waits for its predecessor inside the kernel (:func:`_pdl_wait`), so
its launch overlaps the predecessor's run (H200, session 13: SmolLM2-135M batch-1 decode 1437 -> 1741 tok/s).

All kernels also run under ``TRITON_INTERPRET=1`` on CPU tensors (that is how the tests exercise them), have no
host syncs and take grids from static shapes only, so they are CUDA-graph capturable.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

try:  # programmatic dependent launch (griddepcontrol); older Triton releases lack it: PDL stays off there
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _HAS_GDC = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    gdc_launch_dependents = gdc_wait = None  # type: ignore[assignment]
    _HAS_GDC = False

__all__ = [
    "fused_add_rms_norm",
    "fused_add_rms_norm_partials",
    "pdl_enabled",
    "pdl_launch",
    "rms_norm",
    "rope_store",
    "silu_mul",
]

_FP32, _BF16, _FP16 = 0, 1, 2


def _mode(dtype: torch.dtype) -> int:
    if dtype == torch.float32:
        return _FP32
    if dtype == torch.bfloat16:
        return _BF16
    if dtype == torch.float16:
        return _FP16
    raise ValueError(f"unsupported dtype {dtype} (float32, bfloat16, float16)")


def pdl_enabled(device: torch.device) -> bool:
    """Whether our Triton kernels launch with programmatic dependent launch: ``SPECSERVE_PDL`` (``1``/``0``, read
    per call, i.e. per graph capture); default on for CUDA devices of compute capability 9.0+ (Hopper). Each such
    kernel waits for its predecessor's writes inside the kernel (:func:`_pdl_wait`), so its launch overlaps the
    predecessor's run (H200, session 13: Qwen3-8B-shaped decode 4.622 -> 4.590 ms at batch 1, 5.042 -> 4.935 at
    8 with the Triton split-K GEMMs, benchmarks/results/h200-2026-12-03-s13/c3)."""
    if device.type != "cuda" or not _HAS_GDC:
        return False
    v = os.environ.get("SPECSERVE_PDL", "").strip()
    if v:
        if v not in ("0", "1"):
            raise ValueError(f"SPECSERVE_PDL must be 0 or 1, got {v!r}")
        return v == "1"
    return torch.cuda.get_device_capability(device)[0] >= 9


PDL_EARLY_TAGS = ("norm", "rope", "attn", "merge", "silu")


def warps_setting(env: str, default: int) -> int:
    """``default``, or the warps a kernel launches with as set by ``env`` (read per call, i.e. per graph capture:
    1, 2, 4, 8 or 16): the knobs of the warps sweeps in benchmarks/ (``SPECSERVE_NORM_WARPS``,
    ``SPECSERVE_SILU_WARPS``, ``SPECSERVE_ATTN_WARPS``, ``SPECSERVE_ATTN_MERGE_WARPS``)."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    if raw not in ("1", "2", "4", "8", "16"):
        raise ValueError(f"{env} must be 1, 2, 4, 8 or 16, got {raw!r}")
    return int(raw)


def _pdl_early() -> frozenset[str]:
    raw = os.environ.get("SPECSERVE_PDL_EARLY", "").strip()
    tags = frozenset(t.strip() for t in raw.split(",") if t.strip())
    bad = sorted(tags - set(PDL_EARLY_TAGS))
    if bad:
        raise ValueError(
            f"SPECSERVE_PDL_EARLY: unknown kernel tag(s) {bad}; known: {', '.join(PDL_EARLY_TAGS)}"
        )
    return tags


def pdl_launch(device: torch.device, tag: str | None = None) -> tuple[int, dict[str, bool]]:
    """(the kernel's ``PDL`` constexpr, the launch keywords) under :func:`pdl_enabled`. ``tag`` names a small
    kernel that may release its successor before its own wait (``SPECSERVE_PDL_EARLY=norm,attn,...``, read per
    call): its ``PDL`` is 2 then, so a split-K GEMM after it launches early and reads its first weight rows
    (``GemmTile.pre``) while this kernel still waits / runs."""
    on = pdl_enabled(device)
    mode = int(on)
    if on and tag is not None and tag in _pdl_early():
        mode = 2
    return mode, ({"launch_pdl": True} if on else {})


@triton.jit
def _pdl_wait(PDL: tl.constexpr):
    """Under programmatic dependent launch: wait until the previous kernel's writes are visible, then let the next
    kernel launch (its CTAs wait in turn). Nothing before this may read or write activations. PDL == 2 lets the
    next kernel launch first (letting every small kernel do so measured slower at batch 8: session 13; the tags of
    :func:`pdl_launch` pick the ones that do)."""
    if PDL == 2:
        gdc_launch_dependents()
        gdc_wait()
    elif PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _round(x, MODE: tl.constexpr):
    """fp32 -> model dtype -> fp32, round to nearest even (what a torch op in that dtype does to its result)."""
    if MODE == 1:
        b = x.to(tl.uint32, bitcast=True)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
        return b.to(tl.float32, bitcast=True)
    elif MODE == 2:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


# --------------------------------------------------------------------------------------------- RMSNorm


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    stride_xs,
    n_cols,
    eps,
    BLOCK: tl.constexpr,
    HAS_RES: tl.constexpr,
    MODE: tl.constexpr,
    OUT_MODE: tl.constexpr,
    NSPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if NSPLIT > 0:  # x: a split-K GEMM's fp32 partial outputs, summed here and rounded as the GEMM's output
        for s in tl.static_range(1, NSPLIT):
            x += tl.load(x_ptr + s * stride_xs + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
        x = _round(x, MODE)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        x = _round(x + r, MODE)  # h = h + x in the model dtype
        tl.store(res_out_ptr + row * stride_ro + offs, x.to(res_out_ptr.dtype.element_ty), mask=mask)
    var = tl.sum(x * x, 0) / n_cols
    h = _round(x * tl.math.rsqrt(var + eps), MODE)  # (h * rsqrt(mean + eps)).to(dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = _round(w * h, OUT_MODE)  # weight * h, in the promoted dtype
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    partials: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``partials`` [S, *x.shape] (then ``x`` is only a template of the GEMM output's shape and dtype): x = their
    sum, rounded to x's dtype."""
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"weight must be [{n}]; got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x: {tuple(residual.shape)} {residual.dtype} vs {tuple(x.shape)} {x.dtype}"
        )
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1 and partials is None:
        x2 = x2.contiguous()
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    if residual is not None:
        r2 = residual.reshape(-1, n)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        res_out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    else:
        r2 = res_out = x2  # unused
    rows = x2.shape[0]
    src, stride_src, stride_split, nsplit = x2, x2.stride(0), 0, 0  # 0: x itself, not partials
    if partials is not None:
        if partials.dim() != x.dim() + 1 or tuple(partials.shape[1:]) != tuple(x.shape):
            raise ValueError(f"partials must be [S, {tuple(x.shape)}]; got {tuple(partials.shape)}")
        src = partials.reshape(partials.shape[0], -1, n)
        if src.stride(-1) != 1:
            src = src.contiguous()
        stride_src, stride_split, nsplit = src.stride(1), src.stride(0), src.shape[0]
    if rows > 0:
        block = triton.next_power_of_2(n)
        pdl, pdl_kw = pdl_launch(x.device, "norm")
        _rms_norm_kernel[(rows,)](
            src,
            r2,
            weight,
            out,
            res_out,
            stride_src,
            r2.stride(0),
            out.stride(0),
            res_out.stride(0),
            stride_split,
            n,
            float(eps),
            BLOCK=block,
            HAS_RES=residual is not None,
            MODE=_mode(x.dtype),
            OUT_MODE=_mode(out_dtype),
            NSPLIT=nsplit,
            PDL=pdl,
            num_warps=warps_setting("SPECSERVE_NORM_WARPS", min(16, max(1, block // 256))),
            **pdl_kw,
        )
    return out.view(x.shape), (res_out.view(x.shape) if residual is not None else None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, as :class:`specserve.layers.norm.RMSNorm` computes it."""
    return _launch_rms_norm(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = residual + x`` in the model dtype, then ``(RMSNorm(h), h)`` in one pass (new tensors).

    ``h`` is the residual stream value the torch path computes (``h = h + x``) bit for bit.
    """
    out, res = _launch_rms_norm(x, residual, weight, eps)
    assert res is not None
    return out, res


def fused_add_rms_norm_partials(
    partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fused_add_rms_norm` of ``x`` = the sum of a split-K GEMM's fp32 ``partials`` [S, *residual.shape]
    rounded to the residual's dtype (what one GEMM returns, up to its accumulation order), in the same kernel."""
    x = torch.empty(1, device=residual.device, dtype=residual.dtype).expand(residual.shape)  # shape, dtype
    out, res = _launch_rms_norm(x, residual, weight, eps, partials=partials)
    assert res is not None
    return out, res


# ----------------------------------------------------------------------------- q/k norm + RoPE + KV store


@triton.jit
def _load_qkv(ptrs, mask, stride_split, NSPLIT: tl.constexpr, MODE: tl.constexpr):
    """A qkv tile in fp32: the GEMM output, or the sum of a split-K GEMM's NSPLIT fp32 partials rounded to the
    model dtype (what one GEMM returns, up to its accumulation order)."""
    x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    if NSPLIT > 0:  # 0: the GEMM output itself
        for s in tl.static_range(1, NSPLIT):
            x += tl.load(ptrs + s * stride_split, mask=mask, other=0.0).to(tl.float32)
        x = _round(x, MODE)
    return x


@triton.jit
def _norm_rope(
    ptrs,
    partner_ptrs,
    mask,
    w_ptr,
    offs_d,
    partner,
    cos,
    sin,
    sign,
    eps,
    stride_split,
    HEAD_DIM: tl.constexpr,
    QK_NORM: tl.constexpr,
    MODE: tl.constexpr,
    NSPLIT: tl.constexpr,
):
    """[heads, BLOCK_D] tile: optional per-head RMSNorm, then ``x * cos + rotate_half(x) * sin``.

    ``rotate_half(x)[d]`` is ``sign[d] * x[partner[d]]``; the partner element is loaded (and normed) directly.
    """
    x = _load_qkv(ptrs, mask, stride_split, NSPLIT, MODE)
    xp = _load_qkv(partner_ptrs, mask, stride_split, NSPLIT, MODE)
    if QK_NORM:
        rstd = tl.math.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
        d_mask = offs_d < HEAD_DIM
        w = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        wp = tl.load(w_ptr + partner, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        x = _round(w * _round(x * rstd, MODE), MODE)
        xp = _round(wp * _round(xp * rstd, MODE), MODE)
    return _round(_round(x * cos, MODE) + _round(sign * xp * sin, MODE), MODE)


@triton.jit
def _rope_store_kernel(
    qkv_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    qw_ptr,
    kw_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    q_out_ptr,
    stride_t,
    stride_cos,
    stride_sin,
    stride_ot,
    stride_kcb,
    stride_kcs,
    stride_kch,
    stride_vcb,
    stride_vcs,
    stride_vch,
    eps,
    stride_split,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    Q_CHUNKS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    QK_NORM: tl.constexpr,
    MODE: tl.constexpr,
    NSPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    _pdl_wait(PDL)
    # One program per (token, chunk of heads): chunks [0, Q_CHUNKS) hold q heads, the rest k (+ v) heads.
    tok = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    half = HEAD_DIM // 2
    partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
    sign = tl.where(offs_d < half, -1.0, 1.0)[None, :]
    # cos/sin tables are fp32; the torch path casts them to the model dtype first
    cos = _round(tl.load(cos_ptr + pos * stride_cos + offs_d, mask=d_mask, other=0.0).to(tl.float32), MODE)
    sin = _round(tl.load(sin_ptr + pos * stride_sin + offs_d, mask=d_mask, other=0.0).to(tl.float32), MODE)
    cos = cos[None, :]
    sin = sin[None, :]
    row = qkv_ptr + tok * stride_t
    if chunk < Q_CHUNKS:
        heads = chunk * BLOCK_HQ + tl.arange(0, BLOCK_HQ)
        mask = (heads < NUM_HEADS)[:, None] & d_mask[None, :]
        base = row + heads[:, None] * HEAD_DIM
        q = _norm_rope(
            base + offs_d[None, :],
            base + partner[None, :],
            mask,
            qw_ptr,
            offs_d,
            partner,
            cos,
            sin,
            sign,
            eps,
            stride_split,
            HEAD_DIM,
            QK_NORM,
            MODE,
            NSPLIT,
        )
        o_ptrs = q_out_ptr + tok * stride_ot + heads[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(o_ptrs, q.to(q_out_ptr.dtype.element_ty), mask=mask)
    else:
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot >= 0:  # slot -1: padding / no KV write
            blk = slot // BLOCK_SIZE
            off = slot % BLOCK_SIZE
            heads = (chunk - Q_CHUNKS) * BLOCK_HK + tl.arange(0, BLOCK_HK)
            mask = (heads < NUM_KV_HEADS)[:, None] & d_mask[None, :]
            base = row + (NUM_HEADS + heads[:, None]) * HEAD_DIM
            k = _norm_rope(
                base + offs_d[None, :],
                base + partner[None, :],
                mask,
                kw_ptr,
                offs_d,
                partner,
                cos,
                sin,
                sign,
                eps,
                stride_split,
                HEAD_DIM,
                QK_NORM,
                MODE,
                NSPLIT,
            )
            v = _load_qkv(base + NUM_KV_HEADS * HEAD_DIM + offs_d[None, :], mask, stride_split, NSPLIT, MODE)
            kc = k_cache_ptr + blk * stride_kcb + off * stride_kcs
            vc = v_cache_ptr + blk * stride_vcb + off * stride_vcs
            kc = kc + heads[:, None] * stride_kch + offs_d[None, :]
            vc = vc + heads[:, None] * stride_vch + offs_d[None, :]
            tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def check_rope_store_args(
    qkv: torch.Tensor,
    partials: torch.Tensor | None,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, int, int]:
    """Validate :func:`rope_store`'s arguments (also those of the attention kernel that does its work:
    ``triton_attention.rope_store_paged_attention``); returns (the tensor the kernel reads qkv from, its split
    stride, the number of split-K partials)."""
    t = qkv.shape[0]
    width = (num_heads + 2 * num_kv_heads) * head_dim
    # with partials, qkv is only the template of the GEMM output: its strides do not matter
    if qkv.dim() != 2 or qkv.shape[1] != width or (partials is None and qkv.stride(1) != 1):
        raise ValueError(f"qkv must be [T, {width}] with contiguous rows; got {tuple(qkv.shape)}")
    src, stride_split, nsplit = qkv, 0, 0  # 0: the GEMM output, not partials
    if partials is not None:
        if partials.dim() != 3 or tuple(partials.shape[1:]) != tuple(qkv.shape) or partials.stride(2) != 1:
            raise ValueError(
                f"partials must be [S, {tuple(qkv.shape)}] with contiguous rows; got {tuple(partials.shape)}"
            )
        src, stride_split, nsplit = partials, partials.stride(0), partials.shape[0]
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    if positions.shape != (t,) or slot_mapping.shape != (t,):
        raise ValueError(
            f"positions and slot_mapping must be [T={t}]; got {tuple(positions.shape)}, {tuple(slot_mapping.shape)}"
        )
    if cos.dim() != 2 or cos.shape[1] != head_dim or sin.shape != cos.shape:
        raise ValueError(
            f"cos/sin must be [max_position, {head_dim}]; got {tuple(cos.shape)}, {tuple(sin.shape)}"
        )
    if cos.stride(1) != 1 or sin.stride(1) != 1:
        raise ValueError("cos/sin must be contiguous in their last dimension")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("pass both q_norm_weight and k_norm_weight, or neither")
    for w in (q_norm_weight, k_norm_weight):
        if w is not None and (w.shape != (head_dim,) or w.stride(0) != 1):
            raise ValueError(f"q/k norm weights must be contiguous [{head_dim}]")
    shape = (k_cache.shape[0], k_cache.shape[1], num_kv_heads, head_dim)
    if k_cache.dim() != 4 or tuple(k_cache.shape) != shape or tuple(v_cache.shape) != shape:
        raise ValueError(
            f"caches must be [num_blocks, block_size, {num_kv_heads}, {head_dim}]; got "
            f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("caches must be contiguous in their last dimension")
    return src, stride_split, nsplit


def rope_store(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    partials: torch.Tensor | None = None,
) -> torch.Tensor:
    """Split the fused qkv GEMM output, [q/k RMSNorm,] RoPE q and k, store k and v; return q [T, Hq, D].

    ``partials`` [S, T, (Hq + 2 Hk) D] (fp32): the qkv GEMM as a split-K GEMM's partial outputs, summed here and
    rounded to ``qkv``'s dtype; ``qkv`` is then only a template of the GEMM output's shape and dtype.

    ``qkv`` [T, (Hq + 2 Hk) D] (rows contiguous); ``positions`` [T]; ``cos``/``sin`` the rotary tables
    [max_position, D] (fp32, rotate-half layout); ``q_norm_weight``/``k_norm_weight`` [D] or both None;
    caches [num_blocks, block_size, Hk, D]; ``slot_mapping`` [T] int32/int64 (-1 writes nothing). Equals
    ``Attention.project_qkv`` followed by ``backend.store`` of the torch path. ``num_heads`` 0: ``qkv`` holds k and
    v only ([T, 2 Hk D], rows may be strided: one layer's slice of the DFlash context K/V), nothing is returned
    but an empty q.
    """
    t = qkv.shape[0]
    src, stride_split, nsplit = check_rope_store_args(
        qkv, partials, positions, cos, sin, q_norm_weight, k_norm_weight, k_cache, v_cache, slot_mapping,
        num_heads, num_kv_heads, head_dim,
    )  # fmt: skip
    q_out = torch.empty((t, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q_out
    block_d = max(16, triton.next_power_of_2(head_dim))
    cap = max(1, 2048 // block_d)
    block_hq = min(triton.next_power_of_2(num_heads), cap) if num_heads else 1
    block_hk = min(triton.next_power_of_2(num_kv_heads), cap)
    q_chunks = triton.cdiv(num_heads, block_hq)
    grid = (t, q_chunks + triton.cdiv(num_kv_heads, block_hk))
    qk_norm = q_norm_weight is not None
    pdl, pdl_kw = pdl_launch(qkv.device, "rope")
    _rope_store_kernel[grid](
        src,
        positions,
        cos,
        sin,
        q_norm_weight if qk_norm else qkv,
        k_norm_weight if qk_norm else qkv,
        k_cache,
        v_cache,
        slot_mapping,
        q_out,
        src.stride(-2),
        cos.stride(0),
        sin.stride(0),
        q_out.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        float(eps),
        stride_split,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk,
        Q_CHUNKS=q_chunks,
        BLOCK_SIZE=k_cache.shape[1],
        QK_NORM=qk_norm,
        MODE=_mode(qkv.dtype),
        NSPLIT=nsplit,
        PDL=pdl,
        num_warps=4 if max(block_hq, block_hk) * block_d >= 1024 else 2,
        **pdl_kw,
    )
    return q_out


# ------------------------------------------------------------------------------------------------- SiLU-mul


@triton.jit
def _silu_mul_kernel(
    x_ptr,
    out_ptr,
    stride_x,
    stride_o,
    n_cols,
    BLOCK: tl.constexpr,
    MODE: tl.constexpr,
    PDL: tl.constexpr,
):
    _pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    s = _round(g / (1.0 + tl.exp(-g)), MODE)  # F.silu in the model dtype
    tl.store(out_ptr + row * stride_o + cols, _round(s * u, MODE).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
    """``F.silu(gate) * up`` for ``gate, up = gate_up.split(intermediate, -1)``; gate_up [T, 2I] -> [T, I]."""
    if gate_up.dim() != 2 or gate_up.shape[1] != 2 * intermediate or gate_up.stride(1) != 1:
        raise ValueError(
            f"gate_up must be [T, {2 * intermediate}] with contiguous rows; got {tuple(gate_up.shape)}"
        )
    t = gate_up.shape[0]
    out = torch.empty((t, intermediate), dtype=gate_up.dtype, device=gate_up.device)
    if t == 0:
        return out
    block = min(1024, triton.next_power_of_2(intermediate))
    pdl, pdl_kw = pdl_launch(gate_up.device, "silu")
    _silu_mul_kernel[(t, triton.cdiv(intermediate, block))](
        gate_up,
        out,
        gate_up.stride(0),
        out.stride(0),
        intermediate,
        BLOCK=block,
        MODE=_mode(gate_up.dtype),
        PDL=pdl,
        num_warps=warps_setting("SPECSERVE_SILU_WARPS", 4 if block >= 1024 else 2),
        **pdl_kw,
    )
    return out
