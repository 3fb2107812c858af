set -u
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 100 python .s17/gpu_check.py 2>&1 | grep -v -i warn | tail -1
timeout 200 python .s17/lossless.py 2>&1 | grep -v -i "warn\|deprecat" | tee $OUT/lossless.log | grep -E "identical|graphs ==|Error|error" 
for i in 1 2; do for tree in new old; do
  if [ $tree = new ]; then R=$PWD; else R=$PWD/.s17/old; fi
  (cd $R && PYTHONPATH=$R timeout 100 python benchmarks/step_latency.py --config-dir $OLDPWD/.bench/qwen3-8b --batches 1 --max-tokens 48 --skip-hf --skip-eager \
    --configs plain dflash:15 --out $OUT/ab8b-$tree-$i.json > $OUT/ab8b-$tree-$i.log 2>&1)
  echo "8B $tree $i: $(grep -E '^(plain|dflash|eagle3) ' $OUT/ab8b-$tree-$i.log | awk '{print $1, $5, $6, $7, $NF}' | tr '\n' ' ') $(grep -o 'floor [0-9.]* ms' $OUT/ab8b-$tree-$i.log)"
done; done
cd $OUT && tar czf c3.tgz *.json *.log && rm -f *.json *.log
