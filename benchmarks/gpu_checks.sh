#!/usr/bin/env bash
# One H200 call (~8 min, carry .bench) for what has so far run only on CPU (Triton interpreter / eager graphs):
#   OUT=$OUT bash benchmarks/gpu_checks.sh
# 1. kernels per decoder layer, fused Triton kernels vs eager torch ops (SmolLM2 shape; Qwen3 q/k-norm variant)
# 2. step latency at batch 1 (Qwen3-8B shape, random weights): plain, DFlash K=15 (fused device-resident step:
#    see the fused_steps column), EAGLE-3 K=7, with SPECSERVE_FUSED_KERNELS=0 and =1, same process order
# 3. SmolLM2 shape with the fused kernels: graphs == eager greedy outputs for every method, batch-1 tok/s
#    (HF skipped: its static-cache compile alone takes minutes; run smollm2_gpu.py without --skip-hf separately)
# 4. sampling inside the graphs (temperature 0.8) vs greedy: tok/s and the share of steps on the graph path
# 5. DFlash trainer attention: split vs flex (compiled) ms/step, peak memory, equal loss
set -uo pipefail
OUT=${OUT:-/tmp/specserve-gpu-checks}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[gpu_checks] $* at $(( $(date +%s) - T0 )) s" >&2; }
{ timeout 60 python benchmarks/count_kernels.py; timeout 60 python benchmarks/count_kernels.py --qwen3; } \
    2>&1 | grep -v "^\[transformers\]" | tee "$OUT/count_kernels.log"
say "kernels counted"
for f in 0 1; do
    SPECSERVE_FUSED_KERNELS=$f timeout 150 python benchmarks/step_latency.py --config-dir .bench/qwen3-8b \
        --batches 1 --max-tokens 32 --skip-hf --configs plain dflash:15 eagle3:7 \
        --out "$OUT/step_latency-fused$f.json" 2>&1 | grep -v "^\[transformers\]\|^{" | tee "$OUT/step_latency-fused$f.log"
    say "step latency with SPECSERVE_FUSED_KERNELS=$f"
done
SPECSERVE_FUSED_KERNELS=1 timeout 150 python benchmarks/smollm2_gpu.py --config-dir .bench/smollm2 --skip-hf \
    --dflash specserve/assets/smollm2-135m-dflash --eagle3 specserve/assets/smollm2-135m-eagle3 \
    --out "$OUT/smollm2_gpu-fused.json" 2>&1 | grep -v "^\[transformers\]" | tee "$OUT/smollm2_gpu-fused.log"
say "smollm2 graphs == eager (fused kernels)"
timeout 120 python - <<'PY' 2>&1 | grep -v "^\[transformers\]" | tee "$OUT/sampling_in_graph.log"
import time
from specserve import LLM, SamplingParams
for spec in (None, {"method": "dflash", "model": "specserve/assets/smollm2-135m-dflash", "num_speculative_tokens": 15}):
    llm = LLM(".bench/smollm2", load_format="dummy", dtype="bfloat16", device="cuda", max_num_seqs=8,
              enable_prefix_caching=False, speculative_config=spec)
    r = llm.engine.runner
    prompts = [{"prompt_token_ids": list(range(100 + i, 140 + i))} for i in range(8)]
    for temp in (0.0, 0.8):
        sp = SamplingParams(temperature=temp, max_tokens=128, ignore_eos=True)
        llm.generate(prompts[:1], SamplingParams(temperature=temp, max_tokens=8))
        s0, f0, t0 = r.num_sampling_steps, r.num_fast_steps, time.perf_counter()
        n = sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts, sp))
        dt = time.perf_counter() - t0
        print(f"{'plain' if spec is None else 'dflash K=15'} T={temp} batch 8: {n / dt:.0f} tok/s, "
              f"graph steps {r.num_fast_steps - f0} (sampling {r.num_sampling_steps - s0})", flush=True)
    del llm
PY
say "sampling in the graphs"
timeout 120 python benchmarks/bench_dflash_attention.py --iters 3 2>&1 | tee "$OUT/bench_dflash_attention.log"
say "done"
