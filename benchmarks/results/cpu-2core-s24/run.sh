#!/bin/bash
# Session 24, the 2-core VM (no H200 lent): speculative_config disable_by_batch_size on the CPU demo (float32),
# plain vs DFlash K=3 vs DFlash K=3 gated at batch > 2 (8 chat prompts, 64 tokens, ignore_eos); then where
# speculation wins or loses at batch 4 / 8 by data set (gsm8k_test vs mt_bench, 8 prompts x 128 tokens).
set -e
G=${G:-$HOME/.cache/specserve/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
D=${D:-../shared/data}
DF=specserve/assets/smollm2-135m-dflash
OUT=benchmarks/results/cpu-2core-s24
python benchmarks/throughput.py --model "$G" --device cpu --dtypes float32 --batches 1 2 4 8 \
  --spec "{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":3}" \
  --spec "{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":3,\"disable_by_batch_size\":2}" \
  --out $OUT/throughput-dbs.json 2>&1 | tee $OUT/throughput-dbs.log
for b in 4 8; do
  specserve eval-acceptance --model "$G" --device cpu --dtype auto \
    -sc "{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":3}" \
    --dataset $D/gsm8k_test.jsonl $D/mt_bench_question.jsonl --num-prompts 8 --max-tokens 128 --batch-size $b \
    --out $OUT/eval_acceptance-b$b.json 2>&1 | tee $OUT/eval_acceptance-b$b.log
done
