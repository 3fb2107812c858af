set -x
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
export PYTHONPATH=/root/site:$PWD
mkdir -p /root/out8
timeout 200 python benchmarks/smollm2_gpu.py --gguf /root/smollm2.gguf --dflash /root/assets/smollm2-135m-dflash --eagle3 /root/assets/smollm2-135m-eagle3 --skip-hf --no-eager --only plain "dflash K=15" "eagle3 K=7" --out /root/out8/smollm2_gpu-h200.json > /root/out8/smol.log 2>&1; tail -8 /root/out8/smol.log
timeout 200 python benchmarks/lossless_gpu.py --model /root/smollm2.gguf --dflash /root/assets/smollm2-135m-dflash --eagle3 /root/assets/smollm2-135m-eagle3 --out /root/out8/lossless_gpu-h200.json > /root/out8/lossless.log 2>&1; tail -14 /root/out8/lossless.log
S='{"method":"dflash","model":"/root/assets/smollm2-135m-dflash","num_speculative_tokens":15}'
OUTPUT_LEN=256 CONCURRENCY="1 4" timeout 160 bash benchmarks/serve_e2e.sh /root/smollm2.gguf .s18d/mt_bench_question.jsonl /root/out8/e2e-async 16 "$S" > /root/out8/e2e-async.log 2>&1
OUTPUT_LEN=256 CONCURRENCY="1 4" timeout 160 bash benchmarks/serve_e2e.sh /root/smollm2.gguf .s18d/mt_bench_question.jsonl /root/out8/e2e-sync 16 "$S" --no-async-spec > /root/out8/e2e-sync.log 2>&1
grep -E "Successful|Failed|Output token throughput|Mean TPOT|Acceptance length" -r /root/out8/e2e-*/*.txt | head -60
grep -c ERROR /root/out8/e2e-*/server-*.log
cp .s18d/c8.sh /root/out8/
tar -C /root/out8 -czf $OUT/c8.tgz .
