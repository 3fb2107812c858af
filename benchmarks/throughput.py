"""Decode throughput of the engine (tokens/s), batch 1 and 8, with and without speculation.

    python benchmarks/throughput.py [--model M] [--device cpu|cuda] [--dtypes float32 bfloat16] [--batches 1 8]
        [--spec '{"method": "ngram", "num_speculative_tokens": 4}'] [--max-tokens 64] [--out FILE]

Prints a table and writes JSON (command, git revision, machine) under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue in simple terms.",
    "List five tips for staying productive when working from home.",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle.",
    "Give me a recipe for pancakes.",
    "Why do cats purr?",
    "Summarize the plot of Romeo and Juliet.",
]


def git_rev() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def run_info() -> dict[str, str]:
    """What every CPU benchmark JSON records about its run: the command, git revision and machine."""
    return {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "git_revision": git_rev(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
    }


def save_result(result: dict, out: str | None, stem: str) -> None:
    """Write ``result`` as JSON to ``out`` (default ``benchmarks/results/<stem>-<time>.json``) and say where."""
    out = out or f"benchmarks/results/{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--spec", action="append", default=[], help="speculative config JSON (repeatable)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    from specserve import LLM, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    specs = [None] + [json.loads(s) for s in args.spec]
    for dtype in args.dtypes:
        for spec in specs:
            llm = LLM(
                args.model,
                dtype=dtype,
                device=args.device,
                max_num_seqs=max(args.batches),
                max_model_len=1024,
                speculative_config=spec,
                enable_prefix_caching=False,
            )
            tok = llm.get_tokenizer()
            chats = [
                tok.apply_chat_template(
                    [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
                )
                for p in PROMPTS
            ]
            sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
            llm.generate(chats[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
            for b in args.batches:
                m0 = llm.get_metrics()
                t0 = time.perf_counter()
                outs = llm.generate(chats[:b], sp)
                dt = time.perf_counter() - t0
                m1 = llm.get_metrics()
                ntok = sum(len(o.outputs[0].token_ids) for o in outs)
                drafts = m1["spec_decode_num_drafts"] - m0["spec_decode_num_drafts"]
                acc = m1["spec_decode_num_accepted_tokens"] - m0["spec_decode_num_accepted_tokens"]
                row = {
                    "dtype": dtype,
                    "batch": b,
                    "spec": spec["method"] if spec else "none",
                    "k": spec["num_speculative_tokens"] if spec else 0,
                    # other speculative-config keys (e.g. disable_by_batch_size), as k=v
                    "options": " ".join(
                        f"{k}={v}"
                        for k, v in (spec or {}).items()
                        if k not in ("method", "model", "num_speculative_tokens")
                    ),
                    "tokens": ntok,
                    "seconds": round(dt, 3),
                    "tokens_per_s": round(ntok / dt, 2),
                    "acceptance_length": round(1 + acc / drafts, 3) if drafts else None,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
            del llm
    print(f"\n{'dtype':9} {'spec':8} {'K':>3} {'batch':>5} {'tok/s':>9} {'accept len':>10}  options")
    for r in rows:
        al = f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-"
        print(
            f"{r['dtype']:9} {r['spec']:8} {r['k']:>3} {r['batch']:>5} {r['tokens_per_s']:>9.1f} {al:>10}  {r['options']}"
        )
    result = {
        **run_info(),
        "gpu": (torch.cuda.get_device_name() if torch.cuda.is_available() else None),
        "torch": torch.__version__,
        "rows": rows,
    }
    save_result(result, args.out, f"throughput-{args.device}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
