"""A persistent L2 prefetcher beside a one-row decode step (issue #6, session 39; experimental, off by default).

At a one-row decode step of a large target the DRAM idles while the small kernels between the GEMMs run: ~15 us a
layer on the Qwen3-8B shape (session 34's profile: attention 7.9, the split merge 2.6, two RMSNorms 3.3, SiLU-mul
1.6), which is what keeps the step above the weight-read floor. Reading an L2-resident o_proj weight is 1.6x faster
than a cold one (session 34, ``benchmarks/l2_splitk.py``), but prefetching it from the attention's own programs put
the prefetch on the step's critical path (session 34), and a prefetch kernel joined before each GEMM (session 12)
cost the GEMM its programmatic launch. Here the prefetch runs off the critical path: one kernel, launched on a side
stream at the start of the captured step (a branch of the CUDA graph, joined once after the last layer), walks a
schedule of events; each event waits for a flag that a kernel of the main chain sets (the attention of layer i,
right after its wait for the qkv GEMM), then issues ``prefetch.global.L2`` for a weight range (o_proj of layer i,
and optionally the first rows of its gate_up). The main chain only gains one store per layer.

``SPECSERVE_L2_PREFETCH`` (read per forward, i.e. per graph capture): empty or ``0`` off (default); otherwise
``NAME=FRACTION[@DELAY_US]`` items joined by ``,`` for NAME in ``o`` / ``gate_up`` / ``down`` (the first FRACTION of
each of the GEMM's K slices, prefetched DELAY_US (default 0) after layer i's attention starts, in the order given:
give the delays in increasing order), plus optional ``ctas=N`` (programs of
the prefetch kernel, default 16), ``warps=N`` (per program, default 1), ``sleep_ns=N`` (a waiting program's
``nanosleep`` between polls, default 500; 0 busy-waits), ``policy=normal|last`` (``evict_last`` hint, default normal) and ``timeout_us=N``
(how long one event waits for its flag before the prefetcher gives up for the step, default 20000), e.g.
``o=1,gate_up=0.1@8,ctas=32`` (a delay keeps the prefetch traffic from queueing before the attention's own reads,
or aims it at a later idle window). Only CUDA graph captures of the fused-norm one-row path use it (eager steps run as before); a
prefetch never changes what a kernel reads, so outputs are unchanged by construction.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

ENV = "SPECSERVE_L2_PREFETCH"
NAMES = ("o", "gate_up", "down")
LINE = 128  # bytes a line prefetch brings into L2
attn_captures = 0  # one-row steps captured with site=attn (a check for the benchmarks)


@dataclass(frozen=True)
class PrefetchConfig:
    # (projection, fraction of each K slice, ns after layer i's trigger), in issue order
    fractions: tuple[tuple[str, float, int], ...]
    ctas: int = 16
    evict_last: bool = False
    timeout_us: int = 20000
    warps: int = 1  # per program
    sleep_ns: int = 500  # a waiting program's nanosleep between polls (0: busy-wait)
    # "kernel": the persistent prefetch kernel; "attn": ``ctas`` extra programs of each layer's attention kernel
    # prefetch o_proj (``early``: before the kernel's wait for the qkv GEMM, i.e. while it runs)
    site: str = "kernel"
    early: bool = False


def parse_config(raw: str | None = None) -> PrefetchConfig | None:
    """:data:`ENV` parsed; None when off. A bad value raises ValueError naming the variable."""
    raw = (os.environ.get(ENV, "") if raw is None else raw).strip()
    if raw in ("", "0"):
        return None
    fractions: list[tuple[str, float, int]] = []
    ctas, evict_last, timeout_us, warps, sleep_ns, site, early = 16, False, 20000, 1, 500, "kernel", False
    for item in raw.split(","):
        key, sep, val = (s.strip() for s in item.partition("="))
        try:
            if not sep:
                raise ValueError
            if key in NAMES:
                frac, at, delay = val.partition("@")
                f, delay_ns = float(frac), round(float(delay) * 1000) if at else 0
                if not 0.0 < f <= 1.0 or not 0 <= delay_ns <= 10**6 or any(k == key for k, *_ in fractions):
                    raise ValueError
                fractions.append((key, f, delay_ns))
            elif key == "ctas":
                ctas = int(val)
                if not 1 <= ctas <= 1024:
                    raise ValueError
            elif key == "policy":
                if val not in ("normal", "last"):
                    raise ValueError
                evict_last = val == "last"
            elif key == "warps":
                warps = int(val)
                if warps not in (1, 2, 4, 8):
                    raise ValueError
            elif key == "sleep_ns":
                sleep_ns = int(val)
                if not 0 <= sleep_ns <= 10**6:
                    raise ValueError
            elif key == "site":
                if val not in ("kernel", "attn"):
                    raise ValueError
                site = val
            elif key == "early":
                if val not in ("0", "1"):
                    raise ValueError
                early = val == "1"
            elif key == "timeout_us":
                timeout_us = int(val)
                if not 1 <= timeout_us <= 10**6:
                    raise ValueError
            else:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"{ENV}: bad item {item.strip()!r}; expected NAME=FRACTION[@DELAY_US] (NAME one of {', '.join(NAMES)}, 0 < "
                "FRACTION <= 1, 0 <= DELAY_US <= 1000, each NAME once), ctas=1..1024, warps=1|2|4|8, sleep_ns=0..1000000, policy=normal|last, site=kernel|attn, early=0|1 or timeout_us=1..1000000, joined by ','"
            ) from None
    if not fractions:
        raise ValueError(f"{ENV}: {raw!r} names no projection to prefetch (o, gate_up, down)")
    if site == "attn" and (len(fractions) != 1 or fractions[0][0] != "o" or fractions[0][2]):
        raise ValueError(f"{ENV}: site=attn prefetches o_proj only, without a delay (o=FRACTION)")
    return PrefetchConfig(tuple(fractions), ctas, evict_last, timeout_us, warps, sleep_ns, site, early)


@triton.jit
def _globaltimer(dummy):
    """The GPU's nanosecond clock (``%globaltimer``); ``dummy`` only gives the result its shape."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l,r", [dummy], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _nanosleep(dummy, NS: tl.constexpr):
    """Suspend the warp for about ``NS`` ns (``nanosleep``): a waiting program then takes no issue slots from the
    GEMM programs that share its SM (busy-waiting 16 programs measured +137 us a step on the H100)."""
    return tl.inline_asm_elementwise(
        f"nanosleep.u32 {NS}; mov.u32 $0, 0;", "=r,r", [dummy], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _prefetch_lines(addrs, valid, EVICT_LAST: tl.constexpr):
    """One L2 line prefetch per element whose ``valid`` is nonzero."""
    if EVICT_LAST:
        return tl.inline_asm_elementwise(
            """{
            .reg .pred p;
            setp.ne.s32 p, $2, 0;
            @p prefetch.global.L2::evict_last [$1];
            mov.u32 $0, 0;
            }""",
            "=r,l,r",
            [addrs, valid],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    else:
        return tl.inline_asm_elementwise(
            """{
            .reg .pred p;
            setp.ne.s32 p, $2, 0;
            @p prefetch.global.L2 [$1];
            mov.u32 $0, 0;
            }""",
            "=r,l,r",
            [addrs, valid],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit
def _prefetcher_kernel(
    flags_ptr,
    ev_ptr,
    n_events,
    timeout_ns,
    LANES: tl.constexpr,
    EVICT_LAST: tl.constexpr,
    SLEEP_NS: tl.constexpr,
):
    """Event e of ``ev`` ([E, 6] int64: flag index, base address, slice stride, slices, bytes per slice, delay ns;
    the events of one flag consecutive): wait until ``flags[flag]`` is nonzero, then until ``delay`` ns after this
    program first saw it, then prefetch ``bytes`` from the start of each slice, the lines spread over the programs.
    Waiting longer than ``timeout_ns`` for one flag ends the step's prefetching (no event after it waits): the
    kernel always ends, even if a flag is never set."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, LANES)
    alive = pid >= 0  # a scalar true
    prev = tl.load(ev_ptr) - 1  # no flag seen yet
    seen = _globaltimer(pid)
    for e in range(n_events):
        trig = tl.load(ev_ptr + e * 6)
        base = tl.load(ev_ptr + e * 6 + 1)
        stride = tl.load(ev_ptr + e * 6 + 2)
        nslices = tl.load(ev_ptr + e * 6 + 3)
        per = tl.load(ev_ptr + e * 6 + 4)
        delay = tl.load(ev_ptr + e * 6 + 5)
        if alive:
            if trig != prev:
                t0 = _globaltimer(pid)
                flag = tl.load(flags_ptr + trig, volatile=True)
                waited = t0 - t0
                while (flag == 0) & (waited < timeout_ns):
                    if SLEEP_NS > 0:
                        _nanosleep(pid, SLEEP_NS)
                    flag = tl.load(flags_ptr + trig, volatile=True)
                    waited = _globaltimer(pid) - t0
                alive = flag != 0
                seen = _globaltimer(pid)
                prev = trig
            while _globaltimer(pid) - seen < delay:
                if SLEEP_NS > 0:
                    _nanosleep(pid, SLEEP_NS)
        if alive:
            lines = per // 128
            total = lines * nslices
            for c0 in range(pid * LANES, total, nprog * LANES):
                c = c0 + lanes
                s = c // lines
                addr = base + s * stride + (c - s * lines) * 128
                _prefetch_lines(addr, (c < total).to(tl.int32), EVICT_LAST)


class L2Prefetcher:
    """The schedule and launch state of one model's prefetcher (see the module docstring). Build it outside a
    capture (its tensors are copied to the device); :meth:`start` and :meth:`join` bracket a captured step."""

    def __init__(self, cfg: PrefetchConfig, weights: list[dict[str, tuple[torch.Tensor, int]]]) -> None:
        """``weights[i][name]``: layer i's [K, N] weight of that projection and its split-K slice count."""
        self.cfg = cfg
        dev = next(iter(weights[0].values()))[0].device
        rows: list[list[int]] = []
        for i, layer in enumerate(weights):
            for name, frac, delay_ns in cfg.fractions:
                if name not in layer:
                    continue
                w, slices = layer[name]
                if not w.is_contiguous():
                    raise ValueError(f"{ENV}: layer {i}'s {name} weight is not contiguous")
                nbytes = w.numel() * w.element_size()
                stride = nbytes // max(slices, 1)
                per = int(stride * frac) // LINE * LINE
                if per > 0:
                    rows.append([i, w.data_ptr(), stride, max(slices, 1), per, delay_ns])
        self.n_layers = len(weights)
        self.events = torch.tensor(rows or [[0] * 6], dtype=torch.int64, device=dev)
        self.n_events = len(rows)
        self.flags = torch.zeros(self.n_layers, dtype=torch.int32, device=dev)
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None  # (CPU: the schedule's tests)
        self.prefetched_bytes = sum(r[3] * r[4] for r in rows)

    def flag(self, layer: int) -> torch.Tensor:
        return self.flags[layer : layer + 1]

    def start(self) -> None:
        """Clear the flags and launch the prefetch kernel on the side stream (after the work queued so far)."""
        assert self.stream is not None, "the prefetcher runs on CUDA devices"
        cur = torch.cuda.current_stream(self.flags.device)
        self.flags.zero_()
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            _prefetcher_kernel[(self.cfg.ctas,)](
                self.flags,
                self.events,
                self.n_events,
                self.cfg.timeout_us * 1000,
                LANES=32 * 4 * self.cfg.warps,
                EVICT_LAST=self.cfg.evict_last,
                SLEEP_NS=self.cfg.sleep_ns,
                num_warps=self.cfg.warps,
            )

    def join(self) -> None:
        assert self.stream is not None
        torch.cuda.current_stream(self.flags.device).wait_stream(self.stream)


def prefetcher_for(
    owner: torch.nn.Module, cfg: PrefetchConfig, weights: list[dict[str, tuple[torch.Tensor, int]]]
) -> L2Prefetcher:
    """``owner``'s (a model's layer list) prefetcher under ``cfg``, built on first use and kept on the module (so it
    lives and dies with the weights whose addresses it holds)."""
    cache: dict[PrefetchConfig, L2Prefetcher] = owner.__dict__.setdefault("_l2_prefetchers", {})
    pf = cache.get(cfg)
    if pf is None:
        pf = cache[cfg] = L2Prefetcher(cfg, weights)
    return pf
