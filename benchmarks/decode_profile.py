"""Where a plain decode step's GPU time goes, against the weight-read floor (issue #6: 1.15x the floor at batch 1).

One decode step (all layers + LM head, fused Triton kernels, random weights) is captured in a CUDA graph and timed
by replaying it (the engine's graph path, without the host); the same step runs once more under torch.profiler
with input shapes recorded, so every GEMM is attributed its weight bytes and its achieved read rate. Printed:

  step GPU time (graph replay) vs floor = weight bytes / best DRAM rate measured here (a device copy's traffic
  or a reduction's read rate, as benchmarks/step_latency.py);
  per op: calls per step, GPU us, weight bytes, GB/s and % of the DRAM rate (GEMMs), share of the step;
  totals: GEMM time vs its own floor (the GEMMs' read efficiency), everything else (norm / RoPE+KV store /
  attention / SiLU-mul / argmax), and the gap = graph time - summed kernel time (launch gaps inside the graph).

    python benchmarks/decode_profile.py --config-dir .bench/qwen3-8b [--batch 1] [--context 512] [--out F.json]

Without CUDA it runs a 2-layer SmolLM2-shaped model through the same code for a CPU smoke test (no timings that
mean anything there).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from count_kernels import build, decode_inputs, smollm2  # noqa: E402

from specserve.config import ModelConfig  # noqa: E402

CUDA = torch.cuda.is_available()
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm")  # the innermost ops: linear / matmul call these


def dram_rate() -> float:
    """Best of a device copy's read+write traffic and a reduction's read rate (bytes/s)."""
    from step_latency import copy_bandwidth, read_bandwidth

    return max(copy_bandwidth(), read_bandwidth())


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads: every parameter, the embedding counted once (a row gather) unless it is tied to
    the LM head (then the head reads it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.embed_tokens.weight
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if head is None or head.data_ptr() != emb.data_ptr():
        total -= emb.numel() * emb.element_size()
    return total


def gemm_weight_bytes(shapes: list[Any], elsize: int) -> int:
    """The weight operand's bytes of a GEMM from its recorded input shapes (the larger 2-D operand)."""
    sizes = [int(torch.Size(s).numel()) for s in shapes if isinstance(s, (list, tuple)) and len(s) == 2]
    return max(sizes) * elsize if sizes else 0


def step_fn(model: Any, ids: torch.Tensor, pos: torch.Tensor, meta: Any):  # type: ignore[no-untyped-def]
    def step() -> torch.Tensor:
        return model.compute_logits(model(ids, pos, meta)[0]).argmax(-1)

    return step


def graph_ms(step, reps: int = 50) -> float:  # type: ignore[no-untyped-def]
    """Mean GPU time of one replay of the captured step (CUDA events around a batch of replays)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def profile_ops(step, elsize: int) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:  # type: ignore[no-untyped-def]
    """One profiled step: GEMM ops by input shapes (CPU ops with the GPU time of their kernels: calls, GPU us,
    weight bytes) and every kernel by name ([count, GPU us]). Triton kernels have no aten op above them, so
    "other" time is taken from the kernels (total) minus the GEMM ops, never from op rows (no double count)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    for _ in range(3):
        step()
    if CUDA:
        torch.cuda.synchronize()
    with profile(activities=acts, record_shapes=True) as prof:
        step()
        if CUDA:
            torch.cuda.synchronize()
    gemms = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in GEMM_OPS or e.device_type != torch.autograd.DeviceType.CPU:
            continue
        dev_us = float(getattr(e, "self_device_time_total", 0.0) or 0.0)
        gemms.append(
            dict(
                op=e.key,
                shapes=str(e.input_shapes),
                calls=int(e.count),
                gpu_us=dev_us,
                weight_bytes=gemm_weight_bytes(e.input_shapes, elsize) * int(e.count),
            )
        )
    kernels: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[ev.name]
            k[0] += 1
            k[1] += float(ev.time_range.elapsed_us())
    return sorted(gemms, key=lambda r: -r["gpu_us"]), dict(kernels)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config-dir", default=None, help="HF config.json dir (default: SmolLM2-135M shape)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512, help="tokens already in the KV cache")
    ap.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="host bound on the context the attention picks its split count from (default: the true context; "
        "the engine's graphs pass max_model_len, e.g. 4096)",
    )
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument(
        "--layers", type=int, default=None, help="override the layer count (default: the config's)"
    )
    ap.add_argument("--out", default=None, help="write the report as JSON")
    ap.add_argument(
        "--gemv-sweep",
        nargs="*",
        default=None,
        metavar="BN,BK,WARPS,STAGES[,fma]",
        help="also time the step with the nine-kernel layer (SPECSERVE_TRITON_GEMV=0), the six-kernel layer with "
        "its default launch config, and with each config given (none given: a default list)",
    )
    a = ap.parse_args()
    if a.config_dir:
        import transformers

        cfg = ModelConfig.from_hf(transformers.AutoConfig.from_pretrained(a.config_dir))
    else:
        cfg = smollm2(False)
    layers = a.layers or (cfg.num_hidden_layers if CUDA else 2)
    dtype = getattr(torch, a.dtype)
    ids, pos, meta, blocks = decode_inputs(a.batch, a.context, a.max_seq_len)
    model = build(cfg, layers, dtype, True, blocks)
    from specserve.layers.linear import transpose_decoder_linears, weight_layout

    layout = weight_layout("cuda" if CUDA else "cpu", cfg.hidden_size)  # the engine's choice for this target
    if layout == "kn":  # the projections stored transposed, as the engine does
        transpose_decoder_linears(model.layers)
    elsize = torch.empty((), dtype=dtype).element_size()
    wb = weight_bytes(model)
    step = step_fn(model, ids, pos, meta)
    with torch.inference_mode():
        gemms, kernels = profile_ops(step, elsize)
        g_ms = graph_ms(step) if CUDA else float("nan")
    rate = dram_rate() if CUDA else float("nan")
    floor_ms = 1e3 * wb / rate
    kernel_us = sum(v[1] for v in kernels.values())
    n_kernels = int(sum(v[0] for v in kernels.values()))
    gemm_us = sum(r["gpu_us"] for r in gemms)
    gemm_bytes = sum(r["weight_bytes"] for r in gemms)
    other_us = kernel_us - gemm_us
    name = torch.cuda.get_device_name() if CUDA else "cpu"
    print(
        f"{cfg.architecture} x {layers} layers, batch {a.batch}, context {a.context} (split count from "
        f"{meta.max_seq_len}), {a.dtype}, {name}, "
        f"weight layout {layout}"
    )
    from specserve.layers import triton_gemv

    six = layout == "nk" and ids.shape[0] <= triton_gemv.max_rows(ids.new_empty(0).float(), cfg.hidden_size)
    print(
        "layer: "
        + ("six kernels (Triton GEMVs with fused prologues)" if six else "nine kernels (cuBLAS GEMMs)")
        + f" [SPECSERVE_TRITON_GEMV={os.environ.get('SPECSERVE_TRITON_GEMV', 'auto')}]"
    )
    print(f"GEMM weight bytes / all weight bytes read: {gemm_bytes / wb:.4f} (should be ~1: norms are tiny)")
    print(f"weights {wb / 1e9:.3f} GB; DRAM rate {rate / 1e12:.2f} TB/s -> floor {floor_ms:.3f} ms")
    print(f"graph replay {g_ms:.3f} ms = {g_ms / floor_ms:.3f}x floor; {n_kernels} kernels per step")
    print(
        f"summed kernel time {kernel_us / 1e3:.3f} ms -> gaps inside the graph {g_ms - kernel_us / 1e3:.3f} ms"
    )
    gemm_floor_us = 1e6 * gemm_bytes / rate
    print(
        f"GEMMs {gemm_us / 1e3:.3f} ms for {gemm_bytes / 1e9:.3f} GB = {gemm_bytes / max(gemm_us, 1e-9) / 1e3:.0f} "
        f"GB/s ({100 * gemm_floor_us / max(gemm_us, 1e-9):.1f}% of the DRAM rate); other kernels "
        f"{other_us / 1e3:.3f} ms"
    )
    print(
        f"\n{'GEMM op':<10} {'input shapes':<58} {'calls':>5} {'GPU us':>9} {'us/call':>8} {'GB/s':>7} {'%DRAM':>6}"
    )
    for r in gemms:
        gbs = r["weight_bytes"] / r["gpu_us"] / 1e3 if r["gpu_us"] else float("nan")
        print(
            f"{r['op'][:10]:<10} {r['shapes'][:58]:<58} {r['calls']:>5} {r['gpu_us']:>9.1f} "
            f"{r['gpu_us'] / max(r['calls'], 1):>8.2f} {gbs:>7.0f} {100 * gbs * 1e9 / rate:>6.1f}"
        )
    print(f"\n{'kernel':<70} {'count':>5} {'GPU us':>9} {'us/call':>8} {'%step':>6}")
    for kname, (cnt, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:25]:
        print(
            f"{kname[:70]:<70} {int(cnt):>5} {us:>9.1f} {us / max(cnt, 1):>8.2f} {100 * us / 1e3 / g_ms:>6.1f}"
        )
    sweep = []
    if a.gemv_sweep is not None and CUDA:
        cfgs = ["nine-kernel", "default"] + (a.gemv_sweep or [
            "16,256,4,3", "16,256,4,2", "8,1024,4,1,fma", "8,1024,4,1,fma,1pass", "4,1024,4,1,fma",
            "4,1024,8,1,fma,1pass", "16,1024,8,1,1pass;16,256,4,2", "32,1024,8,1,1pass;16,256,4,2",
        ])  # fmt: skip

        def logits() -> torch.Tensor:
            with torch.inference_mode():
                return model.compute_logits(model(ids, pos, meta)[0]).float()

        saved = {k: os.environ.get(k) for k in ("SPECSERVE_TRITON_GEMV", "SPECSERVE_GEMV_CFG")}
        os.environ["SPECSERVE_TRITON_GEMV"] = "0"
        ref = logits()
        print("\nsix-kernel layer (SPECSERVE_TRITON_GEMV=1) per launch config vs the nine-kernel layer (=0):")
        for c in cfgs:
            os.environ["SPECSERVE_TRITON_GEMV"] = "0" if c == "nine-kernel" else "1"
            os.environ.pop("SPECSERVE_GEMV_CFG", None)
            if c not in ("nine-kernel", "default"):
                os.environ["SPECSERVE_GEMV_CFG"] = c
            try:
                with torch.inference_mode():
                    ms = graph_ms(step_fn(model, ids, pos, meta))
                got = logits()  # eager, same kernels: the values the graph computes
                rel = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
                same = bool((got.argmax(-1) == ref.argmax(-1)).all())
                err = None
            except Exception as e:  # noqa: BLE001 - a config that does not compile / fit: report it, go on
                ms, rel, same, err = float("nan"), float("nan"), False, f"{type(e).__name__}: {str(e)[:120]}"
            sweep.append(
                dict(
                    config=c,
                    graph_ms=ms,
                    x_floor=ms / floor_ms,
                    logits_max_rel_diff=rel,
                    same_argmax=same,
                    error=err,
                )
            )
            print(
                f"  {c:<16} {ms:.3f} ms = {ms / floor_ms:.3f}x floor; logits vs nine-kernel: "
                f"max rel diff {rel:.2e}, same argmax {same}" + (f"  {err}" if err else "")
            )
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    report = dict(
        command="python " + " ".join(sys.argv),
        git=os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip(),
        device=name,
        config=cfg.architecture,
        layers=layers,
        batch=a.batch,
        context=a.context,
        max_seq_len=meta.max_seq_len,
        dtype=a.dtype,
        weight_layout=layout,
        six_kernel_layer=six,
        weight_bytes=wb,
        dram_Bps=rate,
        floor_ms=floor_ms,
        graph_ms=g_ms,
        x_floor=g_ms / floor_ms,
        kernel_ms=kernel_us / 1e3,
        gemm_ms=gemm_us / 1e3,
        gemm_bytes=gemm_bytes,
        other_ms=other_us / 1e3,
        kernels_per_step=n_kernels,
        gemms=gemms,
        kernels={k: {"count": int(v[0]), "us": v[1]} for k, v in kernels.items()},
        gemv_sweep=sweep,
        time=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
