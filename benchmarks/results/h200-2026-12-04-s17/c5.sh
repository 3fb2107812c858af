set -u
export PYTHONPATH=$PWD
timeout 120 python .s17/smol_eager.py 2>&1 | grep -E "graphs ==|Error" | tee $OUT/smol_eager.log
for i in 1 2; do for tree in new old; do
  if [ $tree = new ]; then R=$PWD; else R=$PWD/.s17/old; fi
  (cd $R && PYTHONPATH=$R timeout 90 python benchmarks/step_latency.py --config-dir $OLDPWD/.bench/qwen3-8b --batches 1 --max-tokens 48 --skip-hf --skip-eager \
    --configs plain dflash:15 --out $OUT/ab8b-$tree-$i.json > $OUT/ab8b-$tree-$i.log 2>&1)
  echo "8B $tree $i: $(grep -E '^(plain|dflash|eagle3) ' $OUT/ab8b-$tree-$i.log | awk '{print $1, $5, $6, $7, $NF}' | tr '\n' ' ') $(grep -o 'floor [0-9.]* ms' $OUT/ab8b-$tree-$i.log)"
done; done
for tree in new old; do
  if [ $tree = new ]; then R=$PWD; else R=$PWD/.s17/old; fi
  (cd $R && PYTHONPATH=$R timeout 80 python benchmarks/decode_env_sweep.py --config-dir $OLDPWD/.bench/smollm2 --env SPECSERVE_S17_NOOP --values 1 \
    --batches 1 8 --out $OUT/smol-plain-$tree.json > $OUT/smol-plain-$tree.log 2>&1)
  (cd $R && PYTHONPATH=$R timeout 80 python benchmarks/decode_env_sweep.py --config-dir $OLDPWD/.bench/smollm2 --env SPECSERVE_S17_NOOP --values 1 \
    --batches 1 --spec '{"method": "dflash", "model": "'$OLDPWD'/specserve/assets/smollm2-135m-dflash", "num_speculative_tokens": 15}' \
    --out $OUT/smol-dflash-$tree.json > $OUT/smol-dflash-$tree.log 2>&1)
  echo "SmolLM2 $tree plain b1/b8: $(grep -E '^1 ' $OUT/smol-plain-$tree.log | awk '{print $3}' | tr '\n' ' ') dflash15 b1: $(grep -E '^1 ' $OUT/smol-dflash-$tree.log | awk '{print $3}')"
done
cd $OUT && tar czf c5.tgz *.json *.log && rm -f *.json *.log
