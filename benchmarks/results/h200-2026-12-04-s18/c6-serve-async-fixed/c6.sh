set -x
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
export PYTHONPATH=/root/site:$PWD
mkdir -p /root/out6
OUTPUT_LEN=128 CONCURRENCY="1 2 4" timeout 400 bash benchmarks/serve_e2e.sh /root/smollm2.gguf .s18d/mt_bench_question.jsonl /root/out6/e2e 16 '{"method":"dflash","model":"/root/assets/smollm2-135m-dflash","num_speculative_tokens":7}' > /root/out6/e2e.log 2>&1
grep -E "Successful|Failed|Output token throughput|Mean TPOT|Acceptance length" -r /root/out6/e2e/*.txt | head -60
grep -c ERROR /root/out6/e2e/server-*.log
cp .s18d/c6.sh /root/out6/
tar -C /root/out6 -czf $OUT/c6.tgz .
