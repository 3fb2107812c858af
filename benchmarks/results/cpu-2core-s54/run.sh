#!/usr/bin/env bash
# Session 54, the 2-core VM (AMD EPYC, avx512_bf16; --dtype auto is bfloat16 here): the demo (SmolLM2-135M-Instruct)
# through the new `specserve bench throughput` (vLLM's offline report + acceptance), greedy, plain vs the bundled
# DFlash drafter at the CPU default K=3, at batch 1 (--max-num-seqs 1) and batch 8, on 8 mt-bench and 8 gsm8k_test
# prompts x 128 tokens, in bf16 (auto) and float32. Run from the repo root: bash benchmarks/results/cpu-2core-s54/run.sh
set -euo pipefail
D=../shared/data
OUT=benchmarks/results/cpu-2core-s54
for dtype in auto float32; do
  for ds in mt_bench_question gsm8k_test; do
    for seqs in 1 8; do
      for spec in plain dflash; do
        flag=(); [ "$spec" = plain ] && flag=(--no-speculation)
        name="$dtype-$ds-b$seqs-$spec"
        echo "== $name"
        specserve bench throughput --dtype "$dtype" --max-num-seqs "$seqs" "${flag[@]}" --dataset-name hf \
            --hf-name "$ds" --dataset-path "$D/$ds.jsonl" --num-prompts 8 --output-len 128 --temperature 0 \
            --disable-shuffle --disable-tqdm --output-json "$OUT/$name.json" 2>/dev/null | grep -E "^Throughput|^Speculative"
      done
    done
  done
done
