"""Paged attention: batch metadata and the backend interface (torch reference on CPU, Triton on GPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from specserve.layers.triton_attention import RopeStoreInputs


@dataclass
class AttnMetadata:
    """Varlen batch description shared by every attention layer of one forward.

    Request b has queries ``q[query_start_loc[b]:query_start_loc[b+1]]`` at absolute positions
    ``seq_lens[b] - q_len_b + j``; its K/V (including the new tokens) live at the slots given by
    its block table. ``slot_mapping`` says where each new token's K/V is written (-1: nowhere). One object describes
    one forward: its tensors must not change while it is in use (the torch backend derives its gather indices and
    masks from them once, in the first layer, and keeps them in ``derived`` for the other layers).
    """

    query_start_loc: torch.Tensor  # int32 [B+1]
    seq_lens: torch.Tensor  # int32 [B]
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    slot_mapping: torch.Tensor  # int64 [T]
    max_query_len: int
    max_seq_len: int
    causal: bool = True
    derived: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)


class AttentionBackend:
    """Stores new K/V into a layer's paged cache and attends over it.

    ``fused``: the model runs its fused Triton kernels (add+RMSNorm, q/k-norm+RoPE+KV store, SiLU-mul; see
    :mod:`specserve.layers.triton_fused`) instead of the eager torch ops; only ``attend`` is used then (the
    K/V store is part of the fused RoPE kernel). Tests set it on CPU, where the kernels run interpreted.
    """

    name = "base"
    fused = False

    def store(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        raise NotImplementedError

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttnMetadata,
        *,
        causal: bool,
        sliding_window: int | None,
        scale: float,
    ) -> torch.Tensor:
        raise NotImplementedError

    def rope_store_attend(
        self,
        rope: RopeStoreInputs,
        num_heads: int,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttnMetadata,
        *,
        causal: bool,
        sliding_window: int | None,
        scale: float,
    ) -> torch.Tensor:
        """Fused path: ``rope_store`` (q/k norm, RoPE, K/V store from the qkv GEMM's output or split-K partials)
        then ``attend``; returns [T, num_heads, head_dim]. The Triton backend does both in one kernel."""
        from specserve.layers.triton_fused import rope_store

        hk, d = k_cache.shape[2], k_cache.shape[3]
        q = rope_store(
            rope.qkv, rope.positions, rope.cos, rope.sin, rope.q_norm_weight, rope.k_norm_weight, rope.eps,
            k_cache, v_cache, rope.slot_mapping, num_heads, hk, d, rope.partials,
        )  # fmt: skip
        return self.attend(
            q, k_cache, v_cache, meta, causal=causal, sliding_window=sliding_window, scale=scale
        )


class TorchAttentionBackend(AttentionBackend):
    """Reference backend: works on CPU and GPU for any mix of prefill chunks, decode and verify blocks."""

    name = "torch"

    def store(self, k, v, k_cache, v_cache, slots):  # type: ignore[no-untyped-def]
        from specserve.layers.attention_ref import store_kv_ref

        store_kv_ref(k, v, k_cache, v_cache, slots)

    def attend(self, q, k_cache, v_cache, meta, *, causal, sliding_window, scale):  # type: ignore[no-untyped-def]
        from specserve.layers.attention_ref import paged_attention_ref

        return paged_attention_ref(
            q,
            k_cache,
            v_cache,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            causal=causal,
            sliding_window=sliding_window,
            scale=scale,
            max_seq_len=meta.max_seq_len,
            plan_cache=meta.derived,  # built by the first layer of the forward, reused by the others
        )


class TritonAttentionBackend(AttentionBackend):
    """GPU backend: Triton kernels, no host syncs, CUDA-graph capturable."""

    name = "triton"

    def __init__(self) -> None:
        # the fused Triton norm/RoPE/SiLU kernels (40 -> 9 kernels per Llama layer; on the H200 they took a
        # Qwen3-8B-shaped decode step from 7.9 to 4.8 ms of GPU time, same greedy tokens: benchmarks/results);
        # SPECSERVE_FUSED_KERNELS=0 runs the eager torch ops instead
        self.fused = os.environ.get("SPECSERVE_FUSED_KERNELS", "1") != "0"

    def store(self, k, v, k_cache, v_cache, slots):  # type: ignore[no-untyped-def]
        from specserve.layers.triton_attention import store_kv

        store_kv(k, v, k_cache, v_cache, slots)

    def attend(self, q, k_cache, v_cache, meta, *, causal, sliding_window, scale):  # type: ignore[no-untyped-def]
        from specserve.layers.triton_attention import paged_attention

        args, kw = _kernel_meta(meta)
        return paged_attention(
            q, k_cache, v_cache, *args, causal=causal, sliding_window=sliding_window, scale=scale, **kw
        )

    def rope_store_attend(self, rope, num_heads, k_cache, v_cache, meta, *, causal, sliding_window, scale):  # type: ignore[no-untyped-def]
        """One kernel where each request's queries fit one query tile (decode, verify, a DFlash block):
        :func:`~specserve.layers.triton_attention.rope_store_paged_attention` (``SPECSERVE_FUSED_ROPE_ATTN=0``:
        ``rope_store`` + ``paged_attention`` always)."""
        from specserve.layers.triton_attention import rope_store_paged_attention

        args, kw = _kernel_meta(meta)
        return rope_store_paged_attention(
            rope,
            num_heads,
            k_cache,
            v_cache,
            *args,
            causal=causal,
            sliding_window=sliding_window,
            scale=scale,
            **kw,
        )


def _kernel_meta(meta: AttnMetadata) -> tuple[tuple[torch.Tensor, ...], dict[str, int]]:
    """The Triton attention kernels' metadata arguments: (query_start_loc, seq_lens, block_tables) and the host
    sizes."""
    args = (meta.query_start_loc, meta.seq_lens, meta.block_tables)
    return args, {"max_query_len": meta.max_query_len, "max_seq_len": meta.max_seq_len}


def make_backend(name: str, device: torch.device) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        return TritonAttentionBackend()
    raise ValueError(f"attention_backend must be auto, torch or triton; got {name!r}.")
