"""Batch-1 decode speed for the SmolLM2-135M shape (weights random: speed does not depend on their values):
specserve (CUDA graphs) vs HF transformers eager and with cache_implementation="static" (automatic
torch.compile, warmed up), same config, 256 greedy tokens, ignore EOS, in one run.

    python benchmarks/smollm2_decode_speed.py --config-dir DIR [--tokens 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-static", action="store_true")
    args = ap.parse_args()
    from specserve import LLM, SamplingParams

    rows = {}
    llm = LLM(
        args.config_dir,
        load_format="dummy",
        dtype="bfloat16",
        device="cuda",
        max_model_len=1024,
        max_num_seqs=1,
        enable_prefix_caching=False,
    )
    prompt = {"prompt_token_ids": list(range(100, 140))}
    sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompt, sp)
    t0 = time.perf_counter()
    for _ in range(3):
        llm.generate(prompt, sp)
    rows["specserve (graphs)"] = 3 * args.tokens / (time.perf_counter() - t0)
    print(json.dumps(rows), flush=True)
    del llm
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(args.config_dir)
    with torch.device("cuda"):
        hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.tensor([prompt["prompt_token_ids"]], device="cuda")
    for mode in ["eager"] + ([] if args.skip_static else ["static"]):
        kw = {"cache_implementation": "static"} if mode == "static" else {}
        for _ in range(2):
            hf.generate(ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, **kw)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, **kw)
        torch.cuda.synchronize()
        rows[f"hf {mode}"] = args.tokens / (time.perf_counter() - t0)
        print(json.dumps(rows), flush=True)
    base = rows.get("hf static") or rows["hf eager"]
    for k, v in rows.items():
        print(f"{k:22} {v:8.1f} tok/s  {v / base:5.2f}x")
    out = Path(args.out or "benchmarks/results/smollm2_decode_speed.json")
    out.write_text(
        json.dumps(
            {
                "command": "python benchmarks/smollm2_decode_speed.py --config-dir DIR",
                "gpu": torch.cuda.get_device_name(),
                "tokens_per_s": rows,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
