"""Where a speculative step's time goes on a small target, through the engine (graphs on): per configuration and
batch size, the wall-clock ms per engine step, the device ms of the target part (verify / decode, sampling,
acceptance) and of the drafter part (CUDA events, synchronous profiled steps), the kernels one step launches and
their summed GPU time by kernel (torch.profiler over the steady state), and the prefill latency of one prompt.

    python benchmarks/spec_step_profile.py --config-dir .bench/smollm2 \\
        --spec '{"method": "dflash", "model": "specserve/assets/smollm2-135m-dflash", "num_speculative_tokens": 15}' \\
        [--batches 1 2 4] [--tokens 96] [--prompt-len 128] [--async-spec] [--out F.json]

``--config-dir`` runs random weights (load_format dummy: the step costs are those of the real model, acceptance is
not); ``--gguf`` the real ones. Plain decoding is always measured first, as the reference.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_latency import count_steps  # noqa: E402


def _kernel_table(fn: Any, *args: Any) -> tuple[int, float, list[tuple[str, float, float]]]:
    """(kernels, summed kernel us, [(name, count, us)]) of ``fn(*args)``, the most expensive kernels first."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn(*args)
    agg: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.device_time > 0 and not e.name.startswith(("Memcpy", "Memset")):  # fmt: skip
            agg[e.name][0] += 1
            agg[e.name][1] += e.device_time
    rows = sorted(((k, c, us) for k, (c, us) in agg.items()), key=lambda r: -r[2])
    return int(sum(c for _, c, _ in rows)), sum(us for *_, us in rows), rows


def run(a: argparse.Namespace, spec: dict | None) -> list[dict]:
    from specserve import LLM, SamplingParams

    llm = LLM(
        a.gguf or a.config_dir,
        load_format="auto" if a.gguf else "dummy",
        dtype="bfloat16",
        device=a.device,
        max_model_len=2048,
        max_num_seqs=max(a.batches),
        speculative_config=spec,
        enable_prefix_caching=False,
        async_spec=True if spec and a.async_spec else None,
    )
    eng = llm.engine
    can_async = bool(spec) and eng.runner.async_spec  # --async-spec, on a fused speculative step
    steps = count_steps(eng)
    g = torch.Generator().manual_seed(0)
    out = []
    for b in a.batches:
        prompts = [
            {"prompt_token_ids": torch.randint(1000, 40000, (a.prompt_len,), generator=g).tolist()}
            for _ in range(b)
        ]
        sp = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))  # warm-up
        # prefill latency of one prompt (one token out: the prefill step and its sampling)
        one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        pre = []
        for _ in range(5):
            t0 = time.perf_counter()
            llm.generate(prompts[:1], one)
            pre.append(1e3 * (time.perf_counter() - t0))
        modes = [False, True] if can_async else [False]
        timed = {}
        # synchronous speculative steps, then (--async-spec, fused steps) asynchronous ones; the best of 3 runs
        for mode in modes:
            eng.runner.async_spec = mode
            walls = []
            for _ in range(3):
                steps["n"] = 0
                t0 = time.perf_counter()
                res = llm.generate(prompts, sp)
                walls.append((time.perf_counter() - t0, steps["n"]))
            timed[mode] = (*min(walls), sum(len(r.outputs[0].token_ids) for r in res))
        eng.runner.async_spec = False
        dt, n, toks = timed[False]
        eng.runner.profile, eng.runner.timings = True, []
        llm.generate(prompts, sp)
        eng.runner.profile = False
        dec = [t for t in eng.runner.timings[1:] if t[2] == b]
        steps["n"] = 0
        nk, kus, table = _kernel_table(llm.generate, prompts, sp)
        nsteps = max(steps["n"], 1)
        row = {
            "method": spec["method"] if spec else "plain",
            "k": spec["num_speculative_tokens"] if spec else 0,
            "batch": b,
            "step_ms_wall": round(1e3 * dt / max(n, 1), 3),
            "tok_s": round(toks / dt, 1),
            "tokens_per_step": round(toks / max(n, 1) / b, 3),
            "async_spec": None,
            "target_ms": round(statistics.median([t[0] for t in dec]), 3) if dec else None,
            "drafter_ms": round(statistics.median([t[1] for t in dec]), 3) if dec else None,
            "kernels_per_step": round(nk / nsteps, 1),
            "kernel_ms_per_step": round(kus / nsteps / 1e3, 3),
            "prefill_ms": round(statistics.median(pre), 2),
            "top_kernels": [(k[:90], round(c / nsteps, 2), round(us / nsteps, 1)) for k, c, us in table[:40]],
        }
        if True in timed:
            adt, an, atoks = timed[True]
            row["async_spec"] = {
                "step_ms_wall": round(1e3 * adt / max(an, 1), 3),
                "tok_s": round(atoks / adt, 1),
            }
        out.append(row)
        print(
            f"\n{row['method']} K={row['k']} batch {b}: {row['step_ms_wall']:.3f} ms/step wall "
            f"({row['tok_s']:.1f} tok/s, {row['tokens_per_step']:.2f} tokens/step/request); device: target "
            f"{row['target_ms']} ms + drafter {row['drafter_ms']} ms; {row['kernels_per_step']} kernels = "
            f"{row['kernel_ms_per_step']:.3f} ms GPU per step; prefill of {a.prompt_len} tokens {row['prefill_ms']} ms"
            + (
                f"; async spec: {row['async_spec']['step_ms_wall']:.3f} ms/step ({row['async_spec']['tok_s']:.1f} tok/s)"
                if row["async_spec"]
                else ""
            ),
            flush=True,
        )
        for name, c, us in row["top_kernels"][:24]:
            print(f"   {name[:70]:<70} {c:>6} {us:>8.1f} us/step")
    del llm, eng
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config-dir", help="HF config + tokenizer dir: random weights (load_format dummy)")
    src.add_argument("--gguf")
    ap.add_argument("--spec", action="append", default=[], help="a speculative config (JSON); repeatable")
    ap.add_argument("--batches", nargs="+", type=int, default=[1])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--async-spec",
        action="store_true",
        help="also time each speculative config with asynchronous fused steps (the engine's --async-spec)",
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("spec_step_profile: no CUDA device (--device cpu for a smoke run)", file=sys.stderr)
        return 2
    rows = []
    for spec in [None] + [json.loads(s) for s in a.spec]:
        rows += run(a, spec)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(
                dict(
                    command="python " + " ".join(sys.argv),
                    git=os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip(),
                    device=torch.cuda.get_device_name() if a.device == "cuda" else a.device,
                    env={k: v for k, v in os.environ.items() if k.startswith("SPECSERVE_")},
                    rows=rows,
                    time=time.strftime("%Y-%m-%d %H:%M:%S"),
                ),
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
