"""``specserve eval-acceptance``: acceptance length and speedup of a drafter, per dataset, greedy.

    specserve eval-acceptance --model M --speculative-config JSON --dataset FILE [FILE ...]
        [--num-prompts 40] [--max-tokens 256] [--batch-size 8] [--out FILE]

Each dataset is a JSONL file of prompts (fields turns[0] / question / prompt / problem / text); prompts get the
chat template. The same prompts run without and with speculation in one process; the report gives mean
acceptance length (1 + accepted / drafts, vLLM's definition), per-position rates, tokens/s and the speedup, and
checks that the greedy outputs are identical.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any

from specserve.config import SpeculativeConfig
from specserve.errors import OneLineArgumentParser


def read_prompts(path: str, n: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    out: list[str] = []
    with opener(path, "rt") as f:  # type: ignore[operator]
        text = f.read()
    records: list[Any] = (
        json.loads(text)
        if text.lstrip().startswith("[")
        else [json.loads(line) for line in text.splitlines() if line.strip()]
    )
    for d in records:
        if isinstance(d, str):
            out.append(d)
            continue
        turns = d.get("turns")
        p = turns[0] if turns else None
        p = (
            p
            or d.get("question")
            or d.get("problem")
            or d.get("prompt")
            or d.get("instruction")
            or d.get("text")
        )
        if p:
            out.append(str(p))
        if len(out) >= n:
            break
    return out


def run(
    llm: Any, prompts: list[list[int]], max_tokens: int, batch: int
) -> tuple[list[list[int]], float, dict]:
    from specserve import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens)
    m0 = llm.get_metrics()
    t0 = time.perf_counter()
    outs: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        res = llm.generate([{"prompt_token_ids": p} for p in prompts[i : i + batch]], sp)
        outs += [r.outputs[0].token_ids for r in res]
    dt = time.perf_counter() - t0
    m1 = llm.get_metrics()
    delta = {
        k: m1[k] - m0[k]
        for k in ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
    }
    delta["per_pos"] = [
        a - b
        for a, b in zip(
            m1["spec_decode_num_accepted_tokens_per_pos"],
            m0["spec_decode_num_accepted_tokens_per_pos"]
            or [0] * len(m1["spec_decode_num_accepted_tokens_per_pos"]),
        )
    ]
    return outs, dt, delta


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = OneLineArgumentParser(prog="specserve eval-acceptance")
    ap.add_argument("--model", default=None)
    ap.add_argument(
        "--speculative-config",
        "-sc",
        action="append",
        required=True,
        help="JSON; repeat to compare several drafters on the same prompts",
    )
    ap.add_argument("--dataset", nargs="+", required=True)
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from specserve import LLM

    try:
        specs = [json.loads(s) for s in args.speculative_config]
        data = {
            Path(d).name.split(".")[0]
            if Path(d).parent.name not in ("eagle", "dflash_bench")
            else f"{Path(d).parent.name}/{Path(d).name.split('.')[0]}": read_prompts(d, args.num_prompts)
            for d in args.dataset
        }
    except (OSError, ValueError) as e:
        print(f"specserve eval-acceptance: error: {e}", file=sys.stderr)
        return 2
    common = dict(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=max(1, args.batch_size),
        enable_prefix_caching=False,
        enforce_eager=args.enforce_eager,
    )
    base = LLM(**common)  # type: ignore[arg-type]
    tok = base.get_tokenizer()
    encoded = {}
    for name, prompts in data.items():
        ids = []
        for p in prompts:
            t = tok.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True
            )
            t = list(t["input_ids"] if hasattr(t, "keys") else t)
            ids.append(t[: args.max_model_len - args.max_tokens - 32])
        encoded[name] = ids
    baseline = {}
    for name, ids in encoded.items():
        run(base, ids[:1], 8, 1)  # warm-up
        outs, dt, _ = run(base, ids, args.max_tokens, args.batch_size)
        baseline[name] = (outs, dt)
    del base
    rows = []
    for spec in specs:
        llm = LLM(speculative_config=spec, **common)  # type: ignore[arg-type]
        for name, ids in encoded.items():
            run(llm, ids[:1], 8, 1)
            outs, dt, d = run(llm, ids, args.max_tokens, args.batch_size)
            b_outs, b_dt = baseline[name]
            ntok = sum(len(o) for o in outs)
            drafts = d["spec_decode_num_drafts"]
            row = {
                "dataset": name,
                "method": SpeculativeConfig.from_any(spec).method,  # as inferred when the spec leaves it out
                "k": spec.get("num_speculative_tokens"),
                "prompts": len(ids),
                "tokens": ntok,
                "acceptance_length": round(1 + d["spec_decode_num_accepted_tokens"] / drafts, 3)
                if drafts
                else 1.0,
                "per_position": [round(x / drafts, 3) for x in d["per_pos"]] if drafts else [],
                "tokens_per_s": round(ntok / dt, 1),
                "baseline_tokens_per_s": round(sum(len(o) for o in b_outs) / b_dt, 1),
                "speedup": round(b_dt / dt * ntok / max(1, sum(len(o) for o in b_outs)), 3),
                "identical_to_baseline": outs == b_outs,
                # bf16 greedy: a verify of K+1 tokens rounds differently from one-token decode, so a near-tie
                # can flip; how many outputs are identical and how far they agree before a first difference
                "identical_prompts": sum(o == b for o, b in zip(outs, b_outs)),
                "common_prefix_frac": round(
                    sum(_common_prefix(o, b) for o, b in zip(outs, b_outs))
                    / max(1, sum(len(b) for b in b_outs)),
                    3,
                ),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        del llm
    print(
        f"\n{'dataset':22} {'method':11} {'K':>3} {'accept len':>10} {'tok/s':>8} {'base tok/s':>10} {'speedup':>7} {'same':>7} {'prefix':>6}"
    )
    for r in rows:
        same = f"{r['identical_prompts']}/{r['prompts']}"
        print(
            f"{r['dataset']:22} {r['method']:11} {r['k']:>3} {r['acceptance_length']:>10.2f} {r['tokens_per_s']:>8.1f} "
            f"{r['baseline_tokens_per_s']:>10.1f} {r['speedup']:>7.2f} {same:>7} {r['common_prefix_frac']:>6.3f}"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(
            json.dumps(
                {"command": "specserve eval-acceptance " + " ".join(argv or sys.argv[1:]), "rows": rows},
                indent=2,
            )
        )
    return 0
