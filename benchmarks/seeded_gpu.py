#!/usr/bin/env python
"""Seeded sampling inside the CUDA graphs, on the GPU: the same tokens as `--enforce-eager` and as the host-side
sampler, and the speed of seeded requests against unseeded random and greedy ones.

    python benchmarks/seeded_gpu.py --model DIR_OR_GGUF [--dummy] [--dflash DIR] [--out FILE]

Per configuration (plain decoding, DFlash K=7 when --dflash is given), bf16, 8 prompts, 128 tokens, temperature 0.8,
top_p 0.95, seeds 0-7:
- graphs vs `enforce_eager=True` (the padded path without capture: the same kernels and shapes): tokens equal;
- graphs vs the host sampler (the same engine with in-graph sampling switched off: the synchronous path and
  rejection_sample on the host, as every seeded step ran before the counter-based noise): tokens equal (the same
  logits; both key the noise by seed and position);
- tok/s at batch 1 and 8 for greedy, unseeded random, seeded random on the graph path, and seeded random on the host
  sampler (the pre-change path), each after a warm-up, in one process.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dummy", action="store_true")
    ap.add_argument("--dflash", default=None)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (no graphs there)")
    args = ap.parse_args()
    from specserve import LLM, SamplingParams

    g = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(100, 20000, (40,), generator=g).tolist()} for _ in range(8)]
    seeded = [
        SamplingParams(temperature=0.8, top_p=0.95, seed=s, max_tokens=args.tokens, ignore_eos=True)
        for s in range(8)
    ]
    seeded_t = [SamplingParams(temperature=0.8, seed=s, max_tokens=args.tokens, ignore_eos=True) for s in range(8)]
    specs: list[dict | None] = [None]
    if args.dflash:
        specs.append({"method": "dflash", "model": args.dflash, "num_speculative_tokens": args.k})
    rows, checks = [], []
    for spec in specs:
        name = "plain" if spec is None else f"dflash K={args.k}"

        def make(**kw):  # type: ignore[no-untyped-def]
            return LLM(args.model, load_format="dummy" if args.dummy else "auto", dtype="bfloat16", device=args.device,
                       max_num_seqs=8, max_model_len=1024, enable_prefix_caching=False, speculative_config=spec,
                       padded_decode=True, **kw)  # fmt: skip

        llm = make()
        r = llm.engine.runner
        real_ok = r._graph_sampling_ok

        def host_sampler(on: bool) -> None:
            r._graph_sampling_ok = (lambda items: False) if on else real_ok

        def gen(ps, n):  # type: ignore[no-untyped-def]
            outs = llm.generate(prompts[:n], ps[:n], use_tqdm=False)
            return [o.outputs[0].token_ids for o in outs]

        eager = make(enforce_eager=True)
        for label, sps in (("top_p 0.95", seeded), ("temperature only", seeded_t)):
            f0, n0 = r.num_fast_steps, getattr(r, "num_sort_free_steps", 0)
            graph_toks = gen(sps, 8)
            fast, sort_free = r.num_fast_steps - f0, getattr(r, "num_sort_free_steps", 0) - n0
            host_sampler(True)
            host_toks = gen(sps, 8)
            host_sampler(False)
            eager_toks = [o.outputs[0].token_ids for o in eager.generate(prompts, sps, use_tqdm=False)]
            same_eager = sum(a == b for a, b in zip(graph_toks, eager_toks))
            same_host = sum(a == b for a, b in zip(graph_toks, host_toks))
            distinct = len({tuple(t) for t in graph_toks})
            checks.append({"config": name, "params": label, "graphs_eq_eager": same_eager, "graphs_eq_host": same_host,
                           "of": 8, "graph_steps": fast, "sort_free_steps": sort_free,
                           "distinct_outputs": distinct})  # fmt: skip
            print(f"{name} seeded {label}: graphs == eager {same_eager}/8, graphs == host sampler {same_host}/8, "
                  f"{fast} graph steps ({sort_free} sort-free), {distinct} distinct outputs", flush=True)  # fmt: skip
        del eager
        cases = {
            "greedy": [SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)] * 8,
            "random": [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.tokens, ignore_eos=True)] * 8,
            "random, T only": [SamplingParams(temperature=0.8, max_tokens=args.tokens, ignore_eos=True)] * 8,
            "seeded": seeded,
            "seeded, host sampler": seeded,
        }
        for batch in (1, 8):
            for case, ps in cases.items():
                host_sampler(case.endswith("host sampler"))
                gen(ps, batch)  # warm-up
                best = 0.0
                for _ in range(2):
                    t0 = time.perf_counter()
                    n = sum(len(t) for t in gen(ps, batch))
                    best = max(best, n / (time.perf_counter() - t0))
                host_sampler(False)
                rows.append({"config": name, "batch": batch, "case": case, "tok_s": round(best, 1)})
                print(f"{name} batch {batch} {case}: {best:.1f} tok/s", flush=True)
        del llm
    print("\n| config | batch | greedy | random (top_p 0.95) | random, T only | seeded (top_p 0.95) | seeded, host sampler |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for spec in specs:
        name = "plain" if spec is None else f"dflash K={args.k}"
        for batch in (1, 8):
            v = {x["case"]: x["tok_s"] for x in rows if x["config"] == name and x["batch"] == batch}
            print(f"| {name} | {batch} | {v['greedy']} | {v['random']} | {v['random, T only']} | {v['seeded']} | "
                  f"{v['seeded, host sampler']} |")  # fmt: skip
    if args.out:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.out, "w") as f:
            json.dump({"command": shlex.join(sys.argv), "git_revision": rev, "gpu": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                       "checks": checks, "rows": rows}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
