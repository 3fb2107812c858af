#!/bin/bash
# Session 30 (2-core VM, no GPU lent): the eager CPU layers before (24d7a95, a git worktree in /tmp/base) and after
# (c44411e) the per-forward attention plan / RoPE / RMSNorm / KV-store change, interleaved four times, same venv.
#   git worktree add /tmp/base 24d7a95 && bash benchmarks/results/cpu-2core-s30/run.sh
set -e
OUT=$PWD/benchmarks/results/cpu-2core-s30
SPEC='{"method": "dflash", "model": "specserve/assets/smollm2-135m-dflash", "num_speculative_tokens": 3}'
for i in 1 2 3 4; do
  for tree in /tmp/base $PWD; do
    name=$([ "$tree" = /tmp/base ] && echo before || echo after)
    (cd "$tree" && PYTHONPATH="$tree" python benchmarks/throughput.py --dtypes float32 --batches 1 8 \
      --max-tokens 128 --spec "$SPEC" --out "$OUT/throughput-$name-$i.json" | tail -6)
  done
done
