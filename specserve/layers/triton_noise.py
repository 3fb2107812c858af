"""The seeded race uniforms of :mod:`specserve.layers.seeded_noise` in one Triton launch (the torch form is ~20
elementwise int64 kernels over [rows, vocab]). uint32 arithmetic wraps modulo 2^32, so the bits equal the torch
form's; runs under ``TRITON_INTERPRET=1`` on CPU tensors (the tests). No host syncs; grid from static shapes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specserve.layers import seeded_noise as _sn

__all__ = ["accept_u", "accept_uniform_triton", "race_noise_triton", "race_u"]

_BLOCK = 1024
# the jitted functions read module globals only as constexprs
C1 = tl.constexpr(_sn.C1)
C2 = tl.constexpr(_sn.C2)
GOLDEN = tl.constexpr(_sn.GOLDEN)
STREAM_RACE = tl.constexpr(_sn.STREAM_RACE)
STREAM_ACCEPT = tl.constexpr(_sn.STREAM_ACCEPT)
COL_SALT = tl.constexpr(_sn._COL_SALT)


@triton.jit
def _fmix32(h):
    h ^= h >> 16
    h = h * tl.full((), C1, tl.uint32)
    h ^= h >> 13
    h = h * tl.full((), C2, tl.uint32)
    return h ^ (h >> 16)


@triton.jit
def race_u(key, pos, cols):
    """The seeded race uniforms of (key, pos) (uint32) at columns ``cols``: seeded_noise.race_uniform_torch's."""
    k = _fmix32(key ^ tl.full((), STREAM_RACE, tl.uint32))
    st = _fmix32(k + pos * tl.full((), GOLDEN, tl.uint32))
    c = _fmix32(cols.to(tl.uint32) ^ tl.full((), COL_SALT, tl.uint32))
    h = _fmix32(st ^ c)
    return ((h >> 9) * 2 + 1).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _race_noise_kernel(out_ptr, key_ptr, pos_ptr, V, stride_o, LOG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = tl.load(key_ptr + row).to(tl.uint32)
    pos = tl.load(pos_ptr + row).to(tl.uint32)
    u = race_u(key, pos, cols)
    if LOG:
        u = -tl.log(u)
    tl.store(out_ptr + row.to(tl.int64) * stride_o + cols, u, mask=cols < V)


def race_noise_triton(
    keys: torch.Tensor, positions: torch.Tensor, vocab: int, log: bool = False
) -> torch.Tensor:
    """float32 [N, vocab]: the seeded race uniforms of int ``keys`` / ``positions`` [N] (values below 2^32), bit for
    bit :func:`specserve.layers.seeded_noise.race_uniform_torch`'s; ``log``: their ``-log`` (the Exp(1) noise, by the
    kernel's log, which the fused sampler of :mod:`specserve.layers.triton_sampling` computes the same way)."""
    n = int(keys.shape[0])
    if positions.shape != keys.shape:
        raise ValueError(
            f"keys and positions must have one shape, got {tuple(keys.shape)} / {tuple(positions.shape)}"
        )
    out = torch.empty((n, vocab), dtype=torch.float32, device=keys.device)
    if n == 0 or vocab == 0:
        return out
    keys = keys.to(torch.int64).contiguous()
    positions = positions.to(torch.int64).contiguous()
    _race_noise_kernel[(n, triton.cdiv(vocab, _BLOCK))](
        out, keys, positions, vocab, out.stride(0), LOG=log, BLOCK=_BLOCK, num_warps=4
    )
    return out


@triton.jit
def accept_u(key, pos):
    """The float64 acceptance uniform of (key, pos) (uint32 operands): seeded_noise.accept_uniform_torch's value."""
    k = _fmix32(key ^ tl.full((), STREAM_ACCEPT, tl.uint32))
    h = _fmix32(k + pos * tl.full((), GOLDEN, tl.uint32))
    return (h.to(tl.int64) + 1).to(tl.float64) * (1.0 / 4294967296.0)


@triton.jit
def _accept_uniform_kernel(out_ptr, key_ptr, first_ptr, K, K_PAD: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, K_PAD)
    key = tl.load(key_ptr + row).to(tl.uint32)
    pos = (tl.load(first_ptr + row) + offs).to(tl.uint32)
    tl.store(out_ptr + row * K + offs, accept_u(key, pos), mask=offs < K)


def accept_uniform_triton(keys: torch.Tensor, first: torch.Tensor, k: int) -> torch.Tensor:
    """float64 [N, k]: :func:`specserve.layers.seeded_noise.accept_uniform_torch` in one launch."""
    n = int(keys.shape[0])
    out = torch.empty((n, k), dtype=torch.float64, device=keys.device)
    if n == 0 or k == 0:
        return out
    keys = keys.to(torch.int64).contiguous()
    first = first.to(torch.int64).contiguous()
    _accept_uniform_kernel[(n,)](out, keys, first, k, K_PAD=triton.next_power_of_2(k), num_warps=1)
    return out
