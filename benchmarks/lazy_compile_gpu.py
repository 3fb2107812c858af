"""Triton kernels compiled after the engine has started, i.e. inside requests, per configuration (GPU).

    python benchmarks/lazy_compile_gpu.py --config-dir DIR [--dflash DIR] [--eagle3 DIR] [--draft-model DIR]
        [--out FILE]

A server should compile everything while it starts (graph capture and warm-ups): a kernel compiled at its first use
lands in some user's request (session 28: the pipelined speculative step's bookkeeping kernel, ~0.5 s in the first
request of a fresh process). Each configuration runs in its own process with its own ``TRITON_CACHE_DIR``, seeded
with the plain run's cache (so the kernels every configuration shares are loaded, not compiled, at start); a new
cache entry that appears while a request runs is a kernel compiled inside it. Per configuration it prints the
engine's start time, and per request (greedy, random prompt ids; batch 1, then 3, then 1 again, then a batch of
three prompts of 16 / 200 / 600 tokens x 320 tokens twice) its wall time and the kernels compiled during it. ``--no-warm`` runs a configuration with the async step's warm-up disabled (the
state before session 28's fix) for comparison. Random weights (``load_format="dummy"``): speed and compiles only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = "--worker"


def _entries(cache: Path) -> set[str]:
    """Kernel names of the cache's entries, as ``hash/name``."""
    out = set()
    for d in cache.iterdir() if cache.is_dir() else []:
        for f in d.glob("*.json"):
            if not f.name.startswith("__grp__"):
                out.add(f"{d.name}/{f.stem}")
    return out


def worker(args: argparse.Namespace) -> None:
    import torch

    from specserve import LLM, SamplingParams

    if args.no_warm:
        from specserve.runner.model_runner import ModelRunner

        ModelRunner._warm_async_step_inputs = lambda self: None  # type: ignore[method-assign]
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    spec = json.loads(args.spec) if args.spec else None
    t0 = time.perf_counter()
    llm = LLM(args.config_dir, load_format="dummy", dtype="bfloat16", device=args.device, max_model_len=2048,
              max_num_seqs=4, enable_prefix_caching=False, gpu_memory_utilization=0.4,
              speculative_config=spec)  # fmt: skip
    start_s = time.perf_counter() - t0
    vocab = json.loads((Path(args.config_dir) / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    reqs = []
    # (name, prompt lengths, max_tokens): one prompt, three, the first again; then three prompts of different lengths
    # (a mixed prefill + decode batch, contexts growing past 256 / 512 / 1024 tokens: split counts the eager paths
    # pick by context length), twice
    plan = [("b1", [128], 96), ("b3", [128] * 3, 96), ("b1 again", [128], 96),
            ("mixed", [16, 200, 600], 320), ("mixed again", [16, 200, 600], 320)]  # fmt: skip
    for name, lens, max_tokens in plan:
        prompts = [
            {"prompt_token_ids": torch.randint(100, min(vocab, 40000), (n,), generator=g).tolist()}
            for n in lens
        ]
        if name == "b3":
            prompts = [prompts[0]] * 3
        before = _entries(cache)
        sync()
        t = time.perf_counter()
        sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        llm.generate(prompts, sp, use_tqdm=False)
        sync()
        wall = time.perf_counter() - t
        new = sorted(e.split("/", 1)[1] for e in _entries(cache) - before)
        reqs.append({"request": name, "batch": len(lens), "wall_s": round(wall, 4), "compiled": new})
    r = llm.engine.runner
    print(json.dumps({"label": args.label, "start_s": round(start_s, 2), "requests": reqs,
                      "async_spec_steps": r.num_async_spec_steps, "async_steps": r.num_async_steps}))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--dflash", default=None)
    ap.add_argument("--eagle3", default=None)
    ap.add_argument("--draft-model", default=None, help="a draft model (vLLM's draft_model, K=4)")
    ap.add_argument("--k", type=int, default=15, help="DFlash's K (EAGLE-3 runs K=7)")
    ap.add_argument("--out", default=None)
    ap.add_argument(WORKER, action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no-warm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    configs: list[tuple[str, dict | None, bool]] = [("plain", None, False)]
    if args.dflash:
        s = {"method": "dflash", "model": args.dflash, "num_speculative_tokens": args.k}
        configs += [(f"dflash K={args.k}, async warm-up off", s, True), (f"dflash K={args.k}", s, False)]
    if args.eagle3:
        configs.append(
            ("eagle3 K=7", {"method": "eagle3", "model": args.eagle3, "num_speculative_tokens": 7}, False)
        )
    if args.draft_model:
        configs.append(
            (
                "draft_model K=4",
                {"method": "draft_model", "model": args.draft_model, "num_speculative_tokens": 4},
                False,
            )
        )
    root = Path(tempfile.mkdtemp(prefix="lazy-compile-"))
    base = root / "base"
    rows = []
    for label, spec, no_warm in configs:
        cache = root / label.replace(" ", "_").replace(",", "").replace("=", "")
        if base.is_dir():
            shutil.copytree(base, cache)
        cmd = [sys.executable, __file__, WORKER, "--config-dir", args.config_dir, "--label", label]
        cmd += ["--spec", json.dumps(spec)] if spec else []
        cmd += ["--no-warm"] if no_warm else []
        cmd += ["--device", args.device]
        env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        line = [x for x in res.stdout.splitlines() if x.startswith("{")]
        if res.returncode or not line:
            print(f"{label}: failed\n{res.stderr[-3000:]}", flush=True)
            continue
        row = json.loads(line[-1])
        rows.append(row)
        print(json.dumps(row), flush=True)
        if spec is None and not base.exists() and cache.is_dir():
            shutil.copytree(cache, base)
    print(f"\n{'config':38} {'start s':>7}  request      wall        kernels compiled inside it")
    for r in rows:
        for i, q in enumerate(r["requests"]):
            head = f"{r['label']:38} {r['start_s']:>7.1f}" if i == 0 else " " * 46
            print(f"{head}  {q['request']:12} {q['wall_s']:7.3f} s  {', '.join(q['compiled']) or '-'}")
    if args.out:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from step_latency import result_meta  # type: ignore[import-not-found]

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({**result_meta(), "rows": rows}, indent=2))
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
