"""L2 prefetch of the next GEMM's weights while a decoder layer's small kernels run (issue #6, experimental).

At batch 1 a large target's decode step streams its weights through a handful of GEMMs per layer, and between
them DRAM idles while the small kernels run (split-K reduces, q/k norm + RoPE + KV store, attention, the add +
RMSNorm, SiLU-mul: ~0.9 ms of a 4.8 ms Qwen3-8B-shaped step on the H200). A bulk L2 prefetch
(``cp.async.bulk.prefetch.L2``, sm_90+) issued before those kernels lets the memory system fill L2 with (part of)
the next GEMM's weights in that idle time; the GEMM then reads them from L2. The hint is fire-and-forget: the
issuing kernel does not wait for the data.

``SPECSERVE_L2_PREFETCH`` = ``GROUP=FRACTION[:SPLITS],...`` over the groups ``qkv``, ``o``, ``gate_up``, ``down``
(e.g. ``o=1,gate_up=0.08,down=0.1:2,qkv=0.3:2``): before each GEMM's preceding small kernels, prefetch FRACTION of
its weight bytes as SPLITS equal segments (segment s starts at s/SPLITS of the weight: the first rows each split-K
slice reads). ``0`` or unset: off. The amounts live in a device tensor the kernel reads, so a captured graph can be
re-tuned without re-capture (:meth:`L2Prefetcher.configure`). CUDA only (inline PTX); elsewhere it is never on.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

GROUPS = ("qkv", "o", "gate_up", "down")
# (bytes per lane, lanes per program and loop step) per mode: 0 bulk prefetch, 1 line prefetch, 2 loads
_MODES = {0: (32768, 128), 1: (128, 512), 2: (8, 2048)}


def parse_spec(text: str) -> dict[str, tuple[float, int]]:
    """``"o=1,gate_up=0.08:1"`` -> ``{"o": (1.0, 1), "gate_up": (0.08, 1)}``; ``""`` / ``"0"``: {}."""
    text = text.strip()
    if text in ("", "0"):
        return {}
    out: dict[str, tuple[float, int]] = {}
    for part in text.split(","):
        name, eq, val = part.strip().partition("=")
        frac, _, splits = val.partition(":")
        try:
            f, s = float(frac), int(splits or 1)
        except ValueError:
            f, s = -1.0, 0
        if not eq or name not in GROUPS or not 0.0 <= f <= 1.0 or s < 1:
            raise ValueError(
                f"SPECSERVE_L2_PREFETCH: expected GROUP=FRACTION[:SPLITS] with GROUP in {GROUPS}, "
                f"0 <= FRACTION <= 1, SPLITS >= 1; got {part!r}"
            )
        out[name] = (f, s)
    return out


def plan(nbytes: int, fraction: float, splits: int) -> tuple[int, int]:
    """(segment stride, segment bytes) for prefetching ``fraction`` of ``nbytes`` as ``splits`` segments, both
    multiples of 256 bytes (bulk prefetch sizes and addresses must be 16-byte multiples)."""
    stride = (nbytes // splits) // 256 * 256
    seg = int(stride * fraction) // 256 * 256
    return stride, seg


@triton.jit
def _bulk_prefetch(ptrs, sizes):
    """One ``cp.async.bulk.prefetch.L2`` per element (size 0: none)."""
    return tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        setp.gt.s32 p, $2, 0;
        @p cp.async.bulk.prefetch.L2.global [$1], $2;
        mov.u32 $0, 0;
        }""",
        "=r,l,r",
        [ptrs, sizes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _line_prefetch(ptrs, sizes):
    """One ``prefetch.global.L2::evict_last`` (one cache line) per element (size 0: none)."""
    return tl.inline_asm_elementwise(
        """{
        .reg .pred p;
        setp.gt.s32 p, $2, 0;
        @p prefetch.global.L2::evict_last [$1];
        mov.u32 $0, 0;
        }""",
        "=r,l,r",
        [ptrs, sizes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _l2_prefetch_kernel(w_ptr, cfg_ptr, scratch_ptr, nbytes, GROUP: tl.constexpr, CHUNK: tl.constexpr, LANES: tl.constexpr, MODE: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    permille = tl.load(cfg_ptr + 2 * GROUP)
    splits = tl.maximum(tl.load(cfg_ptr + 2 * GROUP + 1), 1)
    stride = (nbytes // splits) // 256 * 256
    seg = (stride * permille // 1000) // 256 * 256
    per_seg = (seg + CHUNK - 1) // CHUNK
    total = per_seg * splits
    for c0 in range(pid * LANES, total, nprog * LANES):
        c = c0 + tl.arange(0, LANES)
        s = c // tl.maximum(per_seg, 1)
        j = c - s * per_seg
        size = tl.minimum(seg - j * CHUNK, CHUNK)
        size = tl.where(c < total, size, 0).to(tl.int32)
        off = s.to(tl.int64) * stride + j.to(tl.int64) * CHUNK
        if MODE == 0:
            _bulk_prefetch(w_ptr + off, size)
        elif MODE == 1:
            _line_prefetch(w_ptr + off, size)
        else:  # plain loads of CHUNK = 8 bytes per lane, kept alive by a store that never happens
            v = tl.load((w_ptr + off).to(tl.pointer_type(tl.int64)), mask=size > 0, other=0)
            acc = tl.sum(v, 0)
            tl.store(scratch_ptr, acc, mask=acc == 0x1234567890ABCDE)


class L2Prefetcher:
    """Launches the prefetch of a weight's configured share into L2 (see the module docstring)."""

    def __init__(
        self, device: torch.device, spec: dict[str, tuple[float, int]], programs: int | None = None
    ) -> None:
        self.device = device
        self.cfg = torch.zeros(2 * len(GROUPS), dtype=torch.int64, device=device)
        self.active = set(spec)
        self.programs = programs or int(os.environ.get("SPECSERVE_L2_PREFETCH_PROGRAMS", "16"))
        # a bulk prefetch holds its CTA until the data is in L2: the kernel runs on a side stream, concurrently
        # with the small kernels, and the GEMM's stream joins it (:meth:`join`)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.mode = int(os.environ.get("SPECSERVE_L2_PREFETCH_MODE", "1"))
        self.scratch = torch.zeros(1, dtype=torch.int64, device=device)
        self.pending = False
        self.configure(spec)

    def configure(self, spec: dict[str, tuple[float, int]]) -> None:
        """Set the prefetched fraction / splits per group (groups not captured with a prefetch stay off)."""
        vals = [0] * (2 * len(GROUPS))
        for name, (frac, splits) in spec.items():
            i = GROUPS.index(name)
            vals[2 * i], vals[2 * i + 1] = int(round(frac * 1000)), splits
        self.cfg.copy_(torch.tensor(vals, dtype=torch.int64))

    def __call__(self, weight: torch.Tensor, group: str) -> None:
        """Start prefetching ``weight``'s configured share on the side stream (after the work queued so far)."""
        if group not in self.active:
            return
        w = weight.detach()
        if not w.is_contiguous():
            raise ValueError("L2 prefetch needs a contiguous weight")
        assert self.stream is not None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        chunk, lanes = _MODES[self.mode]
        with torch.cuda.stream(self.stream):
            _l2_prefetch_kernel[(self.programs,)](
                w.view(-1).view(torch.uint8),
                self.cfg,
                self.scratch,
                w.numel() * w.element_size(),
                GROUP=GROUPS.index(group),
                CHUNK=chunk,
                LANES=lanes,
                MODE=self.mode,
                num_warps=1 if self.mode == 0 else 4,
            )
        self.pending = True

    def join(self) -> None:
        """Make the current stream wait for the prefetches started so far (before the GEMM that reads them)."""
        if self.pending:
            assert self.stream is not None
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            self.pending = False


def from_env(device: torch.device) -> L2Prefetcher | None:
    """The prefetcher ``SPECSERVE_L2_PREFETCH`` asks for on a CUDA device of compute capability 9.0+, else None."""
    spec = parse_spec(os.environ.get("SPECSERVE_L2_PREFETCH", ""))
    if not spec or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return None
    return L2Prefetcher(device, spec)


def weight_of(linear: torch.nn.Module) -> torch.Tensor:
    """The stored weight of an ``nn.Linear`` or a :class:`specserve.layers.linear.TransposedLinear`."""
    w = getattr(linear, "weight_t", None)
    return w if w is not None else linear.weight  # type: ignore[return-value]
