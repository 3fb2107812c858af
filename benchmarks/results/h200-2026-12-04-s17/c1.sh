set -u
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
timeout 150 python .s17/gpu_check.py 2>&1 | grep -v -i warn | tee $OUT/gpu_check.log | tail -30
for i in 1 2; do for v in 1 0; do
  SPECSERVE_FUSED_ROPE_ATTN=$v timeout 130 python benchmarks/step_latency.py --config-dir .bench/qwen3-8b --batches 1 --max-tokens 48 --skip-hf --skip-eager \
    --configs plain dflash:15 --out $OUT/ab8b-fused$v-run$i.json > $OUT/ab8b-fused$v-run$i.log 2>&1
  echo "8B fused=$v run $i: $(grep -E '^(plain|dflash) ' $OUT/ab8b-fused$v-run$i.log | awk '{print $1, $5, $(NF-4), $NF}' | tr '\n' ' ')"
done; done
grep -E "floor" $OUT/ab8b-fused*-run*.log
