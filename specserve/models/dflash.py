"""DFlash drafter (z-lab ``DFlashDraftModel`` format): Qwen3-style layers whose keys/values also see the
target's tapped hidden states. No embedding or LM head of its own (the target's are borrowed).

The context K/V of every draft layer for newly committed positions comes from one GEMM over the fused target
feature (all layers' k/v rows stacked at load time), then k_norm and RoPE, straight into the paged cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from specserve.config import ModelConfig
from specserve.layers.attention import AttentionBackend, AttnMetadata
from specserve.layers.linear import linear_rows
from specserve.layers.norm import RMSNorm
from specserve.layers.rotary import RotaryEmbedding
from specserve.models.llama import DecoderLayer, KVCache, copy_weight, run_layers_fused


def drafter_model_config(raw: dict[str, Any], qk_norm: bool = True) -> ModelConfig:
    from specserve.config import rope_from_hf

    class _NS:
        pass

    ns = _NS()
    ns.__dict__.update(raw)
    theta, scaling = rope_from_hf(ns)
    nh = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    return ModelConfig(
        architecture=(raw.get("architectures") or ["?"])[0],
        model_type=str(raw.get("model_type", "")),
        vocab_size=int(raw.get("vocab_size", 0)),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_hidden_layers=int(raw.get("num_hidden_layers", 1)),
        num_attention_heads=nh,
        num_key_value_heads=int(raw.get("num_key_value_heads") or nh),
        head_dim=int(raw.get("head_dim") or hidden // nh),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        tie_word_embeddings=False,
        attention_bias=bool(raw.get("attention_bias", False)),
        qk_norm=qk_norm,
    )


class DFlashDraftModel(nn.Module):
    def __init__(self, raw: dict[str, Any], target_hidden: int, max_position: int) -> None:
        super().__init__()
        self.cfg = cfg = drafter_model_config(raw, qk_norm=True)
        dcfg = raw.get("dflash_config") or {}
        self.block_size = int(raw.get("block_size", 16))
        self.mask_token_id = int(dcfg.get("mask_token_id", raw.get("mask_token_id", 0)))
        n_layers = cfg.num_hidden_layers
        self.target_layer_ids = [
            int(i) for i in dcfg.get("target_layer_ids", raw.get("target_layer_ids", []))
        ]
        self.rope = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList([DecoderLayer(cfg, self.rope) for _ in range(n_layers)])
        layer_types = raw.get("layer_types") or ["full_attention"] * n_layers
        causal = bool(dcfg.get("causal", False))
        for layer, kind in zip(self.layers, layer_types):
            layer.self_attn.causal = causal
            if kind == "sliding_attention":
                layer.self_attn.sliding_window = (
                    int(raw.get("sliding_window") or dcfg.get("swa_window_size") or 0) or None
                )
        self.fc = nn.Linear(len(self.target_layer_ids) * target_hidden, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.register_buffer("ctx_kv_weight", torch.empty(0), persistent=False)
        self.register_buffer("ctx_kv_bias", torch.empty(0), persistent=False)
        self.register_buffer("ctx_k_norm", torch.empty(0), persistent=False)
        self.ctx_kv_transposed = False  # ctx_kv_weight stored [H, L*2*n_kv*hd] (transpose_weights)
        self.cpu_mm = False  # float32 CPU: the context GEMM as W @ c.T (layers/linear.py linear_rows; set by the runner)
        # the target's split-K / Triton decode GEMMs for the drafter's layers (set by the proposer: models/llama.py
        # run_layers_fused); the block of a batch-1 step is K+1 <= 16 rows
        self.split_gemm: dict[str, int] = {}
        self.triton_gemm = False

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        seen: set[str] = set()
        for name, t in weights:
            if name.startswith("model."):
                name = name[6:]
            if name.split(".")[0] in ("embed_tokens", "lm_head") or name in ("d2t", "t2d"):
                continue  # shared with the target
            seen.add(copy_weight(params, name, t, self.cfg, "DFlash"))
        if "fc.weight" not in seen:
            raise ValueError("DFlash checkpoint has no 'fc.weight'.")
        self.stack_context_weights()

    def stack_context_weights(self) -> None:
        """All layers' k/v projection rows in one matrix: one GEMM computes every layer's context K/V."""
        q = self.cfg.num_attention_heads * self.cfg.head_dim
        self.ctx_kv_weight = torch.cat(
            [lyr.self_attn.qkv_proj.weight[q:] for lyr in self.layers], 0
        ).contiguous()
        if self.cfg.attention_bias:
            self.ctx_kv_bias = torch.cat([lyr.self_attn.qkv_proj.bias[q:] for lyr in self.layers], 0)
        norms: list[torch.Tensor] = []
        for lyr in self.layers:
            if lyr.self_attn.k_norm is not None:
                norms.append(lyr.self_attn.k_norm.weight)  # type: ignore[arg-type]
        self.ctx_k_norm = torch.stack(norms, 0) if norms else torch.empty(0)

    def transpose_weights(self) -> None:
        """The target's transposed decode GEMM layout (layers/linear.py) for the drafter too: every layer's
        projections, ``fc`` and the stacked context K/V matrix. After ``stack_context_weights``; idempotent."""
        from specserve.layers.linear import TransposedLinear, transpose_decoder_linears

        transpose_decoder_linears(self.layers)
        if isinstance(self.fc, nn.Linear):
            self.fc = TransposedLinear(self.fc)  # type: ignore[assignment]
        if not self.ctx_kv_transposed:
            self.ctx_kv_weight = self.ctx_kv_weight.t().contiguous()
            self.ctx_kv_transposed = True

    def _context_gemm(self, c: torch.Tensor) -> torch.Tensor:
        """[N, H] -> every layer's k/v rows [N, L*2*n_kv*hd] (one GEMM)."""
        bias = self.ctx_kv_bias if self.ctx_kv_bias.numel() else None
        if self.ctx_kv_transposed:
            kv = torch.matmul(c, self.ctx_kv_weight)
            return kv if bias is None else kv + bias
        if self.cpu_mm:
            return linear_rows(c, self.ctx_kv_weight, bias)
        return torch.nn.functional.linear(c, self.ctx_kv_weight, bias)

    def context_kv(
        self, features: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """features [N, n_t*H_t] -> (k, v) each [L, N, n_kv, hd], k normed and rotated."""
        cfg = self.cfg
        L, nkv, hd = len(self.layers), cfg.num_key_value_heads, cfg.head_dim
        kv = self._context_gemm(self.hidden_norm(self.fc(features)))
        kv = kv.view(-1, L, 2, nkv, hd)
        k, v = kv[:, :, 0], kv[:, :, 1]
        if self.ctx_k_norm.numel():
            kf = k.float()
            kf = kf * torch.rsqrt(kf.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
            k = self.ctx_k_norm[None, :, None, :] * kf.to(k.dtype)
        n = k.shape[0]
        k = self.rope.rotate(positions.repeat_interleave(L), k.reshape(n * L, nkv, hd)).view(n, L, nkv, hd)
        return k.transpose(0, 1), v.transpose(0, 1)

    def store_context_kv(
        self,
        features: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        caches: list[KVCache],
        backend: AttentionBackend,
    ) -> None:
        """Context K/V of ``features`` [N, n_t*H_t] at ``positions`` into every layer's cache at ``slots`` (-1:
        none). The fused path (``backend.fused``) runs the fc GEMM, one RMSNorm kernel, the stacked K/V GEMM and
        one q/k-norm+RoPE+store kernel per layer (``rope_store`` with no q heads) instead of ~30 eager ops."""
        if not backend.fused:
            k, v = self.context_kv(features, positions)
            for layer, (kc, vc) in enumerate(caches):
                backend.store(k[layer], v[layer], kc, vc, slots)
            return
        from specserve.layers.triton_fused import rms_norm, rope_store

        cfg = self.cfg
        nkv, hd = cfg.num_key_value_heads, cfg.head_dim
        kv = self._context_gemm(rms_norm(self.fc(features), self.hidden_norm.weight, self.hidden_norm.eps))
        width = 2 * nkv * hd
        norm = self.ctx_k_norm if self.ctx_k_norm.numel() else None
        for layer, (kc, vc) in enumerate(caches):
            w = norm[layer] if norm is not None else None
            rope_store(
                kv[:, layer * width : (layer + 1) * width],
                positions,
                self.rope.cos,
                self.rope.sin,
                w,
                w,
                cfg.rms_norm_eps,
                kc,
                vc,
                slots,
                0,
                nkv,
                hd,
            )

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMetadata,
        caches: list[KVCache],
        backend: AttentionBackend,
    ) -> torch.Tensor:
        if backend.fused:
            return run_layers_fused(
                self.layers,
                embeds,
                positions,
                meta,
                caches,
                backend,
                self.norm,
                split_gemm=self.split_gemm,
                triton_gemm=self.triton_gemm,
            )[0]
        h = embeds
        for layer, cache in zip(self.layers, caches):
            h = layer(h, positions, meta, cache, backend)
        return self.norm(h)
