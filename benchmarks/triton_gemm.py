"""The Triton split-K decode GEMMs (specserve/layers/triton_splitk.py) vs the cuBLAS path, per Qwen3-8B projection,
and what programmatic dependent launch buys between a GEMM and the small kernel after it (issue #6, session 13).

    python benchmarks/triton_gemm.py [--rows 1 16] [--quick] [--out FILE] [--best-env FILE]
        [--tiles1 BN:BK:stages:warps ...] [--tiles16 ...] [--splits qkv=4/8/16,o=8/16,down=8/16] [--lean]

Per projection (qkv 4096->6144, o 4096->4096, gate_up 4096->2x12288 with the SiLU-mul, down 12288->4096) and row
count, us per layer in one CUDA graph of 36 distinct weights (cold reads, as in a decode step):
  * ``cublas``: the engine's path before this session: a 4-way ``torch.bmm`` over K slices with fp32 partials
    (gate_up: ``torch.mm`` + the ``silu_mul`` kernel);
  * ``triton S BN:BK:stages:warps``: the Triton kernel, PDL off (gate_up split S ways too with ``--splits
    gate_up=1/2/4``: the SiLU-mul after the last K slice of each column block);
  * ``chain``: each GEMM followed by the add + RMSNorm kernel that sums its partials (the engine's consumer of o /
    down; for qkv a stand-in of ``rope_store``; gate_up: none), cuBLAS vs the best Triton tile with PDL off and
    on (``SPECSERVE_PDL``).
``--chain-only``: the engine's default tiles and splits, no sweep.
Each result is checked against fp32 math. ``--best-env`` writes the fastest tile and split per projection as
``SPECSERVE_TRITON_GEMM_TILES`` / ``SPECSERVE_SPLIT_GEMM_BEST`` shell assignments (for the engine runs after
it; the rows-16 tile is the best one at the split that was fastest at one row).
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

import specserve.layers.triton_splitk as ts  # noqa: E402
from specserve.layers.linear import DEFAULT_SPLIT_GEMM_TRITON  # noqa: E402
from specserve.layers.triton_fused import fused_add_rms_norm_partials, silu_mul  # noqa: E402

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}
SPLITS = {"qkv": (2, 4, 8), "o": (4, 8, 16), "down": (4, 8, 16), "gate_up": (1,)}
TILES_1 = [(128, 32, 4, 4), (128, 64, 3, 4), (256, 32, 4, 4), (64, 64, 4, 4)]
TILES_16 = [(64, 64, 4, 4), (128, 64, 3, 4), (64, 128, 3, 4), (128, 128, 3, 8)]
# the engine's splits with the Triton GEMMs (gate_up is never split)
SPLITS_DEFAULT = {
    **{p.split("=")[0]: int(p.split("=")[1]) for p in DEFAULT_SPLIT_GEMM_TRITON.split(",")},
    "gate_up": 1,
}
GATE_UP_1 = [(64, 32, 4, 4), (32, 64, 4, 4), (64, 64, 3, 4), (128, 32, 4, 4)]


def run_triton(name: str, x: torch.Tensor, w: torch.Tensor, s: int) -> torch.Tensor:
    if name == "gate_up":
        return ts.gate_up_silu(x, w, w.shape[1] // 2, splits=s)
    return ts.splitk_partials(x, w, s, name)


def run_cublas(name: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if name == "gate_up":
        return silu_mul(x @ w, w.shape[1] // 2)
    k, n = w.shape
    return torch.bmm(
        x.view(x.shape[0], 4, k // 4).transpose(0, 1), w.view(4, k // 4, n), out_dtype=torch.float32
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--quick", action="store_true", help="first tile and split of each list only")
    ap.add_argument("--out", default="benchmarks/results/triton_gemm.json")
    ap.add_argument("--best-env", default=None)
    ap.add_argument(
        "--chain-only", action="store_true", help="the engine's default tiles: no sweep, only chains"
    )
    ap.add_argument("--tiles1", nargs="*", default=[], help="more one-row tiles to sweep: BN:BK:stages:warps")
    ap.add_argument("--gate-up-tiles1", nargs="*", default=[], help="more one-row gate_up tiles")
    ap.add_argument(
        "--tiles16", nargs="*", default=[], help="more 2-16-row tiles to sweep: BN:BK:stages:warps"
    )
    ap.add_argument(
        "--splits",
        default="",
        help="split counts to sweep instead of the defaults: qkv=2/4/8,o=4/8,down=8/16",
    )
    ap.add_argument("--lean", action="store_true", help="2-16 rows: only the split of the one-row best")
    args = ap.parse_args()
    tiles_1 = TILES_1 + [tuple(int(v) for v in t.split(":")) for t in args.tiles1]
    tiles_16 = TILES_16 + [tuple(int(v) for v in t.split(":")) for t in args.tiles16]
    sweep_splits = dict(SPLITS)
    for part in filter(None, args.splits.split(",")):
        nm, _, vals = part.partition("=")
        sweep_splits[nm] = tuple(int(v) for v in vals.split("/"))
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, DRAM (copy traffic) {bw / 1e12:.2f} TB/s", flush=True)
    rows: list[dict] = []
    best: dict[tuple[str, int], tuple[float, int, tuple[int, ...]]] = {}  # 16 rows: with the 1-row best S
    timed: dict[tuple[str, int, int, tuple[int, ...]], float] = {}
    for name, (k, n) in SHAPES.items():
        ws = [torch.randn(k, n, dtype=torch.bfloat16, device=dev) / k**0.5 for _ in range(LAYERS)]
        floor_us = 1e6 * k * n * 2 / bw
        for m in args.rows:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            full = x.float() @ ws[0].float()
            if name == "gate_up":
                g, u = full.split(n // 2, -1)
                ref = torch.nn.functional.silu(g) * u
            else:
                ref = full

            def report(label: str, fn, out: torch.Tensor, extra: dict | None = None) -> float:  # type: ignore[no-untyped-def]
                us = 1e3 * graph_ms(fn) / LAYERS
                got = out.float() if name == "gate_up" else out.sum(0)
                err = ((got - ref).abs().max() / ref.abs().max()).item()
                row = {"proj": name, "M": m, "variant": label, "us": round(us, 2),
                       "pct_dram": round(100 * floor_us / us, 1), "max_rel_err": err, **(extra or {})}  # fmt: skip
                rows.append(row)
                print(f"{name:8} M={m:<3} {label:40} {us:8.2f} us {100 * floor_us / us:6.1f}% DRAM  err {err:.1e}",
                      flush=True)  # fmt: skip
                return us

            report("cublas", lambda: [run_cublas(name, x, w) for w in ws], run_cublas(name, x, ws[0]))
            os.environ["SPECSERVE_PDL"] = "0"
            cls = 1 if m == 1 else 16
            if args.chain_only:  # the engine's tiles and splits
                os.environ.pop("SPECSERVE_TRITON_GEMM_TILES", None)
                t = ts.tile_for(
                    name, m, "kn", dev, (k, n // 2 if name == "gate_up" else n, SPLITS_DEFAULT[name])
                )
                s = SPLITS_DEFAULT[name]
                tile = (t.block_n, t.block_k, t.stages, t.warps)
                best[(name, cls)] = (report(f"triton S={s} " + ":".join(map(str, tile)),
                                            lambda: [run_triton(name, x, w, s) for w in ws],
                                            run_triton(name, x, ws[0], s)), s, tile)  # fmt: skip
            gate_up_1 = GATE_UP_1 + [tuple(int(v) for v in t.split(":")) for t in args.gate_up_tiles1]
            tiles = gate_up_1 if (name == "gate_up" and m == 1) else tiles_1 if m == 1 else tiles_16
            splits = sweep_splits[name]
            if args.lean and cls == 16 and (name, 1) in best:
                splits = (best[(name, 1)][1],)  # the split of the one-row best (one split serves all rows)
            if args.quick:
                tiles, splits = tiles[:1], splits[:1]
            for s in [] if args.chain_only else splits:
                for tile in tiles:
                    spec = f"{name}@{cls}=" + ":".join(map(str, tile))
                    os.environ["SPECSERVE_TRITON_GEMM_TILES"] = spec
                    try:
                        if not ts.fits(name, k, n // 2 if name == "gate_up" else n, s):
                            continue
                        out = run_triton(name, x, ws[0], s)
                        us = report(f"triton S={s} " + ":".join(map(str, tile)),
                                    lambda: [run_triton(name, x, w, s) for w in ws], out)  # fmt: skip
                        timed[(name, cls, s, tile)] = us
                        s_best = best.get((name, 1), (0.0, s))[1] if cls == 16 else s  # one S for all rows
                        if s == s_best and us < best.get((name, cls), (float("inf"),))[0]:
                            best[(name, cls)] = (us, s, tile)
                    except Exception as e:  # noqa: BLE001  (a tile that does not compile: reported, the sweep goes on)
                        print(f"{name} M={m} S={s} {tile}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            # chain: GEMM + its consumer, PDL off / on
            if (name, cls) not in best:
                continue
            _, s, tile = best[(name, cls)]
            hidden = n
            res = torch.randn(m, hidden, dtype=torch.bfloat16, device=dev) if name != "gate_up" else None
            nw = torch.ones(hidden, dtype=torch.bfloat16, device=dev) if name != "gate_up" else None

            def consume(p: torch.Tensor) -> None:
                if name in ("o", "down", "qkv"):
                    fused_add_rms_norm_partials(p, res, nw, 1e-6)

            def cub_chain() -> None:
                for w in ws:
                    consume(run_cublas(name, x, w))

            os.environ["SPECSERVE_PDL"] = "0"
            c_us = 1e3 * graph_ms(cub_chain) / LAYERS
            print(
                f"{name:8} M={m:<3} chain cublas + consumer (PDL off)            {c_us:8.2f} us", flush=True
            )
            chain = {"proj": name, "M": m, "variant": "chain", "cublas_us": round(c_us, 2)}
            os.environ["SPECSERVE_TRITON_GEMM_TILES"] = f"{name}@{cls}=" + ":".join(map(str, tile))
            for pdl in ("0", "1"):
                os.environ["SPECSERVE_PDL"] = pdl

                def tri_chain() -> None:
                    for w in ws:
                        consume(run_triton(name, x, w, s))

                t_us = 1e3 * graph_ms(tri_chain) / LAYERS
                chain[f"triton_pdl{pdl}_us"] = round(t_us, 2)
                print(f"{name:8} M={m:<3} chain triton S={s} {tile} PDL={pdl} {t_us:8.2f} us", flush=True)
            rows.append(chain)
        ws.clear()
        torch.cuda.empty_cache()
    os.environ.pop("SPECSERVE_TRITON_GEMM_TILES", None)
    os.environ.pop("SPECSERVE_PDL", None)
    print("\nbest per projection (us, S, BN:BK:stages:warps):")
    for key, (us, s, tile) in sorted(best.items()):
        print(f"  {key[0]}@{key[1]}: {us:.2f} us S={s} {tile}")
    if args.best_env:
        tiles = ",".join(f"{nm}@{c}=" + ":".join(map(str, t)) for (nm, c), (_, _, t) in sorted(best.items()))
        split = ",".join(
            f"{nm}={best[(nm, 1)][1]}"
            for nm in ("qkv", "o", "down", "gate_up")
            if (nm, 1) in best and (nm != "gate_up" or best[(nm, 1)][1] > 1)
        )
        Path(args.best_env).write_text(
            f"export SPECSERVE_TRITON_GEMM_TILES='{tiles}'\nexport SPECSERVE_SPLIT_GEMM_BEST='{split}'\n"
        )
        print(f"wrote {args.best_env}")
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({**result_meta(), "copy_traffic_Bps": bw, "rows": rows}, indent=2))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
