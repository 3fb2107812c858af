"""CPU cost of cudaGraphLaunch (torch CUDAGraph.replay) per graph node: Triton kernels with few / many arguments,
with and without programmatic dependent launch, and plain torch ops; N nodes per graph."""
import time
import torch, triton, triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def k_few(x_ptr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    i = tl.arange(0, 128)
    tl.store(x_ptr + i, tl.load(x_ptr + i) + 1)


@triton.jit
def k_many(x_ptr, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9,
           c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, y1, y2, y3, y4, y5, y6, y7, y8, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    i = tl.arange(0, 128)
    s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + b0 + b1 + b2 + b3 + b4 + b5 + b6 + b7 + b8 + b9
    s += c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9
    tl.store(x_ptr + i, tl.load(x_ptr + i) + s + tl.load(y1) + tl.load(y2) + tl.load(y3) + tl.load(y4) + tl.load(y5) + tl.load(y6) + tl.load(y7) + tl.load(y8))


x = torch.zeros(4096, device="cuda")
ys = [torch.zeros(16, device="cuda") for _ in range(8)]


def variant(kind, n, pdl):
    kw = {"launch_pdl": True} if pdl else {}
    def body():
        for _ in range(n):
            if kind == "few":
                k_few[(132,)](x, PDL=pdl, **kw)
            elif kind == "many":
                k_many[(132,)](x, *range(30), *ys, PDL=pdl, **kw)
            else:
                x.add_(1)
    body(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    cpu = []
    for _ in range(30):
        torch.cuda.synchronize()
        t0 = time.perf_counter(); g.replay(); cpu.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20):
        g.replay()
    e1.record(); torch.cuda.synchronize()
    c = sorted(cpu)[len(cpu) // 2] * 1e6
    gpu = e0.elapsed_time(e1) / 20 * 1e3
    print(f"{kind:5} pdl={int(pdl)} nodes={n:4}  replay() CPU {c:8.1f} us ({c / n:5.2f} us/node)  GPU {gpu:8.1f} us")


for n in (50, 200, 400):
    for kind, pdl in (("torch", False), ("few", False), ("few", True), ("many", False), ("many", True)):
        variant(kind, n, pdl)
