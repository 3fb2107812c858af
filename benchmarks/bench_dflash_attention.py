#!/usr/bin/env python
"""DFlash training step (drafter forward + backward of the DFlash objective) per attention backend.

    python benchmarks/bench_dflash_attention.py                       # H200: the production shape below
    python benchmarks/bench_dflash_attention.py --device cpu --batch 2 --seq 1024 --anchors 64   # CPU, no grad

Defaults: a SmolLM2-135M-shaped 3-layer drafter (hidden 576, 9 heads, 3 KV heads, head_dim 64), batch 32,
sequence lengths uniform in [seq/4, seq] (loss mask from 20% of each), 256 anchors x block 16. Each backend runs
in its own subprocess (clean peak memory, no shared compile caches); the first ``--warmup`` steps (torch.compile
for flex) are not timed. bf16 autocast on CUDA as in training. On CPU torch has no FlexAttention backward, so
the default there is forward only (``--grad`` forces it and fails for flex); flex runs eagerly on CPU (unfused,
materialises the scores) unless ``--compile-cpu``. Peak memory: CUDA max allocated, CPU max RSS of the process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from specserve.train import models  # noqa: E402
from specserve.train.losses import DFlashObjective, sample_anchors  # noqa: E402
from specserve.train.models import DFlashConfig, DFlashDrafter  # noqa: E402


def one(a: argparse.Namespace) -> dict:
    dev = torch.device(a.device)
    if a.compile_cpu:
        models.FLEX_COMPILE_DEVICES = ("cuda", "cpu")
    torch.manual_seed(0)
    h, vocab, n_taps = 576, a.vocab, 3
    cfg = DFlashConfig(
        hidden_size=h, intermediate_size=1536, num_hidden_layers=a.layers, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, vocab_size=vocab, target_layer_ids=list(range(n_taps)),
        num_target_layers=30, target_hidden_size=h, block_size=a.block, mask_token_id=0,
    )  # fmt: skip
    drafter = DFlashDrafter(cfg).to(dev)
    embed = torch.randn(vocab, h, device=dev) * 0.02
    head = torch.randn(vocab, h, device=dev) * 0.02
    obj = DFlashObjective(drafter, embed, head, backend=a.backend)
    g = torch.Generator().manual_seed(1)
    lens = torch.randint(max(2, a.seq // 4), a.seq + 1, (a.batch,), generator=g)
    s = int(lens.max())
    ids = torch.randint(1, vocab, (a.batch, s), generator=g).to(dev)
    mask = torch.zeros(a.batch, s, dtype=torch.long)
    for i, n in enumerate(lens.tolist()):
        mask[i, int(0.2 * n) : n] = 1
    mask = mask.to(dev)
    taps = torch.randn(a.batch, s, n_taps * h, generator=g).to(dev)
    anchors, valid = sample_anchors(mask, a.anchors, torch.Generator().manual_seed(2))
    autocast = dev.type == "cuda"

    def step() -> float:
        with torch.set_grad_enabled(a.grad), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss, _ = obj(taps, ids, mask, anchors, valid)
        if a.grad:
            loss.backward()
            drafter.zero_grad(set_to_none=True)
        return float(loss)

    t0 = time.perf_counter()
    for _ in range(a.warmup):
        loss = step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    warm = time.perf_counter() - t0
    times = []
    for _ in range(a.iters):
        t = time.perf_counter()
        loss = step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = (
        torch.cuda.max_memory_allocated() / 2**30
        if dev.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    )
    times.sort()
    return dict(
        backend=a.backend, loss=loss, step_s=times[len(times) // 2], min_s=times[0], warmup_s=warm, peak_gib=peak,
        S=s, Q=anchors.shape[1] * a.block,
    )  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", nargs="+", default=["split", "flex"], choices=models.ATTN_BACKENDS)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1500)
    p.add_argument("--anchors", type=int, default=256)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--grad", action=argparse.BooleanOptionalAction, default=None, help="default: on CUDA only"
    )
    p.add_argument("--compile-cpu", action="store_true", help="torch.compile flex on CPU too (forward only)")
    p.add_argument("--backend", help=argparse.SUPPRESS)  # child process: one backend
    a = p.parse_args()
    if a.grad is None:
        a.grad = a.device.startswith("cuda")
    if a.backend:
        print(json.dumps(one(a)))
        return
    rows = []
    for b in a.backends:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            *sys.argv[1:],
            "--backend",
            b,
            "--grad" if a.grad else "--no-grad",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{b}: failed\n{r.stderr[-3000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    mode = "fwd+bwd" if a.grad else "fwd"
    print(
        f"device={a.device} {mode} batch={a.batch} seq<={a.seq} anchors={a.anchors} block={a.block} layers={a.layers}"
    )
    for r in rows:
        print(
            f"{r['backend']:>6}: {r['step_s'] * 1e3:9.1f} ms/step (min {r['min_s'] * 1e3:.1f}, warmup {r['warmup_s']:.1f} s)"
            f"  peak {r['peak_gib']:6.2f} GiB  loss {r['loss']:.5f}  S={r['S']} Q={r['Q']}"
        )
    if len(rows) > 1:
        ref = rows[0]["loss"]
        print("max |loss - " + rows[0]["backend"] + "|:", max(abs(r["loss"] - ref) for r in rows))


if __name__ == "__main__":
    main()
