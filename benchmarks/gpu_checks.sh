#!/usr/bin/env bash
# One H200 call (~6 min) for what has so far run only on CPU (Triton interpreter / eager graphs):
#   CFG=.bench OUT=$OUT bash benchmarks/gpu_checks.sh      # CFG holds qwen3-8b/ and smollm2/ (config + tokenizer)
# 1. kernels per decoder layer, fused Triton kernels vs eager torch ops, and their values (SmolLM2 shape; Qwen3)
# 2. step latency at batch 1 (Qwen3-8B shape, random weights): plain and DFlash K=15 (fused device-resident
#    step: see the fused_steps column) with SPECSERVE_FUSED_KERNELS=0, then =1 with EAGLE-3 K=7 and the
#    --enforce-eager rows (graphs vs eager)
# 3. sampling inside the graphs (temperature 0.8) vs greedy: tok/s and the share of steps on the graph path
# 4. DFlash trainer attention: split vs flex (compiled) ms/step, peak memory, equal loss
set -uo pipefail
OUT=${OUT:-/tmp/specserve-gpu-checks}
CFG=${CFG:-.bench}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[gpu_checks] $* at $(( $(date +%s) - T0 )) s" >&2; }
{ timeout 45 python benchmarks/count_kernels.py; timeout 45 python benchmarks/count_kernels.py --qwen3; } \
    2>&1 | grep -v "^\[transformers\]" | tee "$OUT/count_kernels.log"
say "kernels counted"
SPECSERVE_FUSED_KERNELS=0 timeout 110 python benchmarks/step_latency.py --config-dir "$CFG/qwen3-8b" \
    --batches 1 --max-tokens 32 --skip-hf --skip-eager --configs plain dflash:15 \
    --out "$OUT/step_latency-fused0.json" 2>&1 | grep -v "^\[transformers\]\|^{" | tee "$OUT/step_latency-fused0.log"
say "step latency with SPECSERVE_FUSED_KERNELS=0"
SPECSERVE_FUSED_KERNELS=1 timeout 170 python benchmarks/step_latency.py --config-dir "$CFG/qwen3-8b" \
    --batches 1 --max-tokens 32 --configs plain dflash:15 eagle3:7 \
    --out "$OUT/step_latency-fused1.json" 2>&1 | grep -v "^\[transformers\]\|^{" | tee "$OUT/step_latency-fused1.log"
say "step latency with SPECSERVE_FUSED_KERNELS=1"
timeout 90 python benchmarks/sampling_in_graph.py "$CFG/smollm2" 2>&1 | grep -v "^\[transformers\]" | tee "$OUT/sampling_in_graph.log"
say "sampling in the graphs"
timeout 110 python benchmarks/bench_dflash_attention.py --iters 3 2>&1 | tee "$OUT/bench_dflash_attention.log"
say "done"
