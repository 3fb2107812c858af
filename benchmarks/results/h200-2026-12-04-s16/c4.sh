set -u
for i in 1 2; do for tree in new old; do
  if [ $tree = new ]; then R=$PWD; else R=$PWD/.s16/old; fi
  (cd $R && PYTHONPATH=$R timeout 120 python benchmarks/step_latency.py --config-dir $OLDPWD/.bench/qwen3-8b --batches 1 --max-tokens 48 --skip-hf --skip-eager \
    --configs plain dflash:15 --out $OUT/ab-$tree-$i.json > $OUT/ab-$tree-$i.log 2>&1)
  echo "$tree $i: $(grep -E '^(plain|dflash) ' $OUT/ab-$tree-$i.log | awk '{print $1, $5, $NF}' | tr '\n' ' ')"
done; done
