"""L2 prefetch on the Qwen3-8B shape (issue #6): does prefetching a GEMM's weights during the small kernels before it
shorten the decode step?

    python benchmarks/l2_prefetch.py --config-dir .bench/qwen3-8b [--out FILE]

Part 1 (microbenchmark, transposed "kn" weights as the engine stores them, 36 distinct weights per GEMM so every
GEMM reads cold): per GEMM, one CUDA graph of 36 x [prefetch; idle window of T us (a 1-SM spin kernel standing in
for the small kernels); GEMM], minus the same graph's windows alone: the GEMM's effective time per fraction of its
weights prefetched, vs no prefetch. Part 2 (engine): the plain batch-1 decode step (ms per engine step, graphs) of
the 8B-shaped target with random weights, without prefetch kernels, then with them captured and their amounts
swept through the device-side configuration (no re-capture), against the weight-read floor of step_latency.py.
"""

# ruff: noqa: B023  (the closures below are captured into a graph at once, inside their loop iteration)
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_latency import copy_bandwidth, count_steps, read_bandwidth, read_weight_bytes  # noqa: E402

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}  # (K, N)
WINDOWS_US = {"qkv": [5], "o": [0, 13], "gate_up": [4], "down": [3]}
FRACTIONS = {
    "qkv": [(0.2, 1), (0.4, 1), (0.4, 2), (0.4, 4)],
    "o": [(0.5, 1), (1.0, 1)],
    "gate_up": [(0.05, 1), (0.1, 1)],
    "down": [(0.1, 1), (0.1, 2), (0.2, 2)],
}
PROGRAMS = [(1, 32), (1, 132), (2, 132), (2, 264)]  # (mode, programs)
LAYERS = 36


def graph_ms(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps


def cycles_per_us() -> float:
    def f() -> None:
        torch.cuda._sleep(200000)

    return 200000 / (graph_ms(f) * 1e3)


def micro(rows: list[dict]) -> None:
    from specserve.layers.l2_prefetch import GROUPS, L2Prefetcher

    dev = torch.device("cuda")
    cpu_us = cycles_per_us()
    print(f"spin kernel: {cpu_us:.0f} cycles per us", flush=True)
    pf = L2Prefetcher(dev, {g: (0.0, 1) for g in GROUPS})
    x = torch.randn(1, 12288, dtype=torch.bfloat16, device=dev)
    for name, (k, n) in SHAPES.items():
        ws = [torch.randn(k, n, dtype=torch.bfloat16, device=dev) for _ in range(LAYERS)]
        xs = x[:, :k]
        mb = k * n * 2 / 1e6
        for win in WINDOWS_US[name]:
            cyc = int(win * cpu_us)

            def windows() -> None:
                for _ in range(LAYERS):
                    if cyc:
                        torch.cuda._sleep(cyc)

            def base() -> None:
                for w in ws:
                    if cyc:
                        torch.cuda._sleep(cyc)
                    torch.mm(xs, w)

            def with_pf() -> None:
                for w in ws:
                    pf(w, name)  # side stream
                    if cyc:
                        torch.cuda._sleep(cyc)
                    pf.join()
                    torch.mm(xs, w)

            t_win = graph_ms(windows) if cyc else 0.0
            t_base = graph_ms(base)
            res = {
                "part": "micro",
                "gemm": name,
                "MB": round(mb, 1),
                "window_us": win,
                "gemm_us_no_prefetch": round(1e3 * (t_base - t_win) / LAYERS, 2),
            }
            for mode, progs in PROGRAMS:
                pf.mode, pf.programs = mode, progs
                pf.configure({})
                # prefetch kernels launched, nothing prefetched: the fork / join cost
                res[f"m{mode}p{progs}_empty"] = round(1e3 * (graph_ms(with_pf) - t_win) / LAYERS, 2)
                for frac, splits in FRACTIONS[name]:
                    pf.configure({name: (frac, splits)})
                    t = graph_ms(with_pf)
                    res[f"m{mode}p{progs}_pf_{frac}:{splits}"] = round(1e3 * (t - t_win) / LAYERS, 2)
            rows.append(res)
            print(json.dumps(res), flush=True)
        ws.clear()
        torch.cuda.empty_cache()


def step_ms(llm, steps: dict, prompt: list[int], reps: int = 3) -> float:  # type: ignore[no-untyped-def]
    from specserve import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    best = float("inf")
    for _ in range(reps):
        steps["n"] = 0
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], sp)
        best = min(best, 1e3 * (time.perf_counter() - t0) / max(1, steps["n"]))
    return best


def engine(config_dir: str, sweep: list[str], programs: list[str], rows: list[dict]) -> None:
    from specserve import LLM, SamplingParams
    from specserve.layers.l2_prefetch import GROUPS, parse_spec

    prompt = torch.randint(1000, 100000, (128,), generator=torch.Generator().manual_seed(0)).tolist()
    for captured in [False] + [True] * len(programs):
        if captured:
            os.environ["SPECSERVE_L2_PREFETCH"] = ",".join(f"{g}=0" for g in GROUPS)
            mode, _, progs = programs.pop(0).partition(":")
            os.environ["SPECSERVE_L2_PREFETCH_MODE"] = mode
            os.environ["SPECSERVE_L2_PREFETCH_PROGRAMS"] = progs
        else:
            os.environ.pop("SPECSERVE_L2_PREFETCH", None)
        llm = LLM(
            config_dir,
            load_format="dummy",
            dtype="bfloat16",
            device="cuda",
            max_model_len=2048,
            max_num_seqs=1,
            enable_prefix_caching=False,
            gpu_memory_utilization=0.5,
        )
        steps = count_steps(llm.engine)
        llm.generate(
            [{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        )
        model = llm.engine.runner.model
        ref = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=32))
        ref_ids = ref[0].outputs[0].token_ids
        for spec in sweep if captured else ["none"]:
            if captured:
                model.l2_prefetch.configure(parse_spec(spec))
                out = llm.generate(
                    [{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=32)
                )
                same = out[0].outputs[0].token_ids == ref_ids
            else:
                same = True
            ms = step_ms(llm, steps, prompt)
            progs = (
                os.environ["SPECSERVE_L2_PREFETCH_MODE"] + ":" + os.environ["SPECSERVE_L2_PREFETCH_PROGRAMS"]
                if captured
                else "-"
            )
            row = {"part": "engine", "prefetch_kernels": captured, "programs": progs, "spec": spec, "step_ms": round(ms, 3),
                   "same_tokens": same, "weight_bytes": read_weight_bytes(model)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        del llm, model
        gc.collect()
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument(
        "--sweep",
        nargs="+",
        default=["0", "o=1", "o=0.5", "o=1,qkv=0.3:2", "o=1,gate_up=0.05,down=0.1:2,qkv=0.3:2"],
    )
    ap.add_argument("--programs", nargs="+", default=["1:132"], help="MODE:PROGRAMS of the prefetch kernel")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows: list[dict] = []
    bw = copy_bandwidth()
    read_bw = read_bandwidth()
    dram = max(bw, read_bw)
    print(f"DRAM {dram / 1e12:.2f} TB/s (copy traffic {bw / 1e12:.2f}, reduction read {read_bw / 1e12:.2f})")
    if not args.skip_micro:
        micro(rows)
    engine(args.config_dir, args.sweep, list(args.programs), rows)
    floor_ms = 1e3 * rows[-1]["weight_bytes"] / dram
    print(f"\nweight-read floor {floor_ms:.3f} ms")
    print(f"{'prefetch':50} {'programs':>8} {'step ms':>8} {'x floor':>7} {'same':>5}")
    for r in rows:
        if r["part"] == "engine":
            r["x_floor"] = round(r["step_ms"] / floor_ms, 3)
            print(f"{r['spec']:50} {r['programs']:>8} {r['step_ms']:>8.3f} {r['x_floor']:>7.3f} "
                  f"{str(r['same_tokens']):>5}")  # fmt: skip
    try:
        rev = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:  # noqa: BLE001
        rev = "unknown"
    out = Path(args.out or "benchmarks/results/l2_prefetch.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "command": " ".join(["python"] + sys.argv),
                "git_revision": rev,
                "gpu": torch.cuda.get_device_name(),
                "dram_Bps": dram,
                "weight_read_floor_ms": floor_ms,
                "rows": rows,
            },
            indent=2,
        )  # fmt: skip
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
