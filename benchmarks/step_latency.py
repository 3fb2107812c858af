"""Step latency of a Qwen3-8B-shaped target (random bf16 weights) with plain decode, DFlash and EAGLE-3.

    python benchmarks/step_latency.py --config-dir DIR [--batches 1 2 4 8] [--out FILE]

DIR holds a Qwen3-8B config.json and tokenizer files. Drafters: a Qwen3-8B-DFlash-b16-shaped drafter
(5 layers, taps [1, 9, 17, 25, 33]) and an EAGLE-3 head shaped like AngelSlim/Qwen3-8B_eagle3 (lm_head shared),
both random (load_format="dummy"). Per configuration and batch size it reports ms per engine step (measured
through the engine, graphs on; split into target verify and drafter), the weight-read floor (weight bytes /
the DRAM rate measured in the same run: the higher of a device-to-device copy's read+write traffic and a reduction's
read rate) and HF transformers' decode forward in the same run.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

PUBLISHED = {  # reference/dflash.md §6a, Qwen3-8B, GSM8K, temperature 0 (B200, HF backend)
    ("dflash", 15): 6.55,
    ("eagle3", 7): 2.89,
}


def write_drafters(root: Path) -> tuple[str, str]:
    df, ea = root / "dflash-b16", root / "eagle3"
    df.mkdir(parents=True, exist_ok=True)
    ea.mkdir(parents=True, exist_ok=True)
    (df / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["DFlashDraftModel"],
                "model_type": "qwen3",
                "block_size": 16,
                "num_target_layers": 36,
                "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
                "hidden_size": 4096,
                "intermediate_size": 12288,
                "num_hidden_layers": 5,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "hidden_act": "silu",
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000,
                "max_position_embeddings": 40960,
                "layer_types": ["full_attention"] * 5,
                "sliding_window": None,
                "attention_bias": False,
                "tie_word_embeddings": False,
                "vocab_size": 151936,
            }
        )
    )
    (ea / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 12288,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "num_hidden_layers": 1,
                "rms_norm_eps": 1e-6,
                "rope_theta": 1000000,
                "max_position_embeddings": 40960,
                "vocab_size": 151936,
                "draft_vocab_size": 151936,
                "tie_word_embeddings": False,
            }
        )
    )
    return str(df), str(ea)


def source_sha(root: Path | None = None) -> str:
    """sha256 (first 12 hex digits) of every ``specserve/**/*.py`` file's path and bytes, in path order: names the
    engine code a result ran on where ``git_revision`` cannot (the device machine's copy of the tree keeps a stale
    HEAD; session 47). Run at a commit to match: ``cd benchmarks && python -c "import step_latency as s;
    print(s.source_sha())"``."""
    root = root or Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted((root / "specserve").rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def result_meta() -> dict[str, str]:
    """What every result JSON records: the command line, the git revision (and whether tracked files differ from
    it), the engine sources' hash (:func:`source_sha`), the GPU."""
    try:
        rev = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
        dirty = subprocess.check_output(["git", "status", "--porcelain", "--untracked-files=no"], text=True)
        rev += "-dirty" if dirty.strip() else ""
    except Exception:  # noqa: BLE001
        rev = os.environ.get("GIT_REV", "unknown")
    return {
        "command": " ".join(["python"] + sys.argv),
        "git_revision": rev,
        "source_sha": source_sha(),
        "gpu": torch.cuda.get_device_name(),
    }


def copy_bandwidth() -> float:
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 10
    for _ in range(n):
        y.copy_(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / n
    del x, y
    return 2 * 2 * 2**30 / dt  # bytes read + written per second


def read_bandwidth() -> float:
    """Bytes per second a reduction reads (4 GiB of bf16 through torch.amax): the rate weights can be read at."""
    x = torch.ones(2 * 2**30, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        x.amax()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    n = 10
    for _ in range(n):
        x.amax()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / n
    del x
    return 4 * 2**30 / dt


def read_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads: every parameter, but an input embedding not tied to the LM head only as the rows
    it gathers (~0). Until session 5 (2026-12-03) the whole embedding was counted, 1.24 GB of the Qwen3-8B shape
    (untied): a floor 8% too lenient, so earlier "x floor" values are 8% low (decode_profile.py always did this)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = getattr(getattr(model, "embed_tokens", None), "weight", None)
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if emb is not None and (head is None or head.data_ptr() != emb.data_ptr()):
        total -= emb.numel() * emb.element_size()
    return total


def count_steps(engine: Any) -> dict[str, int]:
    """Wrap ``engine.step`` so that the returned dict's ``"n"`` counts its calls (reset it by hand)."""
    steps = {"n": 0}
    orig = engine.step

    def counted():  # type: ignore[no-untyped-def]
        steps["n"] += 1
        return orig()

    engine.step = counted
    return steps


def timed_generate(
    llm: Any, eng: Any, steps: dict[str, int], prompts: list, max_tokens: int
) -> tuple[float, int, int]:
    """Wall seconds, engine steps and pipelined (asynchronous) steps of one ``generate`` of ``max_tokens``
    greedy tokens per prompt."""
    from specserve import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    r = eng.runner
    a0 = r.num_async_steps + r.num_async_spec_steps
    steps["n"] = 0
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    llm.generate(prompts, sp, use_tqdm=False)
    return time.perf_counter() - t0, steps["n"], r.num_async_steps + r.num_async_spec_steps - a0


def step_ms(
    llm: Any, eng: Any, steps: dict[str, int], prompts: list, short: int, long: int, reps: int
) -> tuple[float, int, int, float, list[float]]:
    """Milliseconds per decode step, from the difference of a ``long`` and a ``short`` generate (the prefill, the
    first steps and the synchronous tail before max_tokens cancel out): the fastest long run minus the fastest
    short run over ``reps`` of each, after one untimed short run in the current mode (its first pipelined steps
    may compile or load kernels: session 28 saw a one-off ~0.5 s land in a timed short run and the best
    *difference* of a pair then read 5.0 ms for a 7.9 ms step). Also the long run's steps, its pipelined steps,
    its plain wall time per step (prefill included, the pre-s18 number) and every timed run's seconds (short
    runs first)."""
    timed_generate(llm, eng, steps, prompts, short)  # warm-up of this mode's pipelined path
    shorts, longs = [], []
    for _ in range(reps):
        shorts.append(timed_generate(llm, eng, steps, prompts, short))
        longs.append(timed_generate(llm, eng, steps, prompts, long))
    t1, n1, _ = min(shorts)
    t2, n2, a2 = min(longs)
    runs = [round(t, 4) for t, _, _ in shorts + longs]
    return 1e3 * (t2 - t1) / max(1, n2 - n1), n2, a2, 1e3 * t2 / max(1, n2), runs


def run_config(
    model_dir: str,
    spec: dict | None,
    batches: list[int],
    eager: bool,
    max_tokens: int,
    short_tokens: int,
    reps: int,
) -> list[dict]:
    from specserve import LLM, SamplingParams

    llm = LLM(
        model_dir,
        load_format="dummy",
        dtype="bfloat16",
        device="cuda",
        max_model_len=2048,
        max_num_seqs=max(batches),
        speculative_config=spec,
        enable_prefix_caching=False,
        enforce_eager=eager,
        gpu_memory_utilization=0.6,
    )
    eng = llm.engine
    weight_bytes = read_weight_bytes(eng.runner.model)
    steps = count_steps(eng)
    rows = []
    g = torch.Generator().manual_seed(0)
    # the engine's defaults (asynchronous scheduling of plain decode and of fused speculative steps where the
    # graphs run them), then both off in the same run: what overlapping the host work with the device buys
    modes = (bool(eng.runner.async_scheduling), bool(eng.runner.async_spec))
    for b in batches:
        prompts = [
            {"prompt_token_ids": torch.randint(1000, 100000, (128,), generator=g).tolist()} for _ in range(b)
        ]
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        eng.runner.profile, eng.runner.timings = True, []
        steps["n"] = 0
        t0 = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False)
        wall = time.perf_counter() - t0
        eng.runner.profile = False
        dec = [t for t in eng.runner.timings[1:] if t[2] == b]  # skip the prefill step
        fused0 = eng.runner.num_fused_steps
        ms, n2, pipelined, ms_incl, runs = step_ms(llm, eng, steps, prompts, short_tokens, max_tokens, reps)
        # per generate: the warm-up and the 2 x reps timed runs of step_ms
        fused = (eng.runner.num_fused_steps - fused0) // (2 * reps + 1)
        sync_ms = sync_incl = None
        sync_runs: list[float] = []
        if any(modes):
            eng.runner.async_scheduling = eng.runner.async_spec = False
            sync_ms, _, _, sync_incl, sync_runs = step_ms(
                llm, eng, steps, prompts, short_tokens, max_tokens, reps
            )
            eng.runner.async_scheduling, eng.runner.async_spec = modes
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0.0  # noqa: E731
        rows.append(
            {
                "method": spec["method"] if spec else "plain",
                "k": spec["num_speculative_tokens"] if spec else 0,
                "batch": b,
                "graphs": not eager,
                "step_ms_wall": round(ms, 3),
                "target_ms": round(med([t[0] for t in dec]), 3),
                "drafter_ms": round(med([t[1] for t in dec]), 3),
                "steps": n2,
                "pipelined_steps": pipelined,
                "fused_steps_per_pair": fused,
                "async_scheduling": modes[0],
                "async_spec": modes[1],
                "step_ms_wall_no_async": None if sync_ms is None else round(sync_ms, 3),
                "step_ms_incl_prefill": round(ms_incl, 3),
                "step_ms_incl_prefill_no_async": None if sync_incl is None else round(sync_incl, 3),
                "tokens": [short_tokens, max_tokens],
                "run_s": runs,
                "run_s_no_async": sync_runs,
                "profiled_wall_s": round(wall, 3),
                "weight_bytes": weight_bytes,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    del llm, eng
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def hf_decode_ms(model_dir: str) -> float:
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(1000, 100000, (1, 128), device="cuda")
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache = out.past_key_values
        tok = ids[:, -1:]
        times = []
        for i in range(25):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(tok, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
            if i >= 5:
                times.append(time.perf_counter() - t0)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return 1e3 * sorted(times)[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per request of the long timed run")
    ap.add_argument(
        "--short-tokens",
        type=int,
        default=64,
        help="tokens per request of the short run subtracted from the long one (ms per step = the difference)",
    )
    ap.add_argument(
        "--reps", type=int, default=2, help="timed runs of each length; the fastest of each counts"
    )
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-eager", action="store_true")
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["plain", "dflash:4", "dflash:15", "eagle3:4", "eagle3:7"],
        help="which configurations: plain, dflash:K, eagle3:K",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = Path(os.environ.get("TMPDIR", "/tmp")) / "specserve-drafters"
    df, ea = write_drafters(root)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    configs: list[dict | None] = []
    for c in args.configs:
        method, _, k = c.partition(":")
        if method == "plain":
            configs.append(None)
        elif method in ("dflash", "eagle3") and k.isdigit():
            path = df if method == "dflash" else ea
            configs.append({"method": method, "model": path, "num_speculative_tokens": int(k)})
        else:
            ap.error(f"--configs: expected plain, dflash:K or eagle3:K, got {c!r}")
    rows = []
    for spec in configs:
        rows += run_config(
            args.config_dir,
            spec,
            args.batches,
            eager=False,
            max_tokens=args.max_tokens,
            short_tokens=args.short_tokens,
            reps=args.reps,
        )
    if not args.skip_eager:
        for spec in configs:
            if spec is None or (spec["method"] == "dflash" and spec["num_speculative_tokens"] == 15):
                rows += run_config(
                    args.config_dir,
                    spec,
                    [1],
                    eager=True,
                    max_tokens=args.max_tokens,
                    short_tokens=args.short_tokens,
                    reps=1,
                )
    hf_ms = None if args.skip_hf else hf_decode_ms(args.config_dir)
    wb = rows[0]["weight_bytes"]
    # reading the weights once at the best DRAM rate measured here: a copy's read+write traffic per second or a
    # reduction's read rate, whichever is higher (the strictest floor). Until 2026-12-02 17:40 this divided by
    # HALF the copy traffic (bytes copied per second), a floor twice too lenient: older x_floor values are 2x low.
    read_bw = read_bandwidth()
    dram = max(bw, read_bw)
    floor_ms = 1e3 * wb / dram
    plain = {r["batch"]: r["step_ms_wall"] for r in rows if r["method"] == "plain" and r["graphs"]}
    from transformers import AutoConfig

    from specserve.layers.linear import weight_layout

    layout = weight_layout("cuda", int(AutoConfig.from_pretrained(args.config_dir).hidden_size))
    print(
        f"\nQwen3-8B-shaped target, bf16, {wb / 1e9:.2f} GB of weights ({layout} projections); "
        f"weight-read floor {floor_ms:.3f} ms "
        f"(DRAM {dram / 1e12:.2f} TB/s: copy traffic {bw / 1e12:.2f}, reduction read {read_bw / 1e12:.2f}); HF transformers decode forward (batch 1): "
        f"{hf_ms if hf_ms is None else round(hf_ms, 2)} ms"
    )
    print(
        f"{'method':8} {'K':>3} {'batch':>5} {'graphs':>6} {'step ms':>8} {'target':>7} {'drafter':>7} "
        f"{'x floor':>7} {'x plain':>7} {'proj tok/s':>10} {'no-async ms':>11}"
    )
    for r in rows:
        tau = PUBLISHED.get((r["method"], r["k"]))
        proj = f"{tau * 1e3 / r['step_ms_wall'] * r['batch']:.0f}" if tau else "-"
        xp = r["step_ms_wall"] / plain[r["batch"]] if r["batch"] in plain else float("nan")
        r.update(
            x_floor=round(r["step_ms_wall"] / floor_ms, 3),
            x_plain=round(xp, 3),
            projected_tokens_per_s=(tau * 1e3 / r["step_ms_wall"] * r["batch"]) if tau else None,
            projected_from_acceptance_length=tau,
        )
        print(
            f"{r['method']:8} {r['k']:>3} {r['batch']:>5} {str(r['graphs']):>6} {r['step_ms_wall']:>8.3f} "
            f"{r['target_ms']:>7.3f} {r['drafter_ms']:>7.3f} {r['x_floor']:>7.2f} {xp:>7.2f} {proj:>10} "
            f"{r['step_ms_wall_no_async'] if r.get('step_ms_wall_no_async') else '-':>11}"
        )
    print(
        "proj tok/s = published acceptance length (DFlash K=15: 6.55, EAGLE-3 K=7: 2.89; GSM8K, Qwen3-8B) x "
        "batch / step time: a PROJECTION, not a measurement."
    )
    result = {
        **result_meta(),
        "copy_bandwidth_Bps": bw,
        "weight_bytes": wb,
        "read_bandwidth_Bps": read_bw,
        "weight_read_floor_ms": floor_ms,
        "floor_definition": "weight bytes / max(copy read+write traffic rate, reduction read rate)",
        "hf_transformers_decode_ms_batch1": hf_ms,
        "weight_layout": layout,
        "rows": rows,
    }
    out = Path(args.out or f"benchmarks/results/step_latency-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
