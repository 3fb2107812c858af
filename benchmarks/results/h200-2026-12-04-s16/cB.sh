set -u
test -s /root/smollm2.gguf || cat /root/partA .partB/part > /root/smollm2.gguf; ls -la /root/smollm2.gguf
export PYTHONPATH=/root/site:$PWD
G=/root/smollm2.gguf; D=/root/assets/smollm2-135m-dflash; E=/root/assets/smollm2-135m-eagle3
SPEC='{"method": "dflash", "model": "'$D'", "num_speculative_tokens": 15}'
cp specserve/engine/async_engine.py /root/async_new.py; python -c "import torch;print(torch.__version__, torch.cuda.get_device_name())"
# e2e A/B of the engine thread: this tree (engine built on its thread) vs the previous async_engine.py
for tree in new old; do
  if [ $tree = old ]; then cp .s16/async_engine_old.py specserve/engine/async_engine.py; fi
  CONCURRENCY="1 2 4" OUTPUT_LEN=128 timeout 200 bash benchmarks/serve_e2e.sh $G .s16/mt_bench_question.jsonl $OUT/e2e-$tree 16 "$SPEC" \
    > $OUT/e2e-$tree.log 2>&1
  grep -h -E "Output token throughput|Mean TPOT|Mean TTFT|Acceptance length" $OUT/e2e-$tree/bench-*.txt | head -40
  for f in $OUT/e2e-$tree/bench-*.txt; do echo "$f $(grep 'Output token throughput' $f | awk '{print $NF}') TPOT $(grep 'Mean TPOT' $f | awk '{print $NF}')"; done
done
cp /root/async_new.py specserve/engine/async_engine.py
timeout 150 python benchmarks/lossless_gpu.py --model $G --dflash $D --eagle3 $E --batch 8 --tokens 128 \
  --out $OUT/lossless_gpu-h200.json 2>&1 | grep -v "^INFO\|it/s\]" > $OUT/lossless_gpu-h200.log; tail -14 $OUT/lossless_gpu-h200.log
