"""CPU decode GEMMs: nn.Linear's ``x @ W.T`` vs ``W @ x.T`` (specserve.layers.linear.linear_rows) on weights that do
not fit in the cache.

    python benchmarks/cpu_gemm_orders.py [--layers 30] [--hidden 576] [--intermediate 1536] [--rows 1 2 5 16 64 128]
        [--reps 3] [--dtype float32|bfloat16] [--out FILE]

One pass = every layer's qkv / o / gate_up / down projection (SmolLM2-135M's shapes by default, float32: 425 MB, far
over the L3) for a batch of ``rows`` rows, as a decode step (1 row), a speculative verify (K+1 rows) or a drafter
block would run them; plus the LM head alone (vocab 49152). Prints ms per pass and the weight-read rate per order,
the read bandwidth of the machine (a ``sum`` over 400 MB), and writes JSON with the command, git revision and machine.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from throughput import run_info, save_result  # benchmarks/ is on sys.path when this runs as a script

from specserve.layers.linear import linear_rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--kv", type=int, default=192)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 16, 64, 128])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    h, i = args.hidden, args.intermediate
    shapes = [(h + 2 * args.kv, h), (h, h), (2 * i, h), (h, i)]
    dt = getattr(torch, args.dtype)
    weights = [[torch.randn(*s).to(dt) for s in shapes] for _ in range(args.layers)]
    head = torch.randn(args.vocab, h).to(dt)
    layer_bytes = sum(w.numel() * w.element_size() for ws in weights for w in ws)

    big = torch.randn(100_000_000)
    big.sum()
    t = time.perf_counter()
    for _ in range(3):
        big.sum()
    read_gbs = 3 * big.numel() * 4 / (time.perf_counter() - t) / 1e9
    del big

    orders = {"x @ W.T (nn.Linear)": lambda x, w: F.linear(x, w), "W @ x.T (linear_rows)": linear_rows}

    def timed(fn, xs, mats) -> float:
        def one() -> None:
            for ws in mats:
                for x, w in zip(xs, ws):
                    fn(x, w)

        one()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            one()
        return (time.perf_counter() - t0) / args.reps * 1e3

    rows_out = []
    for r in args.rows:
        xs = [torch.randn(r, s[1]).to(dt) for s in shapes]
        for name, fn in orders.items():
            ms = timed(fn, xs, weights)
            head_ms = timed(fn, [torch.randn(r, h).to(dt)], [[head]])
            row = {
                "rows": r,
                "order": name,
                "layers_ms": round(ms, 2),
                "layers_gb_per_s": round(layer_bytes / ms / 1e6, 1),
                "lm_head_ms": round(head_ms, 2),
            }
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    print(f"\nweights: {layer_bytes / 1e6:.0f} MB of layers + {head.numel() * head.element_size() / 1e6:.0f} MB LM head ({args.dtype}); "
          f"read bandwidth (sum): {read_gbs:.1f} GB/s; torch threads {torch.get_num_threads()}")  # fmt: skip
    print(f"{'rows':>5} {'order':24} {'layers ms':>10} {'GB/s':>6} {'LM head ms':>11}")
    for row in rows_out:
        print(
            f"{row['rows']:>5} {row['order']:24} {row['layers_ms']:>10.1f} {row['layers_gb_per_s']:>6.1f} "
            f"{row['lm_head_ms']:>11.2f}"
        )
    result = {
        **run_info(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": args.dtype,
        "read_gb_per_s": round(read_gbs, 1),
        "layer_weight_bytes": layer_bytes,
        "rows": rows_out,
    }
    save_result(result, args.out, "cpu_gemm_orders")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
