"""Decode GEMMs of the Qwen3-8B shape at one row as S-way batched GEMMs over K slices (issue #6).

    python benchmarks/gemm_splitk.py [--out FILE]

cuBLAS serves o_proj (4096 x 4096) at one row with 64 CTAs: ~13 us, ~60% of the DRAM rate; an L2 prefetch of its
weights during attention saved only ~1 us (``l2_prefetch.py``): the kernel is short of parallelism, not of
bandwidth. Viewing the transposed weight [K, N] as [S, K/S, N] (no copy) and running ``torch.bmm`` of the S input
slices gives S x the CTAs; the S partial outputs (fp32 with ``out_dtype``) would be summed by the kernel that
consumes the GEMM's output. Per shape: us per GEMM (36 distinct weights per CUDA graph, so every read is cold) for
the plain ``mm``, and ``bmm`` over S slices with bf16 and fp32 partials (without the sum), and the sum alone.
"""

# ruff: noqa: B023  (the closures below are captured into a graph at once, inside their loop iteration)
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from l2_prefetch import LAYERS, SHAPES, graph_ms  # noqa: E402
from step_latency import copy_bandwidth, result_meta  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--out", default="benchmarks/results/gemm_splitk.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, DRAM (copy traffic) {bw / 1e12:.2f} TB/s", flush=True)
    rows: list[dict] = []
    print(f"{'gemm':8} {'M':>2} {'variant':16} {'us':>7} {'%DRAM':>6} {'max rel err':>11}")
    for name, (k, n) in SHAPES.items():
        ws = [torch.randn(k, n, dtype=torch.bfloat16, device=dev) / k**0.5 for _ in range(LAYERS)]
        floor_us = 1e6 * k * n * 2 / bw
        for m in args.rows:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            ref = x.float() @ ws[0].float()

            def report(variant: str, fn, out) -> None:  # type: ignore[no-untyped-def]
                us = 1e3 * graph_ms(fn) / LAYERS
                err = (
                    ((out.float() - ref).abs().max() / ref.abs().max()).item()
                    if out is not None
                    else float("nan")
                )
                rows.append({"gemm": name, "M": m, "variant": variant, "us": round(us, 2),
                             "pct_dram": round(100 * floor_us / us, 1), "max_rel_err": err})  # fmt: skip
                print(
                    f"{name:8} {m:>2} {variant:16} {us:>7.2f} {100 * floor_us / us:>6.1f} {err:>11.1e}",
                    flush=True,
                )

            report("mm", lambda: [torch.mm(x, w) for w in ws], torch.mm(x, ws[0]))
            for s in args.splits:
                if k % s:
                    continue
                xs = x.view(m, s, k // s).transpose(0, 1)  # [S, M, K/S]
                w3 = [w.view(s, k // s, n) for w in ws]
                report(
                    f"bmm{s} bf16",
                    lambda: [torch.bmm(xs, w) for w in w3],
                    torch.bmm(xs, w3[0]).float().sum(0),
                )
                try:
                    p = torch.bmm(xs, w3[0], out_dtype=torch.float32)
                except (RuntimeError, TypeError) as e:
                    print(f"{name:8} {m:>2} bmm{s} fp32: {type(e).__name__}: {str(e)[:80]}")
                    continue
                report(
                    f"bmm{s} fp32", lambda: [torch.bmm(xs, w, out_dtype=torch.float32) for w in w3], p.sum(0)
                )
                report(f"sum{s} (alone)", lambda: [p.sum(0) for _ in ws], None)
        ws.clear()
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result_meta(), "copy_traffic_Bps": bw, "rows": rows}, indent=2))  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
