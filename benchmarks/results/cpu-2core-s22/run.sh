#!/bin/bash
# Session 22, the 2-core VM (AMD EPYC, no AVX-512 BF16; torch 2.13 CPU): the float32 CPU GEMM order
# (SPECSERVE_CPU_GEMM=linear: nn.Linear's x @ W.T; mm: W @ x.T, the new default) A/B, plain vs DFlash / EAGLE-3.
set -e
G=${G:-$HOME/.cache/specserve/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
D=${D:-../shared/data}
OUT=benchmarks/results/cpu-2core-s22
for mode in linear mm; do
  SPECSERVE_CPU_GEMM=$mode specserve eval-acceptance --model "$G" --device cpu --dtype auto \
    -sc '{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":4}' \
    -sc '{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":3}' \
    -sc '{"method":"eagle3","model":"specserve/assets/smollm2-135m-eagle3","num_speculative_tokens":4}' \
    --dataset $D/gsm8k_test.jsonl $D/mt_bench_question.jsonl $D/math500_test.jsonl \
    --num-prompts 8 --max-tokens 128 --batch-size 1 --out $OUT/eval_acceptance-$mode.json 2>&1 | tee $OUT/eval_acceptance-$mode.log
done
# batch 1 and 8 (8 chat prompts, 64 tokens each, ignore_eos), plain vs DFlash K=3 / K=4, both GEMM orders
for mode in linear mm; do
  SPECSERVE_CPU_GEMM=$mode python benchmarks/throughput.py --model "$G" --device cpu --dtypes float32 --batches 1 8 \
    --spec '{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":3}' \
    --spec '{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":4}' \
    --out $OUT/throughput-$mode.json 2>&1 | tee $OUT/throughput-$mode.log
done
