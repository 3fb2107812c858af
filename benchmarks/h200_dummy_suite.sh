#!/usr/bin/env bash
# One H200 call (<= 10 min) on random weights only (no GGUF to ship): CFG holds qwen3-8b/ and smollm2/
# (config + tokenizer). Everything lands in $OUT/suite.tgz (the device tool brings back few files).
#   CFG=.bench OUT=$OUT bash benchmarks/h200_dummy_suite.sh
# 1. lossless: greedy outputs of every drafter == plain decode, float32 and bfloat16 (SmolLM2 shape, batch 8)
# 1b. sampling inside the graphs (temperature 0.8) vs greedy: tok/s and the share of steps on the graph path
# 2. step latency, Qwen3-8B shape: plain, DFlash K=4/15, EAGLE-3 K=4/7, batch 1/2/4/8, graphs vs eager, HF forward,
#    weight-read floor, async scheduling on/off
# 2b. where a plain decode step's GPU time goes (decode_profile.py: per-GEMM read rate, kernels, graph gaps), b1/b8;
#     gemm_layouts.py: each decode GEMM shape as F.linear / x @ W.T-stored / no reduced-precision reduction / Triton;
#     then the whole step and the engine with nn.Linear's layout (SPECSERVE_WEIGHT_LAYOUT=nk; since session 6 the
#     8B-shaped target stores its projections transposed by default, specserve/layers/linear.py)
# 3. SmolLM2-135M shape batch 1: HF transformers eager + static cache (compiled, warmed up) vs specserve plain
#    and DFlash K=15 (random weights: speed only; acceptance of a random target is meaningless)
set -uo pipefail
CFG=${CFG:-.bench}
OUT=${OUT:-/tmp/specserve-dummy-suite}
W=$(mktemp -d)
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[suite] $* at $(( $(date +%s) - T0 )) s" >&2; }
D=specserve/assets/smollm2-135m-dflash; E=specserve/assets/smollm2-135m-eagle3
timeout "${LOSSLESS_TIME:-110}" python benchmarks/lossless_gpu.py --model "$CFG/smollm2" --dummy --dflash $D --eagle3 $E \
    --out "$W/lossless_gpu-h200.json" 2>&1 | tee "$W/lossless_gpu-raw.log" | grep -v "^\[transformers\]\|^{" | tee "$W/lossless_gpu-h200.log"
say "lossless"
timeout "${SAMPLING_TIME:-45}" python benchmarks/sampling_in_graph.py "$CFG/smollm2" 2>&1 | grep -v "^\[transformers\]" | tee "$W/sampling_in_graph.log"
say "sampling in the graphs"
timeout "${STEP_TIME:-190}" python benchmarks/step_latency.py --config-dir "$CFG/qwen3-8b" --batches 1 2 4 8 \
    --max-tokens 48 --configs plain dflash:4 dflash:15 eagle3:4 eagle3:7 --out "$W/step_latency-h200.json" 2>&1 \
    | tee "$W/step_latency-raw.log" | grep -v "^\[transformers\]\|^{" | tee "$W/step_latency-h200.log"
say "step latency"
# (the six-kernel layer's --gemv-sweep is left out since session 5 measured it slower: ~30 s saved per batch)
for b in 1 8; do
    timeout "${PROFILE_TIME:-120}" python benchmarks/decode_profile.py --config-dir "$CFG/qwen3-8b" --batch $b \
        --out "$W/decode_profile-b$b.json" 2>&1 | grep -v "^\[transformers\]" | tee "$W/decode_profile-b$b.log"
done
say "decode profile"
# decode GEMMs per weight layout / cuBLAS setting / Triton skinny GEMM: which one streams the weights fastest
timeout "${LAYOUT_TIME:-150}" python benchmarks/gemm_layouts.py --config-dir "$CFG/qwen3-8b" --rows 1 4 8 16 \
    --out "$W/gemm_layouts.json" 2>&1 | grep -v "^\[transformers\]" | tee "$W/gemm_layouts.log"
say "gemm layouts"
# nn.Linear's layout (SPECSERVE_WEIGHT_LAYOUT=nk) beside the default transposed one: graph replay profile, engine
SPECSERVE_WEIGHT_LAYOUT=nk timeout "${PROFILE_TIME:-120}" python benchmarks/decode_profile.py \
    --config-dir "$CFG/qwen3-8b" --batch 1 --out "$W/decode_profile-nk-b1.json" 2>&1 \
    | grep -v "^\[transformers\]" | tee "$W/decode_profile-nk-b1.log"
SPECSERVE_WEIGHT_LAYOUT=nk timeout "${KN_TIME:-90}" python benchmarks/step_latency.py --config-dir "$CFG/qwen3-8b" \
    --batches 1 8 --max-tokens 48 --configs plain dflash:15 --skip-eager --skip-hf \
    --out "$W/step_latency-nk-h200.json" 2>&1 | grep -v "^\[transformers\]\|^{" | tee "$W/step_latency-nk-h200.log"
say "nn.Linear weight layout"
timeout "${SMOL_TIME:-240}" python benchmarks/smollm2_gpu.py --config-dir "$CFG/smollm2" --no-eager \
    --hf-timeout "${HF_TIME:-200}" --dflash $D --only plain "dflash K=15" --out "$W/smollm2_gpu-dummy-h200.json" 2>&1 \
    | tee "$W/smollm2_gpu-raw.log" | grep -v "^\[transformers\]" | tee "$W/smollm2_gpu-dummy-h200.log"
say "smollm2 vs HF"
mkdir -p "$OUT" && tar -C "$W" -czf "$OUT/suite.tgz" .
