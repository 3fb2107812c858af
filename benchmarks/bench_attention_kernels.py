#!/usr/bin/env python
"""GPU benchmark and check of the Triton paged-attention and KV-store kernels against the torch reference.

    python benchmarks/bench_attention_kernels.py            # full table (~1-2 min on an H200)
    python benchmarks/bench_attention_kernels.py --quick    # fewer shapes
    python benchmarks/bench_attention_kernels.py --sweep    # + tile configs / split counts (~3-5 min more)

For each shape (bf16, block_size 16, shuffled block tables) it checks Triton against ``paged_attention_ref``
(and a CUDA-graph replay against eager, including a replay with new metadata written in place), then times with
``triton.testing.do_bench`` (L2 flushed between calls): eager call, CUDA-graph replay of one call, the same with
split-KV disabled, and dense non-paged SDPA over contiguous K/V as a side-by-side baseline. GB/s counts the K/V
bytes each call must read; "%copy" compares it with the measured device-to-device copy bandwidth.
Both split merges (``SPECSERVE_ATTN_MERGE``) are checked and timed: ``fused`` (opt-in; eager_us, graph_us)
merges in the attention kernel, ``kernel`` (the default; kmerge_us) with a second launch; graphs are checked again after
the timing replays (the fused merge's arrival counters must be back at 0 after every replay).
Results go to benchmarks/results/attention_kernels_<gpu>_<time>.json with the command, git revision and GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from specserve.layers import triton_attention as ta  # noqa: E402
from specserve.layers.attention_ref import paged_attention_ref, store_kv_ref  # noqa: E402

MODELS = {"Qwen3-8B": (32, 8, 128), "SmolLM2-135M": (9, 3, 64)}  # num_heads, num_kv_heads, head_dim
BLOCK_SIZE = 16
DTYPE = torch.bfloat16


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
        ).stdout
        return (rev or "no-commit") + ("-dirty" if dirty.strip() else "")
    except OSError:
        return "unknown"


def bench_us(fn: Callable[[], Any], warmup: int = 10, rep: int = 40) -> float:
    return float(do_bench(fn, warmup=warmup, rep=rep)) * 1e3


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB: (read + write) bytes / time."""
    src = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    us = bench_us(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (us * 1e-6) / 1e9


def capture(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph:
    """Capture ``fn`` (already warmed up / compiled) in a CUDA graph; a host sync inside would raise here."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


MERGES = ("fused", "kernel")  # SPECSERVE_ATTN_MERGE values (the default is "kernel")


@contextlib.contextmanager
def merge_mode(mode: str) -> Iterator[None]:
    """Select the split merge of ``paged_attention`` (read per call, so also what a capture records)."""
    old = os.environ.get(ta.MERGE_ENV)
    os.environ[ta.MERGE_ENV] = mode
    try:
        yield
    finally:
        if old is None:
            del os.environ[ta.MERGE_ENV]
        else:
            os.environ[ta.MERGE_ENV] = old


def make_paged(
    b: int, q_len: int, seq_len: int, h: int, hk: int, d: int, gen: torch.Generator
) -> dict[str, Any]:
    nb_per = triton.cdiv(seq_len, BLOCK_SIZE)
    num_blocks = b * nb_per + 8
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, hk, d, device="cuda", dtype=DTYPE, generator=gen)
    v_cache = torch.randn(num_blocks, BLOCK_SIZE, hk, d, device="cuda", dtype=DTYPE, generator=gen)
    perm = torch.randperm(num_blocks, device="cuda", generator=gen)[: b * nb_per]
    block_tables = perm.view(b, nb_per).to(torch.int32)
    return {
        "q": torch.randn(b * q_len, h, d, device="cuda", dtype=DTYPE, generator=gen),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "query_start_loc": torch.arange(0, b * q_len + 1, q_len, device="cuda", dtype=torch.int32),
        "seq_lens": torch.full((b,), seq_len, device="cuda", dtype=torch.int32),
        "block_tables": block_tables,
    }


def run_attention(args: argparse.Namespace, copy_gbs: float) -> tuple[list[dict[str, Any]], bool]:
    rows: list[dict[str, Any]] = []
    ok = True
    batches = [1, 8] if args.quick else [1, 2, 4, 8]
    header = (
        f"{'model':13s} {'B':>2s} {'q':>3s} {'seq':>5s} {'hint':>5s} {'splits':>6s} {'max_err':>8s} "
        f"{'eager_us':>9s} {'graph_us':>9s} {'GB/s':>7s} {'%copy':>6s} {'kmerge_us':>9s} {'nosplit_us':>10s} "
        f"{'sdpa_us':>8s}"
    )
    # max_seq_len hint = the context, and (as CUDA-graph buckets pass it) the model's maximum length, which
    # picks more splits than the context fills: most of them are empty
    seq_hints = [(s, s) for s in (512, 4096)]
    seq_hints += [(s, args.max_model_len) for s in (512, 4096) if args.max_model_len > s]
    print("\npaged_attention (bf16, block_size 16, causal; times per call; GB/s = K/V bytes / graph time;")
    print("hint = max_seq_len passed; graph_us: fused split merge, kmerge_us: merge kernel)")
    print(header)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for model, (h, hk, d) in MODELS.items():
        for b in batches:
            for q_len in (1, 16):
                for seq_len, hint in seq_hints:
                    m = make_paged(b, q_len, seq_len, h, hk, d, gen)
                    meta = (m["query_start_loc"], m["seq_lens"], m["block_tables"])
                    kw = {"max_query_len": q_len, "max_seq_len": hint}
                    out = torch.empty_like(m["q"])
                    call = lambda m=m, meta=meta, kw=kw, out=out: ta.paged_attention(
                        m["q"], m["k_cache"], m["v_cache"], *meta, out=out, **kw
                    )
                    call_nosplit = lambda m=m, meta=meta, kw=kw: ta.paged_attention(
                        m["q"], m["k_cache"], m["v_cache"], *meta, num_splits=1, **kw
                    )
                    ref = paged_attention_ref(m["q"], m["k_cache"], m["v_cache"], *meta)

                    def max_err(x: torch.Tensor, ref: torch.Tensor = ref) -> float:
                        return (x.float() - ref.float()).abs().max().item()

                    errs: dict[str, dict[str, float]] = {}
                    graphs: dict[str, torch.cuda.CUDAGraph] = {}
                    graph_times: dict[str, float] = {}
                    for merge in MERGES:
                        with merge_mode(merge):
                            out.zero_()
                            call()
                            e = {"eager": max_err(out)}
                            graphs[merge] = g = capture(call)
                        out.zero_()
                        g.replay()
                        torch.cuda.synchronize()
                        e["graph"] = max_err(out)
                        errs[merge] = e
                    err_ns = max_err(call_nosplit())
                    cfg = ta.select_attention_config(h, hk, d, q_len)
                    q_tiles = triton.cdiv(q_len, cfg.queries_per_tile)
                    splits = ta._pick_num_splits(m["q"].device, b * hk * q_tiles, cfg.block_n, hint, q_len)
                    with merge_mode(MERGES[0]):
                        eager_us = bench_us(call)
                    for merge, g in graphs.items():
                        graph_times[merge] = bench_us(g.replay)
                        # after hundreds of replays (the fused merge's counters reset by every launch)
                        out.zero_()
                        g.replay()
                        torch.cuda.synchronize()
                        errs[merge]["graph_after_bench"] = max_err(out)
                    err = errs[MERGES[0]]["eager"]
                    err_graph = errs[MERGES[0]]["graph"]
                    good = max([err_ns] + [v for e in errs.values() for v in e.values()]) < 2e-2
                    ok &= good
                    graph_us, kmerge_us = graph_times["fused"], graph_times["kernel"]
                    g_ns = capture(call_nosplit)
                    nosplit_us = bench_us(g_ns.replay)
                    # Dense, non-paged baseline over contiguous K/V (non-causal; same bytes read).
                    qd = m["q"].view(b, q_len, h, d).transpose(1, 2)
                    kd = torch.randn(b, hk, seq_len, d, device="cuda", dtype=DTYPE)
                    vd = torch.randn_like(kd)
                    try:
                        sdpa = torch.nn.functional.scaled_dot_product_attention
                        sdpa_us = bench_us(functools.partial(sdpa, qd, kd, vd, enable_gqa=True))
                    except RuntimeError:
                        sdpa_us = float("nan")
                    kv_bytes = 2 * b * seq_len * hk * d * m["k_cache"].element_size()
                    gbs = kv_bytes / (graph_us * 1e-6) / 1e9
                    row = {
                        "model": model, "num_heads": h, "num_kv_heads": hk, "head_dim": d, "batch": b,
                        "q_len": q_len, "seq_len": seq_len, "max_seq_len_hint": hint, "num_splits": splits,
                        "config": repr(cfg),
                        "max_abs_err": err, "max_abs_err_nosplit": err_ns, "max_abs_err_graph": err_graph,
                        "max_abs_err_by_merge": errs, "merge": MERGES[0],
                        "ok": good, "eager_us": eager_us, "graph_us": graph_us, "graph_nosplit_us": nosplit_us,
                        "graph_kernel_merge_us": kmerge_us, "graph_us_by_merge": graph_times,
                        "sdpa_dense_us": sdpa_us, "kv_bytes": kv_bytes, "kv_gbs": gbs,
                        "pct_of_copy_bw": 100 * gbs / copy_gbs,
                    }  # fmt: skip
                    rows.append(row)
                    flag = "" if good else "  <-- MISMATCH"
                    print(
                        f"{model:13s} {b:2d} {q_len:3d} {seq_len:5d} {hint:5d} {splits:6d} {err:8.1e} "
                        f"{eager_us:9.1f} {graph_us:9.1f} {gbs:7.0f} {100 * gbs / copy_gbs:5.0f}% {kmerge_us:9.1f} "
                        f"{nosplit_us:10.1f} {sdpa_us:8.1f}{flag}",
                        flush=True,
                    )
                    del g, g_ns, graphs
    return rows, ok


def check_graph_replay_new_metadata() -> bool:
    """Capture once, then rewrite seq_lens / block tables / query_start_loc in place and replay."""
    ok = True
    gen = torch.Generator(device="cuda").manual_seed(1)
    for (model, (h, hk, d)), merge in itertools.product(MODELS.items(), MERGES):
        b, q_len, seq_len = 4, 5, 600
        m = make_paged(b, q_len, seq_len, h, hk, d, gen)
        qsl, sl, bt = m["query_start_loc"], m["seq_lens"], m["block_tables"]
        out = torch.zeros_like(m["q"])
        call = functools.partial(
            ta.paged_attention, m["q"], m["k_cache"], m["v_cache"], qsl, sl, bt,
            max_query_len=q_len, max_seq_len=seq_len, out=out,
        )  # fmt: skip
        with merge_mode(merge):
            g = capture(call)
        # New step: q_lens 5, 1, 3, 0 (padded), new lengths, blocks of request 0 and 1 swapped.
        qsl.copy_(torch.tensor([0, 5, 6, 9, 9], dtype=torch.int32))
        sl.copy_(torch.tensor([37, 599, 256, 0], dtype=torch.int32))
        bt.copy_(bt[[1, 0, 2, 3]].clone())
        out.zero_()
        g.replay()
        ref = paged_attention_ref(m["q"], m["k_cache"], m["v_cache"], qsl, sl, bt)
        err = (out[:9].float() - ref[:9].float()).abs().max().item()
        good = err < 2e-2
        ok &= good
        print(
            f"graph replay with new metadata ({model}, {merge} merge): max_abs_err {err:.1e} "
            f"{'ok' if good else 'MISMATCH'}"
        )
    return ok


def check_fused_merge_stress(iters: int) -> tuple[dict[str, Any], bool]:
    """Many graph replays of the fused split merge with new metadata each time (so stale partials from the
    previous replay would show), against the merge-kernel graph on the same inputs; each fused replay is run
    twice (bit-identical, else a race), and every arrival counter must be 0 at the end."""
    ok = True
    worst = 0.0
    gen = torch.Generator(device="cuda").manual_seed(4)
    h, hk, d = MODELS["Qwen3-8B"]
    cases = [(1, 1, None), (4, 1, None), (3, 5, 64), (8, 16, None), (2, 3, 16)]  # B, max q_len, num_splits
    for b, q_len, splits in cases:
        seq_max = 8192
        m = make_paged(b, q_len, seq_max, h, hk, d, gen)
        qsl, sl = m["query_start_loc"], m["seq_lens"]
        outs = {merge: torch.zeros_like(m["q"]) for merge in MERGES}
        graphs = {}
        for merge in MERGES:
            with merge_mode(merge):
                graphs[merge] = capture(
                    functools.partial(
                        ta.paged_attention,
                        m["q"],
                        m["k_cache"],
                        m["v_cache"],
                        qsl,
                        sl,
                        m["block_tables"],
                        max_query_len=q_len,
                        max_seq_len=32768,
                        out=outs[merge],
                        num_splits=splits,
                    )  # fmt: skip
                )
        for it in range(iters):
            q_lens = torch.randint(0, q_len + 1, (b,), generator=gen, device="cuda")
            qsl[1:].copy_(torch.cumsum(q_lens, 0).to(torch.int32))
            # short and long contexts, some exactly on a 64-key tile boundary, some padded (seq_len 0)
            lens = torch.randint(1, seq_max + 1, (b,), generator=gen, device="cuda")
            lens = torch.where(lens % 3 == 0, lens % 300 + q_lens, lens)
            lens = torch.where(lens % 5 == 0, (lens // 64).clamp(min=1) * 64, lens)
            lens = torch.where(lens % 7 == 0, torch.zeros_like(lens), lens)
            sl.copy_(torch.where(lens == 0, lens, torch.maximum(lens, q_lens)).to(torch.int32))
            for merge in MERGES:
                outs[merge].fill_(float("nan"))
                graphs[merge].replay()
            first = outs["fused"].clone()
            outs["fused"].fill_(float("nan"))
            graphs["fused"].replay()
            torch.cuda.synchronize()
            n = int(qsl[-1])
            err = (outs["fused"][:n].float() - outs["kernel"][:n].float()).abs().max().item() if n else 0.0
            same = torch.equal(first[:n], outs["fused"][:n])
            if it % 25 == 0:
                ref = paged_attention_ref(m["q"], m["k_cache"], m["v_cache"], qsl, sl, m["block_tables"])
                err = max(err, (outs["fused"][:n].float() - ref[:n].float()).abs().max().item() if n else 0.0)
            good = same and err == err and err < 2e-2
            worst = max(worst, err) if err == err else float("inf")
            if not good:
                print(
                    f"  stress mismatch: B={b} q={q_len} splits={splits} iter {it}: err {err:.1e} same {same}"
                )
            ok &= good
        del graphs
    torch.cuda.synchronize()
    counters = ta._merge_counters(torch.device("cuda"), 1)
    left = int(torch.count_nonzero(counters))
    ok &= left == 0
    print(
        f"fused split merge stress ({len(cases)} shapes x {iters} replays with new metadata): max_abs_err vs "
        f"merge kernel / ref {worst:.1e}, counters left non-zero {left}: {'ok' if ok else 'FAILED'}"
    )
    return {"iters": iters, "cases": cases, "max_abs_err": worst, "counters_nonzero": left, "ok": ok}, ok


def run_store_kv(args: argparse.Namespace, copy_gbs: float) -> tuple[list[dict[str, Any]], bool]:
    rows: list[dict[str, Any]] = []
    ok = True
    print("\nstore_kv (bf16; GB/s = bytes read + written / graph time)")
    print(
        f"{'model':13s} {'T':>5s} {'exact':>5s} {'eager_us':>9s} {'graph_us':>9s} {'GB/s':>7s} {'torch_us':>9s}"
    )
    gen = torch.Generator(device="cuda").manual_seed(2)
    for model, (h, hk, d) in MODELS.items():
        num_blocks = 4096
        for t in [1, 8, 40] if args.quick else [1, 8, 40, 128, 512, 2048]:
            qkv = torch.randn(t, h + 2 * hk, d, device="cuda", dtype=DTYPE, generator=gen)
            k, v = qkv[:, h : h + hk], qkv[:, h + hk :]  # strided views, as the model produces them
            slots = torch.randperm(num_blocks * BLOCK_SIZE, device="cuda", generator=gen)[:t]
            slots[::7] = -1
            caches = [
                torch.zeros(num_blocks, BLOCK_SIZE, hk, d, device="cuda", dtype=DTYPE) for _ in range(4)
            ]
            call = functools.partial(ta.store_kv, k, v, caches[0], caches[1], slots)
            call()
            store_kv_ref(k, v, caches[2], caches[3], slots)
            exact = torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
            ok &= exact
            g = capture(call)
            eager_us = bench_us(call)
            graph_us = bench_us(g.replay)
            torch_us = bench_us(functools.partial(store_kv_ref, k, v, caches[2], caches[3], slots))
            nbytes = 2 * 2 * int((slots >= 0).sum()) * hk * d * k.element_size()
            gbs = nbytes / (graph_us * 1e-6) / 1e9
            rows.append(
                {
                    "model": model,
                    "num_kv_heads": hk,
                    "head_dim": d,
                    "tokens": t,
                    "exact": exact,
                    "eager_us": eager_us,
                    "graph_us": graph_us,
                    "torch_ref_us": torch_us,
                    "bytes": nbytes,
                    "gbs": gbs,
                    "pct_of_copy_bw": 100 * gbs / copy_gbs,
                }  # fmt: skip
            )
            print(
                f"{model:13s} {t:5d} {exact!s:>5s} {eager_us:9.1f} {graph_us:9.1f} {gbs:7.0f} {torch_us:9.1f}"
            )
    return rows, ok


def run_sweep(seqs: tuple[int, ...] = (4096,)) -> list[dict[str, Any]]:
    """Decode/verify tile configs and split counts at the extremes (B 1 and 8, each context length in ``seqs``);
    graph replay times."""
    rows: list[dict[str, Any]] = []
    print("\nsweep (graph_us; best first per shape)")
    gen = torch.Generator(device="cuda").manual_seed(3)
    for model, (h, hk, d) in MODELS.items():
        for b in (1, 8):
            for q_len, seq in itertools.product((1, 16), seqs):
                m = make_paged(b, q_len, seq, h, hk, d, gen)
                meta = (m["query_start_loc"], m["seq_lens"], m["block_tables"])
                ref = paged_attention_ref(m["q"], m["k_cache"], m["v_cache"], *meta)
                base = ta.select_attention_config(h, hk, d, q_len)
                results = []
                q_tiles = triton.cdiv(q_len, base.queries_per_tile)
                auto = ta._pick_num_splits(m["q"].device, b * hk * q_tiles, base.block_n, seq, q_len)
                split_choices = sorted({1, max(1, auto // 2), auto, min(64, auto * 2)})
                warp_choices = (4, 8) if base.block_m >= 64 else (4,)
                for block_n in (32, 64, 128):
                    for num_stages in (2, 3):
                        for num_warps in warp_choices:
                            cfg = ta.AttentionConfig(
                                base.block_m, block_n, base.queries_per_tile, num_warps, num_stages
                            )
                            for splits in split_choices:
                                out = torch.empty_like(m["q"])
                                call = functools.partial(
                                    ta.paged_attention, m["q"], m["k_cache"], m["v_cache"], *meta,
                                    max_query_len=q_len, out=out, num_splits=splits, config=cfg,
                                )  # fmt: skip
                                try:
                                    call()
                                    err = (out.float() - ref.float()).abs().max().item()
                                    us = bench_us(capture(call).replay, warmup=5, rep=20)
                                except Exception as e:  # out of shared memory etc.
                                    print(f"  skip {cfg} splits={splits}: {type(e).__name__}")
                                    continue
                                results.append((us, block_n, num_stages, num_warps, splits, err))
                results.sort()
                print(f"{model} B={b} q={q_len} seq={seq} (default {base}, auto splits {auto}):")
                for us, block_n, st, nw, sp, err in results[:5]:
                    print(
                        f"  {us:7.1f} us  block_n={block_n} stages={st} warps={nw} splits={sp} err={err:.1e}"
                    )
                rows.append(
                    {
                        "model": model,
                        "batch": b,
                        "q_len": q_len,
                        "seq_len": seq,
                        "merge": ta._merge_mode(),
                        "results": [
                            dict(
                                zip(
                                    (
                                        "graph_us",
                                        "block_n",
                                        "num_stages",
                                        "num_warps",
                                        "num_splits",
                                        "max_abs_err",
                                    ),
                                    r,
                                )
                            )
                            for r in results
                        ],
                    }  # fmt: skip
                )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--sweep", action="store_true", help="also sweep tile configs / split counts")
    parser.add_argument(
        "--sweep-seq", nargs="+", type=int, default=[4096], help="context lengths of the sweep (default 4096)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=32768,
        help="also time each context with this max_seq_len hint, as CUDA-graph buckets pass it (0: off)",
    )
    parser.add_argument(
        "--stress-iters",
        type=int,
        default=200,
        help="graph replays per shape of the fused-merge stress check",
    )
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("This benchmark needs a CUDA GPU.", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name()
    print(f"GPU {gpu} | torch {torch.__version__} | triton {triton.__version__} | git {git_revision()}")
    copy_gbs = copy_bandwidth_gbs()
    print(f"device-to-device copy bandwidth: {copy_gbs:.0f} GB/s")
    t0 = time.time()
    attn_rows, ok_attn = run_attention(args, copy_gbs)
    ok_replay = check_graph_replay_new_metadata()
    stress, ok_stress = check_fused_merge_stress(args.stress_iters)
    store_rows, ok_store = run_store_kv(args, copy_gbs)
    sweep_rows = run_sweep(tuple(args.sweep_seq)) if args.sweep else []
    result = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "git_revision": git_revision(),
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "copy_bandwidth_gbs": copy_gbs,
        "all_ok": ok_attn and ok_replay and ok_stress and ok_store,
        "paged_attention": attn_rows,
        "fused_merge_stress": stress,
        "store_kv": store_rows,
        "sweep": sweep_rows,
        "wall_s": time.time() - t0,
    }
    path = args.out
    if path is None:
        slug = "".join(c if c.isalnum() else "-" for c in gpu).strip("-")
        path = os.path.join(
            ROOT, "benchmarks", "results", f"attention_kernels_{slug}_{time.strftime('%Y%m%d-%H%M%S')}.json"
        )
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nall checks {'passed' if result['all_ok'] else 'FAILED'}; wrote {path}")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
