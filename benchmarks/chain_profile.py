"""Critical-path share of each kernel of the engine's plain decode step, by its place in the layer (issue #6).

    python benchmarks/chain_profile.py --config-dir .bench/qwen3-8b [--values "" "SPECSERVE_GREEDY_TAIL_PROGRAMS=1"]
        [--spec dflash:15]

Per value (``;``-separated ``NAME=VALUE`` settings, as decode_env_sweep.py's ``--env -``; "" = the defaults): a
fresh engine (random bf16 weights, graphs on, batch 1, a 128-token prompt; with ``--spec`` the speculative step of
step_latency.py's random drafters), 64 greedy tokens under torch.profiler.
With programmatic dependent launch a kernel's own duration includes the time its CTAs wait for their predecessor,
so the table gives each main-stream kernel's *advance*: its end minus the previous main-stream kernel's end, i.e.
what it adds to the step's serial chain. Kernels are labelled by name and predecessor (``_splitk_gemm_kernel <
_merge_splits_kernel`` is o_proj), which tells apart the split-K GEMMs that share a kernel. Kernels that overlap the
chain from a side stream (session 47's L2 prefetch, ``results/h100-2026-12-07-s47/l2_side_prefetch.patch``) are
listed apart with their start relative to the chain kernel before them. Prints one table per value and the per-label difference to the first value; writes JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_latency import result_meta  # noqa: E402

SIDE = ("_l2_prefetch_kernel",)  # kernels launched beside the chain (session 47's l2_side_prefetch.patch)


def short(name: str) -> str:
    """A kernel's name without return type, anonymous namespace, template or parameter list (torch's
    ``void at::native::(anonymous namespace)::indexSelectSmallIndex<...>(...)`` -> ``at::native::indexSelectSmallIndex``):
    distinct kernels keep distinct labels."""
    name = name.replace("void ", "").replace("(anonymous namespace)::", "")
    return re.split(r"[<(]", name)[0][:48]


def spec_config(spec: str | None) -> dict[str, Any] | None:
    """``--spec dflash:K|eagle3:K``: step_latency.py's random drafters for the Qwen3-8B shape (DFlash-b16 with
    5 layers, an EAGLE-3 head), written under $TMPDIR; None: plain decoding."""
    if not spec:
        return None
    from step_latency import write_drafters

    method, _, k = spec.partition(":")
    if method not in ("dflash", "eagle3") or not k.isdigit():
        raise SystemExit(f"--spec: expected dflash:K or eagle3:K, got {spec!r}")
    df, ea = write_drafters(Path(os.environ.get("TMPDIR", "/tmp")) / "specserve-drafters")
    return {"method": method, "model": df if method == "dflash" else ea, "num_speculative_tokens": int(k)}


def profile_value(args: argparse.Namespace, value: str) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from specserve import LLM, SamplingParams

    original = dict(os.environ)
    for kv in filter(None, value.split(";")):
        name, _, val = kv.partition("=")
        os.environ[name] = val
    try:
        llm = LLM(args.config_dir, load_format="dummy", dtype="bfloat16", device="cuda", max_model_len=2048,
                  max_num_seqs=1, enable_prefix_caching=False, gpu_memory_utilization=0.5,
                  speculative_config=spec_config(args.spec))  # fmt: skip
        g = torch.Generator().manual_seed(0)
        ps = [{"prompt_token_ids": torch.randint(1000, 100000, (128,), generator=g).tolist()}]
        sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        llm.generate(ps, sp, use_tqdm=False)  # warm-up
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            llm.generate(ps, sp, use_tqdm=False)
            torch.cuda.synchronize()
    finally:
        os.environ.clear()
        os.environ.update(original)
    ev = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name
         and "Memset" not in e.name),
        key=lambda e: e.time_range.start,
    )  # fmt: skip
    chain: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])  # label -> [count, advance us]
    # side kernel name -> [count, duration, start - the chain's end so far]
    side: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    prev_end, prev_name = None, "start"
    for e in ev:
        s, t = e.time_range.start, e.time_range.end
        if short(e.name) in SIDE:
            a = side[short(e.name)]
            a[0] += 1
            a[1] += t - s
            a[2] += s - (prev_end if prev_end is not None else s)
            continue
        label = f"{short(e.name)} < {prev_name}"
        c = chain[label]
        c[0] += 1
        c[1] += max(0.0, t - prev_end) if prev_end is not None else 0.0
        if prev_end is None or t > prev_end:
            prev_end = t
        prev_name = short(e.name)
    rows: list[dict[str, Any]] = [
        {"kernel": k, "count": int(c), "advance_us": round(a, 1), "advance_us_each": round(a / c, 3)}
        for k, (c, a) in sorted(chain.items(), key=lambda kv: -kv[1][1])
    ]
    sides: list[dict[str, Any]] = [
        {"kernel": k, "count": int(c), "mean_us": round(d / c, 3), "starts_after_chain_us": round(st / c, 3)}
        for k, (c, d, st) in side.items()
    ]
    total = sum(r["advance_us"] for r in rows)
    del llm
    torch.cuda.empty_cache()
    return {
        "value": value,
        "total_advance_us": round(total, 1),
        "rows": rows,
        "side": sides,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--values", nargs="+", default=[""])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument(
        "--spec", default=None, help="dflash:K or eagle3:K (random 8B-shaped drafters): that step's chain"
    )
    ap.add_argument("--top", type=int, default=14, help="rows printed per value")
    ap.add_argument("--out", default="benchmarks/results/chain_profile.json")
    args = ap.parse_args()
    results = [profile_value(args, v) for v in args.values]
    base = {r["kernel"]: r for r in results[0]["rows"]}
    for res in results:
        print(f"\n== {res['value'] or 'defaults'}: chain {res['total_advance_us'] / 1e3:.3f} ms over the run")
        print(f"{'kernel < predecessor':84} {'count':>6} {'us each':>8} {'vs first':>9}")
        for r in res["rows"][: args.top]:
            b = base.get(r["kernel"])
            d = f"{r['advance_us_each'] - b['advance_us_each']:+9.3f}" if b else f"{'new':>9}"
            print(f"{r['kernel']:84} {r['count']:6d} {r['advance_us_each']:8.3f} {d}")
        for s in res["side"]:
            print(f"  side: {s['kernel']} x{s['count']} {s['mean_us']:.3f} us, starts {s['starts_after_chain_us']:.3f} us "
                  f"after the chain kernel before it")  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result_meta(), "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
