"""GPU check (H200): rope_store_paged_attention == rope_store + paged_attention on CUDA (caches bit for bit, output
at dtype tolerance), for the Qwen3-8B and SmolLM2 head shapes, decode / verify, with split-K partials or not."""
import torch
from specserve.layers import triton_attention as ta
from specserve.layers.triton_fused import rope_store
from specserve.layers.rotary import RotaryEmbedding

dev = "cuda"
torch.manual_seed(0)
rows = []
ok_all = True
for name, h, hk, d, qkn, S, dtype in [("8b", 32, 8, 128, True, 8, torch.bfloat16), ("8b-fp32", 32, 8, 128, True, 8, torch.float32),
                                     ("smollm2", 9, 3, 64, False, 1, torch.bfloat16), ("smollm2-split3", 9, 3, 64, False, 3, torch.bfloat16)]:
    for b, ql, ctx, causal in [(1, 1, 150, True), (1, 16, 150, True), (4, 1, 900, True), (8, 16, 300, True), (2, 16, 60, False), (1, 1, 3000, True)]:
        bs = 16
        nblk_per = (ctx + ql) // bs + 2
        nblocks = b * nblk_per + 4
        kc = torch.randn(nblocks, bs, hk, d, device=dev).to(dtype)
        vc = torch.randn(nblocks, bs, hk, d, device=dev).to(dtype)
        perm = torch.randperm(nblocks, device=dev)[: b * nblk_per].view(b, nblk_per).int()
        seq = torch.full((b,), ctx + ql, device=dev, dtype=torch.int32)
        qsl = torch.arange(b + 1, device=dev, dtype=torch.int32) * ql
        t = b * ql
        pos = (torch.arange(ql, device=dev) + ctx).repeat(b)
        bi = torch.arange(b, device=dev).repeat_interleave(ql)
        slots = (perm[bi, pos // bs].long() * bs + pos % bs)
        rope = RotaryEmbedding(d, 8192, 1e6, None)
        cos, sin = rope.cos.to(dev), rope.sin.to(dev)
        W = (h + 2 * hk) * d
        parts = torch.randn(S, t, W, device=dev) if S > 1 else None
        qkv = torch.randn(t, W, device=dev).to(dtype) if S == 1 else torch.empty(1, device=dev, dtype=dtype).expand(t, W)
        qw = (torch.rand(d, device=dev) + 0.5).to(dtype) if qkn else None
        kw = (torch.rand(d, device=dev) + 0.5).to(dtype) if qkn else None
        inp = ta.RopeStoreInputs(qkv, parts, pos, cos, sin, qw, kw, 1e-6, slots)
        meta = (qsl, seq, perm)
        kr, vr = kc.clone(), vc.clone()
        q = rope_store(qkv, pos, cos, sin, qw, kw, 1e-6, kr, vr, slots, h, hk, d, parts)
        ref = ta.paged_attention(q, kr, vr, *meta, causal=causal, max_query_len=ql, max_seq_len=8192)
        kf, vf = kc.clone(), vc.clone()
        out = ta.rope_store_paged_attention(inp, h, kf, vf, *meta, causal=causal, max_query_len=ql, max_seq_len=8192)
        torch.cuda.synchronize()
        cache_eq = torch.equal(kf, kr) and torch.equal(vf, vr)
        diff = (out.float() - ref.float()).abs().max().item()
        neq = (out != ref).float().mean().item()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        ok = cache_eq and diff <= tol
        ok_all &= ok
        print(f"{name:15s} b={b} q={ql:2d} ctx={ctx:4d} causal={causal}: caches equal {cache_eq}, out max|diff| {diff:.2e} (frac != {neq:.4f}) {'OK' if ok else 'FAIL'}", flush=True)
print("ALL OK" if ok_all else "SOME FAILED")
