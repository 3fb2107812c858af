#!/usr/bin/env bash
# Evaluate the trained demo drafters on one GPU, in one call (~5 min on an H200 in session 5, +~2 min for HF static compiling):
#   bash benchmarks/demo_h200_eval.sh GGUF DRAFTERS_DIR EVAL_DATA_DIR OUT_DIR
# DRAFTERS_DIR holds smollm2-135m-dflash/ and smollm2-135m-eagle3/ (benchmarks/train_demo_drafters.sh);
# EVAL_DATA_DIR the held-out sets: mt_bench_question.jsonl gsm8k_test.jsonl math500_test.jsonl humaneval.jsonl
# alpaca.jsonl (copies of ../shared/data/{mt_bench_question,gsm8k_test,math500_test}.jsonl, HumanEval.jsonl.gz
# unpacked, eagle/alpaca.jsonl).
# Time caps (EVAL_TIME 150 + GPU_TIME 280 + E2E_TIME 150 s < one 10-minute call; session 5: the acceptance part took
# ~50 s, HF's static cache compiles for ~100 s inside GPU_TIME, hence HF_TIME 200 (two prompt sets); GPU_TIME=0 / E2E_TIME=0 skip
# parts 2 / 3):
# 1. acceptance length + speedup per held-out set: DFlash K=15/4, EAGLE-3 K=4/7 (greedy, bf16, batch 8)
# 2. benchmarks/smollm2_gpu.py: graphs == eager outputs, batch-1 tok/s vs HF transformers (eager / static), on the
#    script's chat prompts and the first two gsm8k_test prompts
# 3. benchmarks/serve_e2e.sh: bench serve through the HTTP server, with and without DFlash, concurrency 1-4
set -uo pipefail
GGUF=$1; DRAFT=$2; DATA=$3; OUT=$4
D="$DRAFT/smollm2-135m-dflash"; E="$DRAFT/smollm2-135m-eagle3"
mkdir -p "$OUT"
T0=$(date +%s)
timeout "${EVAL_TIME:-150}" python -m specserve eval-acceptance --model "$GGUF" --dtype bfloat16 \
    -sc "{\"method\": \"dflash\", \"model\": \"$D\", \"num_speculative_tokens\": 15}" \
    -sc "{\"method\": \"dflash\", \"model\": \"$D\", \"num_speculative_tokens\": 4}" \
    -sc "{\"method\": \"eagle3\", \"model\": \"$E\", \"num_speculative_tokens\": 4}" \
    -sc "{\"method\": \"eagle3\", \"model\": \"$E\", \"num_speculative_tokens\": 7}" \
    --dataset "$DATA"/{mt_bench_question,gsm8k_test,math500_test,humaneval,alpaca}.jsonl \
    --num-prompts "${EVAL_PROMPTS:-24}" --max-tokens 256 --batch-size 8 --out "$OUT/eval_acceptance-h200.json" \
    2>&1 | grep -v '^{' | tee "$OUT/eval_acceptance-h200.log"
echo "[eval] acceptance done at $(( $(date +%s) - T0 )) s" >&2
[ "${GPU_TIME:-280}" -gt 0 ] && timeout "${GPU_TIME:-280}" python benchmarks/smollm2_gpu.py --gguf "$GGUF" --dflash "$D" --eagle3 "$E" \
    --hf-timeout "${HF_TIME:-200}" --timed-file "$DATA/gsm8k_test.jsonl:2" --only plain "dflash K=15" "eagle3 K=7" --out "$OUT/smollm2_gpu-h200.json" 2>&1 | grep -v "^INFO\|it/s\]" | tee "$OUT/smollm2_gpu-h200.log"
echo "[eval] smollm2_gpu done at $(( $(date +%s) - T0 )) s" >&2
[ "${E2E_TIME:-150}" -gt 0 ] && OUTPUT_LEN=128 CONCURRENCY="1 2 4" timeout "${E2E_TIME:-150}" bash benchmarks/serve_e2e.sh "$GGUF" \
    "$DATA/mt_bench_question.jsonl" "$OUT/e2e" 16 \
    "{\"method\": \"dflash\", \"model\": \"$D\", \"num_speculative_tokens\": 15}"
echo "[eval] e2e done at $(( $(date +%s) - T0 )) s" >&2
