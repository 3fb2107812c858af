"""L2 prefetch on the Qwen3-8B shape (issue #6, session 12): does prefetching a GEMM's weights while the small
kernels before it run shorten the GEMM? Measured: no (benchmarks/results/h200-2026-12-03-s12/c1-c3).

    python benchmarks/l2_prefetch.py

Per GEMM of the decode step (transposed "kn" weights as the engine stores them, 36 distinct weights per GEMM so
every GEMM reads cold): one CUDA graph of 36 x [prefetch on a side stream; an idle window of T us on the main stream
(a 1-SM spin kernel standing in for the small kernels); join; GEMM], minus the windows alone: the GEMM's effective
time per fraction of its weights prefetched, vs no prefetch. Prefetch kernels: mode 0 ``cp.async.bulk.prefetch.L2``
(the CTA waits for the data: ~1 TB/s from a few SMs), mode 1 ``prefetch.global.L2::evict_last`` per line, mode 2
plain loads. The engine integration measured in calls c1-c3 (``SPECSERVE_L2_PREFETCH``: the prefetch kernels
captured into the decode graph; every setting slower than none) is commit 93a15b8's version of this script and of
``specserve/models/llama.py``; it was removed after the measurement.
"""

# ruff: noqa: B023  (the closures below are captured into a graph at once, inside their loop iteration)
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_latency import copy_bandwidth, read_bandwidth, result_meta  # noqa: E402

GROUPS = ("qkv", "o", "gate_up", "down")
# (bytes per lane, lanes per program and loop step) per mode: 0 bulk prefetch, 1 line prefetch, 2 loads
_MODES = {0: (32768, 128), 1: (128, 512), 2: (8, 2048)}


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
        self.programs = programs or 16
        # a bulk prefetch holds its CTA until the data is in L2: the kernel runs on a side stream, concurrently
        # with the small kernels, and the GEMM's stream joins it (:meth:`join`)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.mode = 1  # see _MODES; the benchmark sets it per variant
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


SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}  # (K, N)
WINDOWS_US = {"qkv": [5], "o": [0, 13], "gate_up": [4], "down": [3]}
FRACTIONS = {
    "qkv": [(0.2, 1), (0.4, 1), (0.4, 2), (0.4, 4)],
    "o": [(0.5, 1), (1.0, 1)],
    "gate_up": [(0.05, 1), (0.1, 1)],
    "down": [(0.1, 1), (0.1, 2), (0.2, 2)],
}
PROGRAMS = [(1, 32), (1, 132), (2, 132), (2, 264)]  # (mode, programs)
LAYERS = 36


def graph_ms(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps


def cycles_per_us() -> float:
    def f() -> None:
        torch.cuda._sleep(200000)

    return 200000 / (graph_ms(f) * 1e3)


def micro(rows: list[dict]) -> None:
    dev = torch.device("cuda")
    cpu_us = cycles_per_us()
    print(f"spin kernel: {cpu_us:.0f} cycles per us", flush=True)
    pf = L2Prefetcher(dev, {g: (0.0, 1) for g in GROUPS})
    x = torch.randn(1, 12288, dtype=torch.bfloat16, device=dev)
    for name, (k, n) in SHAPES.items():
        ws = [torch.randn(k, n, dtype=torch.bfloat16, device=dev) for _ in range(LAYERS)]
        xs = x[:, :k]
        mb = k * n * 2 / 1e6
        for win in WINDOWS_US[name]:
            cyc = int(win * cpu_us)

            def windows() -> None:
                for _ in range(LAYERS):
                    if cyc:
                        torch.cuda._sleep(cyc)

            def base() -> None:
                for w in ws:
                    if cyc:
                        torch.cuda._sleep(cyc)
                    torch.mm(xs, w)

            def with_pf() -> None:
                for w in ws:
                    pf(w, name)  # side stream
                    if cyc:
                        torch.cuda._sleep(cyc)
                    pf.join()
                    torch.mm(xs, w)

            t_win = graph_ms(windows) if cyc else 0.0
            t_base = graph_ms(base)
            res = {
                "part": "micro",
                "gemm": name,
                "MB": round(mb, 1),
                "window_us": win,
                "gemm_us_no_prefetch": round(1e3 * (t_base - t_win) / LAYERS, 2),
            }
            for mode, progs in PROGRAMS:
                pf.mode, pf.programs = mode, progs
                pf.configure({})
                # prefetch kernels launched, nothing prefetched: the fork / join cost
                res[f"m{mode}p{progs}_empty"] = round(1e3 * (graph_ms(with_pf) - t_win) / LAYERS, 2)
                for frac, splits in FRACTIONS[name]:
                    pf.configure({name: (frac, splits)})
                    t = graph_ms(with_pf)
                    res[f"m{mode}p{progs}_pf_{frac}:{splits}"] = round(1e3 * (t - t_win) / LAYERS, 2)
            rows.append(res)
            print(json.dumps(res), flush=True)
        ws.clear()
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows: list[dict] = []
    bw = copy_bandwidth()
    read_bw = read_bandwidth()
    dram = max(bw, read_bw)
    print(f"DRAM {dram / 1e12:.2f} TB/s (copy traffic {bw / 1e12:.2f}, reduction read {read_bw / 1e12:.2f})")
    micro(rows)
    out = Path(args.out or "benchmarks/results/l2_prefetch.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                **result_meta(),
                "dram_Bps": dram,
                "rows": rows,
            },
            indent=2,
        )  # fmt: skip
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
