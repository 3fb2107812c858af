#!/usr/bin/env python
"""What the in-graph sampler costs: sample_verify (the sampling graph of a random step) captured in a CUDA graph
and replayed, us per replay and kernels per call, per vocabulary / batch / rows per request, with and without the
seeded noise; beside it the greedy tail (greedy_verify) and the pieces of the random path.

    python benchmarks/sampling_profile.py [--vocab 49152 151936] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

import torch


def graph_us(fn, reps: int = 200) -> float:  # type: ignore[no-untyped-def]
    """us per replay of fn captured in a CUDA graph (after a warm-up call)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(10):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / reps


def kernels(fn) -> int:  # type: ignore[no-untyped-def]
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def kernel_table(fn, top: int = 40) -> str:  # type: ignore[no-untyped-def]
    """The CUDA kernels of one call, in launch order: name and us."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    return "\n".join(f"  {e.time_range.elapsed_us():7.1f} us  {e.name[:110]}" for e in evs[:top])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", nargs="+", type=int, default=[49152, 151936])
    ap.add_argument("--shapes", nargs="+", default=["1x1", "8x1", "1x8", "8x8", "1x16"], help="BxQ")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from specserve.layers.sampler import apply_sampling_constraints, static_sampling_tensors
    from specserve.spec.rejection import greedy_verify, sample_verify

    dev = torch.device("cuda")
    rows = []
    for vocab in args.vocab:
        for shape in args.shapes:
            b, q = map(int, shape.split("x"))
            g = torch.Generator(device=dev).manual_seed(0)
            logits = torch.randn(b * q, vocab, device=dev, generator=g).to(torch.bfloat16)
            ids = torch.randint(0, vocab, (b * q,), device=dev, generator=g)
            temp = torch.full((b,), 0.8, device=dev)
            top_k = torch.zeros(b, dtype=torch.int32, device=dev)
            top_p = torch.full((b,), 0.95, device=dev)
            min_p = torch.zeros(b, device=dev)
            nd = torch.full((b,), q - 1, dtype=torch.int32, device=dev)
            key = torch.arange(1, b + 1, dtype=torch.int32, device=dev)
            pos = torch.arange(b * q, device=dev) + 100
            packed = greedy_verify(logits, ids, b, q)

            def per_row(t: torch.Tensor) -> torch.Tensor:
                return t[:b, None].expand(b, q).reshape(-1)

            st = static_sampling_tensors(per_row(temp), per_row(top_k), per_row(top_p), per_row(min_p))
            fns = {
                "greedy_verify": lambda: greedy_verify(logits, ids, b, q),
                "sample_verify": lambda: sample_verify(
                    logits.float(), ids, temp, top_k, top_p, min_p, nd, b, q, packed
                ),
                "sample_verify + seeds": lambda: sample_verify(
                    logits.float(), ids, temp, top_k, top_p, min_p, nd, b, q, packed, seed_key=key, pos=pos
                ),
                "triton": lambda: sample_verify(
                    logits, ids, temp, top_k, top_p, min_p, nd, b, q, packed, seed_key=key, pos=pos
                ),
                "triton, top_p 1": lambda: sample_verify(
                    logits, ids, temp, top_k, top_p * 0 + 1, min_p, nd, b, q, packed, seed_key=key, pos=pos
                ),
                "triton, top_k 20": lambda: sample_verify(
                    logits, ids, temp, top_k + 20, top_p, min_p, nd, b, q, packed, seed_key=key, pos=pos
                ),
                "constraints": lambda: apply_sampling_constraints(logits.float(), st),
                "sort": lambda: logits.float().sort(dim=-1, descending=True),
                "softmax": lambda: logits.float().softmax(-1),
            }
            for name, fn in fns.items():
                os.environ["SPECSERVE_SAMPLER"] = "triton" if name.startswith("triton") else "torch"
                us = graph_us(fn)
                n = kernels(fn)
                rows.append({"vocab": vocab, "b": b, "q": q, "what": name, "us": round(us, 1), "kernels": n})
                print(f"V={vocab} b={b} q={q} {name}: {us:.1f} us, {n} kernels", flush=True)
                if (
                    name in ("sample_verify + seeds", "triton")
                    and vocab == args.vocab[0]
                    and b == 1
                    and q == 8
                ):
                    print(kernel_table(fn, 80), flush=True)
    if args.out:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.out, "w") as f:
            json.dump({"command": shlex.join(sys.argv), "git_revision": rev, "gpu": torch.cuda.get_device_name(),
                       "rows": rows}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
