"""GPU: the folded-norm kernel forms against the kernels they replace (Qwen3-8B shapes, bf16, one row), and their
times (CUDA events, eager launches)."""
import torch
import specserve.layers.triton_splitk as ts
from specserve.layers.triton_fused import RowScale, rms_norm, silu_mul

dev, dt = "cuda", torch.bfloat16
H, I = 4096, 12288
g = torch.Generator(device=dev).manual_seed(0)
rn = lambda *s: torch.randn(*s, device=dev, generator=g)
x, res = rn(1, H).to(dt), rn(1, H).to(dt)
w_o, w_qkv = (rn(H, H) / 64).to(dt), (rn(H, 6144) / 64).to(dt)
h = ts.splitk_add(x, w_o, 8, "o", res)
ones = torch.ones(H, device=dev, dtype=dt)
sc = RowScale(h.ssq, 1e-6, H)
a = ts.splitk_partials(h.h, w_qkv, 8, "qkv", scale=sc).sum(0)
normed = rms_norm(h.h, ones, 1e-6)
b = ts.splitk_partials(normed, w_qkv, 8, "qkv").sum(0)
print("qkv scaled vs norm+gemm: max abs", (a - b).abs().max().item(), "ref max", b.abs().max().item())
gu = (3 * rn(1, 2 * I)).to(dt)
rstd = torch.rsqrt(h.h.float().pow(2).mean(1, keepdim=True) + 1e-6)
ssc, ref = silu_mul(gu, I, sc), silu_mul((gu.float() * rstd).to(dt), I)
print("silu_mul scaled vs silu_mul(round(gu*r)): max abs", (ssc.float() - ref.float()).abs().max().item(),
      "equal frac", (ssc == ref).float().mean().item())
torch.cuda.synchronize()


def t(fn, n=300):
    for _ in range(20):
        fn()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return 1e3 * s.elapsed_time(e) / n


print("us/launch qkv", round(t(lambda: ts.splitk_partials(normed, w_qkv, 8, "qkv")), 1),
      "qkv scaled", round(t(lambda: ts.splitk_partials(h.h, w_qkv, 8, "qkv", scale=sc)), 1),
      "rms_norm", round(t(lambda: rms_norm(h.h, ones, 1e-6)), 1),
      "silu_mul", round(t(lambda: silu_mul(gu, I)), 1),
      "silu_mul scaled", round(t(lambda: silu_mul(gu, I, sc)), 1))
print("OK")
