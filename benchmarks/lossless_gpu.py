#!/usr/bin/env python
"""Speculative decoding is lossless on the GPU: greedy outputs with each drafter equal plain decode's, token for
token, in float32; in bfloat16 beside it (a verify of K+1 tokens per request runs GEMMs / attention of other shapes
than one-token decode, so bf16 rounding differs and near-ties can flip: the bf16 rows show how often).

    python benchmarks/lossless_gpu.py --model DIR_OR_GGUF [--dummy] [--dflash DIR] [--eagle3 DIR] [--out FILE]

Batch 8, 128 greedy tokens, CUDA graphs on (the default path), prefix caching off.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dummy", action="store_true", help="random weights (load_format dummy)")
    ap.add_argument("--dflash", default=None)
    ap.add_argument("--eagle3", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from specserve import LLM, SamplingParams

    specs: list[dict | None] = [None]
    if args.dflash:
        specs += [{"method": "dflash", "model": args.dflash, "num_speculative_tokens": k} for k in (15, 4)]
    if args.eagle3:
        specs += [{"method": "eagle3", "model": args.eagle3, "num_speculative_tokens": k} for k in (7, 4)]
    specs.append(
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    )
    g = torch.Generator().manual_seed(0)
    # prompts with repeats, so n-gram drafting finds matches too
    prompts = []
    for _ in range(args.batch):
        base = torch.randint(100, 20000, (24,), generator=g).tolist()
        prompts.append({"prompt_token_ids": base + base[:12] + base})
    sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    rows = []
    for dtype in args.dtypes:
        ref = None
        for spec in specs:
            llm = LLM(args.model, load_format="dummy" if args.dummy else "auto", dtype=dtype, device=args.device,
                      max_num_seqs=args.batch, max_model_len=1024, enable_prefix_caching=False,
                      speculative_config=spec)  # fmt: skip
            t0 = time.perf_counter()
            outs = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
            dt = time.perf_counter() - t0
            m = llm.get_metrics()
            del llm
            if args.device == "cuda":
                torch.cuda.empty_cache()
            name = "plain" if spec is None else f"{spec['method']} K={spec['num_speculative_tokens']}"
            if ref is None:
                ref = outs
            prefix = 0
            for a, b in zip(outs, ref):
                prefix += next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            drafts = m["spec_decode_num_drafts"]
            row = {
                "dtype": dtype,
                "config": name,
                "identical": sum(a == b for a, b in zip(outs, ref)),
                "prompts": len(outs),
                "common_prefix_frac": round(prefix / max(1, sum(len(b) for b in ref)), 4),
                "acceptance_length": round(1 + m["spec_decode_num_accepted_tokens"] / drafts, 3)
                if drafts
                else None,
                "seconds": round(dt, 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'dtype':9} {'config':12} {'identical':>9} {'prefix':>7} {'accept':>7}")
    for r in rows:
        acc = f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-"
        print(
            f"{r['dtype']:9} {r['config']:12} {r['identical']:>5}/{r['prompts']:<3} {r['common_prefix_frac']:>7.3f} {acc:>7}"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps({"command": "python " + shlex.join(sys.argv), "rows": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
