"""Decode GEMM read efficiency per weight layout and cuBLAS setting (issue #6: 1.15x the floor needs the GEMMs at
>= ~93% of the DRAM rate; session 5 measured o_proj 64%, qkv 76%, down 80%, gate_up 95%, LM head 98%).

For each decode GEMM shape of a model (Qwen3-8B by default: qkv, o_proj, gate_up, down, LM head) and each row
count M, L distinct weights (one per layer, so the weights come from DRAM, not L2) are multiplied in one CUDA graph;
the graph's replay time per GEMM gives the achieved read rate. Variants (all compute ``x @ W.T`` for the same W):

  linear     F.linear(x, W), W [N, K] row-major: the engine's layout today (cuBLAS "TN")
  mm_t       x @ Wt, Wt = W.T made contiguous [K, N] at load time (cuBLAS "NN": other kernels, other split-K)
  linear_fr  F.linear with torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
  gemv       specserve's Triton skinny GEMM (``SPECSERVE_GEMV_CFG`` configs, --gemv-cfg; M <= 16)

Every variant's output is checked against ``linear`` (max relative difference). Prints a table, writes JSON:

    python benchmarks/gemm_layouts.py [--config-dir .bench/qwen3-8b] [--rows 1 4 8 16] [--out F.json]

Without CUDA it runs tiny shapes for a smoke test (values only; the timings mean nothing there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_profile import dram_rate, graph_ms  # noqa: E402

CUDA = torch.cuda.is_available()


def shapes(cfg: Any) -> dict[str, tuple[int, int]]:
    """(N, K) of each decode GEMM of a decoder layer (+ the LM head) from an HF config."""
    h = cfg.hidden_size
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    d = getattr(cfg, "head_dim", None) or h // heads
    return {
        "qkv": ((heads + 2 * kv) * d, h),
        "o_proj": (h, heads * d),
        "gate_up": (2 * cfg.intermediate_size, h),
        "down": (h, cfg.intermediate_size),
        "lm_head": (cfg.vocab_size, h),
    }


def time_per_call(fns: list[Callable[[], Any]], reps: int = 20) -> float:
    """Seconds per call of one CUDA graph replaying every fn once (decode_profile.graph_ms over all of them)."""

    def all_fns() -> None:
        for f in fns:
            f()

    return graph_ms(all_fns, reps) / 1e3 / len(fns)


class _ReducedPrecision:
    """Context: allow_bf16_reduced_precision_reduction set to ``value`` (cuBLAS may pick other kernels)."""

    def __init__(self, value: bool) -> None:
        self.value = value

    def __enter__(self) -> None:
        m = torch.backends.cuda.matmul
        self.old = m.allow_bf16_reduced_precision_reduction
        m.allow_bf16_reduced_precision_reduction = self.value

    def __exit__(self, *exc: object) -> None:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = self.old


def run_shape(
    name: str, n: int, k: int, m: int, layers: int, dtype: torch.dtype, gemv_cfgs: list[str], rate: float
) -> list[dict[str, Any]]:
    dev = "cuda" if CUDA else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    ws = [torch.randn(n, k, device=dev, dtype=dtype, generator=g) * k**-0.5 for _ in range(layers)]
    x = torch.randn(m, k, device=dev, dtype=dtype, generator=g)
    ref = F.linear(x, ws[0]).float()
    elsize = ws[0].element_size()
    rows: list[dict[str, Any]] = []

    def add(
        variant: str, fns: list[Callable[[], Any]], first: Callable[[], torch.Tensor], ctx: Any = None
    ) -> None:
        err: str | None = None
        try:
            if ctx is not None:
                ctx.__enter__()
            try:
                got = first().float()
                rel = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
                sec = time_per_call(fns) if CUDA else float("nan")
            finally:
                if ctx is not None:
                    ctx.__exit__(None, None, None)
        except Exception as e:  # noqa: BLE001 - a variant that does not compile / fit: report it, go on
            rel, sec, err = float("nan"), float("nan"), f"{type(e).__name__}: {str(e)[:100]}"
        gbs = n * k * elsize / sec / 1e9 if sec == sec else float("nan")
        rows.append(
            dict(
                gemm=name,
                n=n,
                k=k,
                m=m,
                variant=variant,
                us=sec * 1e6,
                gb_s=gbs,
                pct_dram=100 * gbs * 1e9 / rate if rate == rate else float("nan"),
                max_rel_diff=rel,
                error=err,
            )  # fmt: skip
        )

    add("linear", [lambda w=w: F.linear(x, w) for w in ws], lambda: F.linear(x, ws[0]))
    wts = [w.t().contiguous() for w in ws]
    del ws[1:]  # keep memory at ~2 copies
    add("mm_t", [lambda w=w: x @ w for w in wts], lambda: x @ wts[0])
    del wts[1:]
    ws[1:] = [torch.randn(n, k, device=dev, dtype=dtype, generator=g) * k**-0.5 for _ in range(layers - 1)]
    if dtype == torch.bfloat16:
        add(
            "linear_fr",
            [lambda w=w: F.linear(x, w) for w in ws],
            lambda: F.linear(x, ws[0]),
            _ReducedPrecision(False),
        )
    if m <= 16 and gemv_cfgs:
        from specserve.layers.triton_gemv import gemv

        for c in gemv_cfgs:
            os.environ["SPECSERVE_GEMV_CFG"] = c
            add(f"gemv {c}", [lambda w=w: gemv(x, w) for w in ws], lambda: gemv(x, ws[0])[0])
        os.environ.pop("SPECSERVE_GEMV_CFG", None)
    ws.clear()
    wts.clear()
    if CUDA:
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config-dir", default=None, help="HF config.json dir (default: Qwen3-8B's shape)")
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 4, 8, 16])
    ap.add_argument(
        "--layers", type=int, default=None, help="distinct weights per graph (default: the model's)"
    )
    ap.add_argument("--gemms", nargs="+", default=None, help="subset of qkv o_proj gate_up down lm_head")
    ap.add_argument("--gemv-cfg", nargs="*", default=["16,512,8,3,fma", "16,256,4,3,fma"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.config_dir:
        import transformers

        cfg = transformers.AutoConfig.from_pretrained(a.config_dir)
    else:
        from types import SimpleNamespace

        cfg = SimpleNamespace(
            hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            intermediate_size=12288, vocab_size=151936, num_hidden_layers=36,
        )  # fmt: skip
    dtype = getattr(torch, a.dtype)
    table = shapes(cfg)
    if not CUDA:  # smoke test: the same code on tiny shapes
        table = {k: (max(8, n // 64), max(8, kk // 64)) for k, (n, kk) in table.items()}
        os.environ.setdefault("TRITON_INTERPRET", "1")
    layers = a.layers or (cfg.num_hidden_layers if CUDA else 2)
    rate = dram_rate() if CUDA else float("nan")
    name = torch.cuda.get_device_name() if CUDA else "cpu"
    print(f"{name}, {a.dtype}, DRAM rate {rate / 1e12:.2f} TB/s, {layers} distinct weights per graph")
    print(
        f"{'gemm':<8} {'N':>6} {'K':>6} {'M':>3} {'variant':<20} {'us':>8} {'GB/s':>7} {'%DRAM':>6} {'rel diff':>9}"
    )
    rows: list[dict[str, Any]] = []
    for gname, (n, k) in table.items():
        if a.gemms and gname not in a.gemms:
            continue
        nl = 1 if gname == "lm_head" else layers
        for m in a.rows:
            for r in run_shape(gname, n, k, m, nl, dtype, a.gemv_cfg, rate):
                rows.append(r)
                print(
                    f"{gname:<8} {n:>6} {k:>6} {m:>3} {r['variant'][:20]:<20} {r['us']:>8.2f} {r['gb_s']:>7.0f} "
                    f"{r['pct_dram']:>6.1f} {r['max_rel_diff']:>9.1e}"
                    + (f"  {r['error']}" if r["error"] else ""),
                    flush=True,
                )
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(
                dict(
                    command="python " + " ".join(sys.argv),
                    device=name,
                    dtype=a.dtype,
                    dram_Bps=rate,
                    layers=layers,
                    rows=rows,
                    time=time.strftime("%Y-%m-%d %H:%M:%S"),
                ),  # fmt: skip
                f,
                indent=1,
                default=float,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
