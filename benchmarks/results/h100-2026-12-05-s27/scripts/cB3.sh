# session 27, call B3: the gate with slower averages (alpha 0.05, probes of 8 steps, full-K acceptance only) vs ungated DFlash K=15
# carry [".partB", ".s23e", ".s27"] (results + drafter weights out of the tree; drafters in /root/assets from call A)
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /root/partA .partB/part > /root/smollm2.gguf; cp -r .s23e /root/ev
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; R=$OUT/r; mkdir -p $R
timeout ${ST:-60} python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --skip-hf --no-eager \
    --only "dflash K=15" "dflash K=15 gated" --timed-file /root/ev/gsm8k_test.jsonl:2 --out $R/smollm2_gpu.json > $R/smollm2_gpu.log 2>&1
grep "^{" $R/smollm2_gpu.log | cut -c1-330
echo "[cB3] smollm2 at $(( $(date +%s) - T0 )) s"
S="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15}"
SG="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15,\"disable_when_slower\":true}"
LABELS=spec OUTPUT_LEN=256 CONCURRENCY=1 timeout ${BT:-45} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e 16 "$S" > $R/e2e.log 2>&1
LABELS=spec OUTPUT_LEN=256 CONCURRENCY=1 timeout ${BT:-45} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e-gated 16 "$SG" > $R/e2e-gated.log 2>&1
for f in $R/e2e/bench-*.txt $R/e2e-gated/bench-*.txt; do echo "== $f"; grep -h "Output token throughput\|cceptance length" $f; done
echo "[cB3] total $(( $(date +%s) - T0 )) s"
