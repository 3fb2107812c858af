set -x
pip install -q --no-index --no-deps --target /root/site .whl/*.whl 2>&1 | grep -v WARN
export PYTHONPATH=/root/site:$PWD
mkdir -p /root/out4 && ls -la /root/smollm2.gguf
OUTPUT_LEN=128 CONCURRENCY="1 2 4" timeout 400 bash benchmarks/serve_e2e.sh /root/smollm2.gguf .s18b/mt_bench_question.jsonl /root/out4/e2e 16 '{"method":"dflash","model":"/root/assets/smollm2-135m-dflash","num_speculative_tokens":7}' > /root/out4/e2e.log 2>&1
grep -E "Successful|Output token throughput|Mean TPOT|acceptance|Acceptance" -r /root/out4/e2e/*.txt | head -60
cp .s18b/c4.sh /root/out4/
tar -C /root/out4 -czf $OUT/c4.tgz .
