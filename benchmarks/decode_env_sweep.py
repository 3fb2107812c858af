"""Plain decode step of a target (random weights, graphs, batch 1-8) per value of one SPECSERVE_* knob, one run.

    python benchmarks/decode_env_sweep.py --config-dir .bench/qwen3-8b --env SPECSERVE_SPLIT_GEMM \
        --values 0 o=4 o=4,down=2 [--batches 1] [--out FILE]
    python benchmarks/decode_env_sweep.py --config-dir .bench/qwen3-8b --env - \
        --values "SPECSERVE_TRITON_GEMM=0;SPECSERVE_PDL=0" "SPECSERVE_TRITON_GEMM=1;SPECSERVE_PDL=1"

(``--env -``: each value is a ``;``-separated list of ``NAME=VALUE`` settings; a name set by one value and not by
the next returns to its original setting.) ``--spec JSON``: the step of that speculative config instead of plain
decoding (random drafter weights too: ms per engine step, whatever it accepts), e.g. the bundled SmolLM2 drafter
``--config-dir .bench/smollm2 --spec '{"method": "dflash", "model": "specserve/assets/smollm2-135m-dflash",
"num_speculative_tokens": 15}'``.

Per value: a fresh engine (the knob is read at start / capture), ms per engine step over 64 greedy tokens after a
128-token prompt (``--tokens``, ``--prompt-len``; ``--max-model-len`` 2048) (best of 3 runs, prefill included; with
``--short-tokens N``: step_latency.py's difference of the fastest ``--tokens`` and N-token runs), whether the greedy
tokens equal the first value's (random bf16 weights: a GEMM's accumulation order may flip a near-tie), and the
weight-read floor of step_latency.py measured in the same run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_latency import (  # noqa: E402
    copy_bandwidth,
    count_steps,
    read_bandwidth,
    read_weight_bytes,
    result_meta,
    step_ms,
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--env", required=True)
    ap.add_argument("--values", nargs="+", required=True)
    ap.add_argument("--batches", nargs="+", type=int, default=[1])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128, help="random prompt tokens per request")
    ap.add_argument(
        "--short-tokens",
        type=int,
        default=0,
        help="time as step_latency.py does: (fastest --tokens run - fastest run of this many) / steps between "
        "(0: best of 3 runs of --tokens, prefill included)",
    )
    ap.add_argument("--reps", type=int, default=2, help="with --short-tokens: timed runs of each length")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument(
        "--spec", default=None, help="a speculative config (JSON): its step instead of plain decode"
    )
    ap.add_argument("--out", default="benchmarks/results/decode_env_sweep.json")
    args = ap.parse_args()
    spec = json.loads(args.spec) if args.spec else None
    from specserve import LLM, SamplingParams

    bw, read_bw = copy_bandwidth(), read_bandwidth()
    dram = max(bw, read_bw)
    g = torch.Generator().manual_seed(0)
    vocab = json.loads((Path(args.config_dir) / "config.json").read_text())["vocab_size"]
    lo, hi = min(1000, vocab // 2), min(100000, vocab)  # random prompt ids inside the vocabulary
    prompts = [
        torch.randint(lo, hi, (args.prompt_len,), generator=g).tolist() for _ in range(max(args.batches))
    ]
    rows: list[dict] = []
    ref: dict[int, list] = {}
    original = dict(os.environ)
    for value in args.values:
        if args.env == "-":
            for name in {kv.partition("=")[0] for v in args.values for kv in v.split(";")}:
                if name in original:
                    os.environ[name] = original[name]
                else:
                    os.environ.pop(name, None)
            for kv in value.split(";"):
                name, _, val = kv.partition("=")
                os.environ[name] = val
        else:
            os.environ[args.env] = value
        try:
            llm = LLM(args.config_dir, load_format="dummy", dtype="bfloat16", device="cuda",
                      max_model_len=args.max_model_len, max_num_seqs=max(args.batches), enable_prefix_caching=False,
                      gpu_memory_utilization=0.5, speculative_config=spec)  # fmt: skip
        except Exception as e:
            # a value whose engine fails to start (e.g. its graph capture) is recorded and the sweep goes on
            traceback.print_exc()
            rows.append({"env": args.env, "value": value, "error": f"{type(e).__name__}: {e}"[:500]})
            print(json.dumps(rows[-1]), flush=True)
            gc.collect()
            torch.cuda.empty_cache()
            continue
        steps = count_steps(llm.engine)
        wb = read_weight_bytes(llm.engine.runner.model)
        for b in args.batches:
            ps = [{"prompt_token_ids": p} for p in prompts[:b]]
            sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
            toks = [o.outputs[0].token_ids for o in llm.generate(ps, sp)]  # warm-up, and the tokens
            if args.short_tokens:  # step_latency.py's timing: (fastest long - fastest short) / steps between
                best, *_ = step_ms(llm, llm.engine, steps, ps, args.short_tokens, args.tokens, args.reps)
            else:
                best = float("inf")
                for _ in range(3):
                    steps["n"] = 0
                    t0 = time.perf_counter()
                    llm.generate(ps, sp)
                    best = min(best, 1e3 * (time.perf_counter() - t0) / max(1, steps["n"]))
            same = ref.setdefault(b, toks) == toks
            common = sum(
                next((i for i, (x, y) in enumerate(zip(a, r)) if x != y), len(a))
                for a, r in zip(toks, ref[b])
            ) / sum(len(a) for a in toks)
            row = {"env": args.env, "value": value, "spec": spec, "batch": b, "prompt_len": args.prompt_len,
                   "step_ms": round(best, 3),
                   "x_floor": round(best / (1e3 * wb / dram), 3), "same_tokens_as_first": same,
                   "common_prefix": round(common, 3)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    floor_ms = 1e3 * wb / dram
    print(f"\nweight-read floor {floor_ms:.3f} ms (DRAM {dram / 1e12:.2f} TB/s)")
    print(f"{args.env:50} {'batch':>5} {'step ms':>8} {'x floor':>7} {'same':>5}")
    for r in rows:
        if "error" in r:
            print(f"{r['value']:50} error: {r['error'][:120]}")
            continue
        print(f"{r['value']:50} {r['batch']:>5} {r['step_ms']:>8.3f} {r['x_floor']:>7.3f} {str(r['same_tokens_as_first']):>5}")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result_meta(), "dram_Bps": dram,
                               "weight_read_floor_ms": floor_ms, "rows": rows}, indent=2))  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
