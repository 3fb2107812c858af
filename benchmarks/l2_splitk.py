"""Does a weight already in L2 make the one-row Triton split-K GEMM faster? (issue #6, session 34)

    python benchmarks/l2_splitk.py [--out FILE]

Session 12 (``l2_prefetch.py``) found prefetching a GEMM's weights into L2 during the small kernels before it
useless for cuBLAS's one-row o_proj (12.9 -> 11.85 us with all of it prefetched: cuBLAS runs it on too few CTAs to
profit). The decode step's qkv / o_proj / down_proj have since become the Triton split-K GEMMs
(``specserve/layers/triton_splitk.py``, 8 K slices: 4-8x the CTAs), and the 8B-shaped step's remaining 1.16x over
the weight-read floor is the ~15 us a layer of small kernels during which the DRAM idles (session 34's profile). If
the split-K GEMM reads an L2-resident weight much faster than a cold one, a prefetch issued while those kernels run
would shorten it. Per projection of the Qwen3-8B shape, one row, bf16, [K, N] weights as the engine stores them,
microseconds per GEMM from a CUDA graph of 36 GEMMs:

* ``cold``: 36 distinct weights (every GEMM reads DRAM), the engine's case without prefetch;
* ``warm``: one weight 36 times (in L2 where it fits: o_proj's 33.5 MB does, qkv's 50 MB and down's 101 MB do not);
* ``win``: cold, each GEMM behind an idle window of W us (a one-SM spin kernel standing in for the small kernels),
  minus the windows alone; ``win+pf F``: the same with a line prefetch (``prefetch.global.L2::evict_last``, 132
  programs, on a side stream joined before the GEMM) of the first fraction F of the weight during the window.

cuBLAS (``torch.mm``) beside it for the same cases.
"""

# ruff: noqa: B023  (the closures below run inside their loop iteration)
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from l2_prefetch import LAYERS, SHAPES, L2Prefetcher, cycles_per_us, graph_ms  # noqa: E402
from step_latency import result_meta  # noqa: E402

CASES = {"o": [10], "qkv": [3], "down": [3]}  # projection -> idle windows (us) before it in the decode step
FRACTIONS = [0.25, 0.5, 1.0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/l2_splitk.json")
    ap.add_argument("--splits", type=int, default=8)
    args = ap.parse_args()
    from specserve.layers.triton_splitk import splitk_partials

    dev = torch.device("cuda")
    cyc_us = cycles_per_us()
    pf = L2Prefetcher(dev, {"qkv": (0.0, 1), "o": (0.0, 1), "down": (0.0, 1)}, programs=132)
    pf.mode = 1
    rows = []
    for name, windows in CASES.items():
        k, n = SHAPES[name]
        ws = [torch.randn(k, n, dtype=torch.bfloat16, device=dev) * 0.02 for _ in range(LAYERS)]
        x = torch.randn(1, k, dtype=torch.bfloat16, device=dev)
        gemms = {
            "triton": lambda w: splitk_partials(x, w, args.splits, name),
            "cublas": lambda w: torch.mm(x, w),
        }
        for kind, gemm in gemms.items():
            row: dict = {"gemm": name, "kernel": kind, "MB": round(k * n * 2 / 1e6, 1)}
            row["cold_us"] = round(1e3 * graph_ms(lambda: [gemm(w) for w in ws]) / LAYERS, 2)
            row["warm_us"] = round(1e3 * graph_ms(lambda: [gemm(ws[0]) for _ in ws]) / LAYERS, 2)
            for win in windows:
                cyc = int(win * cyc_us)
                t_win = graph_ms(lambda: [torch.cuda._sleep(cyc) for _ in ws])

                def step(prefetch: bool) -> None:
                    for w in ws:
                        if prefetch:
                            pf(w, name)
                        torch.cuda._sleep(cyc)
                        pf.join()
                        gemm(w)

                pf.configure({})
                row[f"win{win}_us"] = round(1e3 * (graph_ms(lambda: step(False)) - t_win) / LAYERS, 2)
                for frac in FRACTIONS:
                    pf.configure({name: (frac, 1)})
                    row[f"win{win}+pf{frac}_us"] = round(
                        1e3 * (graph_ms(lambda: step(True)) - t_win) / LAYERS, 2
                    )
            rows.append(row)
            print(json.dumps(row), flush=True)
        ws.clear()
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result_meta(), "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
