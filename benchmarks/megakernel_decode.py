"""The persistent one-launch decode step (specserve/layers/triton_megakernel.py) on a Qwen3-8B-shaped target with
random bf16 weights, batch 1 (issue #6's plain-decode bar, session 51): checks its logits against the torch reference
for a few steps, then times greedy decode steps after a prompt and prints ms a step against the weight-read floor
measured in the same run (step_latency.py's definition), per variant (the keys of SPECSERVE_MEGAKERNEL_OPTS: rb unit
rows, st pipeline stages, pf L2 prefetch depth, po o_proj's prefetch through the attention, rp o_proj's residual
preload, ch attention chunk, am the attention's own chunk merge (N chunks a round; 0 off), mg o_proj's one-load
merge (with am=0), warps), and where a step's time goes by phase (global-timer stamps
taken when each phase's wait returned and when each program finished its units). The engine's own step with the
kernel: SPECSERVE_MEGAKERNEL=1 python benchmarks/step_latency.py --configs plain ... (benchmarks/README.md, sessions
52-53; longer contexts: --prompt 1800, or decode_env_sweep.py --prompt-len).

    python benchmarks/megakernel_decode.py [--config-dir DIR] [--variants rb=4,pf=1 rb=4,pf=2,rp=0 ...] --out R.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_latency import copy_bandwidth, read_bandwidth, result_meta  # noqa: E402

from specserve.layers.triton_megakernel import MegaConfig, MegaDecoder, parse_opts, reference_step  # noqa: E402

QWEN3_8B = MegaConfig(
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate=12288,
    layers=36,
    vocab=151936,
    eps=1e-6,
    rope_theta=1_000_000.0,
)


def parse_variant(text: str, base: MegaConfig) -> MegaConfig:
    try:
        return replace(base, **parse_opts(text))
    except ValueError as e:
        raise SystemExit(str(e)) from None


def random_weights(cfg: MegaConfig, dev: torch.device, seed: int = 0) -> dict:  # type: ignore[type-arg]
    """Per-layer tensors in the engine's fused nn.Linear layouts (what MegaDecoder.pack returns)."""
    torch.manual_seed(seed)
    h, i, d = cfg.hidden, cfg.intermediate, cfg.head_dim
    nqkv = (cfg.heads + 2 * cfg.kv_heads) * d

    def lin(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device=dev, dtype=torch.bfloat16) * shape[-1] ** -0.5).contiguous()

    def norm(*shape: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(*shape, device=dev)).to(torch.bfloat16)

    layers = [
        {
            "qkv": lin(nqkv, h),
            "o": lin(h, h),
            "gate_up": lin(2 * i, h),
            "down": lin(h, i),
            "in_norm": norm(h),
            "post_norm": norm(h),
            "q_norm": norm(d),
            "k_norm": norm(d),
        }
        for _ in range(cfg.layers)
    ]
    return {
        "layers": layers,
        "lm_head": lin(cfg.vocab, h),
        "embed": torch.randn(cfg.vocab, h, device=dev, dtype=torch.bfloat16),
        "final_norm": norm(h),
    }


def weight_bytes_of(w: dict) -> int:  # type: ignore[type-arg]
    n = sum(t.numel() * t.element_size() for ly in w["layers"] for t in ly.values())
    return n + sum(w[k].numel() * w[k].element_size() for k in ("lm_head", "final_norm"))


def check(cfg: MegaConfig, w: dict, steps: int) -> float:  # type: ignore[type-arg]
    dev = w["lm_head"].device
    nblocks = -(-cfg.max_tokens // 16)
    # a shuffled block table: the paged cache as the engine's allocator hands it out
    dec = MegaDecoder(cfg, w, dev, block_table=torch.randperm(nblocks).tolist())
    kc = torch.zeros(cfg.layers, cfg.kv_heads, cfg.max_tokens, cfg.head_dim, dtype=torch.bfloat16, device=dev)
    vc = torch.zeros_like(kc)
    worst = 0.0
    for pos in range(steps):
        tok = (pos * 7919) % cfg.vocab
        got = dec.launch(torch.tensor(tok, device=dev), pos).clone()
        trace: dict[str, list[torch.Tensor]] = {}
        ref = reference_step(cfg, w, kc, vc, tok, pos, trace)
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        worst = max(worst, err)
        if err > 2e-2:
            # the first layer / buffer that differs
            where = "the LM head"
            for layer in range(cfg.layers):
                kern = dec.kernel
                bufs = {"qkv": kern.qkv[layer], "h_mid": kern.h_mid[layer], "act": kern.act[layer]}
                bad = [
                    f"{k} {((b - trace[k][layer]).abs().max() / trace[k][layer].abs().max()).item():.3g}"
                    for k, b in bufs.items()
                    if ((b - trace[k][layer]).abs().max() / trace[k][layer].abs().max()).item() > 2e-2
                ]
                if bad:
                    where = f"layer {layer}: " + ", ".join(bad)
                    break
            raise RuntimeError(
                f"logits differ from the reference at step {pos}: rel err {err:.3g}; first: {where}"
            )
    del dec
    return worst


def timed(cfg: MegaConfig, w: dict, prompt: int, steps: int, reps: int) -> dict:  # type: ignore[type-arg]
    dev = w["lm_head"].device
    dec = MegaDecoder(cfg, w, dev)
    tok = torch.tensor(1, device=dev)
    for pos in range(prompt):  # the prompt through the same kernel (compiles and fills the cache)
        dec.launch(tok, pos)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for j in range(steps):
            logits = dec.launch(tok, prompt + j)
            tok = logits.argmax()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / steps)
    # eight stamped steps after the timed ones (medians): where the time goes (phases on the chain, us a layer),
    # and per phase when the median and the last program finished its units and how long the next phase's first
    # program took to get past its wait after the last one finished (the dependency's latency)
    names = ("qkv", "attention", "o_proj", "gate_up", "down")
    phase_us: dict[str, list[float]] = {k: [] for k in names}
    split: dict[str, dict[str, list[float]]] = {k: {"median": [], "last": [], "sync": []} for k in names}
    lm = []
    for j in range(8):
        dec.stamps.zero_()
        dec.launch(tok, prompt + steps + j, stamp=True)
        torch.cuda.synchronize()
        st = dec.stamps.double().cpu().numpy()
        st[st == 0] = np.nan
        first = torch.from_numpy(np.nanmin(st, 0))  # [L + 1, 12]: the earliest program
        done_med = torch.from_numpy(np.nanmedian(st, 0))
        done_max = torch.from_numpy(np.nanmax(st, 0))
        L = cfg.layers
        for layer in range(L):
            t = first[layer]
            starts = [t[0], t[1], t[2], t[3], t[4], first[layer + 1, 0]]
            for k, name in enumerate(names):
                phase_us[name].append((starts[k + 1] - starts[k]).item() / 1e3)
                split[name]["median"].append((done_med[layer, 6 + k] - starts[k]).item() / 1e3)
                split[name]["last"].append((done_max[layer, 6 + k] - starts[k]).item() / 1e3)
                split[name]["sync"].append((starts[k + 1] - done_max[layer, 6 + k]).item() / 1e3)
        ends = dec.stamps[:, L, 5].double()
        lm.append((ends.max() - first[L, 0]).item() / 1e3)
    del dec
    torch.cuda.synchronize()
    return {
        "ms_per_step": min(times),
        "ms_reps": times,
        "phase_us_per_layer": {k: statistics.median(v) for k, v in phase_us.items()},
        "lm_head_us": statistics.median(lm),
        "phase_split_us": {k: {m: statistics.median(v) for m, v in d.items()} for k, d in split.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--config-dir", default=None, help="an HF config.json directory (default: Qwen3-8B's shape)"
    )
    ap.add_argument(
        "--variants",
        nargs="+",
        default=[
            "rb=4,st=3,rp=1,pf=1,mg=4",  # the defaults (session 52)
            "rb=4,st=3,rp=0,pf=0,mg=0",  # session 51's form
            "rb=4,st=3,rp=1,pf=2,mg=4",
            "rb=4,st=3,rp=1,pf=1,mg=8",
            "rb=4,st=3,rp=1,pf=1,mg=8,ch=64",
        ],
    )
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--check-steps", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    base = QWEN3_8B
    if args.config_dir:
        from transformers import AutoConfig

        base = MegaConfig.from_hf(AutoConfig.from_pretrained(args.config_dir))
    base = replace(base, max_tokens=max(2048, args.prompt + args.steps + 64))
    t0 = time.time()
    w = random_weights(base, dev)
    weight_bytes = weight_bytes_of(w)
    bw = max(copy_bandwidth(), read_bandwidth())
    floor_ms = weight_bytes / bw * 1e3
    print(
        f"{torch.cuda.get_device_name()}: weights {weight_bytes / 1e9:.3f} GB, DRAM {bw / 1e12:.2f} TB/s, "
        f"floor {floor_ms:.3f} ms ({time.time() - t0:.0f} s setup)",
        flush=True,
    )
    rows = []
    for text in args.variants:
        cfg = parse_variant(text, base)
        t1 = time.time()
        try:
            err = check(cfg, w, args.check_steps)
        except RuntimeError as e:  # a wrong variant is reported and skipped; the others still run
            print(f"{text:24s} FAILED: {e}", flush=True)
            rows.append({"variant": text, "error": str(e)})
            continue
        r = timed(cfg, w, args.prompt, args.steps, args.reps)
        r.update(variant=text, check_rel_err=err, x_floor=r["ms_per_step"] / floor_ms)
        rows.append(r)
        ph = r["phase_us_per_layer"]
        print(
            f"{text:24s} {r['ms_per_step']:.3f} ms = {r['x_floor']:.3f}x floor | check {err:.2e} | us a layer: "
            + " ".join(f"{k} {v:.1f}" for k, v in ph.items())
            + f" = {sum(ph.values()):.1f} | LM head {r['lm_head_us']:.0f} us | {time.time() - t1:.0f} s",
            flush=True,
        )
        print(
            f"{'':24s} median / last program done, then the next phase's wait (us): "
            + " ".join(
                f"{k} {d['median']:.1f}/{d['last']:.1f}+{d['sync']:.1f}"
                for k, d in r["phase_split_us"].items()
            ),
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    **result_meta(),
                    "command": " ".join(sys.argv),
                    "floor_ms": floor_ms,
                    "dram_Bps": bw,
                    "weight_bytes": weight_bytes,
                    "prompt": args.prompt,
                    "steps": args.steps,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
