#!/usr/bin/env python
"""What the in-graph sampler costs: sample_verify (the sampling graph of a random step) captured in a CUDA graph
and replayed, us per replay and kernels per call, per vocabulary / batch / rows per request, with and without the
seeded noise, in torch's form (sort + scan) and the sort-free Triton form (with and without its top-k / top-p
rounds); beside it the greedy tail (greedy_verify) and a sort; then a check that both forms give the same tokens
from the same draws (fp32 logits).

    python benchmarks/sampling_profile.py [--vocab 49152 151936] [--only SUBSTR ...] [--no-check] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_profile import graph_ms  # noqa: E402


def graph_us(fn, reps: int = 200) -> float:  # type: ignore[no-untyped-def]
    """us per replay of fn captured in a CUDA graph (decode_profile's timing)."""
    return graph_ms(fn, reps) * 1000


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
    ap.add_argument("--only", nargs="*", default=None, help="time only the rows whose name contains one of these")
    ap.add_argument("--no-check", action="store_true", help="skip the triton == torch form token check")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from specserve.layers.triton_sampling import sample_verify_triton
    from specserve.spec.rejection import greedy_verify, sample_verify

    dev = torch.device("cuda")
    rows: list = []  # type: ignore[type-arg]
    checks: list = []  # type: ignore[type-arg]
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

            tk20 = top_k + 20
            tp1 = top_p * 0 + 1

            def trit(tk: torch.Tensor, tp: torch.Tensor, searches: bool = True, seeds: bool = True):  # type: ignore[no-untyped-def]
                return lambda: sample_verify_triton(
                    logits, ids, temp, tk, tp, min_p, nd, b, q, packed, key if seeds else None,
                    pos if seeds else None, searches=searches,
                )  # fmt: skip

            fns = {
                "greedy_verify": lambda: greedy_verify(logits, ids, b, q),
                "torch: top_p 0.95": lambda: sample_verify(
                    logits.float(), ids, temp, top_k, top_p, min_p, nd, b, q, packed, use_triton=False
                ),
                "torch: top_p 0.95 + seeds": lambda: sample_verify(
                    logits.float(), ids, temp, top_k, top_p, min_p, nd, b, q, packed, seed_key=key, pos=pos,
                    use_triton=False,
                ),  # fmt: skip
                "torch: top_k 20, top_p 0.95": lambda: sample_verify(
                    logits.float(), ids, temp, tk20, top_p, min_p, nd, b, q, packed, use_triton=False
                ),
                "torch: T only": lambda: sample_verify(
                    logits.float(), ids, temp, top_k, tp1, min_p, nd, b, q, packed, use_triton=False
                ),
                "triton: top_p 0.95": trit(top_k, top_p, seeds=False),
                "triton: top_p 0.95 + seeds": trit(top_k, top_p),
                "triton: top_k 20, top_p 0.95": trit(tk20, top_p, seeds=False),
                "triton: top_k 20": trit(tk20, tp1, seeds=False),
                "triton: T only, searches launched": trit(top_k, tp1, seeds=False),
                "triton sort-free: T only": trit(top_k, tp1, searches=False, seeds=False),
                "sort": lambda: logits.float().sort(dim=-1, descending=True),
            }
            for name, fn in fns.items():
                if args.only is not None and not any(o in name for o in args.only):
                    continue
                us = graph_us(fn)
                n = kernels(fn)
                rows.append({"vocab": vocab, "b": b, "q": q, "what": name, "us": round(us, 1), "kernels": n})
                print(f"V={vocab} b={b} q={q} {name}: {us:.1f} us, {n} kernels", flush=True)
                if name == "triton: top_k 20, top_p 0.95" and vocab == args.vocab[0] and b == 1 and q == 8:
                    print(kernel_table(fn, 80), flush=True)
            # the same draws give the same tokens as the torch form (fp32 logits: bf16 rows tie at thresholds, where
            # the sort keeps an arbitrary subset and the thresholds all of the tied values)
            if args.no_check:
                continue
            lf = torch.randn(b * q, vocab, device=dev, generator=g) * 3
            pk = greedy_verify(lf, ids, b, q)
            for tk, tp, label in ((top_k, top_p, "top_p 0.95"), (tk20, top_p, "top_k 20, top_p 0.95"), (tk20, tp1, "top_k 20"), (top_k, top_p * 0 + 0.5, "top_p 0.5")):  # fmt: skip
                same = 0
                for seed in range(10):
                    outs = []
                    for tri in (False, True):
                        torch.manual_seed(seed)
                        outs.append(sample_verify(lf, ids, temp, tk, tp, min_p, nd, b, q, pk, seed_key=key * (seed % 2), pos=pos, use_triton=tri))  # fmt: skip
                    same += int(torch.equal(outs[0], outs[1]))
                checks.append({"vocab": vocab, "b": b, "q": q, "params": label, "equal": same, "of": 10})
                print(f"V={vocab} b={b} q={q} {label}: triton == torch form {same}/10", flush=True)
    if args.out:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.out, "w") as f:
            json.dump({"command": shlex.join(sys.argv), "git_revision": rev, "gpu": torch.cuda.get_device_name(),
                       "rows": rows, "checks": checks}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
