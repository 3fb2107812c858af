set -x
export PYTHONPATH=/root/site:$PWD
mkdir -p /root/out7
OUTPUT_LEN=128 CONCURRENCY="1 4" timeout 400 bash benchmarks/serve_e2e.sh /root/smollm2.gguf .s18d/mt_bench_question.jsonl /root/out7/e2e 16 '{"method":"dflash","model":"/root/assets/smollm2-135m-dflash","num_speculative_tokens":7}' --no-async-spec > /root/out7/e2e.log 2>&1
grep -E "Successful|Failed|Output token throughput|Mean TPOT|Acceptance length" -r /root/out7/e2e/*.txt | head -60
grep -c ERROR /root/out7/e2e/server-*.log
cp .s18d/c6.sh /root/out7/
tar -C /root/out7 -czf $OUT/c7.tgz .
