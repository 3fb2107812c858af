# session 32, call 3 (carry [".s32"]; warm, /root from calls 1-2): bench serve (mt-bench, 16 prompts x 256 tokens,
# concurrency 1 and 4) with and without DFlash K=15; float32 / bf16 lossless on the real weights (batch 8)
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; E3=/root/assets/smollm2-135m-eagle3; R=/root/r3; mkdir -p $R
S="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15}"
OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT:-220} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e 16 "$S" > $R/e2e.log 2>&1; pkill -f "specserve serve"; sleep 1
for f in $R/e2e/bench-*.txt; do echo "== $f"; grep -h "Output token throughput\|cceptance length\|Mean TPOT" $f; done
echo "[c3] serve $(( $(date +%s) - T0 )) s"
timeout ${LT:-200} python benchmarks/lossless_gpu.py --model $G --dflash $DF --eagle3 $E3 --out $R/lossless.json > $R/lossless.log 2>&1
echo "rc=$?"; grep -v "^INFO" $R/lossless.log | tail -12
tar -C /root -czf $OUT/r3.tgz r3
echo "[c3] total $(( $(date +%s) - T0 )) s"
