"""SmolLM2-135M-Instruct on one GPU: graphs == eager greedy outputs, and tokens/s against HF transformers.

    python benchmarks/smollm2_gpu.py --gguf PATH [--dflash DIR] [--eagle3 DIR] [--draft-model PATH] [--tokens 256] [--out FILE]
    python benchmarks/smollm2_gpu.py --config-dir DIR ...   # random weights of that config (no GGUF needed;
                                                             # drafters random too: speed and equality only)

1. Greedy outputs with CUDA graphs equal those without (--enforce-eager) for 128 tokens, bf16, for plain decode
   and each speculative method available.
2. Batch-1 decode tokens/s (256 tokens, greedy, the same prompts for every engine): HF transformers eager, HF
   with cache_implementation="static" (its automatic torch.compile, warmed up on each timed prompt: a new prompt
   length means a new static cache shape, hence a recompile), specserve plain, and specserve with each drafter
   (acceptance length printed beside), all in this one run. HF runs first, in a subprocess with a time limit
   (``--hf-timeout``), so a slow compile cannot eat the rest of the run. The prompt sets: ``chat`` (the two
   general prompts ``TIMED``) and one more per ``--timed-file FILE[:N]`` (the first N prompts of a dataset
   file, default 2, e.g. gsm8k_test.jsonl: a held-out set of the domain the demo drafters were trained for);
   each row names its set, and the "x HF static" column divides by HF static on the same set. Every timed pass
   (HF eager excepted: ~20x slower) runs ``--reps`` times (default 3) and the row gives the median tokens/s, with
   all passes in ``tokens_per_s_reps``: one pass of two prompts lasts ~0.3 s, so a stall of tens of ms moves a
   single pass by ~20% (session 32's single pass of DFlash K=15 on chat: 1129.6 tok/s, sessions 18 / 28: 1329-1469).
   Every pass runs ``--tokens`` tokens (``ignore_eos``, as HF's ``min_new_tokens``); each specserve row records how
   many of them came before each prompt's first end-of-sequence token (``answer_tokens``): the rest is text no
   drafter was trained on (session 33: "What is the capital of France?" is answered in 7 tokens of 256).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Give three tips for a good night's sleep.",
]
TIMED = PROMPTS[:2]  # batch-1 speed, the same prompts for every engine


def prompt_sets(args: argparse.Namespace) -> dict[str, list[str]]:
    """{"chat": TIMED, <file stem>: its first N prompts, ...} for the batch-1 timing."""
    from specserve.bench.datasets import _first_prompt, _read_records

    sets = {"chat": list(TIMED)}
    for spec in args.timed_file or []:
        path, _, n = spec.partition(":")
        if not os.path.isfile(path):
            raise SystemExit(f"--timed-file: no such file: {path}")
        got = [p for p in (_first_prompt(r) for r in _read_records(path)) if p][: int(n or 2)]
        if not got:
            raise SystemExit(f"--timed-file: no prompts found in {path}")
        sets[Path(path).name.split(".")[0]] = got
    return sets


def specs(args: argparse.Namespace) -> list[dict | None]:
    out: list[dict | None] = [
        None,
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    ]
    if args.dflash:
        out += [
            {"method": "dflash", "model": args.dflash, "num_speculative_tokens": 15},
            # disable_when_slower: drafting only while it measures faster than plain decoding (opt-in)
            {
                "method": "dflash",
                "model": args.dflash,
                "num_speculative_tokens": 15,
                "disable_when_slower": True,
            },
            {"method": "dflash", "model": args.dflash, "num_speculative_tokens": 7},
            {"method": "dflash", "model": args.dflash, "num_speculative_tokens": 4},
        ]
    if args.eagle3:
        out += [
            {"method": "eagle3", "model": args.eagle3, "num_speculative_tokens": 4},
            {"method": "eagle3", "model": args.eagle3, "num_speculative_tokens": 7},
        ]
    if args.draft_model:
        out.append({"method": "draft_model", "model": args.draft_model, "num_speculative_tokens": 3})
    return out


def name(spec: dict | None) -> str:
    if spec is None:
        return "plain"
    return f"{spec['method']} K={spec['num_speculative_tokens']}" + (
        " gated" if spec.get("disable_when_slower") else ""
    )


def answer_length(token_ids: list[int], eos: set[int]) -> int:
    """Tokens before the first end-of-sequence token (all of them if there is none)."""
    return next((i for i, t in enumerate(token_ids) if t in eos), len(token_ids))


def hf_worker(args: argparse.Namespace) -> int:
    """HF transformers eager and static-cache decode speed on TIMED, one JSON row per mode on stdout."""
    import transformers

    from specserve.loading import config_only_checkpoint, load_tokenizer, resolve_checkpoint

    # the engine's tokenizer (chat template included) for both
    tok = load_tokenizer(
        resolve_checkpoint(args.gguf) if args.gguf else config_only_checkpoint(args.config_dir)
    )
    if args.gguf:
        d, f = os.path.split(os.path.abspath(args.gguf))
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            d, gguf_file=f, dtype=getattr(torch, args.dtype)
        )
    else:
        cfg = transformers.AutoConfig.from_pretrained(args.config_dir)
        hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, args.dtype))
    hf = hf.to(args.device).eval()
    n = args.tokens
    for set_name, prompts in prompt_sets(args).items():
        enc = [
            tok.apply_chat_template(
                [{"role": "user", "content": p}],
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=True,
            )["input_ids"].to(args.device)
            for p in prompts
        ]
        # eager (~20x slower) on the first set only
        hf_time(hf, enc, n, set_name, eager=set_name == "chat", reps=args.reps)
    return 0


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def hf_time(
    hf: torch.nn.Module, enc: list[torch.Tensor], n: int, set_name: str, eager: bool, reps: int
) -> None:
    for mode in ("eager", "static") if eager else ("static",):
        kw = {"cache_implementation": "static"} if mode == "static" else {}
        t0 = time.perf_counter()
        # warm-up: static compiles its forward for each prompt length (two runs each); eager one short run
        for ids in enc if mode == "static" else enc[:1]:
            for _ in range(2 if mode == "static" else 1):
                m = n if mode == "static" else 16
                hf.generate(ids, max_new_tokens=m, do_sample=False, min_new_tokens=m, **kw)
        _sync()
        warm = time.perf_counter() - t0
        per_rep = []
        for _ in range(reps if mode == "static" else 1):
            ntok, t0 = 0, time.perf_counter()
            for ids in enc if mode == "static" else enc[:1]:  # eager is ~20x slower: one prompt is enough
                out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)
                ntok += out.shape[1] - ids.shape[1]
            _sync()
            per_rep.append(ntok / (time.perf_counter() - t0))
        row = {"engine": "hf-transformers", "config": mode, "prompt_set": set_name}
        row.update(
            tokens_per_s=round(statistics.median(per_rep), 1),
            tokens_per_s_reps=[round(x, 1) for x in per_rep],
            acceptance_length=None,
            warmup_s=round(warm, 1),
        )
        print(json.dumps(row), flush=True)


def run_hf(args: argparse.Namespace) -> list[dict]:
    cmd = [sys.executable, os.path.abspath(__file__), "--hf-worker", "--tokens", str(args.tokens)]
    cmd += ["--reps", str(args.reps), "--device", args.device, "--dtype", args.dtype]
    cmd += ["--gguf", args.gguf] if args.gguf else ["--config-dir", args.config_dir]
    for f in args.timed_file or []:
        cmd += ["--timed-file", f]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.hf_timeout)
        out, err = p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = f"HF timed out after {args.hf_timeout} s"
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    for r in rows:
        print(json.dumps(r), flush=True)
    if len(rows) < 1 + len(args.timed_file or []) + 1:
        print("HF transformers incomplete:", err[-2000:], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf")
    src.add_argument("--config-dir", help="HF config + tokenizer dir: random weights (load_format dummy)")
    ap.add_argument("--dflash", default=None)
    ap.add_argument("--eagle3", default=None)
    ap.add_argument(
        "--draft-model",
        default=None,
        help="a causal LM with the target's vocabulary ('draft_model K=3'; the GGUF "
        "itself checks the graph path: every draft accepted)",
    )
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3, help="timed passes per row (the median is reported)")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a smoke run of the script
    ap.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--no-eager", action="store_true", help="speed only: skip the graphs == eager comparison")
    ap.add_argument(
        "--only", nargs="+", default=None, help="configs to run, by name: plain, 'dflash K=15', ..."
    )
    ap.add_argument(
        "--hf-timeout", type=float, default=300.0, help="seconds for HF's load + warm-up + timing"
    )
    ap.add_argument(
        "--timed-file",
        action="append",
        metavar="FILE[:N]",
        help="one more prompt set for the batch-1 timing: the first N (default 2) prompts of a dataset file "
        "(repeatable; the chat set is always timed)",
    )
    ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.hf_worker:
        return hf_worker(args)
    from specserve import LLM, SamplingParams

    sets = prompt_sets(args)  # checked before anything loads
    rows: list[dict] = [] if args.skip_hf else run_hf(args)
    equal: dict[str, bool] = {}
    for spec in specs(args):
        if args.only and name(spec) not in args.only:
            continue
        res = {}
        for eager in (False,) if args.no_eager else (True, False):
            llm = LLM(
                args.gguf or args.config_dir,
                load_format="dummy" if args.config_dir else "auto",
                dtype=args.dtype,
                device=args.device,
                max_model_len=2048,
                max_num_seqs=4,
                speculative_config=spec,
                enforce_eager=eager,
                enable_prefix_caching=False,
            )
            chats = [[{"role": "user", "content": p}] for p in PROMPTS]
            outs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=128, ignore_eos=True))
            res[eager] = [o.outputs[0].token_ids for o in outs]
            if not eager:  # timing: batch 1, one prompt after another, each prompt set on its own
                # warm-up: every timed prompt once, as timed (HF static gets the same): the first run of a new
                # prompt length may JIT-compile Triton kernels (prefill shapes), which must not land in the timing
                # one SamplingParams for the warm-up and every timed pass, built outside the timing
                sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
                for p in [p for prompts in sets.values() for p in prompts]:
                    llm.chat([[{"role": "user", "content": p}]], sp)
                # the engine's default, then (fused speculative steps) with their asynchronous pipelining off
                runner, eos = llm.engine.runner, llm.engine.eos_token_ids
                modes = [(name(spec), None)]
                if runner.async_spec and not (spec or {}).get("disable_when_slower"):
                    modes.append((name(spec) + " sync", False))
                for cfg_name, async_spec in modes:
                    if async_spec is not None:
                        runner.async_spec = async_spec
                    for set_name, prompts in sets.items():
                        m0 = llm.get_metrics()
                        per_rep = []
                        for _ in range(args.reps):
                            t0, outs = time.perf_counter(), []
                            for p in prompts:
                                outs.append(
                                    llm.chat([[{"role": "user", "content": p}]], sp)[0].outputs[0].token_ids
                                )
                            per_rep.append(sum(map(len, outs)) / (time.perf_counter() - t0))
                        answers = [answer_length(t, eos) for t in outs]  # greedy: every pass the same tokens
                        m1 = llm.get_metrics()
                        d = m1["spec_decode_num_drafts"] - m0["spec_decode_num_drafts"]
                        a = m1["spec_decode_num_accepted_tokens"] - m0["spec_decode_num_accepted_tokens"]
                        rows.append(
                            {
                                "engine": "specserve",
                                "config": cfg_name,
                                "prompt_set": set_name,
                                "tokens_per_s": round(statistics.median(per_rep), 1),
                                "tokens_per_s_reps": [round(x, 1) for x in per_rep],
                                "acceptance_length": round(1 + a / d, 3) if d else None,
                                "pipelined_spec_steps": runner.num_async_spec_steps,
                                # tokens before each prompt's first end-of-sequence token: ignore_eos times the
                                # rest too, text no drafter was trained on (its acceptance is the lower one)
                                "answer_tokens": answers,
                            }
                        )
                        gate = llm.engine.gate
                        # disable_when_slower: steps it ran plain, probes, ratio at batch 1
                        if gate is not None:
                            rows[-1].update(
                                gated_plain_steps=gate.num_plain_steps,
                                probes=gate.num_probes,
                                spec_over_plain_step=gate.ratio(1),
                                pipelined_plain_steps=runner.num_async_steps,
                            )
                        print(json.dumps(rows[-1]), flush=True)
            del llm
            torch.cuda.empty_cache()
        if not args.no_eager:
            equal[name(spec)] = res[True] == res[False]
            print(f"graphs == eager for {name(spec)}: {equal[name(spec)]}", flush=True)

    hf_static = {r["prompt_set"]: r["tokens_per_s"] for r in rows if r["config"] == "static"}
    print(
        f"\n{'engine':16} {'config':18} {'prompts':12} {'tok/s':>8} {'x HF static':>11} {'accept len':>10} "
        "answer tokens (before EOS)"
    )
    for r in sorted(rows, key=lambda r: list(sets).index(r["prompt_set"])):
        base = hf_static.get(r["prompt_set"])
        x = f"{r['tokens_per_s'] / base:.2f}" if base else "-"
        al = f"{r['acceptance_length']:.2f}" if r["acceptance_length"] else "-"
        ans = ",".join(map(str, r.get("answer_tokens") or [])) or "-"
        print(
            f"{r['engine']:16} {r['config']:18} {r['prompt_set'][:12]:12} {r['tokens_per_s']:>8.1f} {x:>11} "
            f"{al:>10} {ans}"
        )
    print(f"graphs == eager (128 greedy tokens, 4 prompts, {args.dtype}):", json.dumps(equal))
    try:
        rev = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:  # noqa: BLE001
        rev = "unknown"
    out = Path(args.out or f"benchmarks/results/smollm2_gpu-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "command": " ".join(["python"] + sys.argv),
                "git_revision": rev,
                "gpu": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                "rows": rows,
                "graphs_equal_eager": equal,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
