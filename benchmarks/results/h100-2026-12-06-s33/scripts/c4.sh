# session 33, call 4 (carry [".s33"]; warm, /root from calls 1-3): DFlash K = 15 / 7 / 4 vs plain at batch 1 (no HF,
# medians of 5 passes), then bench serve mt-bench DFlash K=7 and K=15 again (concurrency 1, 2, 4), the order swapped
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; R=/root/r4; mkdir -p $R
timeout 150 python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --skip-hf --no-eager --reps 5 \
    --only plain "dflash K=15" "dflash K=7" "dflash K=4" \
    --timed-file /root/ev/gsm8k_test.jsonl:2 --timed-file /root/ev/mt_bench_question.jsonl:2 \
    --out $R/smollm2_gpu-k.json > $R/smollm2_gpu-k.log 2>&1
echo "rc=$?"; grep -v "^INFO" $R/smollm2_gpu-k.log | grep -v "^{" | tail -18
echo "[c4] k $(( $(date +%s) - T0 )) s"
S15="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15}"
S7="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":7}"
LABELS=spec OUTPUT_LEN=256 CONCURRENCY="1 2 4" timeout 110 bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e7 16 "$S7" > $R/e2e7.log 2>&1; pkill -f "specserve serve"; sleep 1
LABELS=spec OUTPUT_LEN=256 CONCURRENCY="1 2 4" timeout 110 bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e15 16 "$S15" > $R/e2e15.log 2>&1; pkill -f "specserve serve"; sleep 1
for f in $R/e2e*/bench-*.txt; do echo "== $f"; grep -h "Output token throughput\|cceptance length" $f; done
tar -C /root -czf $OUT/r4.tgz r4
echo "[c4] total $(( $(date +%s) - T0 )) s"
