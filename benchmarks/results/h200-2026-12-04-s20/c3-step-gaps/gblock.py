"""Does cudaGraphLaunch (torch CUDAGraph.replay) block the CPU while an earlier launch of the SAME graph exec is
still running on the GPU? Back-to-back replays of one graph vs alternating two captures of the same body."""
import time
import torch, triton, triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def k(x_ptr, n, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    i = tl.arange(0, 128)
    v = tl.load(x_ptr + i)
    for _ in range(n):
        v = v * 1.0001 + 1.0
    tl.store(x_ptr + i, v)


x = torch.zeros(4096, device="cuda")


def body(pdl, with_memset):
    kw = {"launch_pdl": True} if pdl else {}
    if with_memset:
        x[2048:].zero_()
    for _ in range(250):
        k[(8,)](x, 200, PDL=pdl, **kw)
    return x[:16] * 2


def cap(pdl, ms):
    body(pdl, ms); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = body(pdl, ms)
    g.replay(); torch.cuda.synchronize()
    return g


for pdl in (True, False):
    for ms in (False, True):
        g1, g2 = cap(pdl, ms), cap(pdl, ms)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); g1.replay(); e1.record(); torch.cuda.synchronize()
        gpu = e0.elapsed_time(e1) * 1e3
        res = {}
        for mode in ("same", "alternate"):
            ts = []
            for _ in range(10):
                torch.cuda.synchronize()
                g1.replay()  # first launch: returns at once (idle GPU)
                t0 = time.perf_counter()
                (g1 if mode == "same" else g2).replay()
                ts.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            res[mode] = sorted(ts)[5] * 1e6
        print(f"pdl={int(pdl)} memset={int(ms)} graph GPU {gpu:7.1f} us: 2nd launch CPU same exec {res['same']:7.1f} us, "
              f"other exec {res['alternate']:7.1f} us")
