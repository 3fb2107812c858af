#!/usr/bin/env python
"""Structured outputs on the GPU: constrained greedy decoding with a drafter equals constrained plain decoding
(float32: token for token), every output is valid under the schema, and what the constraint costs in tokens/s.

    python benchmarks/structured_gpu.py --model <SmolLM2 GGUF> [--dflash DIR] [--eagle3 DIR] [--batch 8]
        [--tokens 128] [--dtype float32] [--device cuda] [--out FILE]

Prompts ask for one person / city / product record as JSON; the schema has free strings, an integer, an enum and
an array. Rows: plain unconstrained (the speed reference), plain constrained, each drafter constrained. CUDA graphs
on (the default); a constrained batch samples on the host (its logits masked per row), so this also measures that
path. Runs on the CPU too (``--device cpu``), for a dry run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "kind": {"enum": ["person", "city", "product"]},
        "year": {"type": "integer"},
        "facts": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "kind", "year", "facts"],
}
TOPICS = [
    "Marie Curie",
    "Paris",
    "the iPhone",
    "Albert Einstein",
    "Tokyo",
    "the Model T car",
    "Ada Lovelace",
    "Rome",
    "the Walkman",
    "Isaac Newton",
    "Cairo",
    "the bicycle",
]


def _valid(obj: object) -> bool:
    """SCHEMA checked by hand (the GPU machine has no jsonschema)."""
    return (
        isinstance(obj, dict)
        and set(obj) == {"name", "kind", "year", "facts"}
        and isinstance(obj["name"], str)
        and obj["kind"] in ("person", "city", "product")
        and isinstance(obj["year"], int)
        and not isinstance(obj["year"], bool)
        and isinstance(obj["facts"], list)
        and len(obj["facts"]) <= 3
        and all(isinstance(f, str) for f in obj["facts"])
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dflash", default=None)
    ap.add_argument("--eagle3", default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from specserve import LLM, SamplingParams, StructuredOutputsParams

    convs = [
        [
            {
                "role": "user",
                "content": f"Describe {TOPICS[i % len(TOPICS)]} as a JSON record: name, kind, year, facts.",
            }
        ]
        for i in range(args.batch)
    ]
    so = StructuredOutputsParams(json=SCHEMA)
    runs: list[tuple[str, dict | None, bool]] = [("plain, free text", None, False), ("plain", None, True)]
    if args.dflash:
        runs += [
            (f"dflash K={k}", {"method": "dflash", "model": args.dflash, "num_speculative_tokens": k}, True)
            for k in (15, 4)
        ]
    if args.eagle3:
        runs.append(
            ("eagle3 K=7", {"method": "eagle3", "model": args.eagle3, "num_speculative_tokens": 7}, True)
        )
    rows, ref = [], None
    for name, spec, constrained in runs:
        llm = LLM(args.model, dtype=args.dtype, device=args.device, max_num_seqs=args.batch, max_model_len=1024,
                  enable_prefix_caching=False, speculative_config=spec)  # fmt: skip
        sp = SamplingParams(
            temperature=0, max_tokens=args.tokens, structured_outputs=so if constrained else None
        )
        # warm-up over the whole batch (Triton compiles its kernels per shape on first use, once per process: a
        # batch-1 warm-up left that in the first config's timed run), the grammar's first masks
        warm = SamplingParams(temperature=0, max_tokens=16, structured_outputs=sp.structured_outputs)
        llm.chat(convs, warm)
        t0 = time.perf_counter()
        outs = [o.outputs[0] for o in llm.chat(convs, sp)]
        dt = time.perf_counter() - t0
        m = llm.get_metrics()
        del llm
        if args.device == "cuda":
            import torch

            torch.cuda.empty_cache()
        toks = [o.token_ids for o in outs]
        valid = 0
        for o in outs:
            try:
                valid += _valid(json.loads(o.text))
            except ValueError:
                pass
        if constrained and ref is None:
            ref = toks
        drafts = m["spec_decode_num_drafts"]
        row = {
            "config": name,
            "constrained": constrained,
            "valid_json": valid,
            "identical_to_plain_constrained": sum(a == b for a, b in zip(toks, ref))
            if constrained and ref
            else None,
            "prompts": len(outs),
            "tokens": sum(len(t) for t in toks),
            "tok_per_s": round(sum(len(t) for t in toks) / dt, 1),
            "acceptance_length": round(1 + m["spec_decode_num_accepted_tokens"] / drafts, 3)
            if drafts
            else None,
            "sample": outs[0].text[:160],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["tok_per_s"]
    print(f"\n{'config':18} {'valid':>6} {'same':>6} {'tok/s':>8} {'x free':>7} {'accept':>7}")
    for r in rows:
        same = (
            "-"
            if r["identical_to_plain_constrained"] is None
            else f"{r['identical_to_plain_constrained']}/{r['prompts']}"
        )
        acc = f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-"
        print(
            f"{r['config']:18} {r['valid_json']:>3}/{r['prompts']:<2} {same:>6} {r['tok_per_s']:>8.1f} {r['tok_per_s'] / base:>7.2f} {acc:>7}"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps({"command": "python " + shlex.join(sys.argv), "rows": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
