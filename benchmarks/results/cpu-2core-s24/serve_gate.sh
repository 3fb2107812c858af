#!/bin/bash
# Session 24, the 2-core VM: `bench serve` through the HTTP server (mt-bench, 16 prompts x 64 tokens, greedy,
# concurrency 1 and 4, float32): plain vs the demo's DFlash K=3, then plain vs DFlash K=3 gated at batch > 2.
G=${G:-$HOME/.cache/specserve/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
D=${D:-../shared/data/mt_bench_question.jsonl}
DF=specserve/assets/smollm2-135m-dflash
OUT=benchmarks/results/cpu-2core-s24
export OUTPUT_LEN=64 CONCURRENCY="1 4"
bash benchmarks/serve_e2e.sh "$G" "$D" $OUT/e2e-k3 16 "{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":3}"
bash benchmarks/serve_e2e.sh "$G" "$D" $OUT/e2e-k3-gated 16 \
  "{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":3,\"disable_by_batch_size\":2}"
