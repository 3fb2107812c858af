"""Counter-based random numbers for seeded requests: the noise behind the token at position ``n`` of a request
with seed ``s`` is a function of ``(s, n)`` alone.

A per-request ``torch.Generator`` makes a seeded request's tokens independent of its batch only while the host
draws them row by row in a fixed order, which the CUDA graphs cannot do (one static launch for all rows, no
Python loop, the pipelined steps' positions known only on the device).  Here every draw is a hash of the
request's seed key, the position of the token it decides, a stream id (the exponential race, the acceptance
test) and, for the race, the vocabulary column, so the same values come out of the graphs, the eager padded path
and the host sampler, at any batch size, bucket or step pipelining, and with or without speculation:

* the exponential race of the token at position ``n`` uses ``E_n[v] = -log U``, ``U`` from the hash of
  ``(key, n, RACE, v)`` on a grid of 2^23 odd multiples of 2^-24 (never 0 or 1, so ``E`` is never 0 or inf);
* the acceptance test of a draft that would become position ``n`` uses ``u_n`` from ``(key, n, ACCEPT)``, a
  float64 in ``(0, 1]`` on a 2^-32 grid.

Rejection sampling reads ``u`` and ``E`` of each position at most once for a decision that is kept (the step
after a rejection at position ``n`` starts at ``n + 1``), so the draws behind a request's tokens are independent
and the output distribution is the target's, as with any other source of uniforms.

The hash is MurmurHash3's 32-bit finalizer (``fmix32``), integer-exact in torch's int64 arithmetic (the 32-bit
products are split so nothing overflows) and in the Triton kernel of :mod:`specserve.layers.triton_noise` (uint32
arithmetic), which CUDA uses for the [rows, vocab] grid and the acceptance uniforms: both give the same bits. On
CUDA ``-log`` is the kernel's (:func:`race_exponential`), as in the fused sampler of
:mod:`specserve.layers.triton_sampling`, so the host path and the graphs draw the same noise; on CPU it is torch's.  Seed keys are 31-bit and never 0 (0 marks an unseeded row in int32 buffers).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
C1, C2 = 0x85EBCA6B, 0xC2B2AE35  # fmix32's multipliers
GOLDEN = 0x9E3779B9  # position stride (odd: distinct positions give distinct row states)
STREAM_RACE = 0x3C6EF372  # the exponential race of a sampled token
STREAM_ACCEPT = 0xA54FF53A  # the acceptance uniform of a draft
_COL_SALT = 0x510E527F
_SEED_SALT = 0x2545F491
_KEY_MOD = 0x7FFFFFFF  # keys in 1 .. 2^31 - 1


def _fmix32_int(h: int) -> int:
    h ^= h >> 16
    h = (h * C1) & MASK32
    h ^= h >> 13
    h = (h * C2) & MASK32
    return h ^ (h >> 16)


def seed_key(seed: int) -> int:
    """The 31-bit, non-zero key of a request seed (any Python int; taken modulo 2^64, as a 64-bit seed)."""
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    h = _fmix32_int((s & MASK32) ^ _fmix32_int((s >> 32) ^ _SEED_SALT))
    return h % _KEY_MOD + 1


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2^32`` for int64 ``x`` in [0, 2^32): the two 16-bit halves of x times c stay below 2^48."""
    lo = (x & 0xFFFF) * c
    hi = ((x >> 16) * c) & 0xFFFF
    return (lo + (hi << 16)) & MASK32


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finalizer on int64 tensors holding uint32 values (the result holds uint32 values too)."""
    h = h ^ (h >> 16)
    h = _mul32(h, C1)
    h = h ^ (h >> 13)
    h = _mul32(h, C2)
    return h ^ (h >> 16)


def row_state(keys: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """uint32 (in int64) state of each (key, position) pair of one stream; broadcasts ``keys`` against
    ``positions``."""
    k = fmix32(keys.to(torch.int64) ^ stream)
    p = _mul32(positions.to(torch.int64) & MASK32, GOLDEN)
    return fmix32((k + p) & MASK32)


_col_cache: dict[tuple[int, str], torch.Tensor] = {}


def column_hash(vocab: int, device: torch.device) -> torch.Tensor:
    """fmix32 of each vocabulary column (salted), int64 [vocab]; cached per (vocab, device)."""
    key = (vocab, str(device))
    t = _col_cache.get(key)
    if t is None:
        t = fmix32(torch.arange(vocab, dtype=torch.int64, device=device) ^ _COL_SALT)
        _col_cache[key] = t
    return t


def race_uniform_torch(keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 [N, vocab] race uniforms of rows (keys[i], positions[i]), in [2^-24, 1 - 2^-24] (torch ops; a row at
    a time, so the int64 temporaries stay in cache: 2-core VM, 8 rows of 49152 12.0 -> 3.5-5.0 ms, where torch's
    ``exponential_`` takes 7.9 ms; one row 0.5 ms)."""
    st = row_state(keys, positions, STREAM_RACE)
    cols = column_hash(vocab, keys.device)

    def rows(s: torch.Tensor) -> torch.Tensor:
        h = fmix32(s.unsqueeze(-1) ^ cols)
        return ((h >> 9) * 2 + 1).to(torch.float32) * (1.0 / 16777216.0)

    if st.shape[0] <= 1:
        return rows(st)
    out = torch.empty(int(st.shape[0]), vocab, dtype=torch.float32, device=keys.device)
    for i in range(int(st.shape[0])):
        out[i] = rows(st[i])
    return out


def race_uniform(keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """:func:`race_uniform_torch`'s values; on CUDA one Triton launch (no host syncs; graph-capturable)."""
    if keys.device.type == "cuda":
        from specserve.layers.triton_noise import race_noise_triton

        return race_noise_triton(keys, positions, vocab)
    return race_uniform_torch(keys, positions, vocab)


def race_exponential(keys: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 [N, vocab] Exp(1) noise of the race deciding the token at positions[i] of the request keyed keys[i]
    (``-log U``: at least 5.9e-8, at most 16.6). On CUDA one Triton launch whose ``-log`` is the fused sampler's
    (:mod:`specserve.layers.triton_sampling`), so the host path and the graphs draw the same values."""
    if keys.device.type == "cuda":
        from specserve.layers.triton_noise import race_noise_triton

        return race_noise_triton(keys, positions, vocab, log=True)
    return race_uniform_torch(keys, positions, vocab).log_().neg_()


def accept_uniform_torch(keys: torch.Tensor, first: torch.Tensor, k: int) -> torch.Tensor:
    """float64 [N, k] acceptance uniforms in (0, 1] of the drafts at positions ``first[i] + j`` of the requests keyed
    ``keys`` ([N]) (torch ops)."""
    positions = first.to(torch.int64).unsqueeze(1) + torch.arange(k, device=first.device)
    h = row_state(keys.unsqueeze(-1), positions, STREAM_ACCEPT)
    return (h + 1).to(torch.float64) * (1.0 / 4294967296.0)


def accept_uniform(keys: torch.Tensor, first: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`accept_uniform_torch`'s values; on CUDA one Triton launch (the torch form is ~30 small kernels)."""
    if keys.device.type == "cuda":
        from specserve.layers.triton_noise import accept_uniform_triton

        return accept_uniform_triton(keys, first, k)
    return accept_uniform_torch(keys, first, k)
