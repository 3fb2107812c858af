"""GPU check of the add + RMSNorms folded into the Triton split-K GEMMs (``SPECSERVE_FUSED_NORM``, issue #6) on the
Qwen3-8B decode shapes, bf16, 1 and 16 rows:

    python benchmarks/fused_norm_check.py [--replays 200] [--out FILE]

* ``splitk_add`` (o_proj 4096 -> 4096, down 12288 -> 4096, 8 splits: the last program of each output block sums the
  partials, adds the residual, writes the block's sums of squares) against ``splitk_partials`` + the add + RMSNorm
  kernel: h must be bit-identical, the sums of squares equal h's up to fp32 order, the arrival counters back at 0;
* the RMSNorm prologue (``NormIn``) of qkv (4096 -> 6144, 8 splits) and gate_up + SiLU-mul (4096 -> 2 x 12288)
  against ``rms_norm`` + the plain kernels (max abs difference; bf16 rounding of a different fp32 order);
* the whole chain (o + add, gate_up with the norm, down + add, qkv with the norm) captured in one CUDA graph and
  replayed ``--replays`` times with fresh inputs each time: every replay's outputs equal an eager run's bit for bit
  (the arrival counters and the last-arriver reduction race-free and deterministic);
* per-layer timing (36 distinct weight sets per graph, cold reads) of the chain o, gate_up + SiLU-mul, down, qkv:
  ``unfused`` (``SPECSERVE_FUSED_NORM=0``: add + RMSNorm kernels summing the partials), ``epilogue`` (``=1``: the
  add epilogues, separate ``rms_norm`` kernels) and ``exact`` (``=2``: the epilogues and the norm prologues).
"""

# ruff: noqa: B023, E741  (closures captured into a graph inside their loop iteration; I = intermediate size)
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_attention_kernels import capture  # noqa: E402
from step_latency import result_meta  # noqa: E402

import specserve.layers.triton_attention as ta  # noqa: E402
import specserve.layers.triton_splitk as ts  # noqa: E402
from specserve.layers.triton_fused import fused_add_rms_norm_partials, rms_norm, silu_mul  # noqa: E402

H, I, QKV, S = 4096, 12288, 6144, 8
LAYERS = 36


def weights(gen: torch.Generator) -> dict[str, torch.Tensor]:
    def w(k: int, n: int) -> torch.Tensor:
        return (torch.randn(k, n, generator=gen, device="cuda") / k**0.5).bfloat16()

    return {"qkv": w(H, QKV), "o": w(H, H), "gate_up": w(H, 2 * I), "down": w(I, H)}


def gate_up_plain(x, W):  # type: ignore[no-untyped-def]
    """The engine's gate_up + SiLU-mul without the fused norm: cuBLAS + ``silu_mul`` at one row, else Triton."""
    if x.shape[0] < ts.gate_up_min_rows():
        return silu_mul(torch.matmul(x, W["gate_up"]), I)
    return ts.gate_up_silu(x, W["gate_up"], I)


def fused_chain(a, entering, ssq, W, ln, pn):  # type: ignore[no-untyped-def]
    """``SPECSERVE_FUSED_NORM=2``: o + add, gate_up + SiLU-mul (with the norm prologue from 2 rows, else
    ``rms_norm`` + the engine's one-row gate_up), down + add, qkv with the norm prologue."""
    after, ssq2 = ts.splitk_add(a, W["o"], S, "o", entering)
    if a.shape[0] >= ts.gate_up_min_rows():
        s = ts.gate_up_silu(after, W["gate_up"], I, ts.NormIn(ssq2, pn, 1e-6))
    else:
        s = gate_up_plain(rms_norm(after, pn, 1e-6), W)
    nxt, ssq3 = ts.splitk_add(s, W["down"], S, "down", after)
    qkv = ts.splitk_partials(nxt, W["qkv"], S, "qkv", ts.NormIn(ssq3, ln, 1e-6))
    return after, nxt, ssq3, qkv


def epilogue_chain(a, entering, W, ln, pn):  # type: ignore[no-untyped-def]
    """The add epilogues with separate ``rms_norm`` kernels (no norm prologue)."""
    after, _ = ts.splitk_add(a, W["o"], S, "o", entering)
    s = gate_up_plain(rms_norm(after, pn, 1e-6), W)
    nxt, _ = ts.splitk_add(s, W["down"], S, "down", after)
    qkv = ts.splitk_partials(rms_norm(nxt, ln, 1e-6), W["qkv"], S, "qkv")
    return after, nxt, qkv


def unfused_chain(a, entering, W, ln, pn):  # type: ignore[no-untyped-def]
    """The engine's default: partials summed by the add + RMSNorm kernels."""
    normed, after = fused_add_rms_norm_partials(ts.splitk_partials(a, W["o"], S, "o"), entering, pn, 1e-6)
    s = gate_up_plain(normed, W)
    normed2, nxt = fused_add_rms_norm_partials(ts.splitk_partials(s, W["down"], S, "down"), after, ln, 1e-6)
    qkv = ts.splitk_partials(normed2, W["qkv"], S, "qkv")
    return after, nxt, qkv


def graph_us(fn, reps: int = 20) -> float:  # type: ignore[no-untyped-def]
    """Best of 5 timings of ``reps`` replays of ``fn`` captured in a CUDA graph, us per replay."""
    g = capture(fn)
    g.replay()  # a warm replay before timing
    best = float("inf")
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        best = min(best, 1e3 * e0.elapsed_time(e1) / reps)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--out", default="benchmarks/results/fused_norm_check.json")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    W = weights(gen)
    ln = (torch.rand(H, generator=gen, device="cuda") + 0.5).bfloat16()
    pn = (torch.rand(H, generator=gen, device="cuda") + 0.5).bfloat16()
    rows_out = []
    ok = True
    for m in (1, 16):
        a = torch.randn(m, H, generator=gen, device="cuda").bfloat16()
        entering = torch.randn(m, H, generator=gen, device="cuda").bfloat16()
        # 1. the epilogue and the prologues against the kernels they replace
        out = ts.splitk_add(a, W["o"], S, "o", entering)
        normed, h_ref = fused_add_rms_norm_partials(ts.splitk_partials(a, W["o"], S, "o"), entering, pn, 1e-6)
        h_equal = torch.equal(out.h, h_ref)
        hf = out.h.float()
        ssq_err = (out.ssq.sum(1) - (hf * hf).sum(1)).abs().max().item() / (hf * hf).sum(1).max().item()
        counters_zero = not ta._merge_counters(a.device, 1)[:64].any().item()
        nin = ts.NormIn(out.ssq, pn, 1e-6)
        gu_diff = (ts.gate_up_silu(out.h, W["gate_up"], I, nin).float() - ts.gate_up_silu(normed, W["gate_up"], I).float()).abs().max().item()  # fmt: skip
        qkv_diff = (ts.splitk_partials(out.h, W["qkv"], S, "qkv", nin) - ts.splitk_partials(normed, W["qkv"], S, "qkv")).abs().max().item()  # fmt: skip
        # 2. the chain in one graph, replayed with fresh inputs: bit-identical to eager every time
        # any valid sums of squares as the chain's input
        ssq0 = ts.splitk_add(a, W["o"], S, "o", entering).ssq
        bufs = {"a": a.clone(), "e": entering.clone(), "q": ssq0.clone()}
        res: dict[str, object] = {}

        def chain() -> None:
            res["out"] = fused_chain(bufs["a"], bufs["e"], bufs["q"], W, ln, pn)

        g = capture(chain)
        mismatches = 0
        for _ in range(args.replays):
            bufs["a"].copy_(torch.randn(m, H, generator=gen, device="cuda").bfloat16())
            bufs["e"].copy_(torch.randn(m, H, generator=gen, device="cuda").bfloat16())
            g.replay()
            got = [t.clone() for t in res["out"]]  # type: ignore[union-attr]
            want = fused_chain(bufs["a"].clone(), bufs["e"].clone(), bufs["q"], W, ln, pn)
            mismatches += sum(not torch.equal(x, y) for x, y in zip(got, want))
        torch.cuda.synchronize()
        # 3. timing: 36 distinct weight sets per graph
        Ws = [W] + [weights(gen) for _ in range(LAYERS - 1)]
        q0 = ssq0

        def run(kind: str) -> None:
            e, q = entering, q0
            for Wl in Ws:
                if kind == "unfused":
                    _, e, _ = unfused_chain(a, e, Wl, ln, pn)
                elif kind == "epilogue":
                    _, e, _ = epilogue_chain(a, e, Wl, ln, pn)
                else:
                    _, e, q, _ = fused_chain(a, e, q, Wl, ln, pn)

        times = {
            k: round(graph_us(lambda k=k: run(k), 5) / LAYERS, 2) for k in ("unfused", "epilogue", "exact")
        }
        Ws.clear()
        torch.cuda.empty_cache()
        row = {"rows": m, "h_bit_identical": h_equal, "ssq_rel_err": ssq_err, "counters_zero": counters_zero,
               "gate_up_max_abs_diff": gu_diff, "qkv_partials_max_abs_diff": qkv_diff,
               "graph_replays": args.replays, "replay_mismatches": mismatches,
               "us_per_layer_chain": times}  # fmt: skip
        ok &= h_equal and counters_zero and mismatches == 0 and ssq_err < 1e-5
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result_meta(), "rows": rows_out, "ok": ok}, indent=2))
    print("OK" if ok else "FAILED", f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
