"""One-row variants of the Triton split-K GEMM (specserve/layers/triton_splitk.py) on the Qwen3-8B projections
(issue #6, session 13).

    python benchmarks/triton_gemv_variants.py [--variants "" acc2d acc2d,preload] [--out FILE]

``SPECSERVE_TRITON_GEMM_ROW`` variants of the CUDA-core path: ``""`` reduces each [BLOCK_K, BLOCK_N] product over K
at every step; ``acc2d`` accumulates elementwise and reduces once at the end; ``preload`` reads the first weight
tile before the PDL wait. Per projection (8-way split; gate_up with the SiLU-mul, unsplit), variant and tile: us per
layer in one CUDA graph of 36 distinct weights, PDL off; then, for the best tile of each variant, the chain of each
GEMM + the add + RMSNorm that sums its partials (gate_up: alone) with PDL on, beside cuBLAS's chain.
"""

# ruff: noqa: B023  (the closures below are captured into a graph at once, inside their loop iteration)
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from l2_prefetch import LAYERS, graph_ms  # noqa: E402
from step_latency import copy_bandwidth, result_meta  # noqa: E402
from triton_gemm import SHAPES, SPLITS_DEFAULT, run_cublas, run_triton  # noqa: E402

from specserve.layers.triton_fused import fused_add_rms_norm_partials  # noqa: E402

TILES = [(128, 32, 4, 4), (256, 32, 4, 4), (128, 64, 3, 4), (64, 64, 4, 4), (128, 16, 6, 4), (256, 16, 6, 8)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", default=["", "acc2d", "acc2d,preload", "preload"])
    ap.add_argument("--out", default="benchmarks/results/triton_gemv_variants.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, DRAM (copy traffic) {bw / 1e12:.2f} TB/s", flush=True)
    rows: list[dict] = []
    for name, (k, n) in SHAPES.items():
        ws = [torch.randn(k, n, dtype=torch.bfloat16, device=dev) / k**0.5 for _ in range(LAYERS)]
        floor_us = 1e6 * k * n * 2 / bw
        x = torch.randn(1, k, dtype=torch.bfloat16, device=dev)
        s = SPLITS_DEFAULT[name]
        hidden = n
        res = torch.randn(1, hidden, dtype=torch.bfloat16, device=dev)
        nw = torch.ones(hidden, dtype=torch.bfloat16, device=dev)

        def consume(p: torch.Tensor) -> None:
            if name != "gate_up":
                fused_add_rms_norm_partials(p, res, nw, 1e-6)

        os.environ["SPECSERVE_PDL"] = "0"
        cub = 1e3 * graph_ms(lambda: [run_cublas(name, x, w) for w in ws]) / LAYERS
        cub_chain = 1e3 * graph_ms(lambda: [consume(run_cublas(name, x, w)) for w in ws]) / LAYERS
        print(
            f"{name:8} cublas {cub:8.2f} us ({100 * floor_us / cub:5.1f}% DRAM); chain {cub_chain:8.2f} us",
            flush=True,
        )
        rows.append({"proj": name, "variant": "cublas", "us": round(cub, 2), "chain_us": round(cub_chain, 2)})
        for variant in args.variants:
            os.environ["SPECSERVE_TRITON_GEMM_ROW"] = variant
            os.environ["SPECSERVE_PDL"] = "0"
            best: tuple[float, tuple[int, ...]] | None = None
            for tile in TILES:
                if name != "gate_up" and (k // s) % tile[1]:
                    continue
                os.environ["SPECSERVE_TRITON_GEMM_TILES"] = f"{name}@1=" + ":".join(map(str, tile))
                try:
                    out = run_triton(name, x, ws[0], s)
                    us = 1e3 * graph_ms(lambda: [run_triton(name, x, w, s) for w in ws]) / LAYERS
                except Exception as e:  # noqa: BLE001  (a tile that does not compile: reported, the sweep goes on)
                    print(f"{name} {variant!r} {tile}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                ref = run_cublas(name, x, ws[0])
                got, want = (out.float(), ref.float()) if name == "gate_up" else (out.sum(0), ref.sum(0))
                err = ((got - want).abs().max() / want.abs().max()).item()
                print(f"{name:8} {variant or 'reduce':14} {str(tile):18} {us:8.2f} us {100 * floor_us / us:5.1f}% DRAM"
                      f"  err {err:.1e}", flush=True)  # fmt: skip
                rows.append({"proj": name, "variant": variant or "reduce", "tile": tile, "us": round(us, 2),
                             "pct_dram": round(100 * floor_us / us, 1), "max_rel_err_vs_cublas": err})  # fmt: skip
                if best is None or us < best[0]:
                    best = (us, tile)
            if best is None:
                continue
            os.environ["SPECSERVE_TRITON_GEMM_TILES"] = f"{name}@1=" + ":".join(map(str, best[1]))
            os.environ["SPECSERVE_PDL"] = "1"
            ch = 1e3 * graph_ms(lambda: [consume(run_triton(name, x, w, s)) for w in ws]) / LAYERS
            print(f"{name:8} {variant or 'reduce':14} best {best[1]} {best[0]:.2f} us; chain PDL on {ch:8.2f} us "
                  f"(cuBLAS chain {cub_chain:.2f})", flush=True)  # fmt: skip
            rows.append({"proj": name, "variant": (variant or "reduce") + " chain pdl", "tile": best[1],
                         "us": round(best[0], 2), "chain_us": round(ch, 2)})  # fmt: skip
        ws.clear()
        torch.cuda.empty_cache()
    for v in ("SPECSERVE_TRITON_GEMM_TILES", "SPECSERVE_PDL", "SPECSERVE_TRITON_GEMM_ROW"):
        os.environ.pop(v, None)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({**result_meta(), "copy_traffic_Bps": bw, "rows": rows}, indent=2))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
