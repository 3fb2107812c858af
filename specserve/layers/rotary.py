"""Rotary position embeddings (HF rotate-half convention) with Llama-3 style scaling."""

from __future__ import annotations

import math
from typing import Any

import torch


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_ctx = float(s.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Precomputed cos/sin tables indexed by absolute position; ``apply`` rotates q and k in place-free form."""

    cos: torch.Tensor  # fp32 [max_position, head_dim] (rotate-half layout: the frequencies twice)
    sin: torch.Tensor
    sin_signed: torch.Tensor  # sin with its first half negated (the sign rotate_half gives those partners)

    def __init__(
        self, head_dim: int, max_position: int, theta: float, scaling: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        attention_factor = 1.0
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind == "llama3":
                inv_freq = _llama3_inv_freq(inv_freq, scaling)
            elif kind == "linear":
                inv_freq = inv_freq / float(scaling["factor"])
            else:
                raise ValueError(f"Unsupported rope_scaling type {kind!r} (supported: llama3, linear).")
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * attention_factor, persistent=False)
        self.register_buffer("sin", emb.sin() * attention_factor, persistent=False)
        half = head_dim // 2
        sign = torch.cat([-torch.ones(half), torch.ones(head_dim - half)])
        self.register_buffer("sin_signed", self.sin * sign, persistent=False)
        self._last: tuple[torch.Tensor, torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the sign-folded sin rows of ``positions`` [T] as [T, 1, D] in ``dtype``. On CPU, where the eager
        layers pay for every op, the layers of one forward share them: the rows of the last positions tensor seen
        are kept and reused while that same tensor holds the same values (compared by value: a buffer refilled in
        place is never served stale rows; no comparison on GPUs, where it would synchronise or break a capture)."""
        cpu = positions.device.type == "cpu"
        last = self._last
        if (
            cpu
            and last is not None
            and last[0] is positions
            and last[2] == dtype
            and torch.equal(last[1], positions)
        ):
            return last[3], last[4]
        idx = positions.reshape(-1).to(torch.long)
        cos = self.cos.index_select(0, idx).unsqueeze(1).to(dtype)
        sin = self.sin_signed.index_select(0, idx).unsqueeze(1).to(dtype)
        if cpu:
            self._last = (positions, positions.clone(), dtype, cos, sin)
        return cos, sin

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hk, D], positions [T] -> rotated (q, k) in the input dtype."""
        cos, sin = self.tables(positions, q.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def rotate(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x [T, H, D] (any number of heads) rotated at ``positions`` [T]."""
        cos, sin = self.tables(positions, x.dtype)
        return _rotate(x, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` as ``x * cos + roll(x) * sin_signed`` (``rotate_half(x) * sin`` negates the
    first half's partners; folding that sign into the table gives the same values, bit for bit, with fewer ops)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed
