set -u
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
for i in 1 2 3; do
  timeout 170 python benchmarks/step_latency.py --config-dir .bench/qwen3-8b --batches 1 --max-tokens 48 --skip-hf --skip-eager \
    --configs plain dflash:15 --out $OUT/step_latency-b1-run$i.json > $OUT/step_latency-b1-run$i.log 2>&1
  grep -v -i "warn\|deprecat" $OUT/step_latency-b1-run$i.log | tail -8
done
