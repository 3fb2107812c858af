set -u
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 150 python .s17/gpu_check.py 2>&1 | grep -v -i warn | tail -3
for i in 1 2; do for v in 1 decode 0; do
  SPECSERVE_FUSED_ROPE_ATTN=$v timeout 130 python benchmarks/step_latency.py --config-dir .bench/qwen3-8b --batches 1 --max-tokens 48 --skip-hf --skip-eager \
    --configs plain dflash:15 --out $OUT/ab8b-fused$v-run$i.json > $OUT/ab8b-fused$v-run$i.log 2>&1
  echo "8B fused=$v run $i: $(grep -E '^(plain|dflash) ' $OUT/ab8b-fused$v-run$i.log | awk '{print $1, $5, $6, $7, $NF}' | tr '\n' ' ') $(grep -o 'floor [0-9.]* ms' $OUT/ab8b-fused$v-run$i.log)"
done; done
timeout 120 python benchmarks/decode_env_sweep.py --config-dir .bench/smollm2 --env SPECSERVE_FUSED_ROPE_ATTN --values 0 1 decode 0 1 --batches 1 8 --out $OUT/smollm2-plain.json 2>&1 | grep -v -i warn | tail -12
timeout 150 python benchmarks/decode_env_sweep.py --config-dir .bench/smollm2 --env SPECSERVE_FUSED_ROPE_ATTN --values 0 1 decode 0 1 --batches 1 \
  --spec '{"method": "dflash", "model": "specserve/assets/smollm2-135m-dflash", "num_speculative_tokens": 15}' --out $OUT/smollm2-dflash15.json 2>&1 | grep -v -i warn | tail -10
cd $OUT && tar czf c2.tgz *.json *.log && rm -f *.json *.log
