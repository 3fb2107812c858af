"""Can a Triton split-K GEMM with the SiLU-mul folded into its input replace SiLU-mul + cuBLAS's split down_proj?
(issue #6, session 12: the next step after the split-K GEMMs; a microbenchmark, not wired into the engine)

    python benchmarks/fused_down_gemm.py [--rows 1 4] [--out FILE]

The Qwen3-8B down projection at decode: gate_up [M, 2 x 12288] -> SiLU(gate) * up -> @ W [12288, 4096] (the engine's
transposed layout). Per config, us per layer (36 distinct weights per CUDA graph: cold reads) of
  * ``engine``: the engine's path since session 12: the ``silu_mul`` kernel, then a 4-way ``torch.bmm`` over K slices
    with fp32 partials (the next add + RMSNorm sums them);
  * ``triton BN,BK,S,stages,warps``: one kernel, grid (N / BN, S): each program takes K / S inputs, computes
    SiLU(gate) * up for them (rounded as the eager path rounds) and accumulates its [BK, BN] weight tiles on the CUDA
    cores, writing its fp32 partial (the same consumer would sum them);
  * ``triton ... nosilu``: the same kernel on a ready input: the GEMM's own streaming rate.
Each output is checked against fp32 math (max relative error).
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from l2_prefetch import LAYERS, graph_ms  # noqa: E402
from step_latency import copy_bandwidth, result_meta  # noqa: E402

from specserve.layers.triton_fused import _round, silu_mul  # noqa: E402

K_DOWN, N_DOWN = 12288, 4096


@triton.jit
def _silu_down_kernel(
    gu_ptr,
    w_ptr,
    out_ptr,
    M,
    stride_gu,
    stride_w,
    stride_os,
    stride_om,
    N: tl.constexpr,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_SPLIT: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    SILU: tl.constexpr,
    MODE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    rows = offs_m[:, None].to(tl.int64) * stride_gu
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_begin = pid_s * K_SPLIT
    for k0 in tl.range(k_begin, k_begin + K_SPLIT, BLOCK_K, num_stages=NUM_STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        g = tl.load(gu_ptr + rows + offs_k[None, :], mask=mask_m[:, None], other=0.0).to(tl.float32)
        if SILU:
            u = tl.load(gu_ptr + rows + K + offs_k[None, :], mask=mask_m[:, None], other=0.0).to(tl.float32)
            g = _round(_round(g / (1.0 + tl.exp(-g)), MODE) * u, MODE)
        w = tl.load(w_ptr + offs_k[:, None].to(tl.int64) * stride_w + offs_n[None, :]).to(tl.float32)
        acc += tl.sum(g[:, :, None] * w[None, :, :], axis=1)
    out = out_ptr + pid_s * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc, mask=mask_m[:, None])


def silu_down(
    gu: torch.Tensor, w: torch.Tensor, cfg: tuple[int, int, int, int, int], silu: bool = True
) -> torch.Tensor:
    """fp32 partials [S, M, N] of (SiLU(gate) * up) @ w (``silu``) or gu[:, :K] @ w."""
    bn, bk, s, stages, warps = cfg
    k, n = w.shape
    m = gu.shape[0]
    assert k % (s * bk) == 0 and n % bn == 0
    out = torch.empty(s, m, n, dtype=torch.float32, device=gu.device)
    _silu_down_kernel[(n // bn, s)](
        gu, w, out, m, gu.stride(0), w.stride(0), out.stride(0), out.stride(1),
        N=n, K=k, BLOCK_M=max(1, triton.next_power_of_2(m)), BLOCK_N=bn, BLOCK_K=bk, K_SPLIT=k // s,
        NUM_STAGES=stages, SILU=silu, MODE=1 if gu.dtype == torch.bfloat16 else 0, num_warps=warps,
    )  # fmt: skip
    return out


CONFIGS = [
    (128, 32, 8, 4, 4),
    (128, 64, 8, 3, 4),
    (128, 64, 8, 4, 4),
    (64, 64, 8, 4, 4),
    (128, 64, 16, 4, 4),
    (256, 32, 8, 4, 4),
    (128, 128, 8, 3, 8),
    (64, 128, 4, 3, 4),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--out", default="benchmarks/results/fused_down_gemm.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    floor_us = 1e6 * K_DOWN * N_DOWN * 2 / bw
    print(
        f"{torch.cuda.get_device_name()}, DRAM (copy traffic) {bw / 1e12:.2f} TB/s; down weights floor {floor_us:.2f} us"
    )
    ws = [torch.randn(K_DOWN, N_DOWN, dtype=torch.bfloat16, device=dev) / K_DOWN**0.5 for _ in range(LAYERS)]
    rows: list[dict] = []
    for m in args.rows:
        gu = torch.randn(m, 2 * K_DOWN, dtype=torch.bfloat16, device=dev)
        act = silu_mul(gu, K_DOWN)
        ref = act.float() @ ws[0].float()
        ref_plain = gu[:, :K_DOWN].float() @ ws[0].float()

        def report(name: str, fn, out: torch.Tensor, r: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
            us = 1e3 * graph_ms(fn) / LAYERS
            err = ((out - r).abs().max() / r.abs().max()).item()
            rows.append({"M": m, "variant": name, "us": round(us, 2), "pct_dram": round(100 * floor_us / us, 1),
                         "max_rel_err": err})  # fmt: skip
            print(f"M={m} {name:34} {us:8.2f} us {100 * floor_us / us:6.1f}% DRAM  err {err:.1e}", flush=True)

        def engine() -> None:
            for w in ws:
                a = silu_mul(gu, K_DOWN)
                torch.bmm(a.view(m, 4, K_DOWN // 4).transpose(0, 1), w.view(4, K_DOWN // 4, N_DOWN),
                          out_dtype=torch.float32)  # fmt: skip

        a0 = silu_mul(gu, K_DOWN)
        p0 = torch.bmm(a0.view(m, 4, K_DOWN // 4).transpose(0, 1), ws[0].view(4, K_DOWN // 4, N_DOWN),
                       out_dtype=torch.float32)  # fmt: skip
        report("engine: silu_mul + bmm4 fp32", engine, p0.sum(0), ref)
        for cfg in CONFIGS:
            try:
                out = silu_down(gu, ws[0], cfg).sum(0)
                report(f"triton {cfg}", lambda: [silu_down(gu, w, cfg) for w in ws], out, ref)
                outp = silu_down(gu, ws[0], cfg, silu=False).sum(0)
                report(
                    f"triton {cfg} nosilu",
                    lambda: [silu_down(gu, w, cfg, False) for w in ws],
                    outp,
                    ref_plain,
                )
            except Exception as e:  # noqa: BLE001  (a config that does not compile: reported, the sweep goes on)
                print(f"M={m} triton {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({**result_meta(), "copy_traffic_Bps": bw,
                                    "down_floor_us": floor_us, "rows": rows}, indent=2))  # fmt: skip
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
