"""One decoder for LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM.

q/k/v and gate/up are fused into one GEMM each at load time. The model sees ``(input_ids, positions)`` plus
the attention metadata the runner built; it can return the hidden states of chosen layers (HF convention:
index 0 = embeddings, index i+1 = output of decoder layer i) for EAGLE-3 / DFlash drafters.

Two numerically equivalent paths: the eager torch ops (CPU, torch attention backend), and, when the backend is
``fused`` (the Triton backend), the fused kernels of :mod:`specserve.layers.triton_fused` with the residual
carried beside the hidden state (vLLM style), ~9 launches per layer instead of ~40-55.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from specserve.config import ModelConfig
from specserve.layers.attention import AttentionBackend, AttnMetadata
from specserve.layers.linear import SPLIT_MAX_ROWS, TransposedLinear
from specserve.layers.norm import RMSNorm
from specserve.layers.rotary import RotaryEmbedding

KVCache = tuple[torch.Tensor, torch.Tensor]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, in_features: int | None = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(
            in_features or cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rope = rope
        self.scale = self.head_dim**-0.5
        self.sliding_window: int | None = None
        self.causal = True

    def project_qkv(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is None or self.k_norm is None:  # q and k heads rotated together (one pass of ops)
            qk = qkv[..., : self.q_size + self.kv_size].view(
                -1, self.num_heads + self.num_kv_heads, self.head_dim
            )
            qk = self.rope.rotate(positions, qk)
            return qk[:, : self.num_heads], qk[:, self.num_heads :], v
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rope(positions, self.q_norm(q), self.k_norm(k))
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMetadata,
        cache: KVCache,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        q, k, v = self.project_qkv(x, positions)
        backend.store(k, v, cache[0], cache[1], meta.slot_mapping)
        return self._attend_out(q, meta, cache, backend)

    def forward_fused(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMetadata,
        cache: KVCache,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """``forward`` with split, q/k norm, RoPE and the K/V store in one kernel (``rope_store``), or with the
        attention too (:meth:`rope_attend`)."""
        return self.o_proj(self.rope_attend(self.qkv_proj(x), positions, meta, cache, backend))

    def rope_attend(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMetadata,
        cache: KVCache,
        backend: AttentionBackend,
        partials: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Fused path: split ``qkv``, q/k norm, RoPE, K/V store (``rope_store``), then attention over the paged
        cache: [T, num_heads * head_dim]. ``partials``: the qkv GEMM's split-K fp32 partials (``qkv`` then only gives
        the shape and dtype). The Triton backend runs both as one kernel at decode steps
        (``backend.rope_store_attend``)."""
        from specserve.layers.triton_attention import RopeStoreInputs

        qn, kn = self.q_norm, self.k_norm
        rope = RopeStoreInputs(
            qkv,
            partials,
            positions,
            self.rope.cos,
            self.rope.sin,
            qn.weight if qn is not None else None,
            kn.weight if kn is not None else None,
            qn.eps if qn is not None else 0.0,
            meta.slot_mapping,
        )
        o = backend.rope_store_attend(
            rope,
            self.num_heads,
            cache[0],
            cache[1],
            meta,
            causal=self.causal and meta.causal,
            sliding_window=self.sliding_window,
            scale=self.scale,
        )
        return o.reshape(-1, self.q_size)

    def attend(
        self, q: torch.Tensor, meta: AttnMetadata, cache: KVCache, backend: AttentionBackend
    ) -> torch.Tensor:
        """Attention over the paged cache (K/V already stored): [T, num_heads * head_dim]."""
        causal = self.causal and meta.causal
        o = backend.attend(
            q, cache[0], cache[1], meta, causal=causal, sliding_window=self.sliding_window, scale=self.scale
        )
        return o.reshape(-1, self.q_size)

    def _attend_out(
        self, q: torch.Tensor, meta: AttnMetadata, cache: KVCache, backend: AttentionBackend
    ) -> torch.Tensor:
        """Attention over the paged cache (K/V already stored), then the output projection."""
        return self.o_proj(self.attend(q, meta, cache, backend))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        from specserve.layers.triton_fused import silu_mul

        return self.down_proj(silu_mul(self.gate_up_proj(x), self.intermediate))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, rope)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        h: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMetadata,
        cache: KVCache,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), positions, meta, cache, backend)
        return h + self.mlp(self.post_attention_layernorm(h))

    def forward_fused(
        self,
        normed: torch.Tensor,
        residual: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMetadata,
        cache: KVCache,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused path, after the input norm: ``normed`` = input_layernorm(residual), ``residual`` the stream
        entering the layer. Returns (MLP output, residual after attention); their sum (done by the next norm)
        is the layer's output."""
        from specserve.layers.triton_fused import fused_add_rms_norm

        x = self.self_attn.forward_fused(normed, positions, meta, cache, backend)
        norm = self.post_attention_layernorm
        h, residual = fused_add_rms_norm(x, residual, norm.weight, norm.eps)
        return self.mlp.forward_fused(h), residual


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused path: ``h = residual + x`` (just ``x`` when ``residual`` is None), returns (norm(h), h)."""
    from specserve.layers.triton_fused import fused_add_rms_norm, fused_add_rms_norm_partials, rms_norm

    if residual is None:
        return rms_norm(x, norm.weight, norm.eps), x
    if x.dim() == residual.dim() + 1:  # a split-K GEMM's fp32 partials (_layer_fused_split)
        return fused_add_rms_norm_partials(x, residual, norm.weight, norm.eps)
    return fused_add_rms_norm(x, residual, norm.weight, norm.eps)


def run_layers_fused(
    layers: nn.ModuleList,
    h: torch.Tensor,
    positions: torch.Tensor,
    meta: AttnMetadata,
    caches: list[KVCache],
    backend: AttentionBackend,
    norm: RMSNorm,
    tap_indices: Iterable[int] = (),
    split_gemm: dict[str, int] | None = None,
    triton_gemm: bool = False,
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """The decoder stack plus final norm on the fused kernels: returns (norm(output), taps).

    ``split_gemm`` (``{"qkv": S, "o": S, "down": S}``, transposed weights): steps of at most ``SPLIT_MAX_ROWS`` rows run
    those projections as split-K partials summed by the add + RMSNorm after them (:func:`_layer_fused_split`);
    ``triton_gemm``: as the Triton kernels of :mod:`specserve.layers.triton_splitk` (the runner checked that the
    shapes fit their tiles: :func:`triton_gemm_fits`).

    ``taps[i]`` is the residual stream entering layer i (i = number of layers: the stack's output), i.e. HF's
    ``hidden_states[i]``: the value the torch path's ``h`` has there (the fused adds round as ``h = h + x``).
    """
    want = set(tap_indices)
    taps: dict[int, torch.Tensor] = {}
    run_layer = _layer_gemv if _gemv_path(layers, h) else _layer_fused
    if split_gemm and triton_gemm and run_layer is _layer_fused and h.shape[0] <= SPLIT_MAX_ROWS:
        mode = _fused_norm_mode_for(layers, split_gemm, h)
        if mode:
            return _run_layers_fused_norm(
                layers, h, positions, meta, caches, backend, norm, want, split_gemm, mode
            )
    if split_gemm and run_layer is _layer_fused and h.shape[0] <= SPLIT_MAX_ROWS:
        from specserve.layers.triton_splitk import gate_up_min_rows

        # gate_up + SiLU-mul as one Triton kernel: the setting is read once per forward, not per layer
        fused_gate_up = triton_gemm and h.shape[0] >= gate_up_min_rows()
        run_layer = functools.partial(
            _layer_fused_split, splits=split_gemm, triton_gemm=triton_gemm, fused_gate_up=fused_gate_up
        )
    x, residual = h, None
    for i, mod in enumerate(layers):
        x, entering, residual = run_layer(
            cast(DecoderLayer, mod), x, residual, positions, meta, caches[i], backend
        )
        if i in want:
            taps[i] = entering
    out, residual = add_rms_norm(x, residual, norm)
    if len(layers) in want:
        taps[len(layers)] = residual
    return out, taps


LayerOut = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

FUSED_NORM_ENV = "SPECSERVE_FUSED_NORM"


def fused_norm_mode(rows: int) -> int:
    """How a Triton split-K step of ``rows`` rows folds the add + RMSNorms into the GEMMs (``SPECSERVE_FUSED_NORM``,
    read per forward, i.e. per graph capture): 0 not at all; 1 o_proj and down_proj end with the residual add
    (``splitk_add``) and the norms are ``rms_norm`` kernels on the finished rows; 2 as 1, and qkv (and the Triton
    gate_up + SiLU-mul) start with the norm computed from the epilogue's sums of squares (``NormIn``); ``auto``
    (default) 1 for one-row steps, else 0. H200, Qwen3-8B shape (session 19, benchmarks/README.md): mode 1 a batch-1
    decode step 4.439 -> 4.374 ms, 4 rows 4.400 -> 4.544, the 16-row DFlash K=15 step 5.819 -> 6.055; mode 2 slower
    everywhere (the prologue's L2 round trip before the weight stream). See :func:`_run_layers_fused_norm`."""
    v = os.environ.get(FUSED_NORM_ENV, "").strip() or "auto"
    if v not in ("0", "1", "2", "auto"):
        raise ValueError(f"{FUSED_NORM_ENV} must be 0, 1, 2 or auto, got {v!r}")
    if v == "auto":
        return 1 if rows == 1 else 0
    return int(v)


def _fused_norm_mode_for(layers: nn.ModuleList, splits: dict[str, int], h: torch.Tensor) -> int:
    """:func:`fused_norm_mode` for this step, 0 where the layers do not fit the fused-norm path."""
    mode = fused_norm_mode(h.shape[0])
    if not mode or not len(layers) or not {"qkv", "o", "down"} <= splits.keys():
        return 0
    layer = cast(DecoderLayer, layers[0])
    attn = layer.self_attn
    fits = (
        attn.qkv_proj.bias is None
        and attn.o_proj.bias is None
        and layer.input_layernorm.weight.dtype == h.dtype
        and layer.post_attention_layernorm.weight.dtype == h.dtype
    )
    return mode if fits else 0


def _run_layers_fused_norm(
    layers: nn.ModuleList,
    h: torch.Tensor,
    positions: torch.Tensor,
    meta: AttnMetadata,
    caches: list[KVCache],
    backend: AttentionBackend,
    norm: RMSNorm,
    want: set[int],
    splits: dict[str, int],
    mode: int,
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """:func:`run_layers_fused` with the residual adds in the GEMMs (``SPECSERVE_FUSED_NORM=1|2``; Triton split-K
    GEMMs, 1-16 rows): o_proj and down_proj end with the residual add (the last program of each output block sums
    the split-K partials, adds the residual and writes the block's sums of squares: ``splitk_add``), so no kernel
    reads fp32 partials and the residual stream is finished when the GEMM ends. Mode 1: the RMSNorms are
    ``rms_norm`` kernels on those rows; mode 2: qkv (and the Triton gate_up + SiLU-mul, from ``gate_up_min_rows``)
    compute the norm in their prologue from the sums of squares (``NormIn``; the first layer's input norm stays a
    kernel). Same rounding points as the other paths; the norms' sums of squares add in another order (fp32)."""
    from specserve.layers.triton_fused import rms_norm, silu_mul
    from specserve.layers.triton_splitk import (
        NormIn,
        gate_up_min_rows,
        gate_up_silu,
        splitk_add,
        splitk_partials,
    )

    prologue = mode == 2
    triton_gate_up = h.shape[0] >= gate_up_min_rows()
    gate_up_splits = splits.get("gate_up", 1)
    taps: dict[int, torch.Tensor] = {}
    entering, ssq = h, None
    for i, mod in enumerate(layers):
        layer = cast(DecoderLayer, mod)
        attn, mlp = layer.self_attn, layer.mlp
        if i in want:
            taps[i] = entering
        ln, pn = layer.input_layernorm, layer.post_attention_layernorm
        w_qkv = _kn_weight(attn.qkv_proj)
        if prologue and ssq is not None:
            parts = splitk_partials(entering, w_qkv, splits["qkv"], "qkv", NormIn(ssq, ln.weight, ln.eps))
        else:  # (the embeddings have no sums of squares)
            parts = splitk_partials(rms_norm(entering, ln.weight, ln.eps), w_qkv, splits["qkv"], "qkv")
        a = attn.rope_attend(_output_like(h, parts), positions, meta, caches[i], backend, partials=parts)
        after_attn, ssq = splitk_add(a, _kn_weight(attn.o_proj), splits["o"], "o", entering)
        if prologue and triton_gate_up:
            nin = NormIn(ssq, pn.weight, pn.eps)
            s = gate_up_silu(after_attn, _kn_weight(mlp.gate_up_proj), mlp.intermediate, nin, gate_up_splits)
        elif triton_gate_up:
            normed = rms_norm(after_attn, pn.weight, pn.eps)
            s = gate_up_silu(normed, _kn_weight(mlp.gate_up_proj), mlp.intermediate, splits=gate_up_splits)
        else:
            s = silu_mul(mlp.gate_up_proj(rms_norm(after_attn, pn.weight, pn.eps)), mlp.intermediate)
        entering, ssq = splitk_add(s, _kn_weight(mlp.down_proj), splits["down"], "down", after_attn)
    if len(layers) in want:
        taps[len(layers)] = entering
    return rms_norm(entering, norm.weight, norm.eps), taps


def _layer_fused(
    layer: DecoderLayer,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    positions: torch.Tensor,
    meta: AttnMetadata,
    cache: KVCache,
    backend: AttentionBackend,
) -> LayerOut:
    """Nine kernels: (MLP output, residual stream entering the layer, residual after attention); ``x`` and
    ``residual`` are the previous layer's (their sum is the stream entering this one; residual None: x is it)."""
    normed, entering = add_rms_norm(x, residual, layer.input_layernorm)
    x, after_attn = layer.forward_fused(normed, entering, positions, meta, cache, backend)
    return x, entering, after_attn


def _layer_fused_split(
    layer: DecoderLayer,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    positions: torch.Tensor,
    meta: AttnMetadata,
    cache: KVCache,
    backend: AttentionBackend,
    splits: dict[str, int],
    triton_gemm: bool = False,
    fused_gate_up: bool = False,
) -> LayerOut:
    """``_layer_fused`` with qkv / o_proj / down_proj as S-way split-K batched GEMMs whose fp32 partials the kernel
    after them sums (``rope_store``, the add + RMSNorm: no reduce kernel; S x the CTAs at a decode step's few rows).
    ``x`` may be the previous layer's down partials [S, T, H]; the layer returns its own (the final norm sums the
    last layer's). Projections with biases (Qwen2's qkv) are not split. ``triton_gemm``: the split GEMMs run as the
    Triton kernels of :mod:`specserve.layers.triton_splitk`; ``fused_gate_up`` (the caller's check of
    ``gate_up_min_rows``): gate_up + SiLU-mul as one of them."""
    from specserve.layers.triton_fused import silu_mul
    from specserve.layers.triton_splitk import gate_up_silu, splitk_partials

    attn, mlp, pn = layer.self_attn, layer.mlp, layer.post_attention_layernorm

    def partials(lin: nn.Module, inp: torch.Tensor, name: str) -> torch.Tensor:
        if triton_gemm:  # one Triton kernel, launched with PDL (layers/triton_splitk.py)
            return splitk_partials(inp, _kn_weight(lin), splits[name], name)
        return cast(TransposedLinear, lin).partials(inp, splits[name])

    normed, entering = add_rms_norm(x, residual, layer.input_layernorm)
    if "qkv" in splits and attn.qkv_proj.bias is None:
        parts = partials(attn.qkv_proj, normed, "qkv")
        a = attn.rope_attend(_output_like(normed, parts), positions, meta, cache, backend, partials=parts)
    else:
        a = attn.rope_attend(attn.qkv_proj(normed), positions, meta, cache, backend)
    o = partials(attn.o_proj, a, "o") if "o" in splits and attn.o_proj.bias is None else attn.o_proj(a)
    h, after_attn = add_rms_norm(o, entering, pn)  # sums o's partials when o_proj was split
    if fused_gate_up:  # (the MLP's projections have no biases)
        s = gate_up_silu(h, _kn_weight(mlp.gate_up_proj), mlp.intermediate, splits=splits.get("gate_up", 1))
    else:
        s = silu_mul(mlp.gate_up_proj(h), mlp.intermediate)
    if "down" in splits and mlp.down_proj.bias is None:
        down = partials(mlp.down_proj, s, "down")
    else:
        down = mlp.down_proj(s)
    return down, entering, after_attn


def _output_like(x: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
    """The split-K GEMM output's shape and dtype for rows ``x`` and partials ``parts`` [S, T, N], as a template
    with no storage read (``rope_attend`` sums the partials itself)."""
    return torch.empty(1, dtype=x.dtype, device=x.device).expand(x.shape[0], parts.shape[-1])


def _kn_weight(lin: nn.Module) -> torch.Tensor:
    """A projection's weight as [K, N] for the Triton GEMMs: a TransposedLinear's ``weight_t``, an nn.Linear's
    ``weight.t()`` (a view)."""
    if isinstance(lin, TransposedLinear):
        return lin.weight_t
    return cast(nn.Linear, lin).weight.t()


def triton_gemm_fits(layers: nn.ModuleList, splits: dict[str, int]) -> bool:
    """Whether every split projection (and gate_up) of the first layer fits the Triton kernels' tiles (all layers
    share their shapes): all TransposedLinear ([K, N] tiles) or all nn.Linear (the nk tiles)."""
    from specserve.layers.triton_splitk import fits

    if not len(layers):
        return False
    layer = cast(DecoderLayer, layers[0])
    lins = {
        "qkv": layer.self_attn.qkv_proj,
        "o": layer.self_attn.o_proj,
        "gate_up": layer.mlp.gate_up_proj,
        "down": layer.mlp.down_proj,
    }
    kinds = {type(lin) for lin in lins.values()}
    if kinds == {TransposedLinear}:
        layout = "kn"
    elif kinds == {nn.Linear}:
        layout = "nk"
    else:
        return False
    for name, lin in lins.items():
        n = lin.out_features // 2 if name == "gate_up" else lin.out_features
        if not fits(name, lin.in_features, n, splits.get(name, 1), layout):
            return False
    return True


def _gemv_path(layers: nn.ModuleList, h: torch.Tensor) -> bool:
    """The six-kernel layer (``SPECSERVE_TRITON_GEMV``, default ``auto``: small models on CUDA, one row; see
    :func:`specserve.layers.triton_gemv.max_rows`); weights in nn.Linear's layout, no projection biases."""
    from specserve.layers import triton_gemv

    if not len(layers):
        return False
    a = cast(DecoderLayer, layers[0]).self_attn
    if not isinstance(a.qkv_proj, nn.Linear):  # SPECSERVE_WEIGHT_LAYOUT=kn: the six-kernel layer reads [N, K]
        return False
    if h.shape[0] > triton_gemv.max_rows(h, a.qkv_proj.in_features):
        return False
    return a.qkv_proj.bias is None and a.o_proj.bias is None


def _layer_gemv(
    layer: DecoderLayer,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    positions: torch.Tensor,
    meta: AttnMetadata,
    cache: KVCache,
    backend: AttentionBackend,
) -> LayerOut:
    """``_layer_fused`` with the add+RMSNorm and SiLU-mul kernels folded into the GEMMs' prologues
    (:mod:`specserve.layers.triton_gemv`): six kernels. Same residual stream."""
    from specserve.layers.triton_gemv import gemv

    attn, mlp = layer.self_attn, layer.mlp
    ln, pn = layer.input_layernorm, layer.post_attention_layernorm
    qkv, entering = gemv(x, attn.qkv_proj.weight, residual=residual, norm_weight=ln.weight, eps=ln.eps)
    assert entering is not None
    o, _ = gemv(attn.rope_attend(qkv, positions, meta, cache, backend), attn.o_proj.weight)
    gu, after_attn = gemv(o, mlp.gate_up_proj.weight, residual=entering, norm_weight=pn.weight, eps=pn.eps)
    assert after_attn is not None
    down, _ = gemv(gu, mlp.down_proj.weight, silu_mul=True)
    return down, entering, after_attn


class DecoderLM(nn.Module):
    """Llama / Qwen2 / Qwen3 causal LM over a paged KV cache."""

    def __init__(self, cfg: ModelConfig, max_position: int) -> None:
        super().__init__()
        self.config = cfg
        self.rope = RotaryEmbedding(cfg.head_dim, max(max_position, 1), cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, self.rope) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # hidden-state indices to tap (HF convention), set by the speculative proposer
        self.tap_indices: list[int] = []
        self.kv_caches: list[KVCache] = []
        self.backend: AttentionBackend | None = None
        # split-K decode GEMMs (layers/linear.py split_gemm_config), set by the runner for transposed weights
        self.split_gemm: dict[str, int] = {}
        # those GEMMs as Triton kernels (layers/triton_splitk.py), set by the runner where the tiles fit
        self.triton_gemm = False
        # batch-1 decode steps as one persistent kernel (layers/triton_megakernel.py MegaKernel), bound by the runner
        # to the KV caches in ``megakernel_caches`` (a profiling forward over scratch caches takes the layers)
        self.megakernel: Any = None
        self.megakernel_caches: list[KVCache] | None = None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttnMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (final normed hidden [T, H], concatenated taps [T, n_taps*H] or None)."""
        assert self.backend is not None and self.kv_caches, "runner must bind KV caches and a backend"
        h = self.embed_tokens(input_ids)
        want = self.tap_indices
        mk = self.megakernel
        if (
            mk is not None
            and not want
            and input_ids.shape[0] == 1
            and meta.block_tables.shape[0] == 1
            and self.kv_caches is self.megakernel_caches
        ):
            out = torch.empty_like(h)
            mk.launch(h[0], positions, meta.block_tables[0], out[0])
            return out, None
        if self.backend.fused:
            out, by_index = run_layers_fused(
                self.layers,
                h,
                positions,
                meta,
                self.kv_caches,
                self.backend,
                self.norm,
                want,
                self.split_gemm,
                self.triton_gemm,
            )
            return out, (torch.cat([by_index[j] for j in want], dim=-1) if want else None)
        taps: list[torch.Tensor] = []
        if 0 in want:
            taps.append(h)
        for i, layer in enumerate(self.layers):
            h = layer(h, positions, meta, self.kv_caches[i], self.backend)
            if i + 1 in want:
                taps.append(h)
        aux = None
        if want:
            order = sorted(want)
            aux = torch.cat([taps[order.index(j)] for j in want], dim=-1)
        return self.norm(h), aux

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over ``hidden``'s last dim. Leading dims are flattened first: a strided [b, q, H] view (the
        drafters' query rows) made torch's CPU bf16 linear take a path ~30x slower than the 2-D GEMM."""
        if hidden.dim() == 2:
            return self.lm_head(hidden)
        flat = self.lm_head(hidden.reshape(-1, hidden.shape[-1]))
        return flat.view(*hidden.shape[:-1], flat.shape[-1])

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors, fusing q/k/v and gate/up. Unknown names raise; missing ones are reported."""
        params = dict(self.named_parameters())
        cfg = self.config
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.startswith("model."):
                name = name[len("model.") :]
            if "rotary_emb" in name or (name == "lm_head.weight" and cfg.tie_word_embeddings):
                continue
            loaded.add(copy_weight(params, name, tensor, cfg, cfg.architecture))
        expected = 0
        for pname in params:
            expected += (
                3
                if pname.endswith(("qkv_proj.weight", "qkv_proj.bias"))
                else 2
                if pname.endswith("gate_up_proj.weight")
                else 1
            )
        if len(loaded) < expected:
            missing = [p for p in params if not any(s.startswith(p) for s in loaded)]
            raise ValueError(
                f"Checkpoint is missing weights: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
            )


def copy_weight(
    params: dict[str, nn.Parameter], name: str, tensor: torch.Tensor, cfg: ModelConfig, what: str
) -> str:
    """Copy one HF-named tensor into ``params``; q/k/v and gate/up go into row slices of the fused
    ``qkv_proj`` / ``gate_up_proj``. Returns a key identifying what was written (for completeness checks)."""
    q, kv, inter = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
        cfg.intermediate_size,
    )
    fused = {
        "q_proj": ("qkv_proj", 0, q),
        "k_proj": ("qkv_proj", q, kv),
        "v_proj": ("qkv_proj", q + kv, kv),
        "gate_proj": ("gate_up_proj", 0, inter),
        "up_proj": ("gate_up_proj", inter, inter),
    }
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in fused:
        fname, start, size = fused[parts[-2]]
        target = ".".join(parts[:-2] + [fname, parts[-1]])
        if target not in params:
            raise ValueError(f"Unexpected weight {name!r} in the {what} checkpoint.")
        dst = params[target][start : start + size]
        if dst.shape != tensor.shape:
            raise ValueError(
                f"Weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)} ({what})."
            )
        dst.copy_(tensor)
        return f"{target}:{start}"
    if name not in params:
        raise ValueError(f"Unexpected weight {name!r} in the {what} checkpoint.")
    if params[name].shape != tensor.shape:
        raise ValueError(
            f"Weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(params[name].shape)} ({what}: "
            "draft/target mismatch?)."
        )
    params[name].copy_(tensor)
    return name
