"""EAGLE-3 draft head (``LlamaForCausalLMEagle3``): one Llama layer whose q/k/v read the concatenation of the
normed token embedding and the normed incoming hidden state (2H), fed by ``fc`` over three target taps; the
pre-norm output is fed back as the next step's hidden state. ``d2t`` maps draft-vocab ids to target ids."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from specserve.layers.attention import AttentionBackend, AttnMetadata
from specserve.layers.norm import RMSNorm
from specserve.layers.rotary import RotaryEmbedding
from specserve.models.dflash import drafter_model_config
from specserve.models.llama import MLP, Attention, KVCache, copy_weight


class Eagle3DraftModel(nn.Module):
    def __init__(self, raw: dict[str, Any], target_hidden: int, target_vocab: int, max_position: int) -> None:
        super().__init__()
        self.cfg = cfg = drafter_model_config(raw, qk_norm=False)
        H = cfg.hidden_size
        self.target_hidden = int(raw.get("target_hidden_size") or target_hidden)
        n_aux = len(
            raw.get("eagle_aux_hidden_state_layer_ids")
            or (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            or [0, 0, 0]
        )
        self.rope = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling)
        self.fc = nn.Linear(n_aux * self.target_hidden, H, bias=False)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, self.rope, in_features=2 * H)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = MLP(H, cfg.intermediate_size)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.draft_vocab_size = int(raw.get("draft_vocab_size") or raw.get("vocab_size") or target_vocab)
        self.norm_before_residual = bool(raw.get("norm_before_residual", False))
        self.embed_tokens: nn.Embedding | None = None
        self.lm_head: nn.Linear | None = None
        self.d2t: torch.Tensor
        self.register_buffer("d2t", torch.zeros(self.draft_vocab_size, dtype=torch.long), persistent=False)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        for name, t in weights:
            if name.startswith("model."):
                name = name[6:]
            for pre in ("midlayer.", "layers.0."):
                if name.startswith(pre):
                    name = name[len(pre) :]
            if name == "d2t":
                self.d2t = t.to(device=self.d2t.device, dtype=torch.long)
                continue
            if name == "t2d":
                continue
            if name == "embed_tokens.weight":
                self.embed_tokens = nn.Embedding(
                    t.shape[0], t.shape[1], device=t.device, dtype=self.fc.weight.dtype
                )
                self.embed_tokens.weight.copy_(t)
                continue
            if name == "lm_head.weight":
                self.lm_head = nn.Linear(
                    t.shape[1],
                    t.shape[0],
                    bias=False,
                    device=self.fc.weight.device,
                    dtype=self.fc.weight.dtype,
                )
                self.lm_head.weight.copy_(t)
                continue
            copy_weight(params, name, t, self.cfg, "EAGLE-3")
        if self.lm_head is not None and self.lm_head.weight.shape[0] != self.draft_vocab_size:
            raise ValueError(
                f"EAGLE-3 lm_head has {self.lm_head.weight.shape[0]} rows but draft_vocab_size is {self.draft_vocab_size}."
            )
        self.d2t = self.d2t.to(self.fc.weight.device)

    def transpose_weights(self) -> None:
        """The target's transposed decode GEMM layout (layers/linear.py): the layer's projections and ``fc``."""
        from specserve.layers.linear import TransposedLinear, transpose_decoder_linears

        transpose_decoder_linears([self])
        if isinstance(self.fc, nn.Linear):
            self.fc = TransposedLinear(self.fc)  # type: ignore[assignment]

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        meta: AttnMetadata,
        cache: KVCache,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (pre-norm output fed back as the next hidden, normed output for the LM head)."""
        normed_hidden = self.hidden_norm(hidden)
        residual = normed_hidden if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed_hidden], dim=-1)
        h = residual + self.self_attn(x, positions, meta, cache, backend)
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, self.norm(h)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
